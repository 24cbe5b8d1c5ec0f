"""``pipectl``: parse, call, print. Data on stdout, people on stderr; exit codes per DESIGN.md.

0 ok; 1 the operation failed (a workflow that ends Failed); 2 usage or validation error;
3 a cluster or service unreachable or unauthorised. Heavy imports (hera, torch, mlflow, boto3)
stay inside commands so ``pipectl --help`` is fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from pipectl.cli.errors import PipectlError, fail

PIPELINES = ("training",)
RENDERABLE = ("training", "cluster")


def _console() -> Any:
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class Group(click.Group):
    """Catches :class:`PipectlError` at one boundary: headline + hint on stderr, its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.exceptions.Abort):
            _console().print("[yellow]interrupted[/]: everything this run started has been stopped")
            ctx.exit(130)
        except PipectlError as e:
            console = _console()
            console.print(f"[bold red]error:[/] {e.headline}", soft_wrap=True)
            if e.hint:
                console.print(f"[dim]hint:[/] {e.hint}", soft_wrap=True)
            ctx.exit(e.exit_code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="pipectl")
def main() -> None:
    """ML training pipelines on Argo Workflows: render, run locally, submit."""


def _pipeline_arg() -> Any:
    return click.argument("pipeline", type=click.Choice(PIPELINES))


def _parse_overrides(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            fail(f"parameter {pair!r} is not key=value", "write -p epochs=5", code=2)
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def _parameters(pairs: tuple[str, ...]) -> Any:
    """Validate ``-p`` overrides against the typed parameters; exit 2 with every problem named."""
    from pydantic import ValidationError

    from pipectl.components.contracts import TrainingParameters

    try:
        return TrainingParameters.from_overrides(_parse_overrides(pairs))
    except ValueError as e:
        if isinstance(e, ValidationError):
            problems = "; ".join(
                f"{'.'.join(str(x).replace('_', '-') for x in err['loc'])}: {err['msg']}"
                + (f" (got {err['input']!r})" if "input" in err else "")
                for err in e.errors()
            )
            fail(f"invalid parameter: {problems}", "see `pipectl render training` for each parameter's type and values", code=2)
        fail(str(e), "parameters are the WorkflowTemplate arguments, e.g. -p epochs=5 -p lane=urgent", code=2)


def _launcher_option() -> Any:
    return click.option(
        "--launcher", type=click.Choice(["volcano", "pytorchjob"]), default="volcano", show_default=True,
        help="Gang job the train step creates: a Volcano Job or a Kubeflow PyTorchJob.",
    )


def _compile_config(bucket: str | None, launcher: str = "volcano") -> Any:
    from pipectl.pipelines.training import CompileConfig

    return CompileConfig(launcher=launcher, **({"bucket": bucket} if bucket else {}))


@main.command()
@click.argument("what", type=click.Choice(RENDERABLE))
@click.option("--bucket", envvar="PIPECTL_BUCKET", default=None, help="Bucket baked into the template's URIs.")
@_launcher_option()
@click.option("--write", "write_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="(cluster) write every manifest under this folder (argo/) instead of printing.")
def render(what: str, bucket: str | None, launcher: str, write_dir: Path | None) -> None:
    """Print the WorkflowTemplate of a pipeline (what submit sends and run executes), or with
    `cluster` every manifest of argo/ (namespace, RBAC, lanes, config, alerts, templates, cron)."""
    cfg = _compile_config(bucket, launcher)
    if what == "training":
        from pipectl.pipelines.training import build_training

        click.echo(build_training(cfg).to_yaml(), nl=False)
        return
    from pipectl.pipelines.cluster import render_files

    files = render_files(cfg)
    if write_dir is None:
        click.echo("---\n".join(files[p] for p in sorted(files)), nl=False)
        return
    for rel, text in files.items():
        target = write_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        _console().print(f"wrote {target}")


@main.command()
@click.argument("paths", nargs=-1, type=click.Path(exists=True, path_type=Path))
@click.option("--output", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def lint(paths: tuple[Path, ...], output_format: str) -> None:
    """Validate manifests against the Argo/Volcano/Kubeflow/Kubernetes schemas and pipectl's
    policy rules. PATHS: YAML files or folders; none = everything `pipectl render cluster` makes.
    Exit 2 when anything is found."""
    import yaml

    from pipectl.pipelines.lint import lint_objects, load_paths

    if paths:
        objects = load_paths(list(paths))
    else:
        from pipectl.pipelines.cluster import render_files

        objects = [(f"render:{rel}", doc) for rel, text in render_files().items() if rel != "kustomization.yaml"
                   for doc in yaml.safe_load_all(text) if doc]
    findings = lint_objects(objects)
    if output_format == "json":
        click.echo(json.dumps([{"where": f.where, "message": f.message} for f in findings], indent=2))
    from rich.text import Text

    for f in findings:
        _console().print(Text("✗ ", style="red") + Text(str(f)), soft_wrap=True)
    if findings:
        fail(f"{len(findings)} problem(s) in {len(objects)} object(s)", "fix each field named above", code=2)
    _console().print(f"{len(objects)} object(s) valid")


@main.group()
def data() -> None:
    """Example datasets that ship with pipectl."""


@data.command("example")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", type=click.Choice(["digits"]), default="digits", show_default=True)
def data_example(directory: Path, name: str) -> None:
    """Write the example dataset NAME to DIRECTORY in ImageFolder layout (<label>/<image>.jpg)."""
    from pipectl.components.data import write_example

    if not str(directory).strip() or str(directory) in (".", ""):
        fail("DIRECTORY is empty", "name a folder to write into, e.g. pipectl data example ./digits", code=2)
    try:
        n = write_example(name, directory)
    except OSError as e:
        fail(f"cannot write to {directory}: {e.strerror or e}", "choose a writable folder", code=2)
    _console().print(f"wrote {n} images of {name} to {directory}")
    click.echo(str(directory))


@main.command()
@_pipeline_arg()
@click.option("-p", "--parameter", "params", multiple=True, metavar="KEY=VALUE", help="Workflow parameter (repeatable).")
@click.option("--s3-endpoint", default=None, help="S3 endpoint (Ceph RGW...). Default: start an embedded S3 server.")
@click.option("--s3-access-key", default=None)
@click.option("--s3-secret-key", default=None)
@click.option("--bucket", default=None, help="Bucket for datasets, shards, checkpoints. [default: pipectl]")
@click.option("--mlflow-uri", default=None, help="MLflow tracking URI. Default: start an embedded MLflow server.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None, help="Folder for local state. [default: .pipectl]")
@_launcher_option()
@click.option("--output", "output_format", type=click.Choice(["text", "json"]), default="text", show_default=True)
def run(pipeline: str, params: tuple[str, ...], output_format: str, launcher: str, **opts: Any) -> None:
    """Run PIPELINE on this machine with the embedded local backend (same compiled workflow)."""
    from pipectl.cli.run_local import run_local

    parameters = _parameters(params)
    result = run_local(parameters, {k: v for k, v in opts.items() if v is not None}, launcher, _console())
    if output_format == "json":
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    if result["phase"] != "Succeeded":
        sys.exit(1)


from pipectl.cli.cluster_cmds import register as _register_cluster_commands  # noqa: E402

_register_cluster_commands(main)
