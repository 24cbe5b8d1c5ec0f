"""Stage a labelled image dataset into the object store under a content-addressed prefix.

Layout written (``<digest>`` = first 20 hex of the dataset digest)::

    s3://<bucket>/datasets/<digest>/data/<label>/<file>   one object per image
    s3://<bucket>/datasets/<digest>/manifest.json         written last: marks completion

Guarantees: validates the whole source before writing anything; copies in parallel (one PUT
below 8 MiB, boto3 managed multipart above); verifies each write (a single PUT's ETag is the
content md5; multipart writes and copies by HEAD of size and the ``sha256`` metadata);
resumable (one LIST finds objects an interrupted run already wrote; matching size and ETag
are skipped) and idempotent (a complete prefix is detected by its manifest: nothing copied).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from pipectl.components.contracts import DatasetManifest, ManifestEntry, StageInput, StageOutput, StoreSettings
from pipectl.components.runtime import (
    StepError,
    ensure_bucket,
    join_uri,
    object_exists,
    parse_s3_uri,
    read_json,
    s3_client,
    write_json,
)

log = logging.getLogger("pipectl.stage")

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png"})
MULTIPART_THRESHOLD_BYTES = 8 * 1024 * 1024
EXAMPLE_SCHEME = "example:"


class DatasetError(StepError):
    """The source is not a usable dataset (missing, empty, unlabelled). Never transient; CLI exit 2."""

    cli_exit = 2


@dataclass(frozen=True)
class SourceFile:
    """One image of the source: ``key`` is ``<label>/<name>`` relative to the dataset root."""

    key: str
    label: str
    size: int
    open: Callable[[], Any]  # returns a binary file object
    s3_location: tuple[str, str] | None = None  # (bucket, key) for server-side copies


def _check_layout(keys: list[str], where: str) -> None:
    if not keys:
        raise DatasetError(
            f"dataset {where} is empty: no {'/'.join(sorted(IMAGE_SUFFIXES))} files found",
            "put images in one subfolder per class: <dataset>/<label>/<image>.jpg",
        )
    unlabelled = [k for k in keys if "/" not in k]
    if unlabelled:
        raise DatasetError(
            f"dataset {where} has images with no label: {', '.join(unlabelled[:3])}"
            + (f" and {len(unlabelled) - 3} more" if len(unlabelled) > 3 else ""),
            "use ImageFolder layout: one subfolder per class, named after the label",
        )
    nested = [k for k in keys if k.count("/") > 1]
    if nested:
        raise DatasetError(
            f"dataset {where} nests folders below the label level: {nested[0]}",
            "use exactly <label>/<image>; move deeper files up one level",
        )
    labels = {k.split("/", 1)[0] for k in keys}
    if len(labels) < 2:
        raise DatasetError(
            f"dataset {where} has a single label ({next(iter(labels))}); a classifier needs at least 2",
            "add one subfolder per class",
        )


def scan_local(root: Path) -> list[SourceFile]:
    """List the images under ``root`` (ImageFolder layout). Raises :class:`DatasetError`."""
    if not root.exists():
        raise DatasetError(f"dataset path {root} does not exist", "check the path, or run: pipectl data example DIR")
    if not root.is_dir():
        raise DatasetError(f"dataset path {root} is not a folder", "pass the folder that holds one subfolder per label")
    files = []
    for folder, dirs, names in os.walk(root, followlinks=True):  # a symlinked label folder counts
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # hidden folders are not classes
        for name in names:
            p = Path(folder) / name
            if p.suffix.lower() in IMAGE_SUFFIXES and not name.startswith(".") and p.is_file():
                files.append(p)
    files.sort()
    keys = [p.relative_to(root).as_posix() for p in files]
    _check_layout(keys, str(root))
    return [
        SourceFile(key=k, label=k.split("/", 1)[0], size=p.stat().st_size, open=(lambda p=p: open(p, "rb")))
        for k, p in zip(keys, files)
    ]


def scan_s3(s3: Any, uri: str) -> list[SourceFile]:
    """List the images under an ``s3://bucket/prefix`` (ImageFolder layout)."""
    from botocore.exceptions import ClientError

    try:
        bucket, prefix = parse_s3_uri(uri)
    except ValueError as e:
        raise DatasetError(f"dataset URI {uri!r} is not s3://bucket/prefix", "write s3://<bucket>/<prefix>") from e
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    objects: list[tuple[str, int]] = []
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if Path(rel).suffix.lower() in IMAGE_SUFFIXES and not any(part.startswith(".") for part in rel.split("/")):
                    objects.append((rel, obj["Size"]))
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in ("NoSuchBucket", "AccessDenied", "AllAccessDisabled"):
            raise DatasetError(f"dataset {uri}: bucket {bucket!r} {'does not exist' if code == 'NoSuchBucket' else 'is not readable'} ({code})",
                               "check the bucket name and that these credentials can list it") from e
        raise
    objects.sort()
    _check_layout([k for k, _ in objects], uri)

    def opener(key: str) -> Callable[[], Any]:
        return lambda: s3.get_object(Bucket=bucket, Key=prefix + key)["Body"]

    return [
        SourceFile(key=k, label=k.split("/", 1)[0], size=size, open=opener(k), s3_location=(bucket, prefix + k))
        for k, size in objects
    ]


def _digests(f: SourceFile) -> tuple[str, str]:
    """(sha256, md5) hex of the file's bytes, in one pass. md5 only to compare S3 ETags."""
    sha, md5 = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    stream = f.open()
    try:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            sha.update(chunk)
            md5.update(chunk)
    finally:
        stream.close()
    return sha.hexdigest(), md5.hexdigest()


def dataset_digest(entries: Iterable[ManifestEntry]) -> str:
    """sha256 over ``"<key>\\t<sha256>\\n"`` of the entries sorted by key: the content address."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.key):
        h.update(f"{e.key}\t{e.sha256}\n".encode())
    return h.hexdigest()


def _metadata(entry: ManifestEntry) -> dict[str, str]:
    """S3 user metadata must be ASCII: the label is percent-encoded (RFC 3986)."""
    from urllib.parse import quote

    return {"sha256": entry.sha256, "label": quote(entry.label, safe="")}


def _upload(s3: Any, f: SourceFile, entry: ManifestEntry, md5: str, bucket: str, key: str) -> int:
    """Write one object and verify it: a single PUT's ETag must equal the content md5;
    multipart uploads and copies are verified by HEAD (size and our sha256 metadata).
    Returns the retries botocore needed for a single PUT (0 for managed transfers)."""
    from boto3.s3.transfer import TransferConfig

    if f.s3_location is None and entry.size < MULTIPART_THRESHOLD_BYTES:
        stream = f.open()
        try:
            body = stream.read()
        finally:
            stream.close()
        resp = s3.put_object(Bucket=bucket, Key=key, Body=body, Metadata=_metadata(entry))
        retries = resp.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        if resp.get("ETag", "").strip('"') != md5 or len(body) != entry.size:
            raise StepError(
                f"verification failed for s3://{bucket}/{key}: the store's ETag differs from the content md5",
                "the source changed during staging or the store altered the write; rerun",
                transient=True,
            )
        return retries

    config = TransferConfig(multipart_threshold=MULTIPART_THRESHOLD_BYTES, multipart_chunksize=MULTIPART_THRESHOLD_BYTES)
    extra = {"Metadata": _metadata(entry)}
    if f.s3_location is not None:
        src_bucket, src_key = f.s3_location
        s3.copy(
            {"Bucket": src_bucket, "Key": src_key},
            bucket,
            key,
            ExtraArgs={**extra, "MetadataDirective": "REPLACE"},
            Config=config,
        )
    else:
        stream = f.open()
        try:
            s3.upload_fileobj(stream, bucket, key, ExtraArgs=extra, Config=config)
        finally:
            stream.close()
    if not _verified(object_exists(s3, bucket, key), entry):
        raise StepError(
            f"verification failed for s3://{bucket}/{key}: size or sha256 differs after upload",
            "the store lost or altered the write; rerun (verified objects are skipped)",
            transient=True,
        )
    return 0  # managed transfers do not report their retries


def _verified(head: dict | None, entry: ManifestEntry) -> bool:
    return (
        head is not None
        and head.get("ContentLength") == entry.size
        and head.get("Metadata", {}).get("sha256") == entry.sha256
    )


def stage(inp: StageInput, s3: Any, *, example_dir: Path | None = None) -> StageOutput:
    """Copy ``inp.source_uri`` into ``s3://<inp.bucket>/datasets/<digest>/``; see the module doc.

    Raises :class:`DatasetError` (exit 1 in a step; exit 2 at the CLI) before any write when the
    source is missing, empty or unlabelled; :class:`StepError` when a written object fails
    verification. S3 connection errors propagate (exit 75: transient).
    """
    source = inp.source_uri
    with tempfile.TemporaryDirectory(prefix="pipectl-example-", dir=example_dir) as tmp:
        if source.startswith(EXAMPLE_SCHEME):
            from pipectl.components.data import write_example

            try:
                write_example(source[len(EXAMPLE_SCHEME):], Path(tmp))
            except ValueError as e:
                raise DatasetError(str(e), "use example:digits, a local folder or an s3:// prefix") from e
            files = scan_local(Path(tmp))
        elif source.startswith("s3://"):
            files = scan_s3(s3, source)
        else:
            files = scan_local(Path(source.removeprefix("file://")))
        return _stage_files(inp, s3, files)


def _existing(s3: Any, bucket: str, prefix: str) -> dict[str, tuple[int, str]]:
    """``{key: (size, etag)}`` of the objects under ``prefix``: one LIST per 1,000 keys."""
    found: dict[str, tuple[int, str]] = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            found[obj["Key"]] = (obj["Size"], obj.get("ETag", "").strip('"'))
    return found


def _stage_files(inp: StageInput, s3: Any, files: list[SourceFile]) -> StageOutput:
    with ThreadPoolExecutor(max_workers=inp.max_concurrency) as pool:
        digests = list(pool.map(_digests, files))
    entries = [ManifestEntry(key=f.key, size=f.size, sha256=sha, label=f.label) for f, (sha, _) in zip(files, digests)]
    digest = dataset_digest(entries)
    prefix = f"datasets/{digest[:20]}"
    dataset_uri = f"s3://{inp.bucket}/{prefix}/"
    manifest_uri = join_uri(dataset_uri, "manifest.json")
    manifest = DatasetManifest(
        digest=digest,
        source_uri=inp.source_uri,
        labels=sorted({e.label for e in entries}),
        entries=entries,
    )

    def result(copied: int, retries: int = 0) -> StageOutput:
        return StageOutput(
            retries=retries,
            dataset_uri=dataset_uri,
            manifest_uri=manifest_uri,
            objects=len(entries),
            bytes=manifest.total_bytes,
            copied=copied,
            skipped=len(entries) - copied,
        )

    ensure_bucket(s3, inp.bucket)
    if object_exists(s3, inp.bucket, f"{prefix}/manifest.json") is not None:
        existing_manifest = DatasetManifest.model_validate(read_json(s3, manifest_uri))
        if existing_manifest.digest == digest:
            log.info("already staged: %s (%d objects); nothing copied", dataset_uri, len(entries))
            return result(0)

    present = _existing(s3, inp.bucket, f"{prefix}/data/")

    def put(item: tuple[SourceFile, ManifestEntry, str]) -> int | None:
        """None when already present; else the retries the write needed."""
        f, entry, md5 = item
        key = f"{prefix}/data/{entry.key}"
        size, etag = present.get(key, (-1, ""))
        if size == entry.size and (etag == md5 or ("-" in etag and _verified(object_exists(s3, inp.bucket, key), entry))):
            return None  # written and verified by an earlier, interrupted run
        return _upload(s3, f, entry, md5, inp.bucket, key)

    with ThreadPoolExecutor(max_workers=inp.max_concurrency) as pool:
        written = [r for r in pool.map(put, [(f, e, md5) for f, e, (_, md5) in zip(files, entries, digests)]) if r is not None]
    write_json(s3, manifest_uri, manifest.model_dump(mode="json"))
    log.info("staged %s: %d copied, %d already present, %d retried requests", dataset_uri, len(written), len(entries) - len(written), sum(written))
    return result(len(written), sum(written))


def run(inp: StageInput, settings: StoreSettings) -> StageOutput:
    """Step entry: builds the S3 client from ``settings`` and calls :func:`stage`."""
    return stage(inp, s3_client(settings, max_pool=max(10, inp.max_concurrency)))


def validate_source(source_uri: str) -> int:
    """Check a local or example source without touching any store; returns the image count.

    Raises :class:`DatasetError`. ``s3://`` sources are checked by the step itself.
    """
    if source_uri.startswith(EXAMPLE_SCHEME):
        from pipectl.components.data import EXAMPLES

        name = source_uri[len(EXAMPLE_SCHEME):]
        if name not in EXAMPLES:
            raise DatasetError(f"unknown example dataset {name!r}", f"known: {', '.join('example:' + e for e in EXAMPLES)}")
        return -1
    if source_uri.startswith("s3://"):
        return -1
    return len(scan_local(Path(source_uri.removeprefix("file://"))))
