"""A real Alluxio 2.9.4 (master, job master, worker, job worker, proxy; jars from Maven Central)
over the session's real Ceph RGW: warm a staged prefix, read through Alluxio's S3 proxy."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from pipectl.components.alluxio import AlluxioClient, alluxio_s3_client, data_read_client
from pipectl.components.contracts import DatasetManifest, PreprocessInput, StageInput
from pipectl.components.preprocess.core import preprocess
from pipectl.components.runtime import read_json, s3_client
from pipectl.components.stage.core import stage

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def alluxio(ceph_cluster, tmp_path_factory):
    from tests.alluxio.alluxio import AlluxioCluster, AlluxioUnavailable

    try:
        cluster = AlluxioCluster(tmp_path_factory.mktemp("alluxio") / "run", s3_endpoint=ceph_cluster.s3_endpoint,
                                 access_key=ceph_cluster.access_key, secret_key=ceph_cluster.secret_key)
        cluster.start()
    except AlluxioUnavailable as e:
        if os.environ.get("PIPECTL_REQUIRE_CEPH") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))
    print(f"alluxio up in {cluster.startup_s:.1f}s, {cluster.rss_bytes() / 2**20:.0f} MiB RSS")
    yield cluster
    cluster.stop()


@pytest.fixture()
def staged(ceph_settings, small_digits_dir, alluxio):
    """small digits (300 images) staged to a fresh Ceph bucket, mounted in Alluxio at /<bucket>."""
    s3 = s3_client(ceph_settings)
    out = stage(StageInput(source_uri=str(small_digits_dir), bucket=ceph_settings.bucket), s3)
    alluxio.mount_bucket(ceph_settings.bucket)
    settings = ceph_settings.model_copy(update={"alluxio_proxy_url": alluxio.proxy_url,
                                                "alluxio_job_master_url": alluxio.job_master_url})
    return settings, out


def _files(settings, out) -> list[str]:
    manifest = DatasetManifest.model_validate(read_json(s3_client(settings), out.manifest_uri))
    prefix = out.dataset_uri.split("/", 3)[3]
    return [f"/{settings.bucket}/{prefix}data/{e.key}" for e in manifest.entries]


def test_warm_loads_the_staged_prefix_and_reports_cached_bytes(staged, alluxio, tmp_path):
    settings, out = staged
    client = AlluxioClient(alluxio.proxy_url, alluxio.job_master_url)
    assert client.cached_bytes(_files(settings, out)) == (0, out.bytes), "nothing cached before the warm-up"
    used_before = alluxio.master_info()["capacity"]["used"]
    r = subprocess.run(
        [sys.executable, "-m", "pipectl.components.stage.warm", "--manifest-uri", out.manifest_uri,
         "--batch-size", "100", "--outputs-dir", str(tmp_path / "out")],
        env={**os.environ, **settings.step_env()}, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "output.json").read_text())
    assert result["files"] == 300 and result["jobs"] == 3
    assert result["bytes"] == out.bytes and result["cached_bytes"] == out.bytes
    assert client.cached_bytes(_files(settings, out)) == (out.bytes, out.bytes)
    assert alluxio.master_info()["capacity"]["used"] - used_before >= out.bytes
    print(f"warm: {result['cached_bytes']} bytes, {result['files']} files in {result['seconds']} s")


def test_reads_through_the_alluxio_s3_proxy_are_the_staged_bytes(staged):
    settings, out = staged
    via = alluxio_s3_client(settings)
    direct = s3_client(settings)
    manifest = DatasetManifest.model_validate(read_json(direct, out.manifest_uri))
    prefix = out.dataset_uri.split("/", 3)[3] + "data/"
    for e in manifest.entries[::15]:
        body = via.get_object(Bucket=settings.bucket, Key=prefix + e.key)["Body"].read()
        assert hashlib.sha256(body).hexdigest() == e.sha256
    assert data_read_client(settings).meta.endpoint_url.endswith("/api/v1/s3")
    assert data_read_client(settings.model_copy(update={"alluxio_proxy_url": None})).meta.endpoint_url == settings.s3_endpoint


def test_preprocess_reads_the_dataset_through_alluxio(staged, alluxio):
    """No warm-up: preprocess's reads go through Alluxio's proxy, which caches what it serves;
    the shards are the same as when reading the store directly."""
    settings, out = staged
    client = AlluxioClient(alluxio.proxy_url, alluxio.job_master_url)
    files = _files(settings, out)
    assert client.cached_bytes(files)[0] == 0
    s3 = s3_client(settings)
    base = dict(manifest_uri=out.manifest_uri, image_size=16, validation_fraction=0.2, max_corrupt_fraction=0.01)
    through = preprocess(PreprocessInput(output_uri=f"s3://{settings.bucket}/runs/a/shards/", **base), s3, reader=data_read_client(settings))
    assert client.cached_bytes(files) == (out.bytes, out.bytes), "every image was read through Alluxio (and cached)"
    direct = preprocess(PreprocessInput(output_uri=f"s3://{settings.bucket}/runs/b/shards/", **base), s3)
    assert (through.train_count, through.validation_count) == (direct.train_count, direct.validation_count)
    a = read_json(s3, f"s3://{settings.bucket}/runs/a/shards/index.json")
    b = read_json(s3, f"s3://{settings.bucket}/runs/b/shards/index.json")
    assert {k: v for k, v in a.items() if k not in ("train", "validation")} == {k: v for k, v in b.items() if k not in ("train", "validation")}


def test_warm_of_an_unmounted_bucket_fails_with_a_hint(ceph_settings, small_digits_dir, alluxio, tmp_path):
    s3 = s3_client(ceph_settings)
    out = stage(StageInput(source_uri=str(small_digits_dir), bucket=ceph_settings.bucket), s3)
    settings = ceph_settings.model_copy(update={"alluxio_proxy_url": alluxio.proxy_url,
                                                "alluxio_job_master_url": alluxio.job_master_url})
    r = subprocess.run(
        [sys.executable, "-m", "pipectl.components.stage.warm", "--manifest-uri", out.manifest_uri,
         "--outputs-dir", str(tmp_path / "out")],
        env={**os.environ, **settings.step_env()}, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode in (1, 75), r.stderr
    assert "mounted" in r.stderr or "FAILED" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_warm_with_alluxio_unreachable_is_transient_and_unconfigured_is_an_error(ceph_settings, small_digits_dir, tmp_path):
    s3 = s3_client(ceph_settings)
    out = stage(StageInput(source_uri=str(small_digits_dir), bucket=ceph_settings.bucket), s3)
    argv = [sys.executable, "-m", "pipectl.components.stage.warm", "--manifest-uri", out.manifest_uri,
            "--outputs-dir", str(tmp_path / "out")]
    dead = ceph_settings.model_copy(update={"alluxio_proxy_url": "http://127.0.0.1:9", "alluxio_job_master_url": "http://127.0.0.1:9"})
    r = subprocess.run(argv, env={**os.environ, **dead.step_env()}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 75 and "Alluxio unreachable at http://127.0.0.1:9" in r.stderr, r.stderr
    r = subprocess.run(argv, env={**os.environ, **ceph_settings.step_env()}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "PIPECTL_ALLUXIO_PROXY_URL" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
