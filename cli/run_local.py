"""Printing for ``pipectl run``: per-step progress (rich) on stderr, the summary at the end."""

from __future__ import annotations

import re
import signal
from typing import Any

from pipectl.components.contracts import RunSettings, TrainingParameters
from pipectl.components.errors import redact_credentials


_CAUSE = re.compile(r"^(error|hint): |^[A-Za-z_.]+(Error|Exception): ")


def run_local(parameters: TrainingParameters, options: dict[str, Any], launcher: str, console: Any) -> dict[str, Any]:
    """Run with progress on ``console``; returns the summary dict (see pipelines.run_local)."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from pipectl.pipelines.run_local import run_training_locally

    settings = RunSettings(**options)
    progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=False)
    ids: dict[str, Any] = {}

    def on_event(kind: str, task: str, node: Any) -> None:
        if kind == "start":
            ids[task] = progress.add_task(f"{task} …", total=1)
        else:
            if task not in ids:  # skipped (`when` false): never started
                ids[task] = progress.add_task(task, total=1)
            mark = {"Succeeded": "[green]✓[/]", "Skipped": "[dim]–[/]"}.get(node.phase, "[red]✗[/]")
            progress.update(ids[task], description=f"{mark} {task} [dim]{node.message}[/]", completed=1)

    def on_services(urls: dict[str, str]) -> None:
        # Validation is over: from here on there is progress to show.
        console.print("[dim]services: " + redact_credentials(", ".join(f"{k} {v}" for k, v in urls.items())) + "[/]", soft_wrap=True)
        progress.start()

    def on_sigterm(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds: gang processes and services are stopped on the way out

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        summary = run_training_locally(parameters, settings, on_event, on_services, launcher=launcher)
    finally:
        progress.stop()
        signal.signal(signal.SIGTERM, previous)

    if summary["phase"] != "Succeeded":
        failed = next(s for s in summary["steps"] if s["phase"] not in ("Succeeded", "Skipped"))
        console.print(f"[bold red]workflow {summary['workflow']} Failed[/] at step {failed['task']} ({failed['message']})")
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
        return summary

    table = Table(title=f"workflow {summary['workflow']} Succeeded", show_header=False)
    model = summary.get("model", {})
    table.add_row("model", f"{model.get('name')} version {model.get('version')}")
    champion = model.get("champion_version")
    table.add_row("alias", model.get("alias") or (f"(none; champion is version {champion})" if champion else "(none; no champion yet)"))
    for k, v in summary.get("metrics", {}).items():
        table.add_row(k, f"{v:.4f}")
    table.add_row("decision", str(summary.get("decision")))
    table.add_row("mlflow run", str(summary.get("mlflow_run_id")))
    pre = summary.get("preprocess", {})
    table.add_row("preprocess", f"{pre.get('images-per-s')} images/s on {pre.get('device')}, {pre.get('corrupt')} corrupt")
    table.add_row("wall time", f"{sum(s['duration_s'] for s in summary['steps']):.1f} s in steps")
    console.print(table)
    return summary
