"""``pipectl site``: the site file, the settings of one install in one place
(:mod:`pipectl.pipelines.site`): ``init`` writes every setting with its default, ``show`` prints
what the commands use."""

from __future__ import annotations

from pathlib import Path

import click

from pipectl.cli.common import compile_config, console, fail, site_file


@click.group()
def site() -> None:
    """The site file: endpoints, namespace, registry, quotas, retries, node pools of one install.

    \b
    Example:
      pipectl site init site.yaml          # every setting with its default; edit it
      pipectl --site site.yaml render cluster --write argo
      export PIPECTL_SITE=$PWD/site.yaml   # or once for every command
    """


@site.command("init")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path), default=Path("site.yaml"))
@click.option("--force", is_flag=True, default=False, help="Overwrite PATH if it exists.")
def init(path: Path, force: bool) -> None:
    """Write PATH (default site.yaml): every setting with its default and description."""
    from pipectl.pipelines.site import site_template

    if path.exists() and not force:
        fail(f"{path} exists", "edit it, or add --force to write the defaults over it", code=2)
    path.write_text(site_template())
    console().print(f"wrote {path}: edit it, then: pipectl --site {path} render cluster --write argo", markup=False)


@site.command("show")
def show() -> None:
    """Print the settings the commands use: the site file's (--site or $PIPECTL_SITE) over the defaults."""
    import yaml

    cfg = compile_config()
    source = site_file()
    console().print(f"# from {source if source else 'the defaults (no site file)'}", markup=False)
    click.echo(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"pipeline_parameters"}), sort_keys=False), nl=False)
