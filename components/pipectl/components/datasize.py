"""A dataset's size against its lane's maximum (:class:`~pipectl.components.contracts.DatasetMax`).

Measured where it is known without copying anything: a staged dataset by its manifest, shards a
team already has by their index and a listing, any other source by the listing stage scans
anyway. Over the lane's maximum: :class:`DatasetTooLarge` with the numbers and the fix — exit 2
at the command line, exit 1 in a step (the data's failure: a retry would find the same size).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pipectl.components.contracts import DatasetLayout, DatasetManifest, DatasetMax, Lane, ShardIndex
from pipectl.components.runtime import StepError, join_uri, list_objects, object_exists, parse_s3_uri, read_json

GIB = 1 << 30


class DatasetTooLarge(StepError):
    """The dataset is over its lane's maximum. Never transient; exit 2 at the command line."""

    cli_exit = 2


@dataclass(frozen=True)
class DatasetSize:
    """``samples``: images, every split; ``bytes``: the staged files' or the shard files' bytes."""

    uri: str
    samples: int
    bytes: int


def size_text(n: float) -> str:
    """Bytes for people, in binary units, never an exponent: ``512 B``, ``1.5 KiB``, ``1,023 MiB``, ``20 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.3g} {unit}" if n < 100 else f"{n:,.0f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _limit_text(m: DatasetMax) -> str:
    parts = [f"{m.max_samples:,} images" if m.max_samples is not None else "",
             size_text(m.max_gib * GIB) if m.max_gib is not None else ""]
    return ", ".join(p for p in parts if p) or "no maximum"


def _over(size: DatasetSize, m: DatasetMax) -> list[str]:
    """What of ``size`` passes ``m``: e.g. ``["150,000 images > 100,000"]``."""
    out = []
    if m.max_samples is not None and size.samples > m.max_samples:
        out.append(f"{size.samples:,} images > {m.max_samples:,}")
    if m.max_gib is not None and size.bytes > m.max_gib * GIB:
        out.append(f"{size_text(size.bytes)} > {size_text(m.max_gib * GIB)}")
    return out


def check_dataset_size(size: DatasetSize, lane: Lane, maxima: Mapping[Lane, DatasetMax]) -> None:
    """Raise :class:`DatasetTooLarge` when ``size`` passes ``lane``'s maximum in ``maxima`` (a lane
    not in it has no bound); the hint names the lanes that take it and the site setting."""
    over = _over(size, maxima.get(lane, DatasetMax()))
    if not over:
        return
    fits = [f"{other.value} (up to {_limit_text(m)})" for other, m in maxima.items() if other != lane and not _over(size, m)]
    where = f"submit it to another lane: {'; '.join(fits)}; or " if fits else "no lane takes it: "
    raise DatasetTooLarge(
        f"dataset {size.uri} ({size.samples:,} images, {size_text(size.bytes)}) is over the {lane.value} lane's "
        f"maximum: {'; '.join(over)}",
        f"{where}raise the site setting lane_dataset_max.{lane.value} (max_samples, max_gib) and render the "
        "install again: pipectl --site SITE render cluster --write argo, pipectl templates apply")


def staged_size(s3: Any, dataset_uri: str) -> DatasetSize | None:
    """The size of a staged dataset (:meth:`DatasetLayout.of_uri`) from its manifest; None for any
    other URI, or when no manifest is there."""
    layout = DatasetLayout.of_uri(dataset_uri)
    if layout is None or not dataset_uri.startswith("s3://"):
        return None
    if object_exists(s3, *parse_s3_uri(layout.manifest_uri)) is None:
        return None
    manifest = DatasetManifest.model_validate(read_json(s3, layout.manifest_uri))
    return DatasetSize(dataset_uri, len(manifest.entries), manifest.total_bytes)


def shard_bytes(s3: Any, shards_uri: str, uris: list[str]) -> dict[str, int]:
    """Bytes of each of ``uris`` that exists: one listing of ``shards_uri`` (a request per 1,000
    keys), a HEAD for a shard kept elsewhere."""
    bucket, prefix = parse_s3_uri(join_uri(shards_uri, ""))
    listed = {f"s3://{bucket}/{o['Key']}": o["Size"] for o in list_objects(s3, bucket, prefix)}
    out = {}
    for uri in uris:
        if uri in listed:
            out[uri] = listed[uri]
        elif (head := object_exists(s3, *parse_s3_uri(uri))) is not None:
            out[uri] = head["ContentLength"]
    return out


def shards_size(s3: Any, shards_uri: str, index: ShardIndex | None = None) -> DatasetSize:
    """The size of pre-built shards: samples from ``index`` (read from ``<shards_uri>/index.json``
    when None), bytes of the shard files that exist."""
    if index is None:
        index = ShardIndex.model_validate(read_json(s3, join_uri(shards_uri, "index.json")))
    found = shard_bytes(s3, shards_uri, index.train + index.validation)
    return DatasetSize(shards_uri, index.train_count + index.validation_count, sum(found.values()))


def known_size(s3: Any, dataset_uri: str, *, prebuilt: bool) -> DatasetSize | None:
    """The size of ``dataset_uri`` when it is known before anything runs: shards a team already
    has (``prebuilt``: their ``index.json`` is there) or a staged dataset (its manifest is there);
    None otherwise (stage measures it)."""
    if not dataset_uri.startswith("s3://"):
        return None
    if prebuilt:
        if object_exists(s3, *parse_s3_uri(join_uri(dataset_uri, "index.json"))) is None:
            return None
        return shards_size(s3, dataset_uri)
    return staged_size(s3, dataset_uri)
