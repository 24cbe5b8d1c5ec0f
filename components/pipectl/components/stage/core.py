"""Stage a labelled image dataset into the store under a content-addressed prefix.

Layout written (``<digest>`` = first 20 hex of the dataset digest; ``<target>`` is
``s3://<bucket>`` by default, or a CephFS / mounted folder: see targets.py)::

    <target>/datasets/<digest>/data/<label>/<file>   one object per image
    <target>/datasets/<digest>/manifest.json         written last: marks completion

Guarantees, the same for every target: validates the whole source before writing anything;
copies in parallel (S3: one PUT below 8 MiB, boto3 managed multipart above); verifies each
write (S3: a single PUT's ETag is the content md5, multipart writes and copies by HEAD of size
and the ``sha256`` metadata; file system: sha256 read back before an atomic rename); resumable
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
from pipectl.components.runtime import StepError, parse_s3_uri, s3_client
from pipectl.components.stage.targets import MULTIPART_THRESHOLD_BYTES, S3Target, SourceFile, Target, parse_target

log = logging.getLogger("pipectl.stage")

# torchvision's ImageFolder IMG_EXTENSIONS (datasets/folder.py), compared case-insensitively (.JPG
# is an image: field case C13); .gif too (decoded by preprocess's PIL fallback). The name only
# selects files: preprocess decides the format by content, so PNG bytes named .jpg are a PNG.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".pbm", ".bmp", ".tif", ".tiff", ".webp", ".gif"})
EXAMPLE_SCHEME = "example:"


class DatasetError(StepError):
    """The source is not a usable dataset (missing, empty, unlabelled). Never transient; CLI exit 2."""

    cli_exit = 2


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
    """List the images under ``root`` (ImageFolder layout). Raises :class:`DatasetError`.

    Symlinks are followed only while they stay inside ``root`` (resolved): one that leads out of
    the dataset folder is refused (a dataset must not be able to copy other files of the
    machine or pod — credentials, a ServiceAccount token — into the bucket), and a folder reached
    twice (a link cycle) is walked once.
    """
    if not root.exists():
        raise DatasetError(f"dataset path {root} does not exist", "check the path, or run: pipectl data example DIR")
    if not root.is_dir():
        raise DatasetError(f"dataset path {root} is not a folder", "pass the folder that holds one subfolder per label")
    real_root = root.resolve()

    def inside(p: Path) -> Path:
        real = p.resolve()
        if real != real_root and real_root not in real.parents:
            raise DatasetError(f"dataset {root}: {p.relative_to(root)} is a symlink to {real}, outside the dataset folder",
                               "copy the files into the dataset folder (links may point only inside it)")
        return real

    files = []
    seen: set[Path] = set()
    for folder, dirs, names in os.walk(root, followlinks=True):  # a symlinked label folder counts
        real_folder = inside(Path(folder))
        if real_folder in seen:  # reached again through a link: a cycle or a duplicate
            dirs[:] = []
            continue
        seen.add(real_folder)
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))  # hidden folders are not classes
        for name in names:
            p = Path(folder) / name
            if p.suffix.lower() in IMAGE_SUFFIXES and not name.startswith(".") and p.is_file():
                inside(p)
                files.append(p)
    files.sort()
    keys = [p.relative_to(root).as_posix() for p in files]
    _check_layout(keys, str(root))
    return [
        SourceFile(key=k, label=k.split("/", 1)[0], size=p.stat().st_size, open=(lambda p=p: open(p, "rb")), path=str(p))
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
    """(sha256, md5) hex of the file's bytes, in one pass. md5 only to compare the ETag of a single
    PUT (below the multipart threshold); "" for larger files (verified by HEAD + sha256 metadata)."""
    sha = hashlib.sha256()
    md5 = hashlib.md5(usedforsecurity=False) if f.size < MULTIPART_THRESHOLD_BYTES else None
    stream = f.open()
    try:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            sha.update(chunk)
            if md5 is not None:
                md5.update(chunk)
    finally:
        stream.close()
    return sha.hexdigest(), md5.hexdigest() if md5 is not None else ""


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
        return _stage_files(inp, target if target is not None else make_target(inp, s3), files)


def _upload(inp: StageInput, target: Target, data_prefix: str, todo: list[tuple[SourceFile, ManifestEntry, str]]) -> list[int]:
    """Write each ``(file, entry, md5)`` of ``todo`` at ``data_prefix + entry.key``; returns the
    retried requests, one number per object written."""
    written: list[int] = []  # retried requests, one number per object written
    if isinstance(target, S3Target) and target.settings is not None:
        # many small local files: single PUTs from several processes (see parallel.py)
        from pipectl.components.stage import parallel

        small = [t for t in todo if t[0].path is not None and t[0].s3_location is None and t[1].size < target.part_size]
        processes = inp.upload_processes or parallel.default_processes()
        if len(small) >= parallel.MIN_FILES and processes > 1:
            retries = parallel.put_in_processes(
                target.settings, target.bucket,
                [(data_prefix + e.key, f.path, e.model_dump_json(), md5) for f, e, md5 in small],
                processes, threads=max(1, inp.max_concurrency // processes))
            written = [retries] + [0] * (len(small) - 1)
            sent = {id(t) for t in small}
            todo = [t for t in todo if id(t) not in sent]

    def put(item: tuple[SourceFile, ManifestEntry, str]) -> int:
        f, entry, md5 = item
        return target.put(data_prefix + entry.key, f, entry, md5)

    with ThreadPoolExecutor(max_workers=inp.max_concurrency) as pool:
        written += list(pool.map(put, todo))
    return written


def _stage_files(inp: StageInput, target: Target, files: list[SourceFile]) -> StageOutput:
    with ThreadPoolExecutor(max_workers=inp.max_concurrency) as pool:
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


def make_target(inp: StageInput, s3: Any, settings: StoreSettings | None = None, *, own_client: bool = False) -> Target:
    """The :class:`Target` for ``inp.target_uri`` (default ``s3://<inp.bucket>``); see targets.py.
    ``own_client``: ``s3`` belongs to this staging (its PutObject hooks may be tuned)."""
    if not inp.target_uri:
        return S3Target(s3, inp.bucket, max_concurrency=min(inp.max_concurrency, 10), skip_100_continue=own_client,
                        settings=settings if own_client else None)
    return parse_target(
        inp.target_uri, s3=s3, cephfs_mount=settings.cephfs_mount if settings else None,
        max_concurrency=min(inp.max_concurrency, 10),
    )


def run(inp: StageInput, settings: StoreSettings) -> StageOutput:
    """Step entry: builds the S3 client and the target from ``settings`` and calls :func:`stage`."""
    # room for each concurrent multipart upload's own part threads (TransferConfig.max_concurrency)
    s3 = s3_client(settings, max_pool=max(32, 2 * inp.max_concurrency))
    return stage(inp, s3, target=make_target(inp, s3, settings, own_client=True))


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
