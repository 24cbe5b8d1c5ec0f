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
import io
import logging
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

from pipectl.components.contracts import DatasetLayout, DatasetManifest, ManifestEntry, StageInput, StageOutput, StoreSettings
from pipectl.components.datasize import DatasetSize, check_dataset_size
from pipectl.components.objstore import Endpoint
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

KEEP_BYTES = 256 << 20
"""Bytes of small local files kept in memory from their hashing to their PUT (read once, and the
md5 the PUT's ETag is checked against is computed in the upload threads, beside the store's work,
from the very bytes sha256 hashed). Past it, files are read again for the PUT and their md5 is
computed with their sha256."""


@dataclass
class Hashed:
    """What one read of a file before any write gave: ``sha256`` (manifest, content address);
    ``md5`` (to check a single PUT's ETag; "" for files of the multipart size, verified by HEAD +
    sha256 metadata, and until :meth:`md5_hex` for a kept ``body``); ``body``: the bytes hashed,
    kept for the PUT, or None."""

    sha256: str
    md5: str = ""
    body: bytes | None = None

    def md5_hex(self) -> str:
        if not self.md5 and self.body is not None:
            self.md5 = hashlib.md5(self.body, usedforsecurity=False).hexdigest()
        return self.md5

    def source(self, f: SourceFile) -> SourceFile:
        """``f``, read from the kept bytes when there are some."""
        body = self.body
        return f if body is None else replace(f, open=lambda: io.BytesIO(body))


class _Hasher:
    """Hashes files (:meth:`all`: from a thread per CPU), keeping small local files' bytes up to
    ``keep_bytes`` in all. No request hashes a body again (stage/transfer.py)."""

    def __init__(self, keep_bytes: int = KEEP_BYTES) -> None:
        self._left = keep_bytes
        self._lock = threading.Lock()

    def _keep(self, f: SourceFile, n: int) -> bool:
        if f.s3_location is not None:  # copied server-side: its bytes are never sent from here
            return False
        with self._lock:
            if n > self._left:
                return False
            self._left -= n
            return True

    def __call__(self, f: SourceFile) -> Hashed:
        if f.path is not None and f.s3_location is None and f.size < MULTIPART_THRESHOLD_BYTES:
            return self._small(f, _read_file(f.path, f.size))
        stream = f.open()
        try:
            if f.size < MULTIPART_THRESHOLD_BYTES:  # small: one read (OpenSSL hashes with the GIL released)
                return self._small(f, stream.read())
            sha = hashlib.sha256()
            for chunk in iter(lambda: stream.read(4 << 20), b""):
                sha.update(chunk)
            return Hashed(sha.hexdigest())
        finally:
            stream.close()

    def _small(self, f: SourceFile, body: bytes) -> Hashed:
        sha = hashlib.sha256(body).hexdigest()
        if self._keep(f, len(body)):
            return Hashed(sha, body=body)
        return Hashed(sha, hashlib.md5(body, usedforsecurity=False).hexdigest())

    def all(self, files: list[SourceFile], threads: int) -> list[Hashed]:
        """Every file's :class:`Hashed`, in order, from ``threads`` threads that each take every
        ``threads``-th file (no task per file: with thousands of small files a pool's per-file
        hand-offs cost more than the hashing; 2,000 files of 4-60 KiB on 2 cores: 48 ms this way,
        100 ms through ``ThreadPoolExecutor.map``)."""
        out: list[Hashed | None] = [None] * len(files)
        errors: list[BaseException] = []

        def work(first: int) -> None:
            try:
                for i in range(first, len(files), threads):
                    if errors:
                        return
                    out[i] = self(files[i])
            except BaseException as e:  # raised in the caller's thread below
                errors.append(e)

        workers = [threading.Thread(target=work, args=(i,), name=f"hash-{i}") for i in range(1, threads)]
        for w in workers:
            w.start()
        work(0)
        for w in workers:
            w.join()
        if errors:
            raise errors[0]
        return out  # type: ignore[return-value]


def _read_file(path: str, size: int) -> bytes:
    """The bytes of a local file (one ``read(2)`` for a file of ``size`` bytes; the GIL released)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [os.read(fd, size + 1)]
        while chunks[-1]:  # to the end: a short read, or a file grown since it was listed (the size check fails)
            chunks.append(os.read(fd, 1 << 20))
        return chunks[0] if len(chunks) == 2 else b"".join(chunks)
    finally:
        os.close(fd)


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


def _upload(inp: StageInput, target: Target, data_prefix: str, todo: list[tuple[SourceFile, ManifestEntry, Hashed]]) -> list[int]:
    """Write each ``(file, entry, hashed)`` of ``todo`` at ``data_prefix + entry.key`` from
    ``inp.max_concurrency`` threads (S3: obstore sends with the GIL released; a kept body's md5 is
    computed here); returns the retried requests, one number per object written."""

    def put(item: tuple[SourceFile, ManifestEntry, Hashed]) -> int:
        f, entry, hashed = item
        retried = target.put(data_prefix + entry.key, hashed.source(f), entry, hashed.md5_hex())
        hashed.body = None  # written: its bytes are not needed again
        return retried

    with ThreadPoolExecutor(max_workers=inp.max_concurrency) as pool:
        return list(pool.map(put, todo))


def _stage_files(inp: StageInput, target: Target, files: list[SourceFile]) -> StageOutput:
    # hashing is CPU (OpenSSL, the GIL released) and page-cache reads: a thread per CPU; more
    # threads only fight over the GIL between files (2 cores, 2,000 small files: 48 ms with 2
    # threads, 52 ms with 3)
    digests = _Hasher().all(files, max(1, min(inp.max_concurrency, available_cpus())))
    entries = [ManifestEntry(key=f.key, size=f.size, sha256=h.sha256, label=f.label) for f, h in zip(files, digests)]
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

    def in_place(entry: ManifestEntry, hashed: Hashed) -> bool:
        """Written and verified by an earlier, interrupted run."""
        key = data_prefix + entry.key
        have = present.get(key)
        return have is not None and target.is_complete(key, have, entry, hashed.md5_hex())

    todo = [(f, e, h) for f, e, h in zip(files, entries, digests) if not in_place(e, h)]
    written = _upload(inp, target, data_prefix, todo)
    target.write_manifest(f"{prefix}/{DatasetLayout.MANIFEST}", manifest.model_dump(mode="json"))
    target.finish()
    log.info("staged %s: %d copied, %d already present, %d retried requests", dataset_uri, len(written), len(entries) - len(written), sum(written))
    return result(len(written), sum(written))


def make_target(inp: StageInput, s3: Any, settings: StoreSettings | None = None) -> Target:
    """The :class:`Target` for ``inp.target_uri`` (default ``s3://<inp.bucket>``); see targets.py.
    With ``settings`` that hold an endpoint and keys, an S3 target reaches the store through obstore
    alone for a staging from local files (``s3`` is then asked for only where boto3 is needed)."""
    endpoint = Endpoint.of(settings) if settings is not None else None
    if not inp.target_uri:
        return S3Target(s3, inp.bucket, max_concurrency=min(inp.max_concurrency, 10), endpoint=endpoint)
    return parse_target(
        inp.target_uri, s3=s3, cephfs_mount=settings.cephfs_mount if settings else None,
        max_concurrency=min(inp.max_concurrency, 10), endpoint=endpoint,
    )


def _denied_code(e: BaseException) -> str | None:
    """The error code of a boto3 ``ClientError`` in :data:`DENIED_CODES`, else None (boto3 is not
    imported to ask: a step that never loaded it raised no ClientError)."""
    exceptions = sys.modules.get("botocore.exceptions")
    if exceptions is None or not isinstance(e, exceptions.ClientError):
        return None
    code = e.response.get("Error", {}).get("Code")
    return code if code in DENIED_CODES else None


def run(inp: StageInput, settings: StoreSettings) -> StageOutput:
    """Step entry: builds the S3 client and the target from ``settings`` and calls :func:`stage`.
    The boto3 client is built on first use where the target reaches the store through obstore
    (an endpoint and keys in ``settings``), else while the source is scanned and hashed."""
    endpoint = Endpoint.of(settings)
    s3 = Deferred(lambda: drop_expect_header(s3_client(settings, max_pool=max(32, 2 * inp.max_concurrency))),
                  background=endpoint is None)
    target = make_target(inp, s3, settings)
    try:
        return stage(inp, s3, target=target)
    except Exception as e:
        code = _denied_code(e)
        if code is None:
            raise
        raise StepError(
            f"the store refused these credentials at {target.root_uri}/ ({e.operation_name}: "  # type: ignore[attr-defined]
            f"{code}); no dataset was staged (its manifest is written last)",
            "a team's key reaches only its own prefix (the site file's s3_prefix): stage under it "
            "(`pipectl data push DIR --to <s3_prefix>`; the stage step's --target-uri), or have the platform "
            "admin grant it (`pipectl teams store-policy --apply`)", cli_exit=2) from e
