"""Commands of the compile layer: ``render`` and ``lint``. Nothing here talks
to a cluster or starts a service."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipectl.cli.common import compile_config, console, fail, image_config, image_options, launcher_option, needs_steps_extra

@click.command()
@click.argument("what", metavar="PIPELINE|cluster")
@click.option("--bucket", envvar="PIPECTL_BUCKET", default=None, help="Bucket baked into the template's URIs.")
@launcher_option
@image_options
@click.option("--write", "write_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="(cluster) write every manifest under this folder (argo/) instead of printing.")
@click.option("--accept-no-gang-restart", is_flag=True, default=False,
              help="Render a launcher that cannot restart the whole gang after an infrastructure loss "
                   "(a lost pod then fails the training attempt).")
def render(what: str, bucket: str | None, launcher: str | None, registry: str | None, images: tuple[str, ...],
           write_dir: Path | None, accept_no_gang_restart: bool) -> None:
    """Print the WorkflowTemplate of PIPELINE (what submit sends and run executes), or with
    `cluster` every manifest of argo/ (namespace, RBAC, lanes, config, alerts, templates, cron).

    PIPELINE: a built-in pipeline (training), or your own: path/to/file.py:NAME or package.module:NAME."""
    cfg = compile_config(bucket, launcher, **image_config(registry, images))
    from pipectl.pipelines.launchers import LAUNCHERS

    limitation = LAUNCHERS[cfg.launcher].gang_restart_limitation
    if limitation and not accept_no_gang_restart:
        fail(f"launcher {cfg.launcher!r} cannot restart the whole gang after an infrastructure loss: {limitation}",
             "use --launcher volcano (whole-gang restart from the checkpoint), or add --accept-no-gang-restart", code=2)
    if what != "cluster":
        from pipectl.cli.pipeline_ref import load_pipeline

        click.echo(load_pipeline(what).build(cfg).to_yaml(), nl=False)
        return
    from pipectl.pipelines.manifests import render_files

    files = render_files(cfg)
    if write_dir is None:
        click.echo("---\n".join(files[p] for p in sorted(files)), nl=False)
        return
    for rel, text in files.items():
        target = write_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
        console().print(f"wrote {target}", markup=False)
    _remove_stale(write_dir, files)


def _remove_stale(write_dir: Path, files: dict[str, str]) -> None:
    """Remove the team files an earlier render wrote for teams no longer in the site file."""
    from pipectl.pipelines.manifests import TEAMS_DIR, stale_files

    teams = write_dir / TEAMS_DIR
    existing = {str(p.relative_to(write_dir)): (p.read_text().splitlines() or [""])[0]
                for p in sorted(teams.glob("*.yaml"))} if teams.is_dir() else {}
    for rel in stale_files(existing, files):
        (write_dir / rel).unlink()
        console().print(f"removed {write_dir / rel}: its team is no longer in the site file (its namespace and "
                        "queues stay in the cluster until an admin deletes them)", markup=False)


@click.command()
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
        from pipectl.pipelines.manifests import render_files

        objects = [(f"render:{rel}", doc) for rel, text in render_files(compile_config()).items() if not rel.endswith("kustomization.yaml")
                   for doc in yaml.safe_load_all(text) if doc]
    findings = lint_objects(objects)
    if output_format == "json":
        click.echo(json.dumps([{"where": f.where, "message": f.message} for f in findings], indent=2))
    from rich.text import Text

    out = console()
    for f in findings:
        out.print(Text("✗ ", style="red") + Text(str(f)), soft_wrap=True)
    if findings:
        fail(f"{len(findings)} problem(s) in {len(objects)} object(s)", "fix each field named above", code=2)
    out.print(f"{len(objects)} object(s) valid")
