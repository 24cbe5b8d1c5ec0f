"""``pipectl``: the root command group. Each command lives in the module of its kind and is added
here once; no command module imports this one (no import cycle).

- :mod:`pipectl.cli.compile_cmds`: render, lint (compile layer, no I/O beyond files);
- :mod:`pipectl.cli.data_cmds`: data example, data push (datasets);
- :mod:`pipectl.cli.run_cmd`: run (the local backend), ui (the MLflow UI of local runs);
- :mod:`pipectl.cli.cluster_cmds`: submit, templates, cron, list, status, wait, logs, retry, stop, terminate, delete;
- :mod:`pipectl.cli.doctor_cmd`: doctor (is a cluster ready);
- :mod:`pipectl.cli.completion_cmd`: completion (click's shell completion scripts).

Exit codes (DESIGN.md): 0 ok; 1 the operation failed (a workflow that ends Failed); 2 usage or
validation error; 3 a cluster or service unreachable or unauthorised.
"""

from __future__ import annotations

import click

from pipectl.cli import cluster_cmds, compile_cmds, completion_cmd, data_cmds, doctor_cmd, run_cmd
from pipectl.cli.common import Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipectl")
def main() -> None:
    """ML training pipelines on Argo Workflows: render, run locally, submit."""


for _command in (
    compile_cmds.render, compile_cmds.lint, data_cmds.data,
    run_cmd.run, run_cmd.ui,
    cluster_cmds.submit, cluster_cmds.templates, cluster_cmds.cron, cluster_cmds.list_, cluster_cmds.status, cluster_cmds.wait,
    cluster_cmds.logs, cluster_cmds.retry, cluster_cmds.stop, cluster_cmds.terminate, cluster_cmds.delete,
    doctor_cmd.doctor, completion_cmd.completion,
):
    main.add_command(_command)
