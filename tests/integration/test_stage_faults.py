"""stage against a real Ceph RGW under faults: SIGKILL at 20 random points, and an S3 path that
answers 503 SlowDown or resets the connection on 10% of requests."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
import time

import pytest

from pipectl.components.contracts import DatasetManifest, StageInput
from pipectl.components.runtime import read_json, s3_client
from pipectl.components.stage.core import stage
from pipectl.pipelines.local import kill_tree
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
