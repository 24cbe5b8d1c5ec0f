"""``pipectl``: the root command group. Each command lives in the module of its kind and is added
here once; no command module imports this one (no import cycle).

- :mod:`pipectl.cli.compile_cmds`: render, lint (compile layer, no I/O beyond files);
- :mod:`pipectl.cli.data_cmds`: data example, data push (datasets);
- :mod:`pipectl.cli.run_cmd`: run (the local backend), ui (the MLflow UI of local runs);
- :mod:`pipectl.cli.cluster_cmds`: submit, templates, cron, list, status, wait, logs, retry, resubmit, stop, terminate, delete;
- :mod:`pipectl.cli.doctor_cmd`: doctor (is a cluster ready);
- :mod:`pipectl.cli.site_cmds`: site init, site show (the site file);
- :mod:`pipectl.cli.teams_cmds`: teams mlflow-user (a team's MLflow user and its Secret);
- :mod:`pipectl.cli.completion_cmd`: completion (click's shell completion scripts).

Exit codes: 0 ok; 1 the operation failed (a workflow that ends Failed); 2 usage or
validation error; 3 a cluster or service unreachable or unauthorised.
"""

from __future__ import annotations

from pathlib import Path

import click

from pipectl.cli import cluster_cmds, compile_cmds, completion_cmd, data_cmds, doctor_cmd, run_cmd, site_cmds, teams_cmds
from pipectl.cli.common import SITE_META, Group


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipectl")
@click.option("--site", type=click.Path(exists=True, dir_okay=False, path_type=Path), envvar="PIPECTL_SITE", default=None,
              help="Site file: this install's endpoints, namespace, registry, quotas, retries, node pools "
                   "(pipectl site init writes one) [env: PIPECTL_SITE].")
@click.pass_context
def main(ctx: click.Context, site: Path | None) -> None:
    """ML training pipelines on Argo Workflows: render, run locally, submit."""
    ctx.meta[SITE_META] = site


for _command in (
    compile_cmds.render, compile_cmds.lint, data_cmds.data,
    run_cmd.run, run_cmd.ui,
    cluster_cmds.submit, cluster_cmds.templates, cluster_cmds.cron, cluster_cmds.list_, cluster_cmds.status, cluster_cmds.wait,
    cluster_cmds.logs, cluster_cmds.retry, cluster_cmds.resubmit, cluster_cmds.stop, cluster_cmds.terminate, cluster_cmds.delete,
    doctor_cmd.doctor, site_cmds.site, teams_cmds.teams, completion_cmd.completion,
):
    main.add_command(_command)
