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


@pytest.mark.parametrize("extra, words", [
    ({"team": "visoin"}, "line 1: team: visoin is not one of the site's teams (known: speech, vision)"),
    ({"team": "speech"}, "line 1: team: speech's namespace is ml-speech (teams:), but namespace: is pipectl; set namespace: ml-speech"),
    ({"team": "speech", "namespace": "ml-vision"}, "line 3: teams: Value error, team vision: namespace ml-vision is the install's own"),
])
def test_a_namespaces_team_must_be_a_declared_team_in_its_namespace(tmp_path, extra, words):
    """``team:`` picks the team's Volcano queues for the namespace's gangs: a team the site does not
    declare (a typo) or another namespace than the team's would put them in queues the namespace may
    not use. Exit 2 naming the key and its line, the known teams and the fix; nothing written."""
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({**extra, "teams": [VISION, SPEECH]}, sort_keys=False))
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 2, (r.returncode, r.stderr)
    said = " ".join(r.stderr.split())
    assert f"site file {site}, {words}" in said, r.stderr
    assert not (tmp_path / "argo").exists()


def test_a_site_file_for_one_of_its_teams_renders_that_teams_namespace_once(tmp_path):
    """``team: vision`` with ``namespace: ml-vision`` among ``teams:``: the render is vision's own
    namespace (not "a team in the install's namespace"); its Namespace, quotas, Role and rules
    ConfigMap are each rendered once across argo/ (kustomize refuses an object twice)."""
    from collections import Counter

    cfg = CompileConfig(team="vision", namespace="ml-vision", teams=[VISION, SPEECH])
    files = cluster_manifests(cfg)
    assert "cluster/namespace.yaml" not in files
    ids = Counter((o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                  for path, objs in files.items() if not path.startswith("autoscaling/") for o in objs)
    assert [k for k, n in ids.items() if n > 1] == []
    for kind, name in (("Namespace", None), ("ResourceQuota", "pipectl-namespace-gpus"), ("LimitRange", "pipectl-defaults"),
                       ("Role", "pipectl-submitter"), ("RoleBinding", "pipectl-submitter"), ("ConfigMap", "pipectl-parameter-rules")):
        assert ids[(kind, None, "ml-vision") if kind == "Namespace" else (kind, "ml-vision", name)] == 1, kind
    assert _team_objects(cfg, "vision")[("Namespace", "ml-vision")]["metadata"]["labels"]["pipectl.io/team"] == "vision"
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"namespace": "ml-vision", "team": "vision", "teams": [VISION, SPEECH]}))
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 0, r.stderr


def test_the_site_names_the_platform_admins_who_may_label_namespaces(tmp_path):
    """``pipectl-namespaces`` as argo/cluster renders it: ``system:masters`` always, plus the site's
    ``admin_groups``/``admin_users``; a group or user that is everyone is refused (exit 2, nothing
    written). What the API server does with it: tests/cluster/test_admission.py."""
    import json

    from pipectl.pipelines.admission import ADMIN_LABELS, TEAM_LABEL

    def policy(cfg: CompileConfig) -> dict:
        docs = cluster_manifests(cfg)["cluster/admission/policies.yaml"]
        return next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "pipectl-namespaces")

    default = policy(CompileConfig())["spec"]
    assert default["matchConditions"][0]["expression"] == '!request.userInfo.groups.exists(g, g in ["system:masters"])'
    assert TEAM_LABEL in ADMIN_LABELS and TEAM_LABEL in json.dumps(default["variables"])
    assert default["matchConstraints"]["resourceRules"][0]["resources"] == ["namespaces"]
    site = policy(CompileConfig(admin_groups=["platform-admins"], admin_users=["system:serviceaccount:argocd:argocd-server"]))
    match = site["spec"]["matchConditions"][0]["expression"]
    assert '["system:masters", "platform-admins"]' in match and '["system:serviceaccount:argocd:argocd-server"]' in match
    assert "group system:masters, platform-admins or user system:serviceaccount:argocd:argocd-server" in site["spec"]["validations"][0]["messageExpression"]
    for text, words in (("admin_groups: [system:authenticated]\n", "system:authenticated: Kubernetes puts every signed-in identity"),
                        ("admin_users: [system:anonymous]\n", "system:anonymous: every anonymous request"),
                        ("admin_groups: ['']\n", "an identity's name, not empty")):
        path = tmp_path / "site.yaml"
        path.write_text(text)
        r = _run("--site", path, "render", "cluster", "--write", tmp_path / "argo")
        assert r.returncode == 2 and words in r.stderr and f"site file {path}, line 1:" in r.stderr, r.stderr
        assert not (tmp_path / "argo").exists()


def test_a_teams_mlflow_secret_holds_the_variables_mlflows_client_reads():
    """The Secret the steps take with envFrom: MLFLOW_TRACKING_USERNAME/PASSWORD, in the team's
    namespace, under the name the templates name (pipectl-mlflow-credentials)."""
    import base64

    from pipectl.components.names import MLFLOW_SECRET
    from pipectl.pipelines.teams import mlflow_credentials_secret

    secret = mlflow_credentials_secret("ml-vision", "vision", "s3cr3t")
    assert (secret["kind"], secret["metadata"]["name"], secret["metadata"]["namespace"]) == ("Secret", MLFLOW_SECRET, "ml-vision")
    assert {k: base64.b64decode(v).decode() for k, v in secret["data"].items()} == {
        "MLFLOW_TRACKING_USERNAME": "vision", "MLFLOW_TRACKING_PASSWORD": "s3cr3t"}


def test_teams_mlflow_user_refuses_an_unknown_team_and_missing_admin_credentials_before_anything(tmp_path):
    """Exit 2 with one line naming what and how to fix it, before MLflow or the cluster is asked
    (no kubeconfig, no server here)."""
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [VISION, SPEECH]}))
    bare = {"MLFLOW_TRACKING_USERNAME": "", "MLFLOW_TRACKING_PASSWORD": ""}
    r = _run("--site", site, "teams", "mlflow-user", "nlp", env={"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "x"})
    assert r.returncode == 2 and "unknown team 'nlp': the site file's teams are speech, vision" in r.stderr, r.stderr
    r = _run("teams", "mlflow-user", "vision", env=bare)
    assert r.returncode == 2 and "the site file declares no teams" in r.stderr, r.stderr
    r = _run("--site", site, "teams", "mlflow-user", "vision", env=bare)
    assert r.returncode == 2 and "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are not both set" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
