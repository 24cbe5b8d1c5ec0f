"""What a dataset source is, read into the files stage copies (:class:`SourceFile`).

Sources (``dataset-uri``):

- an ImageFolder tree: a local folder or an ``s3://bucket/prefix`` holding ``<label>/<image>``;
- ``example:digits``: the bundled example, written as an ImageFolder tree first;
- a manifest: a ``.csv`` or ``.parquet`` file (local or ``s3://``) of rows with a ``uri`` (or
  ``path``) column and a ``label`` column. A ``uri`` is ``s3://bucket/key``, or a path relative to
  the manifest's folder (local: it must stay inside that folder, as symlinks must in a tree). The
  images are staged as ``<label>/<short hash of the uri>-<file name>``, so preprocess, train and
  the manifest read a manifest's dataset exactly as an ImageFolder one.

Every reader validates the whole source before anything is written and raises
:class:`DatasetError` naming the file, the row and the fix.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from pipectl.components.runtime import StepError, list_objects, parse_s3_uri
from pipectl.components.stage.targets import SourceFile

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

    # plain strings, not Path objects, per file: with thousands of files pathlib's parsing was most
    # of the scan (2,000 files: 25 ms with Path objects, a third of it with strings)
    found: list[tuple[str, os.DirEntry]] = []  # (key relative to root, entry)
    seen: set[Path] = set()
    pending: list[tuple[str, str]] = [(str(root), "")]  # (folder, its key prefix: "" or "label/")
    while pending:  # one stat per file; a path is resolved only where a link is
        folder, rel = pending.pop()
        real_folder = inside(Path(folder))
        if real_folder in seen:  # reached again through a link: a cycle or a duplicate
            continue
        seen.add(real_folder)
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError as e:
            raise DatasetError(f"dataset {root}: cannot read {folder}: {e.strerror}", "make the folder readable") from e
        subfolders = []
        for entry in sorted(entries, key=lambda e: e.name):
            name = entry.name
            if name.startswith("."):  # hidden files and folders are not part of the dataset
                continue
            if entry.is_dir():  # a symlinked label folder counts
                subfolders.append((entry.path, f"{rel}{name}/"))
            elif os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES and entry.is_file():
                if entry.is_symlink():
                    inside(Path(entry.path))
                found.append((rel + name, entry))
        pending.extend(reversed(subfolders))  # depth first, in name order (a folder reached twice: its first path counts)
    found.sort(key=lambda item: item[0].split("/"))  # the order of the paths' parts
    _check_layout([k for k, _ in found], str(root))
    return [
        SourceFile(key=k, label=k.split("/", 1)[0], size=entry.stat().st_size,
                   open=(lambda p=entry.path: open(p, "rb")), path=entry.path)
        for k, entry in found
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
        for obj in list_objects(s3, bucket, prefix):
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
    if is_manifest(source_uri):
        return len(scan_manifest(None, source_uri))
    return len(scan_local(Path(source_uri.removeprefix("file://"))))


MANIFEST_SUFFIXES = (".csv", ".parquet")
URI_COLUMNS = ("uri", "path")


def is_manifest(source_uri: str) -> bool:
    return source_uri.lower().endswith(MANIFEST_SUFFIXES)


def _read_bytes(source_uri: str, s3: Any) -> bytes:
    """The manifest file's bytes (local or ``s3://``)."""
    if source_uri.startswith("s3://"):
        from botocore.exceptions import ClientError

        bucket, key = parse_s3_uri(source_uri)
        try:
            return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as e:
            raise DatasetError(f"dataset manifest {source_uri} cannot be read ({e.response.get('Error', {}).get('Code', '')})",
                               "check the URI and that these credentials can read it") from e
    path = Path(source_uri.removeprefix("file://"))
    if not path.is_file():
        raise DatasetError(f"dataset manifest {path} does not exist", "check the path")
    return path.read_bytes()


def _rows(source_uri: str, data: bytes) -> list[dict[str, str]]:
    """The manifest's rows as text: CSV (a header row) or Parquet (pyarrow)."""
    if source_uri.lower().endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(io.BytesIO(data))
        except (pa.ArrowInvalid, OSError) as e:
            raise DatasetError(f"dataset manifest {source_uri} is not a Parquet file: {e}", "write it with pandas/pyarrow") from e
        columns = table.column_names
        return [{c: "" if v is None else str(v) for c, v in zip(columns, row)}
                for row in zip(*(table.column(c).to_pylist() for c in columns))] if columns else []
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DatasetError(f"dataset manifest {source_uri} is not UTF-8 text", "save the CSV as UTF-8") from e
    return [{(k or "").strip(): (v or "").strip() for k, v in row.items()} for row in csv.DictReader(io.StringIO(text))]


def _columns(source_uri: str, rows: list[dict[str, str]]) -> str:
    """The name of the manifest's uri column; DatasetError when a column is missing."""
    if not rows:
        raise DatasetError(f"dataset manifest {source_uri} has no rows", "one row per image: uri,label")
    have = list(rows[0])
    uri_column = next((c for c in URI_COLUMNS if c in have), None)
    if uri_column is None or "label" not in have:
        raise DatasetError(f"dataset manifest {source_uri} needs the columns uri (or path) and label; it has {', '.join(have) or 'none'}",
                           "write a header row: uri,label")
    return uri_column


def _check_row(source_uri: str, n: int, uri: str, label: str) -> None:
    where = f"dataset manifest {source_uri} row {n}"
    if not uri:
        raise DatasetError(f"{where}: the uri is empty", "give every row the image's uri or path")
    if not label or "/" in label or "\\" in label or label.startswith(".") or any(ord(c) < 32 for c in label):
        raise DatasetError(f"{where}: label {label!r} cannot name a class folder",
                           "labels are non-empty, without '/', '\\', control characters or a leading '.'")
    if PurePosixPath(uri.split("?")[0]).suffix.lower() not in IMAGE_SUFFIXES:
        raise DatasetError(f"{where}: {uri} is not an image file name ({'/'.join(sorted(IMAGE_SUFFIXES))})",
                           "list image files only")


def _key(uri: str, label: str) -> str:
    return f"{label}/{hashlib.sha256(uri.encode()).hexdigest()[:10]}-{PurePosixPath(uri).name}"


def _local_file(manifest: Path, n: int, uri: str) -> Path:
    """Row ``n``'s image: a path relative to the manifest's folder, which it must stay inside."""
    folder = manifest.parent.resolve()
    p = Path(uri.removeprefix("file://"))
    real = (p if p.is_absolute() else folder / p).resolve()
    if folder not in real.parents:
        raise DatasetError(f"dataset manifest {manifest} row {n}: {uri} is outside the manifest's folder {folder}",
                           "put the images in the manifest's folder (or below it), or list s3:// URIs")
    if not real.is_file():
        raise DatasetError(f"dataset manifest {manifest} row {n}: {uri} does not exist", "fix the path or drop the row")
    return real


def _s3_file(s3: Any, base: str, n: int, uri: str, source_uri: str) -> tuple[str, str, int]:
    """(bucket, key, size) of row ``n``'s image: ``s3://`` as it is, else relative to ``base``."""
    from botocore.exceptions import ClientError

    bucket, key = parse_s3_uri(uri if uri.startswith("s3://") else base + uri.lstrip("/"))
    if ".." in key.split("/"):
        raise DatasetError(f"dataset manifest {source_uri} row {n}: {uri} leaves the manifest's prefix", "list plain keys")
    try:
        return bucket, key, int(s3.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except ClientError as e:
        raise DatasetError(f"dataset manifest {source_uri} row {n}: s3://{bucket}/{key} cannot be read "
                           f"({e.response.get('Error', {}).get('Code', '')})", "fix the URI or drop the row") from e


def scan_manifest(s3: Any, source_uri: str) -> list[SourceFile]:
    """The images a CSV/Parquet manifest lists (module doc). Raises :class:`DatasetError`."""
    rows = _rows(source_uri, _read_bytes(source_uri, s3))
    uri_column = _columns(source_uri, rows)
    listed = [(n, row[uri_column].strip(), row["label"].strip()) for n, row in enumerate(rows, start=2 if not
              source_uri.lower().endswith(".parquet") else 1)]
    for n, uri, label in listed:
        _check_row(source_uri, n, uri, label)
    keys = [_key(uri, label) for _, uri, label in listed]
    seen: dict[str, int] = {}
    for (n, uri, label), key in zip(listed, keys):
        if key in seen:
            raise DatasetError(f"dataset manifest {source_uri} row {n}: {uri} with label {label} is listed already (row {seen[key]})",
                               "list each image once")
        seen[key] = n
    _check_layout(keys, source_uri)
    if not source_uri.startswith("s3://") and not any(uri.startswith("s3://") for _, uri, _ in listed):
        manifest = Path(source_uri.removeprefix("file://"))
        files = [_local_file(manifest, n, uri) for n, uri, _ in listed]
        return [SourceFile(key=k, label=label, size=p.stat().st_size, open=(lambda p=p: open(p, "rb")), path=str(p))
                for k, p, (_, _, label) in zip(keys, files, listed)]
    if not source_uri.startswith("s3://"):
        raise DatasetError(f"dataset manifest {source_uri}: a local manifest lists s3:// images",
                           "put the manifest in the store beside them (s3://...) and pass its URI")
    base = source_uri.rsplit("/", 1)[0] + "/"
    with ThreadPoolExecutor(max_workers=16) as pool:
        located = list(pool.map(lambda r: _s3_file(s3, base, r[0], r[1], source_uri), listed))

    def opener(bucket: str, key: str) -> Callable[[], Any]:
        return lambda: s3.get_object(Bucket=bucket, Key=key)["Body"]

    return [SourceFile(key=k, label=label, size=size, open=opener(bucket, key), s3_location=(bucket, key))
            for k, (bucket, key, size), (_, _, label) in zip(keys, located, listed)]


def scan_source(source_uri: str, s3: Any, example_dir: Path) -> list[SourceFile]:
    """The files of any source (module doc); ``example_dir``: where an ``example:`` dataset is written."""
    if is_manifest(source_uri):
        return scan_manifest(s3, source_uri)
    if source_uri.startswith(EXAMPLE_SCHEME):
        from pipectl.components.data import write_example

        try:
            write_example(source_uri[len(EXAMPLE_SCHEME):], example_dir)
        except ValueError as e:
            raise DatasetError(str(e), "use example:digits, a local folder, an s3:// prefix or a .csv/.parquet manifest") from e
        return scan_local(example_dir)
    if source_uri.startswith("s3://"):
        return scan_s3(s3, source_uri)
    return scan_local(Path(source_uri.removeprefix("file://")))
