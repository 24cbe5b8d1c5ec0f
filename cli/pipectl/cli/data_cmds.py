"""``pipectl data``: datasets — the example that ships with pipectl, and a local folder pushed to
the store so that a pipeline on a cluster can read it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipectl.cli.common import console, fail, needs_steps_extra


@click.group()
def data() -> None:
    """Datasets: the bundled example, and pushing a local folder to the store."""


@data.command("example")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", type=click.Choice(["digits"]), default="digits", show_default=True)
@needs_steps_extra("pipectl data example")
def data_example(directory: Path, name: str) -> None:
    """Write the example dataset NAME to DIRECTORY in ImageFolder layout (<label>/<image>.jpg), and
    DIRECTORY/train.csv: the same images as a manifest of uri,label rows. Either is a dataset-uri."""
    from pipectl.components.data import write_example
    from pipectl.components.data.digits import write_manifest

    if not str(directory).strip() or str(directory) in (".", ""):
        fail("DIRECTORY is empty", "name a folder to write into, e.g. pipectl data example ./digits", code=2)
    try:
        n = write_example(name, directory)
        manifest = write_manifest(directory)
    except OSError as e:
        fail(f"cannot write to {directory}: {e.strerror or e}", "choose a writable folder", code=2)
    console().print(f"wrote {n} images of {name} to {directory} and a manifest of them, {manifest}", markup=False)
    click.echo(str(directory))


@data.command("push")
@click.argument("source")
@click.option("--bucket", envvar="PIPECTL_BUCKET", default=None, help="Bucket to write to. [default: pipectl]")
@click.option("--s3-endpoint", envvar="PIPECTL_S3_ENDPOINT", default=None,
              help="S3 endpoint (Ceph RGW, MinIO...); credentials from PIPECTL_S3_ACCESS_KEY/PIPECTL_S3_SECRET_KEY.")
@click.option("--to", "to", default=None, metavar="S3_URI",
              help="Where to push: a prefix such as your team's s3_prefix (s3://pipectl/teams/vision/). [default: s3://<bucket>]")
@needs_steps_extra("pipectl data push")
def data_push(source: str, bucket: str | None, s3_endpoint: str | None, to: str | None) -> None:
    """Copy SOURCE (a local folder in ImageFolder layout, or a CSV/Parquet manifest of uri,label
    rows) to the store, verified and content-addressed, as the pipeline's stage step does; print
    the dataset URI to submit with (-p dataset-uri=...). Pushing the same images again writes nothing.

    \b
    Example:
      pipectl submit training -p dataset-uri=$(pipectl data push ./my-images)
      pipectl data push ./my-images --to s3://pipectl/teams/vision/   # a team's key writes under its prefix only"""
    from pydantic import ValidationError

    from pipectl.components.contracts import DatasetLayout, StageInput, StoreSettings

    if source.startswith(("s3://", "example:")):
        fail(f"{source} is not on this machine: a pipeline reads it as it is",
             f"submit with -p dataset-uri={source}", code=2)
    try:
        settings = StoreSettings(**{k: v for k, v in {"bucket": bucket, "s3_endpoint": s3_endpoint}.items() if v})
    except ValidationError as e:
        fail(f"invalid store setting: {e.errors()[0]['msg']}", "see pipectl data push --help", code=2)
    path = Path(source).expanduser().resolve()
    if to is not None and not to.startswith("s3://"):
        fail(f"--to {to}: an S3 URI is expected", "e.g. --to s3://pipectl/teams/vision/", code=2)
    out = _stage(StageInput(source_uri=str(path), bucket=settings.bucket, target_uri=to), settings)
    data_uri = DatasetLayout(dataset_uri=out.dataset_uri).data_uri
    console().print(f"pushed {out.objects} images ({out.bytes / 1e6:.1f} MB, {out.copied} written, "
                    f"{out.skipped} already there) to {out.dataset_uri}", markup=False)
    click.echo(data_uri)


def _stage(inp: Any, settings: Any) -> Any:
    """The stage step's code, run here (StageInput, StoreSettings -> StageOutput); a store that
    cannot be reached is exit 3."""
    from botocore.exceptions import BotoCoreError, ClientError

    from pipectl.components.stage.core import run as stage

    try:
        return stage(inp, settings)
    except (BotoCoreError, ClientError) as e:
        where = settings.s3_endpoint or "AWS S3"
        fail(f"cannot write to the store at {where} (bucket {settings.bucket}): {e}",
             "set PIPECTL_S3_ENDPOINT, PIPECTL_S3_ACCESS_KEY and PIPECTL_S3_SECRET_KEY to the store the cluster uses",
             code=3)
