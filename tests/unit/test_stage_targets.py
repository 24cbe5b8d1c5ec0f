"""stage targets: URI parsing, the CephFS mount check, the file-system target's atomic verified writes."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess

import pytest

from pipectl.components.contracts import ManifestEntry
from pipectl.components.runtime import StepError
from pipectl.components.stage.targets import SourceFile
from pipectl.components.stage.targets import TMP_DIR, FsTarget, S3Target, mount_fstype, parse_target


@pytest.mark.parametrize(
    ("uri", "mount", "says"),
    [
        ("cephfs:///data", None, "PIPECTL_CEPHFS_MOUNT"),
        ("cephfs://fs/data", "/mnt", "three slashes"),
        ("s3://bucket/some/../path/", None, "s3://<bucket>/<path>/"),
        ("s3://bucket//path/", None, "s3://<bucket>/<path>/"),
        ("s3://bucket/path/?versionId=1", None, "s3://<bucket>/<path>/"),
        ("s3:///path/", None, "s3://<bucket>"),
        ("ftp://host/x", None, "is not s3://<bucket>, cephfs:///<path> or an absolute path"),
        ("relative/path", None, "is not s3://<bucket>"),
    ],
)
def test_bad_target_uris_are_usage_errors(uri, mount, says):
    with pytest.raises(StepError) as e:
        parse_target(uri, s3=None, cephfs_mount=mount)
    assert says in str(e.value.headline) + e.value.hint
    assert e.value.cli_exit == 2


def test_target_uris_map_to_targets(tmp_path):
    assert isinstance(parse_target("s3://b", s3=object(), cephfs_mount=None), S3Target)
    team = parse_target("s3://b/teams/vision", s3=object(), cephfs_mount=None)  # a team's prefix, / or not
    assert (team.bucket, team.prefix, team.root_uri) == ("b", "teams/vision/", "s3://b/teams/vision")
    assert parse_target("s3://b/teams/vision/", s3=object(), cephfs_mount=None).prefix == "teams/vision/"
    t = parse_target("cephfs:///pipectl/x", s3=None, cephfs_mount=str(tmp_path))
    assert isinstance(t, FsTarget) and t.root == tmp_path / "pipectl/x" and t.root_uri == "cephfs:///pipectl/x"
    assert parse_target(f"file://{tmp_path}", s3=None, cephfs_mount=None).root == tmp_path
    assert parse_target(str(tmp_path), s3=None, cephfs_mount=None).root_uri == str(tmp_path)


def test_cephfs_target_refuses_a_folder_that_is_not_a_cephfs_mount(tmp_path):
    t = parse_target("cephfs:///pipectl", s3=None, cephfs_mount=str(tmp_path))
    with pytest.raises(StepError) as e:
        t.prepare()
    assert "is not a CephFS mount" in e.value.headline and e.value.cli_exit == 2
    assert not (tmp_path / "pipectl").exists(), "nothing written"


def test_mount_fstype_finds_the_longest_mount_prefix(tmp_path):
    mnt, fstype = mount_fstype(tmp_path / "not" / "yet")
    assert fstype and (mnt == tmp_path or mnt in tmp_path.parents)


def _src(data: bytes, key: str = "a/x.jpg") -> tuple[SourceFile, ManifestEntry]:
    f = SourceFile(key=key, label="a", size=len(data), open=lambda: io.BytesIO(data))
    return f, ManifestEntry(key=key, size=len(data), sha256=hashlib.sha256(data).hexdigest(), label="a")


def test_fs_put_is_verified_and_atomic(tmp_path):
    t = FsTarget(tmp_path / "root")
    t.prepare()
    f, entry = _src(b"hello")
    t.put("datasets/d/data/a/x.jpg", f, entry, "")
    assert (tmp_path / "root/datasets/d/data/a/x.jpg").read_bytes() == b"hello"
    # a source whose bytes differ from what was hashed: verification fails, nothing is renamed in
    changed = SourceFile(key="a/y.jpg", label="a", size=5, open=lambda: io.BytesIO(b"HELLO"))
    with pytest.raises(StepError) as e:
        t.put("datasets/d/data/a/y.jpg", changed, entry, "")
    assert e.value.transient and "sha256 read back differs" in e.value.headline
    assert not (tmp_path / "root/datasets/d/data/a/y.jpg").exists()
    assert list(t._tmp.iterdir()) == [], "the failed temporary file is removed"
    t.finish()
    assert not (tmp_path / "root" / TMP_DIR).exists()


def test_fs_prepare_sweeps_temporary_files_of_dead_runs_on_this_host(tmp_path):
    import socket

    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname().replace(".", "_")
    stale = tmp_path / TMP_DIR / f"{host}.{dead.pid}.abcd1234"
    stale.mkdir(parents=True)
    (stale / "partial").write_bytes(b"half")
    alive = tmp_path / TMP_DIR / f"{host}.{os.getpid()}.abcd1234"
    alive.mkdir()
    other_host = tmp_path / TMP_DIR / "elsewhere.1.abcd1234"
    other_host.mkdir()
    FsTarget(tmp_path).prepare()
    assert not stale.exists()
    assert alive.exists() and other_host.exists()


@pytest.mark.parametrize("size", [8 << 20, 20 << 20, 256 << 20, 100 << 30, 1 << 40, 5 << 40])
def test_multipart_plans_stay_within_the_s3_limits(size):
    from pipectl.components.stage.transfer import MiB, part_plan

    part, in_flight = part_plan(size)
    assert part % MiB == 0 and part >= 8 * MiB  # S3: parts >= 5 MiB
    assert -(-size // part) <= 10_000  # S3: at most 10,000 parts
    assert 1 <= in_flight <= 8 and in_flight <= -(-size // part)
    assert part <= 64 * MiB or size > 640 * 1024 * MiB  # larger parts only where 10,000 would not do


@pytest.mark.parametrize(
    ("message", "transient"),
    [   # the first lines of obstore 0.12.1 errors seen against Ceph RGW and the fault proxy
        ("Generic S3 error: Error performing PUT http://127.0.0.1:1/b/k in 3ms - Server returned non-2xx status code: "
         "503 Service Unavailable: <Error><Code>SlowDown</Code></Error>", True),
        ("Generic S3 error: Error performing PUT http://127.0.0.1:1/b/k in 419µs - HTTP error: error sending request", True),
        ("The operation lacked the necessary privileges to complete for path k: Error performing PUT "
         "http://127.0.0.1:1/b/k in 474µs - Server returned non-2xx status code: 403 Forbidden: "
         "<Error><Code>SignatureDoesNotMatch</Code></Error>", False),
        ("Object at location k not found: Error performing PUT http://127.0.0.1:1/b/k in 1ms - Server returned "
         "non-2xx status code: 404 Not Found: <Error><Code>NoSuchBucket</Code></Error>", False),
    ],
)
def test_obstore_errors_are_retried_only_when_transient(message, transient):
    from pipectl.components.stage.transfer import is_transient

    assert is_transient(RuntimeError(message)) is transient
