"""The Ceph fixture is a working S3 endpoint: bucket, small object, 20 MiB multipart object."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest

pytestmark = pytest.mark.integration


def test_small_object_roundtrip(ceph_s3):
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    ceph_s3.create_bucket(Bucket=bucket)
    assert bucket in [b["Name"] for b in ceph_s3.list_buckets()["Buckets"]]
    ceph_s3.put_object(Bucket=bucket, Key="dir/hello.txt", Body=b"hello ceph\n")
    got = ceph_s3.get_object(Bucket=bucket, Key="dir/hello.txt")
    assert got["Body"].read() == b"hello ceph\n"
    keys = [o["Key"] for o in ceph_s3.list_objects_v2(Bucket=bucket, Prefix="dir/")["Contents"]]
    assert keys == ["dir/hello.txt"]
    ceph_s3.delete_object(Bucket=bucket, Key="dir/hello.txt")
    assert ceph_s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def test_multipart_20mib(ceph_s3, tmp_path):
    from boto3.s3.transfer import TransferConfig

    bucket = f"t-{uuid.uuid4().hex[:12]}"
    ceph_s3.create_bucket(Bucket=bucket)
    data = os.urandom(20 * 1024 * 1024)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    cfg = TransferConfig(multipart_threshold=8 * 1024 * 1024, multipart_chunksize=5 * 1024 * 1024)
    ceph_s3.upload_file(str(src), bucket, "big.bin", Config=cfg)
    head = ceph_s3.head_object(Bucket=bucket, Key="big.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-4")  # 4 parts of 5 MiB: really multipart
    dst = tmp_path / "back.bin"
    ceph_s3.download_file(bucket, "big.bin", str(dst), Config=cfg)
    assert hashlib.sha256(dst.read_bytes()).digest() == hashlib.sha256(data).digest()


def test_cluster_healthy(ceph_cluster):
    import json

    status = json.loads(ceph_cluster.ceph("status", "--format", "json"))
    assert status["osdmap"]["num_up_osds"] == 1
    assert status["health"]["status"] in ("HEALTH_OK", "HEALTH_WARN"), status["health"]


def test_cephfs_roundtrip(cephfs_mount, ceph_cluster):
    import json

    data = os.urandom(3 * 1024 * 1024)
    (cephfs_mount / "staged").mkdir()
    (cephfs_mount / "staged" / "part-0.bin").write_bytes(data)
    os.sync()
    assert (cephfs_mount / "staged" / "part-0.bin").read_bytes() == data
    mds = json.loads(ceph_cluster.ceph("mds", "stat", "--format", "json"))
    assert any(i["state"] == "up:active" for i in mds["fsmap"]["filesystems"][0]["mdsmap"]["info"].values())


def test_doctor_measures_the_delayed_ack_stall_of_a_gateway_without_tcp_nodelay(ceph_cluster, ceph_s3, tmp_path):
    """A small request on a kept-alive connection: ~1 ms from an RGW with ``tcp_nodelay=1`` (ok),
    ~40 ms from one with Nagle's algorithm on (doctor warns, naming the frontend option); the same
    stall seen by the steps' own client on a small GET."""
    import statistics
    import time

    from pipectl.components.store_latency import SLOW_MS, small_request_ms, verdict
    from tests.ceph.ceph import CephCluster

    fast = small_request_ms(ceph_cluster.s3_endpoint)
    assert fast < SLOW_MS and verdict(fast)[0] == "ok", fast
    with CephCluster(tmp_path / "nagle", memstore_bytes=1 << 30, tcp_nodelay=False) as slow_ceph:
        slow = small_request_ms(slow_ceph.s3_endpoint)
        status, detail, fix = verdict(slow)
        assert slow >= SLOW_MS and status == "warn" and "tcp_nodelay=1" in fix, (slow, detail)
        s3 = slow_ceph.s3_client()
        s3.create_bucket(Bucket="small")
        s3.put_object(Bucket="small", Key="k", Body=b"x" * 7500)
        s3.get_object(Bucket="small", Key="k")["Body"].read()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            s3.get_object(Bucket="small", Key="k")["Body"].read()
            times.append(1000 * (time.perf_counter() - t0))
        assert statistics.median(times) >= SLOW_MS, times
