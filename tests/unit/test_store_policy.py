"""Each team's store key held to its own prefix: the bucket policy pipectl renders (pure), the
`teams store-policy` command without a store, and a team's namespace keeping every object its
runs write under the team's prefix. The store enforcing the policy: tests/integration/test_team_store.py."""

from __future__ import annotations

import json

import pytest
import yaml

from pipectl.pipelines.builtin import build_training
from pipectl.pipelines.manifests import config_maps
from pipectl.pipelines.store_policy import SID_PREFIX, bucket_policies, merged_policy, team_statements
from pipectl.pipelines.tenancy import TeamSpec
from pipectl.pipelines.training import CompileConfig
from tests.unit.test_cli_conventions import _run
from tests.unit.test_teams import SPEECH, VISION

SPEECH_USER = {**SPEECH, "s3_principal": "arn:aws:iam:::user/pipectl-speech"}


def _resources(statements: list[dict], principal: str) -> set[str]:
    return {r for s in statements if s["Principal"]["AWS"] == [principal] for r in s["Resource"]}


def test_each_teams_key_is_granted_its_own_prefix_and_nothing_else():
    policies = bucket_policies((TeamSpec(**VISION), TeamSpec(**SPEECH_USER)))
    assert list(policies) == ["pipectl"]
    statements = policies["pipectl"]
    assert all(s["Effect"] == "Allow" and s["Sid"].startswith(SID_PREFIX) for s in statements)
    assert _resources(statements, VISION["s3_principal"]) == {"arn:aws:s3:::pipectl/teams/vision/*", "arn:aws:s3:::pipectl"}
    assert _resources(statements, SPEECH_USER["s3_principal"]) == {"arn:aws:s3:::pipectl/teams/speech/*", "arn:aws:s3:::pipectl"}
    # the bucket itself only for listing, and only keys under the team's prefix
    (listing,) = [s for s in statements if s["Sid"] == f"{SID_PREFIX}vision-list"]
    assert listing["Action"] == ["s3:ListBucket"]
    assert listing["Condition"] == {"StringLike": {"s3:prefix": ["teams/vision/*"]}}
    objects = next(s for s in statements if s["Sid"] == f"{SID_PREFIX}vision-objects")
    assert "s3:PutBucketPolicy" not in objects["Action"] and "s3:PutObject" in objects["Action"]


def test_teams_in_two_buckets_get_a_policy_each():
    other = {**SPEECH_USER, "s3_prefix": "s3://speech-data/"}
    policies = bucket_policies((TeamSpec(**VISION), TeamSpec(**other)))
    assert sorted(policies) == ["pipectl", "speech-data"]
    assert _resources(policies["speech-data"], other["s3_principal"]) == {"arn:aws:s3:::speech-data/*", "arn:aws:s3:::speech-data"}


def test_a_merged_policy_keeps_the_admins_own_statements_and_drops_a_removed_teams():
    own = {"Sid": "backup-reader", "Effect": "Allow", "Principal": {"AWS": ["arn:aws:iam:::user/backup"]},
           "Action": ["s3:GetObject"], "Resource": ["arn:aws:s3:::pipectl/*"]}
    gone = {**team_statements(TeamSpec(**SPEECH_USER))[0]}
    vision = team_statements(TeamSpec(**VISION))
    merged = merged_policy({"Version": "2012-10-17", "Statement": [own, gone]}, vision)
    assert merged["Statement"] == [own, *vision]
    assert merged_policy(None, vision) == {"Version": "2012-10-17", "Statement": vision}


def test_a_team_without_a_store_identity_has_no_policy():
    with pytest.raises(ValueError, match="team speech has no s3_principal"):
        bucket_policies((TeamSpec(**VISION), TeamSpec(**SPEECH)))


@pytest.mark.parametrize("principal", ["pipectl-speech", "arn:aws:s3:::pipectl", "arn:aws:iam:::group/x", "arn:aws:iam:::user/a b"])
def test_a_store_identity_is_a_user_or_role_arn(principal):
    with pytest.raises(ValueError, match="s3_principal"):
        TeamSpec(**{**SPEECH, "s3_principal": principal})


def test_store_policy_prints_one_policy_per_bucket_and_refuses_a_team_without_an_identity(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [VISION, SPEECH_USER]}))
    r = _run("--site", site, "teams", "store-policy")
    assert r.returncode == 0, r.stderr
    header, body = r.stdout.split("\n", 1)
    assert header == "# bucket pipectl"
    assert json.loads(body) == merged_policy(None, bucket_policies((TeamSpec(**VISION), TeamSpec(**SPEECH_USER)))["pipectl"])
    site.write_text(yaml.safe_dump({"teams": [VISION, SPEECH]}))
    r = _run("--site", site, "teams", "store-policy", "--apply", env={"PIPECTL_S3_ENDPOINT": "http://127.0.0.1:9"})
    assert r.returncode == 2 and "team speech has no s3_principal" in r.stderr, r.stderr


def test_two_teams_with_one_store_identity_are_refused(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [VISION, {**SPEECH, "s3_principal": VISION["s3_principal"]}]}))
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 2 and "teams vision and speech: both name store identity" in r.stderr, r.stderr
    assert not (tmp_path / "argo").exists()


def _args(template: dict) -> list[str]:
    return template["container"]["args"]


def test_a_teams_namespace_stages_runs_and_logs_under_the_teams_prefix():
    cfg = CompileConfig(team="vision", namespace="ml-vision", teams=[VISION, SPEECH_USER])
    templates = {t["name"]: t for t in build_training(cfg).to_dict()["spec"]["templates"]}
    stage = _args(templates["stage"])
    assert stage[stage.index("--target-uri") + 1] == "s3://pipectl/teams/vision/"
    text = json.dumps(templates)
    assert "s3://pipectl/teams/vision/runs/{{workflow.name}}" in text
    assert "s3://pipectl/runs/" not in text
    (repo,) = [c for c in config_maps(cfg) if c["metadata"]["name"] == "artifact-repositories"]
    s3 = yaml.safe_load(repo["data"]["ceph-rgw"])["s3"]
    assert (s3["bucket"], s3["keyFormat"]) == ("pipectl", "teams/vision/logs/{{workflow.name}}/{{pod.name}}")
    # pipectl's own namespace: the bucket's root, as before
    plain = {t["name"]: t for t in build_training(CompileConfig()).to_dict()["spec"]["templates"]}
    assert "--target-uri" not in _args(plain["stage"]) and "s3://pipectl/runs/{{workflow.name}}" in json.dumps(plain)
