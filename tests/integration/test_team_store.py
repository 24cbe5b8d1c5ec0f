"""Each team's key held to its own prefix by the store itself: a real Ceph RGW, two RGW users (as
a platform admin creates them), the bucket policy `pipectl teams store-policy --apply` writes,
and the stage step's code run with each team's key. Pure parts: tests/unit/test_store_policy.py."""

from __future__ import annotations

import json
import uuid

import pytest
from botocore.exceptions import ClientError

from pipectl.components.contracts import StageInput, StoreSettings
from pipectl.components.runtime import StepError, s3_client
from pipectl.components.stage.core import run as stage
from pipectl.pipelines.backends.store_admin import apply_policies
from pipectl.pipelines.store_policy import bucket_policies
from pipectl.pipelines.tenancy import TeamSpec

OWNERS_OWN = {"Sid": "backup-reader", "Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam:::user/pipectl-test"]},
              "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::{bucket}/*"]}


def _user(ceph, uid: str) -> tuple[str, str]:
    key, secret = uuid.uuid4().hex[:20].upper(), uuid.uuid4().hex
    ceph.radosgw_admin("user", "create", "--uid", uid, "--display-name", uid, "--access-key", key, "--secret-key", secret)
    return key, secret


@pytest.fixture(scope="module")
def teams(ceph_cluster):
    """A fresh bucket, two teams with RGW users of their own, pipectl's policy applied (next to
    a statement of the admin's own); yields (bucket, {team: StoreSettings}, owner's client)."""
    bucket, run = f"teams-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    owner = ceph_cluster.s3_client()
    owner.create_bucket(Bucket=bucket)
    own = json.loads(json.dumps(OWNERS_OWN).replace("{bucket}", bucket))
    owner.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Version": "2012-10-17", "Statement": [own]}))
    specs, settings = [], {}
    for name in ("vision", "speech"):
        uid = f"pipectl-{name}-{run}"
        key, secret = _user(ceph_cluster, uid)
        specs.append(TeamSpec(name=name, namespace=f"ml-{name}", groups=[f"{name}-ml"], max_gpus=8, model_prefix=name,
                              s3_prefix=f"s3://{bucket}/teams/{name}/", s3_principal=f"arn:aws:iam:::user/{uid}"))
        settings[name] = StoreSettings(s3_endpoint=ceph_cluster.s3_endpoint, s3_access_key=key, s3_secret_key=secret, bucket=bucket)
    done = apply_policies(owner, bucket_policies(tuple(specs)))
    assert [(a.bucket, a.statements, a.kept) for a in done] == [(bucket, 4, 1)]
    assert json.loads(owner.get_bucket_policy(Bucket=bucket)["Policy"])["Statement"][0] == own
    return bucket, settings, owner


def _keys(s3, bucket: str, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]


def _images(tmp_path, big: bool = False):
    """Two labels of small JPEG-named files (content is what stage hashes), one of 9 MiB with ``big``
    (a multipart upload)."""
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(3):
            (tmp_path / label / f"{i}.jpg").write_bytes(f"{label}{i}".encode() * 100)
    if big:
        (tmp_path / "a" / "big.jpg").write_bytes(uuid.uuid4().bytes * (9 * 2**20 // 16))
    return tmp_path


def test_a_teams_key_stages_under_its_prefix_and_again_copies_nothing(teams, tmp_path):
    bucket, settings, owner = teams
    src = _images(tmp_path, big=True)
    inp = StageInput(source_uri=str(src), bucket=bucket, target_uri=f"s3://{bucket}/teams/vision/")
    first = stage(inp, settings["vision"])
    assert first.dataset_uri.startswith(f"s3://{bucket}/teams/vision/datasets/") and first.copied == 7
    again = stage(inp, settings["vision"])  # a missing key and a present one read right under the policy
    assert (again.dataset_uri, again.copied) == (first.dataset_uri, 0)
    assert len(_keys(owner, bucket, "teams/vision/datasets/")) == 8  # 7 images + the manifest


@pytest.mark.parametrize("where", ["teams/speech/", "", "teams/"])
def test_a_teams_key_is_refused_outside_its_prefix_and_writes_nothing(teams, tmp_path, where):
    bucket, settings, owner = teams
    inp = StageInput(source_uri=str(_images(tmp_path)), bucket=bucket, target_uri=f"s3://{bucket}/{where}")
    with pytest.raises(StepError) as err:
        stage(inp, settings["vision"])
    assert err.value.cli_exit == 2 and "the store refused these credentials" in err.value.headline
    assert f"s3://{bucket}/{where}".rstrip("/") in err.value.headline and "s3_prefix" in err.value.hint
    assert [k for k in _keys(owner, bucket, where) if not k.startswith("teams/vision/")] == []


def test_a_team_reads_nothing_of_anothers(teams, tmp_path):
    bucket, settings, owner = teams
    speech = stage(StageInput(source_uri=str(_images(tmp_path)), bucket=bucket, target_uri=f"s3://{bucket}/teams/speech/"),
                   settings["speech"])
    vision = s3_client(settings["vision"])
    manifest_key = speech.manifest_uri.removeprefix(f"s3://{bucket}/")
    for request in (lambda: vision.get_object(Bucket=bucket, Key=manifest_key),
                    lambda: vision.head_object(Bucket=bucket, Key=manifest_key),
                    lambda: vision.list_objects_v2(Bucket=bucket, Prefix="teams/speech/"),
                    lambda: vision.list_objects_v2(Bucket=bucket),
                    lambda: vision.delete_object(Bucket=bucket, Key=manifest_key),
                    lambda: vision.put_bucket_policy(Bucket=bucket, Policy=json.dumps({"Statement": []}))):
        with pytest.raises(ClientError) as e:
            request()
        assert e.value.response["Error"]["Code"] in ("AccessDenied", "403"), e.value.response
    assert owner.head_object(Bucket=bucket, Key=manifest_key)["ContentLength"] > 0  # still there


def test_a_teams_run_checkpoints_and_resumes_under_its_prefix(teams):
    """The other lookup of an object that may be missing: a run's first attempt asks for its
    checkpoint pointer, which is not there yet (the store answers 403 to a key listed only under a
    prefix); then the checkpoint's multipart upload, and the resume of a second attempt."""
    import torch

    from pipectl.components.contracts import RunLayout
    from pipectl.components.train.checkpoints import resume, save_checkpoint

    bucket, settings, _ = teams
    s3 = s3_client(settings["vision"])
    run_uri = RunLayout.under(f"s3://{bucket}/teams/vision/", f"training-{uuid.uuid4().hex[:5]}").run_uri
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert resume(s3, run_uri, model, optimizer) == (0, None)
    uri = save_checkpoint(s3, run_uri, 7, model, optimizer, part_bytes=5 * 2**20)
    assert resume(s3, run_uri, torch.nn.Linear(4, 2), torch.optim.SGD(model.parameters(), lr=0.1)) == (7, uri)
    other = RunLayout.under(f"s3://{bucket}/teams/speech/", "training-x").run_uri
    with pytest.raises(ClientError):
        resume(s3, other, model, optimizer)  # another team's run: refused, not "no checkpoint"


def test_a_team_pushes_its_images_under_its_prefix_and_is_told_where_it_may_not(teams, tmp_path):
    import os
    import subprocess

    from tests.unit.test_cli_conventions import PIPECTL

    bucket, settings, owner = teams
    vision = settings["vision"]
    env = {**os.environ, "PIPECTL_S3_ENDPOINT": vision.s3_endpoint, "PIPECTL_S3_ACCESS_KEY": vision.s3_access_key,
           "PIPECTL_S3_SECRET_KEY": vision.s3_secret_key, "PIPECTL_BUCKET": bucket}
    src = _images(tmp_path)
    ok = subprocess.run([PIPECTL, "data", "push", str(src), "--to", f"s3://{bucket}/teams/vision/"],
                        capture_output=True, text=True, timeout=300, env=env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().startswith(f"s3://{bucket}/teams/vision/datasets/") and ok.stdout.strip().endswith("/data/")
    refused = subprocess.run([PIPECTL, "data", "push", str(src)], capture_output=True, text=True, timeout=300, env=env)
    assert refused.returncode == 2 and refused.stdout == "", refused.stderr
    assert f"the store refused these credentials at s3://{bucket}/" in refused.stderr and "s3_prefix" in refused.stderr
    assert [k for k in _keys(owner, bucket, "datasets/")] == []


def test_a_wrong_key_is_told_as_a_wrong_key_not_as_a_prefix(teams, tmp_path):
    """A HEAD answers 403 with no body to a key the store does not know as well: the listing that
    decides a 403 names it (InvalidAccessKeyId), and `data push` says to set the credentials (exit 3)."""
    import os
    import subprocess

    from tests.unit.test_cli_conventions import PIPECTL

    bucket, settings, _ = teams
    env = {**os.environ, "PIPECTL_S3_ENDPOINT": settings["vision"].s3_endpoint, "PIPECTL_S3_ACCESS_KEY": "NOSUCHKEY0000",
           "PIPECTL_S3_SECRET_KEY": "wrong", "PIPECTL_BUCKET": bucket}
    r = subprocess.run([PIPECTL, "data", "push", str(_images(tmp_path)), "--to", f"s3://{bucket}/teams/vision/"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 3, r.stderr
    assert "InvalidAccessKeyId" in r.stderr and "PIPECTL_S3_ACCESS_KEY" in r.stderr and "s3_prefix" not in r.stderr


def test_doctor_asks_the_store_with_the_namespaces_key_where_its_runs_write(teams):
    """`pipectl doctor`'s store key row: the team's key lists its own prefix; the same key at the
    other team's prefix, a key the store does not know, a secret that does not match, a missing
    bucket and a store that does not answer are each named."""
    import base64

    from pipectl.pipelines.backends.doctor_store import key_row

    bucket, settings, _ = teams
    vision = settings["vision"]

    def secret(key: str, secret_key: str) -> dict[str, str]:
        return {"PIPECTL_S3_ACCESS_KEY": base64.b64encode(key.encode()).decode(),
                "PIPECTL_S3_SECRET_KEY": base64.b64encode(secret_key.encode()).decode()}

    mine = secret(vision.s3_access_key, vision.s3_secret_key)
    at = vision.s3_endpoint
    ok = key_row(at, mine, f"s3://{bucket}/teams/vision/")
    assert ok.status == "ok" and f"s3://{bucket}/teams/vision/" in ok.detail, ok
    theirs = key_row(at, mine, f"s3://{bucket}/teams/speech/")
    assert theirs.status == "fail" and "may not list" in theirs.detail and "store-policy" in theirs.fix, theirs
    unknown = key_row(at, secret("NOSUCHKEY0000", "x"), f"s3://{bucket}/teams/vision/")
    assert unknown.status == "fail" and "InvalidAccessKeyId" in unknown.detail and "Secret" in unknown.fix, unknown
    mismatched = key_row(at, secret(vision.s3_access_key, "not-the-secret"), f"s3://{bucket}/teams/vision/")
    assert mismatched.status == "fail" and "SignatureDoesNotMatch" in mismatched.detail, mismatched
    missing = key_row(at, mine, f"s3://no-such-{uuid.uuid4().hex[:8]}/")
    assert missing.status == "fail" and "does not exist" in missing.detail, missing
    down = key_row("http://127.0.0.1:9", mine, f"s3://{bucket}/teams/vision/", timeout=2)
    assert down.status == "warn" and "did not answer" in down.detail, down
    assert key_row(at, {}, f"s3://{bucket}/") is None  # no key: the store credentials row says so
