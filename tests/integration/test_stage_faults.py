"""stage against a real Ceph RGW under faults: SIGKILL at 20 random points, and an S3 path that
answers 503 SlowDown or resets the connection on 10% of requests."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipectl.components.contracts import DatasetManifest, StageInput
from pipectl.components.runtime import read_json, s3_client
from pipectl.components.stage.core import stage
from pipectl.pipelines.backends.processes import kill_tree
from tests.tools.faulty_proxy import FaultyProxy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def dataset_500(tmp_path_factory):
    """500 files of 1-40 KiB (random bytes; stage copies bytes, it does not decode) in 5 labels."""
    root = tmp_path_factory.mktemp("ds500")
    rng = random.Random(500)
    for i in range(500):
        label = root / f"class-{i % 5}"
        label.mkdir(exist_ok=True)
        (label / f"img-{i:03d}.jpg").write_bytes(rng.randbytes(rng.randint(1024, 40 * 1024)))
    return root


def _contents(s3, bucket: str, prefix: str) -> dict[str, str]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            body = s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            out[o["Key"][len(prefix):]] = hashlib.sha256(body).hexdigest()
    return out


def _etags(s3, bucket: str, prefix: str) -> dict[str, str]:
    """Key -> ETag (the content md5 of a single-PUT object) from one LIST per 1,000 keys."""
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"][len(prefix):]] = o["ETag"].strip('"')
    return out


def _count(s3, bucket: str) -> int:
    try:
        return sum(page.get("KeyCount", 0) for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="datasets/"))
    except Exception:  # the bucket does not exist until the first attempt creates it
        return 0


def test_sigkill_at_20_random_points_then_rerun_equals_a_clean_copy(ceph_settings, dataset_500, tmp_path):
    settings = ceph_settings
    s3 = s3_client(settings)
    # The attempts reach Ceph through 10 ms of added latency (no faults) so a copy lasts seconds and
    # the kills land during it; the test itself talks to Ceph directly.
    slow = FaultyProxy(settings.s3_endpoint, rate=0.0, delay_s=0.01).__enter__()
    env = {**os.environ, **settings.step_env(), "PIPECTL_S3_ENDPOINT": slow.url}
    argv = [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(dataset_500),
            "--bucket", settings.bucket, "--outputs-dir", str(tmp_path / "out"),
            "--max-concurrency", "2"]
    sources = {p.relative_to(dataset_500).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in dataset_500.rglob("*.jpg")}
    source_md5 = {p.relative_to(dataset_500).as_posix(): hashlib.md5(p.read_bytes()).hexdigest() for p in dataset_500.rglob("*.jpg")}
    # 20 random points: each attempt is killed a random 0-150 ms after it has written its first
    # new object (each rerun resumes, so the points move through the whole copy).
    rng = random.Random(20)
    kills_mid_copy = 0
    for _ in range(20):
        target = _count(s3, settings.bucket) + 1
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline and _count(s3, settings.bucket) < target:
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.15))
        finished = proc.poll() is not None
        kill_tree(proc.pid)
        proc.wait()
        objects = _etags(s3, settings.bucket, "datasets/")
        if not finished and not any(k.endswith("manifest.json") for k in objects):
            kills_mid_copy += 1
        for key, etag in objects.items():  # nothing partial is visible: every object is whole
            if not key.endswith("manifest.json"):
                assert etag == source_md5[key.split("/data/", 1)[1]], key
    final = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    slow.__exit__()
    assert final.returncode == 0, final.stderr[-2000:]
    out = read_json(s3, f"s3://{settings.bucket}/" + next(k for k in _contents(s3, settings.bucket, "") if k.endswith("manifest.json")))
    manifest = DatasetManifest.model_validate(out)
    assert {e.key: e.sha256 for e in manifest.entries} == sources

    clean = stage(StageInput(source_uri=str(dataset_500), bucket=settings.bucket + "-clean"), s3)
    prefix = clean.dataset_uri.split("/", 3)[3]
    assert _contents(s3, settings.bucket, prefix) == _contents(s3, settings.bucket + "-clean", prefix)
    assert kills_mid_copy >= 15, f"only {kills_mid_copy} of 20 kills landed mid-copy"


def test_10_percent_503_and_resets_still_stage_a_correct_manifest(ceph_settings, dataset_500):
    with FaultyProxy(ceph_settings.s3_endpoint, rate=0.10, seed=7) as proxy:
        flaky = ceph_settings.model_copy(update={"s3_endpoint": proxy.url})
        out = stage(StageInput(source_uri=str(dataset_500), bucket=ceph_settings.bucket, max_concurrency=8), s3_client(flaky))
    assert out.copied == 500
    assert proxy.faults["503"] > 10 and proxy.faults["reset"] > 10, proxy.faults
    assert out.retries > 0
    direct = s3_client(ceph_settings)
    prefix = out.dataset_uri.split("/", 3)[3]
    manifest = DatasetManifest.model_validate(read_json(direct, out.manifest_uri))
    contents = _contents(direct, ceph_settings.bucket, prefix + "data/")
    assert contents == {e.key: e.sha256 for e in manifest.entries}
    print(f"faults injected {proxy.faults} over {proxy.requests} requests; stage reported {out.retries} retried writes")


def test_sigkill_at_20_random_points_to_cephfs_then_rerun_equals_a_clean_copy(ceph_settings, cephfs_mount, dataset_500, tmp_path):
    """The same 20 kills with a CephFS target (ceph-fuse mount): after each, every file under the
    final prefix is whole (temp + fsync + verify + rename); the last rerun completes the copy, sweeps
    the dead runs' temporary files, and the tree equals the sources."""
    import uuid

    from pipectl.components.stage.targets import TMP_DIR

    rel = f"kill-{uuid.uuid4().hex[:8]}"
    root = cephfs_mount / rel
    env = {**os.environ, **ceph_settings.step_env(), "PIPECTL_CEPHFS_MOUNT": str(cephfs_mount)}
    argv = [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(dataset_500),
            "--bucket", ceph_settings.bucket, "--target-uri", f"cephfs:///{rel}",
            "--outputs-dir", str(tmp_path / "out"), "--max-concurrency", "1"]
    sources = {p.relative_to(dataset_500).as_posix(): p.read_bytes() for p in dataset_500.rglob("*.jpg")}

    def placed() -> dict[str, Path]:
        base = root / "datasets"
        return {p.relative_to(base).as_posix(): p for p in base.rglob("*") if p.is_file()} if base.exists() else {}

    rng = random.Random(21)
    kills_mid_copy = 0
    for _ in range(20):
        target = len(placed()) + 1
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 120
        # the copy is stopped (SIGSTOP) while the mount is listed: a listing of the FUSE mount under
        # load took longer than the rest of the copy, and the kills came after the last file
        while proc.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGSTOP)
            reached = len(placed()) >= target
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
            if reached:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0, 0.02))  # no proxy latency here: a CephFS copy of the rest takes ~1 s
        finished = proc.poll() is not None
        kill_tree(proc.pid)
        proc.wait()
        files = placed()
        if not finished and not any(k.endswith("manifest.json") for k in files):
            kills_mid_copy += 1
        for key, path in files.items():  # nothing partial under the final prefix
            if not key.endswith("manifest.json"):
                assert path.read_bytes() == sources[key.split("/data/", 1)[1]], key
    final = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    files = placed()
    manifest = DatasetManifest.model_validate_json(next(p for k, p in files.items() if k.endswith("manifest.json")).read_bytes())
    assert {e.key: e.sha256 for e in manifest.entries} == {k: hashlib.sha256(v).hexdigest() for k, v in sources.items()}
    assert {k.split("/data/", 1)[1]: p.read_bytes() for k, p in files.items() if "/data/" in k} == sources
    assert not (root / TMP_DIR).exists() or not any((root / TMP_DIR).rglob("*")), "temporary files swept"
    # Kills come 0-20 ms of copying after the first new file seen in a listing of the FUSE mount
    # (the copy stopped while it is listed), so only the last attempts can finish the copy first.
    assert kills_mid_copy >= 10, f"only {kills_mid_copy} of 20 kills landed mid-copy"


def test_sigkill_of_the_stage_process_alone_stops_every_write(ceph_settings, tmp_path):
    """2,400 small files sent from stage's own threads (obstore: no helper process). SIGKILL of
    the stage process alone (not its process group) stops the writes: nothing is written after
    it (beyond the requests already sent); the rerun completes; every object is whole and
    verified (its ETag is its md5)."""
    rng = random.Random(2400)
    src = tmp_path / "many"
    n = 2400
    for i in range(n):
        (src / f"l{i % 4}").mkdir(parents=True, exist_ok=True)
        (src / f"l{i % 4}" / f"{i:05d}.jpg").write_bytes(rng.randbytes(rng.randint(200, 2000)))
    s3 = s3_client(ceph_settings)
    slow = FaultyProxy(ceph_settings.s3_endpoint, rate=0.0, delay_s=0.01).__enter__()
    env = {**os.environ, **ceph_settings.step_env(), "PIPECTL_S3_ENDPOINT": slow.url}
    argv = [sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(src), "--bucket", ceph_settings.bucket,
            "--outputs-dir", str(tmp_path / "out"), "--max-concurrency", "4"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and _count(s3, ceph_settings.bucket) < 200:
        time.sleep(0.02)
    proc.kill()  # the stage process only
    proc.wait()
    at_kill = _count(s3, ceph_settings.bucket)
    # PUTs the killed process had already sent still land (the proxy holds each 10 ms): at most
    # one per thread; after that, nothing.
    time.sleep(0.5)
    after_kill = _count(s3, ceph_settings.bucket)
    assert after_kill - at_kill <= 4, (at_kill, after_kill)
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        assert _count(s3, ceph_settings.bucket) == after_kill, "nothing written after the kill"
        time.sleep(0.25)
    assert _count(s3, ceph_settings.bucket) == after_kill < n, "nothing written after the kill"

    final = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    slow.__exit__()
    assert final.returncode == 0, final.stderr[-2000:]
    out = json.loads((tmp_path / "out" / "output.json").read_text())
    assert (out["objects"], out["copied"]) == (n, n - after_kill)
    prefix = out["dataset_uri"].split("/", 3)[3]
    md5 = {p.relative_to(src).as_posix(): hashlib.md5(p.read_bytes()).hexdigest() for p in src.rglob("*.jpg")}
    assert _etags(s3, ceph_settings.bucket, prefix + "data/") == md5


@pytest.mark.parametrize("store", ["moto", "ceph-rgw"])
def test_C14_etags_that_are_no_md5_verify_by_size_and_sha256_and_resume(store, settings, ceph_settings, dataset_500):
    """C14: a store whose ETags are not the content MD5 (S3 with SSE-KMS or SSE-C, some gateways) —
    here a real S3 server behind a proxy that answers every ETag (headers and listings) with an
    opaque value. Right: staging completes verified by size and the recorded sha256 (the store
    checked each PUT's Content-MD5), and a second run copies nothing; a bucket staged with MD5
    ETags is recognised through the opaque gateway too (the same kind, seen from the resume side)."""
    base = settings if store == "moto" else ceph_settings
    with FaultyProxy(base.s3_endpoint, rate=0.0, opaque_etags=True) as proxy:
        opaque = base.model_copy(update={"s3_endpoint": proxy.url})
        first = stage(StageInput(source_uri=str(dataset_500), bucket=base.bucket), s3_client(opaque))
        again = stage(StageInput(source_uri=str(dataset_500), bucket=base.bucket), s3_client(opaque))
        s3o = s3_client(opaque)
        etag = s3o.head_object(Bucket=base.bucket, Key=first.manifest_uri.split("/", 3)[3])["ETag"].strip('"')
    assert first.copied == 500 and again.copied == 0, (first, again)
    direct = s3_client(base)
    prefix = first.dataset_uri.split("/", 3)[3]
    manifest = DatasetManifest.model_validate(read_json(direct, first.manifest_uri))
    assert _contents(direct, base.bucket, prefix + "data/") == {e.key: e.sha256 for e in manifest.entries}
    body = direct.get_object(Bucket=base.bucket, Key=first.manifest_uri.split("/", 3)[3])["Body"].read()
    assert etag != hashlib.md5(body).hexdigest()  # the proxy did hide the MD5s

    # staged directly (MD5 ETags), then resumed through the opaque gateway after losing its manifest
    direct.delete_object(Bucket=base.bucket, Key=first.manifest_uri.split("/", 3)[3])
    with FaultyProxy(base.s3_endpoint, rate=0.0, opaque_etags=True) as proxy:
        resumed = stage(StageInput(source_uri=str(dataset_500), bucket=base.bucket),
                        s3_client(base.model_copy(update={"s3_endpoint": proxy.url})))
    assert resumed.copied == 0 and resumed.skipped == 500, resumed


def test_C14_a_body_that_does_not_match_its_md5_is_refused_by_the_store(ceph_settings, tmp_path):
    """The other half of C14's rule: with ETags no longer proving the content, the store checks
    each PUT's Content-MD5 — a body whose MD5 is not the one stage computed (the file changed after
    it was hashed) is refused by Ceph RGW and reported as a transient verification failure."""
    from pipectl.components.contracts import ManifestEntry
    from pipectl.components.runtime import StepError, ensure_bucket
    from pipectl.components.stage.targets import SourceFile
    from pipectl.components.stage.targets import S3Target

    s3 = s3_client(ceph_settings)
    ensure_bucket(s3, ceph_settings.bucket)
    f = tmp_path / "a.jpg"
    f.write_bytes(b"now different bytes")
    entry = ManifestEntry(key="0/a.jpg", size=f.stat().st_size, sha256="0" * 64, label="0")
    src = SourceFile(key="0/a.jpg", label="0", size=entry.size, open=lambda: f.open("rb"))
    with pytest.raises(StepError, match="differ") as e:
        S3Target(s3, ceph_settings.bucket).put("c14/0/a.jpg", src, entry, hashlib.md5(b"the bytes hashed").hexdigest())
    assert e.value.transient
    assert s3.list_objects_v2(Bucket=ceph_settings.bucket, Prefix="c14/").get("KeyCount", 0) == 0
