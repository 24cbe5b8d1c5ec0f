"""Teams of the site file rendered into argo/cluster/teams/ (pure), and the site files refused
(the real pipectl executable: exit 2, nothing written). What the API server does with the
objects: tests/cluster/test_admission.py."""

from __future__ import annotations

import pytest
import yaml

from pipectl.pipelines import tenancy
from pipectl.pipelines.admission import DATA_PREFIX_ANNOTATION, MODEL_PREFIX_LABEL, submission_policy
from pipectl.pipelines.manifests import cluster_manifests
from pipectl.pipelines.training import CompileConfig
from tests.unit.test_cli_conventions import _run


def _documented_teams() -> dict:
    """The ``teams:`` example of the tenancy module (what users copy)."""
    example = tenancy.__doc__.split("Example (in the site file)::", 1)[1]
    return yaml.safe_load("\n".join(line[4:] for line in example.splitlines()))


VISION = _documented_teams()["teams"][0]
SPEECH = {"name": "speech", "namespace": "ml-speech", "groups": ["speech-ml"], "max_gpus": 16,
          "model_prefix": "speech", "s3_prefix": "s3://pipectl/teams/speech/"}


def _team_objects(cfg: CompileConfig, name: str) -> dict[tuple[str, str], dict]:
    objs = cluster_manifests(cfg)[f"cluster/teams/{name}.yaml"]
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def test_each_team_gets_its_namespace_quotas_lanes_prefixes_and_submitters():
    cfg = CompileConfig(teams=[VISION, SPEECH])
    vision = _team_objects(cfg, "vision")
    assert {o["metadata"].get("namespace") for k, o in vision.items() if k[0] not in ("Namespace", "Queue")} == {"ml-vision"}
    ns = vision[("Namespace", "ml-vision")]["metadata"]
    assert ns["labels"][MODEL_PREFIX_LABEL] == "vision" and ns["labels"]["lanes.pipectl.io/urgent"] == "true"
    assert ns["labels"]["pipectl.io/submission-policy"] == "enforce"
    assert ns["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ns["annotations"] == {DATA_PREFIX_ANNOTATION: "s3://pipectl/teams/vision/"}
    assert vision[("ResourceQuota", "pipectl-namespace-gpus")]["spec"]["hard"] == {"requests.nvidia.com/gpu": "32"}
    urgent = vision[("ResourceQuota", "pipectl-lane-urgent")]["spec"]
    assert urgent["hard"] == {"requests.nvidia.com/gpu": "8"}
    assert urgent["scopeSelector"]["matchExpressions"][0]["values"] == ["pipectl-urgent"]
    assert vision[("ResourceQuota", "pipectl-lane-batch")]["spec"]["hard"] == {"requests.nvidia.com/gpu": "16"}
    assert ("LimitRange", "pipectl-defaults") in vision and ("ConfigMap", "pipectl-parameter-rules") in vision
    binding = vision[("RoleBinding", "pipectl-submitter")]
    assert binding["roleRef"]["name"] == "pipectl-submitter" and vision[("Role", "pipectl-submitter")]
    assert [s["name"] for s in binding["subjects"]] == ["vision-ml"]
    speech = _team_objects(cfg, "speech")
    labels = speech[("Namespace", "ml-speech")]["metadata"]["labels"]
    assert not any(k.startswith("lanes.pipectl.io/") for k in labels)  # urgent not listed: not granted
    assert not any(k[1].startswith("pipectl-lane-") for k in speech)


def test_no_teams_render_no_team_files():
    assert not any(p.startswith("cluster/teams/") for p in cluster_manifests(CompileConfig()))


def test_the_submission_policy_holds_dataset_uris_to_the_namespaces_data_prefix():
    policy = submission_policy()[0]
    rules = [v for v in policy["spec"]["validations"] if DATA_PREFIX_ANNOTATION in v["expression"]]
    assert len(rules) == 1 and "variables.datasetUri.startsWith" in rules[0]["expression"]
    assert {"datasetUri", "annotations"} <= {v["name"] for v in policy["spec"]["variables"]}


@pytest.mark.parametrize("change, words", [
    ({"namespace": "ml-vision"}, "teams vision and speech: both name namespace ml-vision"),
    ({"name": "vision"}, "teams vision and vision: two teams with one name"),
    ({"model_prefix": "vision-x"}, "model prefixes vision and vision-x overlap"),
    ({"s3_prefix": "s3://pipectl/teams/"}, "S3 prefixes s3://pipectl/teams/vision/ and s3://pipectl/teams/ overlap"),
    ({"namespace": "pipectl"}, "team speech: namespace pipectl is the install's own"),
    ({"namespace": "kube-system"}, "team speech: namespace kube-system is Kubernetes' own"),
    ({"namespace": "default"}, "team speech: namespace default is Kubernetes' own"),
    ({"namespace": "volcano-system"}, "team speech: namespace volcano-system is Volcano's own"),
    ({"namespace": "argo"}, "team speech: namespace argo is Argo's controller's own"),
    ({"max_gpus": 65}, "team speech: max_gpus 65 is over the cluster's 64 GPUs"),
    ({"lane_gpus": {"urgent": 17}}, "team speech: lane_gpus.urgent 17 is over the team's max_gpus 16"),
    ({"s3_prefix": "s3://pipectl/teams/speech"}, "s3_prefix: String should match pattern"),
    ({"groups": []}, "groups: Tuple should have at least 1 item"),
    ({"groups": ["speech-ml", "system:authenticated"]}, "system:authenticated: Kubernetes puts every signed-in identity"),
    ({"groups": ["system:serviceaccounts"]}, "system:serviceaccounts: Kubernetes puts every ServiceAccount"),
    ({"groups": [""]}, "'': a group name, not empty"),
    # a negative quota the API server refuses (kubectl apply stops half way); a boolean is no 1 GPU
    ({"lane_gpus": {"standard": -1}}, "lane_gpus.standard: Input should be greater than or equal to 0"),
    ({"lane_gpus": {"batch": True}}, "lane_gpus: Value error, a number of GPUs per lane, not true or false"),
    ({"max_gpus": True}, "max_gpus: Value error, a number of GPUs, not true or false"),
])
def test_a_team_that_takes_anothers_namespace_prefix_or_more_than_the_cluster_exits_2_and_writes_nothing(tmp_path, change, words):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [VISION, {**SPEECH, **change}]}))
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert words in r.stderr and str(site) in r.stderr and "teams" in r.stderr, r.stderr
    assert not (tmp_path / "argo").exists()


def test_the_clusters_gpus_come_from_the_site_else_the_gpu_node_pools():
    assert CompileConfig(cluster_gpus=200, teams=[{**SPEECH, "max_gpus": 200}]).teams[0].max_gpus == 200
    assert tenancy.cluster_gpu_ceiling(None, CompileConfig().autoscaling) == 64
    pools = CompileConfig().autoscaling.node_pools
    unbounded = CompileConfig().autoscaling.model_copy(update={"node_pools": tuple(
        p.model_copy(update={"limit_gpus": None}) for p in pools)})
    assert tenancy.cluster_gpu_ceiling(None, unbounded) is None


def test_a_site_file_with_teams_renders_a_file_per_team_in_the_cluster_kustomization(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [VISION, SPEECH]}))
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 0, r.stderr
    kustomization = yaml.safe_load((tmp_path / "argo" / "cluster" / "kustomization.yaml").read_text())
    assert {"teams/vision.yaml", "teams/speech.yaml"} <= set(kustomization["resources"])
    lint = _run("--site", site, "lint")
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_team_removed_from_the_site_file_loses_its_rendered_file_and_nothing_else(tmp_path):
    """The real pipectl, as an admin runs it: a render after a team left the site file removes the
    team file an earlier render wrote, and keeps a file of the admin's own in the same folder."""
    from pathlib import Path

    def site(*names: str) -> Path:
        teams = [{"name": n, "namespace": f"ml-{n}", "groups": [f"{n}-ml"], "max_gpus": 8, "model_prefix": n,
                  "s3_prefix": f"s3://pipectl/teams/{n}/"} for n in names]
        path = tmp_path / f"site-{len(names)}.yaml"
        path.write_text(yaml.safe_dump({"teams": teams}))
        return path

    out = tmp_path / "argo"
    r = _run("--site", site("vision", "speech"), "render", "cluster", "--write", out)
    assert r.returncode == 0, r.stderr
    own = out / "cluster" / "teams" / "admin-notes.yaml"
    own.write_text("# the admin's own objects\n")
    assert (out / "cluster/teams/speech.yaml").exists()
    r = _run("--site", site("vision"), "render", "cluster", "--write", out)
    assert r.returncode == 0, r.stderr
    said = "".join(r.stderr.split())
    assert not (out / "cluster/teams/speech.yaml").exists() and f"removed{out / 'cluster/teams/speech.yaml'}:" in said, r.stderr
    assert (out / "cluster/teams/vision.yaml").exists() and own.read_text() == "# the admin's own objects\n"
    assert "teams/speech.yaml" not in (out / "cluster/kustomization.yaml").read_text()
