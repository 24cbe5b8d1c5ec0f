"""``pipectl run``: the local backend, with per-step progress (rich) on stderr and the summary at the end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from pipectl.cli.parameters_help import PipelineCommand
from pipectl.cli.common import compile_config, console, fail, launcher_option, needs_steps_extra, output_option, parameter_option, training_parameters
from pipectl.components.errors import redact_credentials

_CAUSE = re.compile(r"^(error|hint): |^[A-Za-z_.]+(Error|Exception): ")


@click.command(cls=PipelineCommand)
@click.argument("pipeline")
@parameter_option
@click.option("--s3-endpoint", default=None, help="S3 endpoint (Ceph RGW...). Default: start an embedded S3 server.")
@click.option("--s3-access-key", default=None, help="Access key for --s3-endpoint. [default: $PIPECTL_S3_ACCESS_KEY]")
@click.option("--s3-secret-key", default=None, help="Secret key for --s3-endpoint. [default: $PIPECTL_S3_SECRET_KEY]")
@click.option("--bucket", default=None, help="Bucket for datasets, shards, checkpoints. [default: pipectl]")
@click.option("--mlflow-uri", default=None, help="MLflow tracking URI. Default: start an embedded MLflow server.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Folder for local state. [default: .pipectl]")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[RUN]",
              help="Continue the state folder's last run (or RUN, the workflow name a run printed) that was "
                   "interrupted or failed: finished steps are not run again, training continues from its checkpoint. "
                   "Parameters, --launcher and the store must be the run's (omit them).")
@launcher_option
@output_option
@needs_steps_extra("pipectl run")
def run(pipeline: str, params: tuple[str, ...], parameter_file: Path | None, output_format: str, launcher: str | None,
        resume: str | None, **opts: Any) -> None:
    """Run PIPELINE on this machine with the embedded local backend (same compiled workflow).
    Needs the steps' dependencies: the steps extra (pip install '.[steps]' in a pipectl checkout). PIPELINE: a built-in pipeline
    (training), or your own: path/to/file.py:NAME or package.module:NAME (its steps' commands run
    here, importing from the file's folder).

    Interrupted (Ctrl-C, SIGTERM, SIGHUP) it stops every process it started; `--resume` continues it.
    A SIGINT or SIGHUP ignored when it starts (nohup, `cmd &` in a script) stays ignored: stop it with SIGTERM.
    A dataset over its lane's maximum (the site file's lane_dataset_max, else the lane's own) is refused before anything starts.
    Exit codes: 0 Succeeded, 1 the workflow Failed, 2 bad input or nothing to resume, 3 a service
    is unreachable, 128+N stopped by signal N."""
    from pipectl.cli.pipeline_ref import load_pipeline, user_code_path

    chosen = load_pipeline(pipeline)
    code_path = user_code_path(pipeline)
    if code_path:  # the steps' processes import the user's modules as the pipeline file did
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (code_path, os.environ.get("PYTHONPATH")) if p)
    parameters = training_parameters(params, parameter_file, chosen)
    resume_arg: str | bool = False if resume is None else (resume or True)
    result = _run_with_progress(parameters, {k: v for k, v in opts.items() if v is not None}, launcher, console(), resume_arg,
                                pipeline=chosen)
    if output_format == "json":
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    if not opts.get("mlflow_uri"):  # the embedded server is gone with the run: say how to see its runs
        where = "" if opts.get("state_dir") in (None, Path(".pipectl")) else f" --state-dir {opts['state_dir']}"
        console().print(f"MLflow UI of this folder's runs: {_this_command()} ui{where}", markup=False, style="dim", soft_wrap=True)
    if result["phase"] != "Succeeded":
        sys.exit(1)


@click.command()
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=Path(".pipectl"), show_default=True,
              help="The state folder of `pipectl run`.")
def ui(state_dir: Path) -> None:
    """Open the MLflow UI of the local runs in the state folder (experiments, metrics such as the
    step-time shares, registered models) on a loopback port, until Ctrl-C; prints the page of the
    newest run, whose Artifacts tab holds its pictures (confusion matrix, learning curve)."""
    from pipectl.pipelines.backends.services import mlflow_store_exists, start_mlflow

    if not mlflow_store_exists(state_dir):
        fail(f"no local runs in {state_dir} (no MLflow store there)", "run one first: pipectl run training", code=2)
    svc = start_mlflow(state_dir)
    try:
        with stop_on_signals():
            latest = _latest_run_page(svc.url)
            console().print(f"MLflow UI of {state_dir}: {svc.url}  (Ctrl-C to stop)", markup=False, soft_wrap=True)
            if latest:
                console().print(f"latest run: {latest}  (metrics; pictures under Artifacts, evaluation/)", markup=False, soft_wrap=True)
            svc.process.wait()
    except SystemExit as e:
        if e.code not in (128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP):
            raise
    finally:
        svc.stop()


def _latest_run_page(mlflow_url: str) -> str:
    """The MLflow UI page of the newest run at ``mlflow_url`` (one run per pipeline run: the
    training's, where evaluate logs its pictures); empty when there is none."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_url)
    experiments = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(experiments, order_by=["attributes.start_time DESC"], max_results=1) if experiments else []
    if not runs:
        return ""
    return f"{mlflow_url.rstrip('/')}/#/runs/{runs[0].info.run_id}"  # MLflow's route, as the Argo UI's link


def _run_with_progress(parameters: Any, options: dict[str, Any], launcher: str | None, console: Any,
                       resume: str | bool = False, pipeline: Any = None) -> dict[str, Any]:
    """Run with progress on ``console``; returns the summary dict (see pipelines.backends.local)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from pipectl.components.contracts import RunSettings
    from pipectl.pipelines.backends.local import run_training_locally

    settings = RunSettings(**options)
    site_dataset_max = compile_config().lane_dataset_max  # the site file's lane maxima apply here too
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False)
    ids: dict[str, Any] = {}
    # written by the training, if it gets that far (bad input writes nothing anywhere)
    progress_file = Path(tempfile.gettempdir()) / f"pipectl-progress-{os.getpid()}-{secrets.token_hex(4)}.jsonl"
    live = LiveTraining(progress, progress_file)

    def on_event(kind: str, task: str, node: Any) -> None:
        with live.lock:
            if kind == "start":
                ids[task] = progress.add_task(f"{task} …", total=1)
                live.running(task, ids[task])
                return
            live.running(None, None)
            if task not in ids:  # skipped (`when` false): never started
                ids[task] = progress.add_task(task, total=1)
            progress.update(ids[task], description=step_row(task, node.phase, node.reused, node.message), completed=1)

    def on_services(urls: dict[str, str]) -> None:
        # Validation is over: from here on there is progress to show.
        console.print("[dim]services: " + redact_credentials(", ".join(f"{k} {v}" for k, v in urls.items())) + "[/]", soft_wrap=True)
        progress.start()

    started = time.time()
    try:
        with stop_on_signals(), live:
            summary = run_training_locally(parameters, settings, on_event, on_services, launcher=launcher, resume=resume,
                                           pipeline=pipeline, progress_file=progress_file,
                                           lane_dataset_max=site_dataset_max)
    except (KeyboardInterrupt, SystemExit):
        progress.stop()
        _print_resume_hint(settings, started, console)
        raise
    finally:
        progress.stop()
        progress_file.unlink(missing_ok=True)

    (_print_failure if summary["phase"] != "Succeeded" else _print_summary)(summary, console)
    return summary


class LiveTraining:
    """While a step runs, its row shows the training's last progress line (epoch, step, loss,
    images/s: :mod:`pipectl.components.progress`), re-read twice a second by a thread of its own."""

    def __init__(self, progress: Any, path: Path) -> None:
        self.progress, self.path = progress, path
        self.lock = threading.Lock()
        self._task: str | None = None
        self._row: Any = None
        self._seen = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pipectl-progress", daemon=True)

    def running(self, task: str | None, row: Any) -> None:
        """The step now running and its row (None, None: none); call with :attr:`lock` held."""
        self._task, self._row = task, row

    def __enter__(self) -> "LiveTraining":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _loop(self) -> None:
        from pipectl.components.progress import describe, last

        while not self._stop.wait(0.5):
            try:
                mtime = self.path.stat().st_mtime
            except OSError:
                continue
            line = last(self.path) if mtime != self._seen else None
            with self.lock:
                if line and self._task is not None:
                    self._seen = mtime
                    self.progress.update(self._row, description=f"{self._task} … [dim]{describe(line)}[/]")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@contextlib.contextmanager
def stop_on_signals() -> Any:
    """While inside: SIGTERM (kill, systemd), SIGHUP (the terminal closed) and SIGINT (Ctrl-C) raise
    ``SystemExit(128 + N)``, which unwinds the run: every process it started is stopped on the way
    out and the run is left resumable.

    A SIGHUP or SIGINT that this process started with *ignored* stays ignored, as the shell meant
    it: ``nohup pipectl run …`` survives the terminal closing, and ``pipectl run … &`` in a script
    (no job control: the shell ignores SIGINT for it) is not stopped by a Ctrl-C meant for the
    script. SIGTERM always stops the run; use it (``kill PID``) for a run started that way."""

    def on_signal(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS
                if sig == signal.SIGTERM or signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def step_row(task: str, phase: str, reused: bool, message: str) -> str:
    """A finished step's progress row (rich markup): its mark, name and message, the two escaped
    (a step's message is the step's text: a user's exception may hold ``[/]``)."""
    from rich.markup import escape

    mark = "[green]↺[/]" if reused else {"Succeeded": "[green]✓[/]", "Skipped": "[dim]–[/]"}.get(phase, "[red]✗[/]")
    return f"{mark} {escape(task)} [dim]{escape(message or '')}[/]"


def _print_resume_hint(settings: Any, since: float, console: Any) -> None:
    """After an interruption: how to continue the run, when this command's run was recorded as
    Interrupted (not when it was stopped before its run started). Best effort: the terminal may be gone."""
    from pipectl.components.errors import PipectlError
    from pipectl.pipelines.backends.local import resumable_run

    try:
        record = resumable_run(Path(settings.state_dir).resolve())
    except PipectlError:
        return
    if record.phase == "Interrupted" and (record.finished_at or 0) >= since:
        done = [t for t, v in record.tasks.items() if v.get("phase") == "Succeeded"]
        where = "" if Path(settings.state_dir) == Path(".pipectl") else f" --state-dir {settings.state_dir}"
        with contextlib.suppress(Exception):
            console.print(f"[yellow]run {record.name} can be resumed[/]: pipectl run training{where} --resume"
                          + (f" (done: {', '.join(done)})" if done else ""), soft_wrap=True)


def _print_failure(summary: dict[str, Any], console: Any) -> None:
    """The failed step, its log's tail and the likely cause (under torchrun, above its boilerplate)."""
    from rich.markup import escape

    failed = next(s for s in summary["steps"] if s["phase"] not in ("Succeeded", "Skipped"))
    console.print(f"[bold red]workflow {summary['workflow']} Failed[/] at step {escape(failed['task'])} ({escape(failed['message'])})")
    try:
        with open(failed["log"], errors="replace") as f:
            lines = f.readlines()
    except OSError:
        lines = []
    console.print("".join(lines[-15:]).rstrip(), markup=False, style="dim")
    causes = [line.rstrip() for line in lines if _CAUSE.search(line) and "torch.distributed.elastic" not in line]
    if causes:  # under torchrun the real error sits above its ChildFailedError boilerplate
        console.print("cause: " + "\n       ".join(dict.fromkeys(causes[-4:])), markup=False, style="bold")
    console.print(f"[dim]log: {failed['log']}[/]")
    console.print("[dim]once the cause is fixed, `pipectl run training --resume` continues from this step[/]")


def _print_summary(summary: dict[str, Any], console: Any) -> None:
    """Model, alias, metrics, decision and the training's step time and verdicts of a Succeeded run, as a table."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"workflow {summary['workflow']} Succeeded", show_header=False)
    model = summary.get("model", {})
    table.add_row("model", f"{model.get('name')} version {model.get('version')}")
    champion = model.get("champion_version")
    table.add_row("alias", model.get("alias") or (f"(none; champion is version {champion})" if champion else "(none; no champion yet)"))
    for k, v in summary.get("metrics", {}).items():
        table.add_row(k, f"{v:.4f}")
    reason = summary.get("decision_reason")
    table.add_row("decision", str(summary.get("decision")) + (f" ({escape(reason)})" if reason else ""))
    table.add_row("mlflow run", str(summary.get("mlflow_run_id")))
    if summary.get("pictures"):
        table.add_row("pictures", escape(", ".join(summary["pictures"])) + " (the run's artifacts in the MLflow UI)")
    if summary.get("step_time"):
        table.add_row("step time", escape(summary["step_time"]) + " (last epoch)")
    for verdict in summary.get("verdicts", []):
        table.add_row("verdict", escape(verdict))
    pre = summary.get("preprocess", {})
    table.add_row("preprocess", f"{pre.get('images-per-s')} images/s on {pre.get('device')}, {pre.get('corrupt')} corrupt")
    ran = [s for s in summary["steps"] if not s.get("reused")]
    reused = [s["task"] for s in summary["steps"] if s.get("reused")]
    table.add_row("wall time", f"{sum(s['duration_s'] for s in ran):.1f} s in steps"
                  + (f" (resumed: {', '.join(reused)} not run again)" if reused else ""))
    console.print(table)


def _this_command() -> str:
    """How to call pipectl again from here: ``pipectl`` when that is what PATH finds, else the path
    this one was started by (``.venv/bin/pipectl`` after ``make demo``)."""
    import shutil
    import sys

    me = Path(sys.argv[0])
    found = shutil.which("pipectl")
    if me.name != "pipectl" or (found and Path(found).resolve() == me.resolve()):
        return "pipectl"
    try:
        return str(me.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(me)

