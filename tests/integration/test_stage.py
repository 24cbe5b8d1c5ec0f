"""stage against a real S3 HTTP server: idempotent, resumable after SIGKILL, verified, content-addressed."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from pipectl.components.contracts import DatasetManifest, StageInput
from pipectl.components.runtime import read_json
from pipectl.components.stage.core import stage

pytestmark = pytest.mark.integration


@pytest.fixture()
def settings(store_settings):
    """Every test here runs against moto's S3 server and against a real Ceph RGW."""
    return store_settings


def _objects(s3, bucket, prefix):
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = o["Size"]
    return out


def test_second_run_copies_nothing(settings, s3, digits_dir):
    first = stage(StageInput(source_uri=str(digits_dir), bucket=settings.bucket), s3)
    assert (first.objects, first.copied, first.skipped) == (1797, 1797, 0)
    second = stage(StageInput(source_uri=str(digits_dir), bucket=settings.bucket), s3)
    assert (second.copied, second.skipped) == (0, 1797)
    assert second.dataset_uri == first.dataset_uri

    manifest = DatasetManifest.model_validate(read_json(s3, first.manifest_uri))
    assert len(manifest.entries) == 1797 and manifest.labels == [str(i) for i in range(10)]
    entry = manifest.entries[0]
    body = s3.get_object(Bucket=settings.bucket, Key=first.dataset_uri.split("/", 3)[3] + "data/" + entry.key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == entry.sha256
    assert body == (digits_dir / entry.key).read_bytes()


def test_s3_source_gets_the_same_content_address(settings, s3, small_digits_dir):
    local = stage(StageInput(source_uri=str(small_digits_dir), bucket=settings.bucket), s3)
    for p in sorted(small_digits_dir.rglob("*.jpg")):
        s3.put_object(Bucket=settings.bucket, Key=f"incoming/{p.relative_to(small_digits_dir).as_posix()}", Body=p.read_bytes())
    remote = stage(StageInput(source_uri=f"s3://{settings.bucket}/incoming", bucket=settings.bucket), s3)
    assert remote.dataset_uri == local.dataset_uri
    assert remote.copied == 0  # already staged under that address


def test_sigkill_mid_copy_then_rerun_finishes_where_it_stopped(settings, s3, digits_dir, step_env, tmp_path):
    argv = [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(digits_dir),
            "--bucket", settings.bucket, "--outputs-dir", str(tmp_path / "out1")]
    proc = subprocess.Popen(argv, env=step_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    s3.create_bucket(Bucket=settings.bucket)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_objects(s3, settings.bucket, "datasets/")) < 300:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = _objects(s3, settings.bucket, "datasets/")
    assert 300 <= len(partial) < 1797, "the kill must land mid-copy"
    assert not any(k.endswith("manifest.json") for k in partial), "no manifest before the copy completes"

    rerun = subprocess.run([*argv[:-1], str(tmp_path / "out2")], env=step_env, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    copied = int((tmp_path / "out2" / "copied").read_text())
    assert copied == 1797 - len(partial)
    final = _objects(s3, settings.bucket, "datasets/")
    assert len(final) == 1797 + 1  # every image once, plus the manifest

    clean = stage(StageInput(source_uri=str(digits_dir), bucket=settings.bucket + "-c"), s3)
    bucket_prefix = clean.dataset_uri.split("/", 3)[3]
    assert _objects(s3, settings.bucket + "-c", bucket_prefix) == {k: v for k, v in final.items()}


def test_bad_source_exits_1_and_writes_nothing(settings, s3, step_env, tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(tmp_path / "missing"),
         "--bucket", settings.bucket, "--outputs-dir", str(tmp_path / "out")],
        env=step_env, capture_output=True, text=True,
    )
    assert r.returncode == 1
    assert "does not exist" in r.stderr
    assert settings.bucket not in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert not (tmp_path / "out").exists()


def test_unreachable_store_is_transient_exit_75(settings, digits_dir, tmp_path):
    env = {**os.environ, **settings.step_env(), "PIPECTL_S3_ENDPOINT": "http://127.0.0.1:9"}
    r = subprocess.run(
        [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(digits_dir),
         "--bucket", settings.bucket, "--outputs-dir", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 75, r.stderr
    assert "127.0.0.1:9" in r.stderr


def test_large_objects_go_multipart_and_are_verified(settings, s3, tmp_path):
    """A 20 MiB file crosses the 8 MiB multipart threshold: uploaded in parts, verified by HEAD."""
    import random

    from pipectl.components.stage.core import MULTIPART_THRESHOLD_BYTES

    rng = random.Random(7)
    big = bytes(rng.getrandbits(8) for _ in range(1024)) * (20 * 1024)
    assert len(big) > MULTIPART_THRESHOLD_BYTES
    for label in ("a", "b"):
        (tmp_path / "ds" / label).mkdir(parents=True)
        (tmp_path / "ds" / label / "big.jpg").write_bytes(big + label.encode())
    out = stage(StageInput(source_uri=str(tmp_path / "ds"), bucket=settings.bucket), s3)
    assert out.copied == 2 and out.bytes == 2 * (len(big) + 1)
    key = out.dataset_uri.split("/", 3)[3] + "data/a/big.jpg"
    head = s3.head_object(Bucket=settings.bucket, Key=key)
    assert "-" in head["ETag"], "a multipart upload's ETag is md5-of-parts with a part count"
    assert head["Metadata"]["sha256"] == hashlib.sha256(big + b"a").hexdigest()
    # an interrupted run that lost the manifest: the multipart objects are checked by HEAD, not re-sent
    s3.delete_object(Bucket=settings.bucket, Key=out.dataset_uri.split("/", 3)[3] + "manifest.json")
    again = stage(StageInput(source_uri=str(tmp_path / "ds"), bucket=settings.bucket), s3)
    assert (again.copied, again.skipped) == (0, 2)


def test_non_ascii_labels_are_staged(settings, s3, small_digits_dir, tmp_path):
    import shutil

    from pipectl.components.runtime import read_json

    ds = tmp_path / "ds"
    shutil.copytree(small_digits_dir / "0", ds / "zéro un")
    shutil.copytree(small_digits_dir / "1", ds / "一")
    out = stage(StageInput(source_uri=str(ds), bucket=settings.bucket), s3)
    assert out.copied == 60
    manifest = read_json(s3, out.manifest_uri)
    assert manifest["labels"] == ["zéro un", "一"]
