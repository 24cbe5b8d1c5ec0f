"""Stage a labelled image dataset into the store under a content-addressed prefix.

Layout written (``<digest>`` = first 20 hex of the dataset digest; ``<target>`` is
``s3://<bucket>`` by default, or a CephFS / mounted folder: see targets.py)::

    <target>/datasets/<digest>/data/<label>/<file>   one object per image
    <target>/datasets/<digest>/manifest.json         written last: marks completion

Guarantees, the same for every target: validates the whole source before writing anything;
copies in parallel (S3: obstore, one unsigned PUT below 8 MiB, parts above: see transfer.py);
verifies each write (S3: a single PUT's ETag is the content md5, else the PUT goes again with
Content-MD5; multipart writes and copies by HEAD of size and the ``sha256`` metadata; file
system: sha256 read back before an atomic rename); resumable
(one listing finds what an interrupted run already put in place; verified ones are skipped)
and idempotent (a complete prefix is detected by its manifest: nothing copied).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable

from pipectl.components.contracts import DatasetLayout, DatasetManifest, ManifestEntry, StageInput, StageOutput, StoreSettings
from pipectl.components.datasize import DatasetSize, check_dataset_size
from pipectl.components.runtime import DENIED_CODES, Deferred, StepError, available_cpus, s3_client
from pipectl.components.stage.sources import (  # noqa: F401 - DatasetError, scan_local, validate_source: the step's API
    IMAGE_SUFFIXES,
    DatasetError,
    scan_local,
    scan_s3,
    scan_source,
    validate_source,
)
from pipectl.components.stage.targets import MULTIPART_THRESHOLD_BYTES, S3Target, SourceFile, Target, drop_expect_header, parse_target

log = logging.getLogger("pipectl.stage")

def _digests(f: SourceFile) -> tuple[str, str]:
    """(sha256, md5) hex of the file's bytes, from its one read before any write: sha256 for the
    manifest and the content address, md5 to check a single PUT's ETag (below the multipart
    threshold; "" for larger files, verified by HEAD + sha256 metadata). No request hashes the
    body again (stage/transfer.py)."""
    stream = f.open()
    try:
        if f.size < MULTIPART_THRESHOLD_BYTES:  # small: one read, two hashes (OpenSSL, GIL released)
            body = stream.read()
            return hashlib.sha256(body).hexdigest(), hashlib.md5(body, usedforsecurity=False).hexdigest()
        sha = hashlib.sha256()
        for chunk in iter(lambda: stream.read(4 << 20), b""):
            sha.update(chunk)
        return sha.hexdigest(), ""
    finally:
        stream.close()


def dataset_digest(entries: Iterable[ManifestEntry]) -> str:
    """sha256 over ``"<key>\\t<sha256>\\n"`` of the entries sorted by key: the content address."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.key):
        h.update(f"{e.key}\t{e.sha256}\n".encode())
    return h.hexdigest()


def stage(inp: StageInput, s3: Any, *, example_dir: Path | None = None, target: Target | None = None) -> StageOutput:
    """Copy ``inp.source_uri`` into ``<target>/datasets/<digest>/``; see the module doc.

    ``s3``: a boto3 client (reads ``s3://`` sources; the default target ``s3://<inp.bucket>``).
    ``target``: where to write (:mod:`.targets`); default :func:`make_target` of ``inp``
    (``inp.target_uri``; ``cephfs://`` then needs a target built with the settings' mount).

    ``inp.source_uri``: an ImageFolder tree (a folder, ``s3://`` prefix, ``example:digits``) or a
    CSV/Parquet manifest of (uri, label) rows (:mod:`.sources`).

    Raises :class:`DatasetError` (exit 1 in a step; exit 2 at the CLI) before any write when the
    source is missing, empty or unlabelled; :class:`DatasetTooLarge` (the same exits) before any
    write when it is over ``inp.lane``'s ``inp.dataset_max``; :class:`StepError` when a written object fails
    verification. S3 connection errors propagate (exit 75: transient).
    """
    with tempfile.TemporaryDirectory(prefix="pipectl-example-", dir=example_dir) as tmp:
        files = scan_source(inp.source_uri, s3, Path(tmp))
        if inp.lane is not None and inp.dataset_max:
            check_dataset_size(DatasetSize(inp.source_uri, len(files), sum(f.size for f in files)), inp.lane, inp.dataset_max)
        return _stage_files(inp, target if target is not None else make_target(inp, s3), files)


def _upload(inp: StageInput, target: Target, data_prefix: str, todo: list[tuple[SourceFile, ManifestEntry, str]]) -> list[int]:
    """Write each ``(file, entry, md5)`` of ``todo`` at ``data_prefix + entry.key`` from
    ``inp.max_concurrency`` threads (S3: obstore sends with the GIL released); returns the retried
    requests, one number per object written."""

    def put(item: tuple[SourceFile, ManifestEntry, str]) -> int:
        f, entry, md5 = item
        return target.put(data_prefix + entry.key, f, entry, md5)

    with ThreadPoolExecutor(max_workers=inp.max_concurrency) as pool:
        return list(pool.map(put, todo))


def _stage_files(inp: StageInput, target: Target, files: list[SourceFile]) -> StageOutput:
    # hashing is CPU (OpenSSL, the GIL released) and page-cache reads: a thread per CPU; more
    # threads only fight over the GIL between files (2 cores, 2,000 small files: 0.11 s with 2
    # threads, 0.16 s with 16)
    with ThreadPoolExecutor(max_workers=max(1, min(inp.max_concurrency, available_cpus()))) as pool:
        digests = list(pool.map(_digests, files))
    entries = [ManifestEntry(key=f.key, size=f.size, sha256=sha, label=f.label) for f, (sha, _) in zip(files, digests)]
    digest = dataset_digest(entries)
    prefix = DatasetLayout.prefix_for(digest)
    layout = DatasetLayout(dataset_uri=f"{target.root_uri}/{prefix}/")
    dataset_uri, manifest_uri = layout.dataset_uri, layout.manifest_uri
    data_prefix = f"{prefix}/{DatasetLayout.DATA}/"
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

    target.prepare()
    existing_manifest = target.read_manifest(f"{prefix}/{DatasetLayout.MANIFEST}")
    if existing_manifest is not None and DatasetManifest.model_validate(existing_manifest).digest == digest:
        log.info("already staged: %s (%d objects); nothing copied", dataset_uri, len(entries))
        target.finish()
        return result(0)

    present = target.present(data_prefix)

    def in_place(entry: ManifestEntry, md5: str) -> bool:
        """Written and verified by an earlier, interrupted run."""
        key = data_prefix + entry.key
        have = present.get(key)
        return have is not None and target.is_complete(key, have, entry, md5)

    todo = [(f, e, md5) for f, e, (_, md5) in zip(files, entries, digests) if not in_place(e, md5)]
    written = _upload(inp, target, data_prefix, todo)
    target.write_manifest(f"{prefix}/{DatasetLayout.MANIFEST}", manifest.model_dump(mode="json"))
    target.finish()
    log.info("staged %s: %d copied, %d already present, %d retried requests", dataset_uri, len(written), len(entries) - len(written), sum(written))
    return result(len(written), sum(written))


def make_target(inp: StageInput, s3: Any, settings: StoreSettings | None = None) -> Target:
    """The :class:`Target` for ``inp.target_uri`` (default ``s3://<inp.bucket>``); see targets.py."""
    if not inp.target_uri:
        return S3Target(s3, inp.bucket, max_concurrency=min(inp.max_concurrency, 10))
    return parse_target(
        inp.target_uri, s3=s3, cephfs_mount=settings.cephfs_mount if settings else None,
        max_concurrency=min(inp.max_concurrency, 10),
    )


def run(inp: StageInput, settings: StoreSettings) -> StageOutput:
    """Step entry: builds the S3 client and the target from ``settings`` and calls :func:`stage`.
    The client is built while the source is scanned and hashed (neither needs it)."""
    from botocore.exceptions import ClientError

    # room for boto3's own writes (C14 stores, copies from an S3 source) from every thread
    s3 = Deferred(lambda: drop_expect_header(s3_client(settings, max_pool=max(32, 2 * inp.max_concurrency))))
    target = make_target(inp, s3, settings)
    try:
        return stage(inp, s3, target=target)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in DENIED_CODES:
            raise
        raise StepError(
            f"the store refused these credentials at {target.root_uri}/ ({e.operation_name}: "
            f"{e.response['Error'].get('Code')}); no dataset was staged (its manifest is written last)",
            "a team's key reaches only its own prefix (the site file's s3_prefix): stage under it "
            "(`pipectl data push DIR --to <s3_prefix>`; the stage step's --target-uri), or have the platform "
            "admin grant it (`pipectl teams store-policy --apply`)", cli_exit=2) from e
