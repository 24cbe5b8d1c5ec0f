"""The site file: one install's settings in one place, rendered into argo/ (the real pipectl
executable of this venv in a subprocess, as a user runs it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.unit.test_cli_conventions import _namespace, _run

def _documented_example() -> str:
    """The site file of the module's own example (what users copy)."""
    from pipectl.pipelines import site

    example = site.__doc__.split("Example::", 1)[1]
    return "\n".join(line[4:] for line in example.splitlines() if not line.strip().startswith("#")).strip() + "\n"


SITE = _documented_example()


def _render(tmp_path: Path, *args: str, env=None) -> dict[str, list[dict]]:
    out = tmp_path / "argo"
    r = _run(*args, "render", "cluster", "--write", out, env=env)
    assert r.returncode == 0, r.stderr
    return {str(f.relative_to(out)): [d for d in yaml.safe_load_all(f.read_text()) if d] for f in out.rglob("*.yaml")}


def _one(files: dict[str, list[dict]], kind: str, name: str) -> dict:
    return next(d for docs in files.values() for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)


def test_site_init_writes_every_setting_whose_defaults_render_argo_as_checked_in(tmp_path):
    r = _run("site", "init", tmp_path / "site.yaml")
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "site.yaml").read_text()
    assert "# The object store's S3 endpoint" in text and "s3_endpoint: http://rook-ceph-rgw-pipectl.rook-ceph.svc:80" in text
    assert "(C0" not in text  # no field-case ids in a file written for users
    checked_in = Path(__file__).resolve().parents[2] / "argo"
    rendered = _render(tmp_path, "--site", tmp_path / "site.yaml")
    for rel, docs in rendered.items():
        assert docs == [d for d in yaml.safe_load_all((checked_in / rel).read_text()) if d], rel
    again = _run("site", "init", tmp_path / "site.yaml")
    assert again.returncode == 2 and "exists" in again.stderr and "--force" in again.stderr


def test_a_site_files_settings_reach_every_object_they_belong_to(tmp_path):
    (tmp_path / "site.yaml").write_text(SITE)
    files = _render(tmp_path, "--site", tmp_path / "site.yaml")
    store = _one(files, "ConfigMap", "pipectl-store")
    assert store["metadata"]["namespace"] == "ml-vision"
    assert store["data"]["PIPECTL_S3_ENDPOINT"] == "https://s3.example.com"
    assert store["data"]["PIPECTL_MLFLOW_URI"] == "https://mlflow.example.com"
    repo = yaml.safe_load(_one(files, "ConfigMap", "artifact-repositories")["data"]["ceph-rgw"])
    assert repo["s3"]["endpoint"] == "s3.example.com" and repo["s3"]["insecure"] is False
    links = yaml.safe_load(_one(files, "ConfigMap", "workflow-controller-configmap")["data"]["links"])
    assert links[0]["url"].startswith("https://mlflow.example.com/#/runs/")
    template = _one(files, "WorkflowTemplate", "training-v1")
    images = {t["container"]["image"] for t in template["spec"]["templates"] if "container" in t}
    assert images and all(i.startswith("registry.example.com/ml/step-") for i in images)
    backoffs = [t["retryStrategy"]["backoff"]["cap"] for t in template["spec"]["templates"] if "backoff" in t.get("retryStrategy", {})]
    assert backoffs and set(backoffs) == {"900s"}
    quota = next(d for docs in files.values() for d in docs if d["kind"] == "ResourceQuota"
                 and d["spec"]["hard"].get("requests.nvidia.com/gpu") == "128")
    assert quota["metadata"]["namespace"] == "ml-vision"
    assert _namespace(_run("--site", tmp_path / "site.yaml", "submit", "training", "--dry-run")) == "ml-vision"


def test_a_command_option_wins_over_the_site_file_and_the_environment_names_the_file(tmp_path):
    (tmp_path / "site.yaml").write_text(SITE)
    env = {"PIPECTL_SITE": str(tmp_path / "site.yaml")}
    r = _run("render", "training", "--registry", "other.example.com/x", env=env)
    assert r.returncode == 0, r.stderr
    assert "other.example.com/x/step-light" in r.stdout and "registry.example.com" not in r.stdout
    assert _namespace(_run("submit", "training", "--dry-run", "-n", "mine", env=env)) == "mine"
    shown = _run("site", "show", env=env)
    assert shown.returncode == 0 and yaml.safe_load(shown.stdout)["s3_endpoint"] == "https://s3.example.com"
    assert str(tmp_path / "site.yaml") in shown.stderr


@pytest.mark.parametrize("text, expected", [
    ("namespace: ml\nbogus: 1\n", "bogus: Extra inputs are not permitted"),
    ("retry:\n  scale_up_s: 5\n", "retry.scale_up_s: Input should be greater than or equal to 30"),
    ("s3_endpoint: s3.example.com\n", "s3_endpoint: String should match pattern"),
    ("s3_endpoint: https://key:secret@s3.example.com\n", "s3_endpoint: String should match pattern"),
    ("namespace: [ml\n", "line 2, column 1 is not valid YAML"),
    ("- namespace\n", "holds a list, not a mapping"),
    ("pipeline_parameters: []\n", "pipeline_parameters is not a site setting"),
    ("fabric:\n  nccl_socket_ifname: eth0 $(reboot)\n", "fabric.nccl_socket_ifname: String should match pattern"),
    ("fabric:\n  nccl_debug: LOUD\n", "fabric.nccl_debug: Input should be 'VERSION', 'WARN', 'INFO' or 'TRACE'"),
    ("fabric:\n  nccl_ib_gid_index: 300\n", "fabric.nccl_ib_gid_index: Input should be less than or equal to 255"),
    ("fabric:\n  rdma:\n    resource: memory\n", "rdma.resource 'memory' is not a device plugin's extended resource"),
    ("fabric:\n  rdma:\n    resource: rdma/hca\n    ipc_lock: true\n", "refused by Pod Security 'restricted'"),
    ("fabric:\n  nccl_ib_disable: true\n  rdma:\n    resource: rdma/hca\n", "nccl_ib_disable: true turns InfiniBand/RoCE off"),
    ("fabric:\n  nccl_ib: mlx5_0\n", "fabric.nccl_ib: Extra inputs are not permitted"),
    ("topology:\n  key: kubernetes.io/hostname\n", "topology: Value error, topology.key kubernetes.io/hostname would put every gang pod on one node"),
])
def test_a_bad_site_file_exits_2_naming_the_file_and_the_key_and_writes_nothing(tmp_path, text, expected):
    site = tmp_path / "site.yaml"
    site.write_text(text)
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert expected in r.stderr and str(site) in r.stderr, r.stderr
    assert "secret" not in r.stderr.replace("Secret", "")
    assert not (tmp_path / "argo").exists()


def test_lint_checks_what_the_site_file_renders(tmp_path):
    (tmp_path / "site.yaml").write_text(SITE)
    r = _run("--site", tmp_path / "site.yaml", "lint")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_site_module_documents_an_example_that_loads():
    from pipectl.pipelines.site import SITE_ENV

    doc = yaml.safe_load(SITE)
    assert doc["namespace"] == "ml-vision" and doc["retry"] == {"scale_up_s": 900}
    assert SITE_ENV == "PIPECTL_SITE"


FABRIC = """\
fabric:
  nccl_socket_ifname: "=eth1"
  nccl_ib_hca: mlx5_0,mlx5_1
  nccl_ib_gid_index: 3
  nccl_debug: WARN
  rdma:
    resource: rdma/rdma_shared_device_a
    count: 2
"""


def test_a_site_fabric_profile_reaches_every_gang_pod_and_nothing_else(tmp_path):
    """The site's fabric settings become the same NCCL/gloo environment and RDMA request in every
    gang pod of the rendered template; the steps' own pods get none of it; no fabric, no change."""
    from tests.unit.test_training_template import _job, _pods

    (tmp_path / "site.yaml").write_text(FABRIC)
    template = _one(_render(tmp_path, "--site", tmp_path / "site.yaml"), "WorkflowTemplate", "training-v1")
    templates = {t["name"]: t for t in template["spec"]["templates"]}
    pods = _pods(_job(template, workers="2"))
    assert pods
    for pod in pods:
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert {k: env.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_DISABLE",
                                         "NCCL_IB_GID_INDEX", "NCCL_DEBUG")} == {
            "NCCL_SOCKET_IFNAME": "=eth1", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_HCA": "mlx5_0,mlx5_1",
            "NCCL_IB_DISABLE": "0", "NCCL_IB_GID_INDEX": "3", "NCCL_DEBUG": "WARN"}
        assert container["resources"]["limits"]["rdma/rdma_shared_device_a"] == 2
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # still restricted
    for name, t in templates.items():
        for c in [t.get("container")] + [s for s in t.get("initContainers") or []]:
            assert c is None or not any(e["name"].startswith("NCCL_") for e in c.get("env") or []), name
    r = _run("--site", tmp_path / "site.yaml", "lint")
    assert r.returncode == 0, r.stdout + r.stderr
    (tmp_path / "plain.yaml").write_text("namespace: pipectl\n")
    plain = _one(_render(tmp_path / "p", "--site", tmp_path / "plain.yaml"), "WorkflowTemplate", "training-v1")
    assert "NCCL_" not in yaml.safe_dump(plain) and "rdma/" not in yaml.safe_dump(plain)


@pytest.mark.parametrize("namespace, words", [
    ("kube-system", "kube-system is Kubernetes' own"), ("kube-public", "kube-public is Kubernetes' own"),
    ("default", "default is Kubernetes' own"), ("argo", "argo is Argo's controller's own"),
    ("volcano-system", "volcano-system is Volcano's own"), ("volcano-monitoring", "volcano-monitoring is Volcano's own"),
    ("ML_Vision", "'ML_Vision' is not a namespace name"),
])
def test_the_install_is_never_rendered_into_a_system_namespace(tmp_path, namespace, words):
    """Its namespace is labelled restricted and given GPU quotas and a LimitRange: in kube-system or
    Argo's namespace that would refuse the cluster's own pods. Exit 2 naming the file, the key's line
    and the fix; nothing written."""
    site = tmp_path / "site.yaml"
    site.write_text(f"# our cluster\nregistry: registry.example.com/ml\nnamespace: {namespace}\n")
    r = _run("--site", site, "render", "cluster", "--write", tmp_path / "argo")
    assert r.returncode == 2, (r.returncode, r.stderr)
    said = " ".join(r.stderr.split())
    assert f"site file {site}, line 3: namespace:" in said and words in said, r.stderr
    if namespace != "ML_Vision":
        assert "Give pipectl a namespace of its own" in said, r.stderr
    assert not (tmp_path / "argo").exists()


def test_a_system_namespace_given_as_an_option_is_refused_as_the_options(tmp_path):
    r = _run("templates", "apply", "--dry-run", "-n", "kube-system")
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "option: namespace:" in r.stderr and "kube-system is Kubernetes' own" in r.stderr, r.stderr
    assert r.stdout == ""
