"""Where `stage` writes: an S3 bucket (Ceph RGW, MinIO, AWS) or a POSIX file system (CephFS).

Both targets hold the same layout under a root::

    <root>/datasets/<digest>/data/<label>/<file>
    <root>/datasets/<digest>/manifest.json        written last: marks a complete staging

and give the same guarantees, through the :class:`Target` interface that ``core.py`` drives:

- verification of every write: S3 compares a single PUT's ETag with the content md5 hashed before
  the write; where it is no MD5 (SSE-KMS, SSE-C and some gateways, field case C14) the PUT goes
  with ``Content-MD5`` (the store checks the body) and a HEAD of size + ``sha256`` metadata
  decides, as for multipart uploads (stage/transfer.py); the file system target re-reads the written
  temporary file from the mount and compares its sha256 with the source's before it renames it.
- nothing partial under the final prefix: one S3 PUT / CompleteMultipartUpload is atomic; on a
  file system each file is written to ``<root>/.pipectl-tmp/<run>/``, fsynced, verified, then
  ``rename(2)``d into place (atomic within one file system, CephFS included), so a SIGKILL leaves
  at most a stray temporary file outside the prefix (swept by the next run on the same host).
- resume: :meth:`Target.present` lists what an interrupted run already put in place (one LIST per
  1,000 keys on S3, one ``scandir`` per label folder on a file system).
- idempotency: a manifest with the same digest means nothing is copied.

Target URIs (``StageInput.target_uri``): ``s3://<bucket>`` (the default, ``s3://<StageInput.bucket>``)
or a prefix in a bucket, ``s3://<bucket>/<path>/`` (a team's, whose key may write nowhere else),
``cephfs:///<path>`` (a path inside the CephFS mounted at ``StoreSettings.cephfs_mount``; the
mount is checked to be a CephFS, kernel ``ceph`` or ``fuse.ceph-fuse``), or a plain mounted path
``/mnt/...`` / ``file:///mnt/...`` (any POSIX file system). The step never mounts anything
itself: on Kubernetes a CephFS reaches a pod as a ceph-csi PersistentVolumeClaim mounted into it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from pipectl.components.contracts import ManifestEntry
from pipectl.components.objstore import Endpoint
from pipectl.components.runtime import StepError, ensure_bucket, list_objects, object_exists


@dataclass(frozen=True)
class SourceFile:
    """One image of the source: ``key`` is ``<label>/<name>`` relative to the dataset root."""

    key: str
    label: str
    size: int
    open: Callable[[], Any]  # returns a binary file object
    s3_location: tuple[str, str] | None = None  # (bucket, key) for server-side copies
    path: str | None = None  # local file (lets worker processes open it)


MULTIPART_THRESHOLD_BYTES = 8 * 1024 * 1024
TMP_DIR = ".pipectl-tmp"
CEPHFS_FSTYPES = frozenset({"ceph", "fuse.ceph-fuse", "fuse.ceph"})


@dataclass(frozen=True)
class Present:
    """What a target already holds at one key: ``size`` in bytes and an ``etag`` (S3 only)."""

    size: int
    etag: str = ""


class Target(Protocol):
    """A stage destination. Keys are ``/``-separated and relative to the target's root."""

    root_uri: str  # e.g. s3://bucket or cephfs:///pipectl or /mnt/data (no trailing slash)

    def prepare(self) -> None:
        """Create the bucket / root folder if missing. Raises on permission or connection errors."""

    def read_manifest(self, key: str) -> dict | None:
        """The JSON at ``key``, or None when absent."""

    def present(self, prefix: str) -> dict[str, Present]:
        """Everything under ``prefix`` (a folder key ending in ``/``): ``{key: Present}``."""

    def is_complete(self, key: str, have: Present, entry: ManifestEntry, md5: str) -> bool:
        """True when ``have`` (from :meth:`present`) is a verified copy of ``entry``."""

    def put(self, key: str, src: Any, entry: ManifestEntry, md5: str) -> int:
        """Write ``src`` (a :class:`SourceFile`) at ``key`` and
        verify it; returns the retried requests it needed. Raises StepError(transient) when
        verification fails."""

    def write_manifest(self, key: str, obj: Any) -> None:
        """Write JSON at ``key`` atomically (readers see the old state or the whole new file)."""

    def finish(self) -> None:
        """Clean up after a successful run (temporary files)."""


# ---------------------------------------------------------------- S3


def _metadata(entry: ManifestEntry) -> dict[str, str]:
    """S3 user metadata must be ASCII: the label is percent-encoded (RFC 3986)."""
    from urllib.parse import quote

    return {"sha256": entry.sha256, "label": quote(entry.label, safe="")}


def _changed(bucket: str, key: str) -> StepError:
    return StepError(
        f"verification failed for s3://{bucket}/{key}: the bytes differ from the content md5",
        "the source changed during staging or the write was altered on the way; rerun",
        transient=True,
    )


def _verified_head(head: dict | None, entry: ManifestEntry) -> bool:
    return (
        head is not None
        and head.get("ContentLength") == entry.size
        and head.get("Metadata", {}).get("sha256") == entry.sha256
    )


class S3Target:
    """``s3://<bucket>`` or ``s3://<bucket>/<prefix>`` (every key written under ``prefix``): local
    files through obstore (stage/transfer.py: one unsigned PUT below 8 MiB, its ETag compared with
    the content md5; parts above, verified by HEAD of size and the ``sha256`` user metadata); boto3
    for server-side copies from an S3 source, for streams that are no local file, and for every
    single PUT of a store whose ETags are no MD5 (C14: sent with Content-MD5, so the store checks
    the body). ``s3`` is a boto3 client (``runtime.s3_client``);
    obstore writes to the same endpoint with the same credentials."""

    def __init__(self, s3: Any, bucket: str, *, prefix: str = "", part_size: int = MULTIPART_THRESHOLD_BYTES,
                 max_concurrency: int = 10, endpoint: Endpoint | None = None) -> None:
        """``prefix``: the folder in the bucket the layout's keys go under (``teams/vision/``; empty:
        the bucket's root). ``s3`` is used only from :meth:`prepare` on (it may be built on first
        use: ``runtime.Deferred``). ``endpoint``: the store's URL and static keys; with it the
        manifest's reads and write and the listing go through obstore too, and ``s3`` is built only
        where boto3 is needed (a bucket to create, an answer other than found or not found, C14
        stores, copies from an S3 source): a staging from local files then never loads boto3."""
        self.s3 = s3
        self.endpoint = endpoint
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.root_uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.part_size = part_size
        self.max_concurrency = max_concurrency
        self.md5_etags = True  # False once a PUT showed an ETag that is no MD5 (C14)
        self._writer: Any = None
        self._writer_lock = threading.Lock()
        # multipart uploads in flight at once: each holds up to part size x parts in flight of
        # buffers (transfer.part_plan: <= 8 x 64 MiB), so two bound the memory to ~1 GiB
        self._large = threading.BoundedSemaphore(2)

    def writer(self) -> Any:
        """The obstore :class:`~pipectl.components.stage.transfer.ObjectWriter` (made on first use)."""
        with self._writer_lock:
            if self._writer is None:
                from pipectl.components.stage.transfer import ObjectWriter

                self._writer = ObjectWriter(self.s3, self.bucket, self.endpoint)
            return self._writer

    def _fast(self, request: Callable[[Any], Any]) -> tuple[bool, Any]:
        """(True, ``request(writer)``) through obstore when there is an :attr:`endpoint` and the
        store answered; (False, None) otherwise: the caller asks again through boto3, whose errors
        (a refusal, a missing bucket, a team key's 403 for an absent object) the step maps."""
        if self.endpoint is None:
            return False, None
        try:
            return True, request(self.writer())
        except Exception:  # obstore's errors: boto3 asks again and says what it was
            return False, None

    def prepare(self) -> None:
        if self.endpoint is None:  # else the listing in present() shows the bucket is there
            ensure_bucket(self.s3, self.bucket)

    def read_manifest(self, key: str) -> dict | None:
        key = self.prefix + key
        answered, body = self._fast(lambda w: w.read(key))
        if answered:
            return None if body is None else json.loads(body)
        if object_exists(self.s3, self.bucket, key) is None:
            return None
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def present(self, prefix: str) -> dict[str, Present]:
        answered, listed = self._fast(lambda w: w.listing(self.prefix + prefix))
        if answered:
            return {key[len(self.prefix):]: Present(size, etag) for key, size, etag in listed}
        if self.endpoint is not None:  # not listed: the bucket may be missing (prepare() left it)
            ensure_bucket(self.s3, self.bucket)
        found: dict[str, Present] = {}
        for obj in list_objects(self.s3, self.bucket, self.prefix + prefix):
            found[obj["Key"][len(self.prefix):]] = Present(obj["Size"], obj.get("ETag", "").strip('"'))
        return found

    def is_complete(self, key: str, have: Present, entry: ManifestEntry, md5: str) -> bool:
        if have.size != entry.size:
            return False
        if have.etag == md5:
            return True  # a single PUT's ETag is the content md5
        # multipart ETags ("<md5 of part md5s>-<parts>"), and ETags that are no MD5 at all (SSE-KMS,
        # SSE-C, some gateways: field case C14): the size and the sha256 recorded at upload decide
        return _verified_head(object_exists(self.s3, self.bucket, self.prefix + key), entry)

    def put(self, key: str, src: Any, entry: ManifestEntry, md5: str) -> int:
        key = self.prefix + key
        if src.s3_location is None and entry.size < self.part_size:
            return self._put_small(key, src, entry, md5)
        if src.s3_location is None and getattr(src, "path", None):
            with self._large:
                self.writer().put_file(key, src.path, entry.size, _metadata(entry))
            retries = 0  # parts are retried inside object_store, uncounted
        else:
            retries = self._put_managed(key, src, entry)
        if not _verified_head(object_exists(self.s3, self.bucket, key), entry):
            raise StepError(
                f"verification failed for s3://{self.bucket}/{key}: size or sha256 differs after upload",
                "the store lost or altered the write; rerun (verified objects are skipped)",
                transient=True,
            )
        return retries

    def _put_small(self, key: str, src: Any, entry: ManifestEntry, md5: str) -> int:
        """One PUT, verified: the ETag is the md5 of the read before the write, or (C14, or bytes
        that changed since) the body is sent again with Content-MD5 for the store to check."""
        stream = src.open()
        try:
            body = stream.read()
        finally:
            stream.close()
        if len(body) != entry.size:
            raise _changed(self.bucket, key)
        if not self.md5_etags:
            return self._put_with_md5(key, body, entry, md5, undo=False)
        # no user metadata: the ETag proves this write, the manifest holds the sha256 and the label
        # (metadata cost the store 5% more CPU a PUT; only writes an ETag cannot prove carry it)
        etag, retries = self.writer().put(key, body, {})
        if etag == md5:
            return retries
        return retries + self._put_with_md5(key, body, entry, md5, undo=True)

    def _put_with_md5(self, key: str, body: bytes, entry: ManifestEntry, md5: str, *, undo: bool) -> int:
        """boto3 PUT with Content-MD5: the store refuses a body that is not the one hashed.
        ``undo``: an object already written at ``key`` is deleted when refused."""
        from botocore.exceptions import ClientError

        try:
            resp = self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, Metadata=_metadata(entry),
                                      ContentMD5=base64.b64encode(bytes.fromhex(md5)).decode())
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("BadDigest", "InvalidDigest"):
                if undo:
                    self.s3.delete_object(Bucket=self.bucket, Key=key)
                raise _changed(self.bucket, key) from e
            raise
        retries = resp.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        if resp.get("ETag", "").strip('"') == md5:
            return retries
        # An ETag that is no MD5 (SSE-KMS/SSE-C, some gateways: C14) verifies nothing; the store
        # accepted the Content-MD5, and a HEAD confirms size and the recorded sha256.
        if not _verified_head(object_exists(self.s3, self.bucket, key), entry):
            raise _changed(self.bucket, key)
        self.md5_etags = False  # this store's ETags prove nothing: Content-MD5 from now on
        return retries

    def _put_managed(self, key: str, src: Any, entry: ManifestEntry) -> int:
        """boto3 managed transfers: a server-side copy from an S3 source, or a stream's upload."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
                                max_concurrency=self.max_concurrency)
        extra = {"Metadata": _metadata(entry)}
        if src.s3_location is not None:
            src_bucket, src_key = src.s3_location
            self.s3.copy({"Bucket": src_bucket, "Key": src_key}, self.bucket, key,
                         ExtraArgs={**extra, "MetadataDirective": "REPLACE"}, Config=config)
        else:
            stream = src.open()
            try:
                self.s3.upload_fileobj(stream, self.bucket, key, ExtraArgs=extra, Config=config)
            finally:
                stream.close()
        return 0  # managed transfers do not report their retries

    def write_manifest(self, key: str, obj: Any) -> None:
        body = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
        answered, _ = self._fast(lambda w: w.put(self.prefix + key, body, {"Content-Type": "application/json"}))
        if not answered:
            self.s3.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=body, ContentType="application/json")

    def finish(self) -> None:
        pass


# ---------------------------------------------------------------- POSIX file system (CephFS)


def drop_expect_header(s3: Any) -> Any:
    """Drop the ``Expect: 100-continue`` header botocore puts on every PutObject of ``s3`` (an extra
    round trip before the body; it only pays off for large bodies a server might refuse, and the
    single PUTs of a staging are < 8 MiB). Changes the client's event hooks: only for a client the
    staging owns. Returns ``s3``."""
    from botocore.handlers import add_expect_header

    s3.meta.events.unregister("before-call.s3.PutObject", add_expect_header)
    return s3


def mount_fstype(path: Path) -> tuple[Path, str]:
    """(mount point, fstype) of the file system holding ``path`` (from /proc/self/mounts)."""
    path = Path(os.path.realpath(path))
    best: tuple[Path, str] = (Path("/"), "")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mnt = Path(fields[1].replace("\\040", " "))
        if (path == mnt or mnt in path.parents) and len(str(mnt)) >= len(str(best[0])):
            best = (mnt, fields[2])
    return best


class FsTarget:
    """A folder on a mounted POSIX file system (CephFS through ceph-fuse or the kernel client).

    Each file: written to ``<root>/.pipectl-tmp/<run id>/``, ``fsync``ed, re-read and compared
    with the source's sha256, then renamed into ``<root>/<key>`` (POSIX ``rename(2)`` is atomic
    within one file system). The manifest goes the same way. ``root_uri`` is what outputs report
    (``cephfs:///path`` or the folder's path).
    """

    def __init__(self, root: Path, root_uri: str | None = None, *, require_cephfs: bool = False) -> None:
        self.root = Path(root)
        self.root_uri = (root_uri or str(self.root)).rstrip("/")
        self.require_cephfs = require_cephfs
        host = socket.gethostname().replace(".", "_")
        self._run_id = f"{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._tmp = self.root / TMP_DIR / self._run_id

    def prepare(self) -> None:
        probe = self.root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        mnt, fstype = mount_fstype(probe)
        if self.require_cephfs and fstype not in CEPHFS_FSTYPES:
            raise StepError(
                f"{self.root_uri}: {mnt} is not a CephFS mount (file system type {fstype or 'unknown'})",
                "mount the CephFS there (ceph-fuse, mount -t ceph, or a ceph-csi volume) "
                "or set PIPECTL_CEPHFS_MOUNT to where it is mounted",
                cli_exit=2,
            )
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._tmp.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StepError(f"cannot create {self.root}: {e.strerror}", "check the mount and its permissions") from e
        self._sweep_stale()

    def _sweep_stale(self) -> None:
        """Remove temporary folders of killed runs on this host (pid gone). Other hosts' are left."""
        host = self._run_id.split(".", 1)[0]
        base = self.root / TMP_DIR
        for d in base.iterdir():
            parts = d.name.split(".")
            if d == self._tmp or len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
                continue
            try:
                os.kill(int(parts[1]), 0)
                continue  # that run is still alive
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            for f in d.iterdir():
                f.unlink(missing_ok=True)
            d.rmdir()

    def read_manifest(self, key: str) -> dict | None:
        try:
            return json.loads((self.root / key).read_bytes())
        except FileNotFoundError:
            return None

    def present(self, prefix: str) -> dict[str, Present]:
        found: dict[str, Present] = {}
        base = self.root / prefix
        if not base.is_dir():
            return found
        stack = [base]
        while stack:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    elif e.is_file(follow_symlinks=False):
                        found[Path(e.path).relative_to(self.root).as_posix()] = Present(e.stat(follow_symlinks=False).st_size)
        return found

    def is_complete(self, key: str, have: Present, entry: ManifestEntry, md5: str) -> bool:
        # Only verified files are ever renamed into the prefix, and the prefix is the content
        # address: a file of the right size there is the verified copy.
        return have.size == entry.size

    def _atomic_write(self, dest: Path, write: Any, sha256: str | None) -> None:
        tmp = self._tmp / uuid.uuid4().hex
        try:
            with open(tmp, "wb") as out:
                write(out)
                out.flush()
                os.fsync(out.fileno())
            if sha256 is not None:
                h = hashlib.sha256()
                with open(tmp, "rb") as back:
                    for chunk in iter(lambda: back.read(1 << 20), b""):
                        h.update(chunk)
                if h.hexdigest() != sha256:
                    raise StepError(
                        f"verification failed for {self.root_uri}/{dest.relative_to(self.root).as_posix()}: "
                        "sha256 read back differs from the source",
                        "the source changed during staging or the file system altered the write; rerun",
                        transient=True,
                    )
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.rename(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def put(self, key: str, src: Any, entry: ManifestEntry, md5: str) -> int:
        def write(out: Any) -> None:
            stream = src.open()
            try:
                for chunk in iter(lambda: stream.read(1 << 20), b""):
                    out.write(chunk)
            finally:
                stream.close()

        self._atomic_write(self.root / key, write, entry.sha256)
        return 0

    def write_manifest(self, key: str, obj: Any) -> None:
        body = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
        dest = self.root / key
        self._atomic_write(dest, lambda out: out.write(body), hashlib.sha256(body).hexdigest())
        fd = os.open(dest.parent, os.O_RDONLY)  # make the rename itself durable
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def finish(self) -> None:
        try:
            for f in self._tmp.iterdir():
                f.unlink(missing_ok=True)
            self._tmp.rmdir()
            (self.root / TMP_DIR).rmdir()  # only when no other run's folder is left
        except OSError:
            pass


def parse_target(target_uri: str, *, s3: Any, cephfs_mount: str | None, max_concurrency: int = 10,
                 endpoint: Endpoint | None = None) -> Target:
    """``s3://bucket`` or ``s3://bucket/prefix/`` -> :class:`S3Target`; ``cephfs:///path`` -> :class:`FsTarget` under
    ``cephfs_mount`` (checked to be a CephFS); ``/path`` or ``file:///path`` -> :class:`FsTarget`.

    Raises StepError (CLI exit 2) for an unknown scheme, an S3 prefix that is no key prefix, or
    ``cephfs://`` without ``cephfs_mount``.
    """
    from urllib.parse import urlparse

    u = urlparse(target_uri)
    if u.scheme == "s3":
        prefix = u.path.strip("/")
        if not u.netloc or u.query or u.fragment or "//" in u.path or any(p in (".", "..") for p in prefix.split("/")):
            raise StepError(f"target {target_uri!r}: write s3://<bucket> or s3://<bucket>/<path>/ (datasets go under "
                            "<target>/datasets/)", "e.g. s3://pipectl or s3://pipectl/teams/vision/", cli_exit=2)
        return S3Target(s3, u.netloc, prefix=prefix, max_concurrency=max_concurrency, endpoint=endpoint)
    if u.scheme == "cephfs":
        if not cephfs_mount:
            raise StepError(
                f"target {target_uri!r} needs to know where the CephFS is mounted",
                "set PIPECTL_CEPHFS_MOUNT (e.g. /mnt/cephfs; on Kubernetes the ceph-csi volume's mountPath)",
                cli_exit=2,
            )
        if u.netloc:
            raise StepError(f"target {target_uri!r}: write cephfs:///<path> (three slashes; the path is inside the mount)",
                            "e.g. cephfs:///pipectl", cli_exit=2)
        rel = u.path.strip("/")
        return FsTarget(Path(cephfs_mount) / rel, f"cephfs:///{rel}", require_cephfs=True)
    if u.scheme == "file" or (not u.scheme and target_uri.startswith("/")):
        path = u.path if u.scheme == "file" else target_uri
        return FsTarget(Path(path))
    raise StepError(f"target {target_uri!r} is not s3://<bucket>, cephfs:///<path> or an absolute path",
                    "e.g. s3://pipectl, cephfs:///pipectl, /mnt/cephfs/pipectl", cli_exit=2)
