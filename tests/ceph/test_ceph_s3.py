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
