"""``pipectl doctor`` against the control plane: ready once argo/ is applied, the template applied
and the store's Secret created; each prerequisite removed in turn is named, with its fix, and
exits 1; put back, ready again."""

from __future__ import annotations

import json

import pytest

from tests.cluster.test_control_plane import _pipectl, project_applied  # noqa: F401 - fixture

NS = "pipectl"
pytestmark = pytest.mark.usefixtures("project_applied")


def _doctor(test_cluster, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, dict]]:
    """`pipectl doctor -o json` (``env``: added to this process's, less ARGO_SERVER unless given)."""
    if env is None:
        r = _pipectl(test_cluster, "doctor", "-n", NS, "-o", "json", *args)
    else:
        import os
        import subprocess

        from tests.cluster.test_control_plane import PIPECTL

        base = {k: v for k, v in os.environ.items() if not k.startswith("ARGO_")}
        r = subprocess.run([str(PIPECTL), "doctor", "-n", NS, "-o", "json", *args], capture_output=True, text=True,
                           timeout=120, env={**base, "KUBECONFIG": str(test_cluster.kubeconfig), **env})
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, {row["check"]: row for row in json.loads(r.stdout)}


def _rendered(kind: str, name: str) -> dict:
    from pipectl.pipelines.manifests import cluster_manifests

    return next(o for objs in cluster_manifests().values() for o in objs if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.fixture(scope="module")
def ready(test_cluster, k8s_api):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    secret = {"metadata": {"name": "pipectl-s3-credentials"},
              "stringData": {"PIPECTL_S3_ACCESS_KEY": "k", "PIPECTL_S3_SECRET_KEY": "s"}}
    try:
        client.CoreV1Api(k8s_api).create_namespaced_secret(NS, secret)
    except ApiException as e:
        if e.status != 409:
            raise


def _delete(test_cluster, obj: dict) -> None:
    from kubernetes import dynamic

    res = dynamic.DynamicClient(test_cluster.api_client()).resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    res.delete(name=obj["metadata"]["name"], namespace=obj["metadata"].get("namespace"))


def test_doctor_says_ready_when_everything_is_there(test_cluster, ready):
    code, rows = _doctor(test_cluster)
    assert code == 0, {k: r for k, r in rows.items() if r["status"] != "ok"}
    for check in ("Kubernetes", "Argo Workflows CRDs", "gang launcher CRDs (volcano)", "PriorityClass", "Queue",
                  "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Role", "ServiceAccount", "ConfigMap",
                  "WorkflowTemplate", "store credentials", "GPU nodes", f"namespace {NS} labels"):
        assert rows[check]["status"] == "ok", rows[check]
    # the store's and MLflow's names in argo/ are cluster-internal: not reachable from here, a warning
    assert rows["object store"]["status"] in ("ok", "warn") and rows["MLflow"]["status"] in ("ok", "warn")


@pytest.mark.parametrize("kind, name, check, fix", [
    ("PriorityClass", "pipectl-batch", "PriorityClass", "argo/cluster"),
    ("Queue", "pipectl-urgent", "Queue", "argo/cluster"),
    ("ValidatingAdmissionPolicy", "pipectl-submission", "ValidatingAdmissionPolicy", "argo/cluster"),
    ("ValidatingAdmissionPolicyBinding", "pipectl-lanes", "ValidatingAdmissionPolicyBinding", "argo/cluster"),
    ("Role", "pipectl-submitter", "Role", "argo/namespace"),
    ("ServiceAccount", "pipectl-launcher", "ServiceAccount", "argo/namespace"),
    ("ConfigMap", "pipectl-store", "ConfigMap", "argo/namespace"),
    ("WorkflowTemplate", "training-v1", "WorkflowTemplate", "pipectl templates apply"),
])
def test_doctor_names_each_missing_object_and_how_to_add_it(test_cluster, ready, kind, name, check, fix):
    obj = _rendered(kind, name)
    # what the fix puts back: a ServiceAccount's token Secret goes with it (the token controller
    # deletes it) and comes back with the same apply
    restore = [obj, _rendered("Secret", f"{name}.service-account-token")] if kind == "ServiceAccount" else [obj]
    _delete(test_cluster, obj)
    try:
        code, rows = _doctor(test_cluster)
        assert code == 1 and rows[check]["status"] == "fail", rows[check]
        assert name in rows[check]["detail"] and fix in rows[check]["fix"], rows[check]
    finally:
        test_cluster.apply(restore, field_manager="pipectl-tests")
    code, rows = _doctor(test_cluster)
    assert code == 0, {k: r for k, r in rows.items() if r["status"] == "fail"}


def test_doctor_names_a_missing_secret_a_relabelled_namespace_and_a_missing_launcher(test_cluster, k8s_api, ready):
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    secret = core.read_namespaced_secret("pipectl-s3-credentials", NS)
    core.delete_namespaced_secret("pipectl-s3-credentials", NS)
    try:
        code, rows = _doctor(test_cluster)
        assert code == 1 and "create secret generic pipectl-s3-credentials" in rows["store credentials"]["fix"]
    finally:
        core.create_namespaced_secret(NS, {"metadata": {"name": "pipectl-s3-credentials"}, "data": secret.data})

    core.patch_namespace(NS, {"metadata": {"labels": {"lanes.pipectl.io/urgent": None}}})
    try:
        code, rows = _doctor(test_cluster)
        assert code == 1 and "lanes.pipectl.io/urgent" in rows[f"namespace {NS} labels"]["detail"]
    finally:
        core.patch_namespace(NS, {"metadata": {"labels": {"lanes.pipectl.io/urgent": "true"}}})

    # this cluster has no Kubeflow training operator
    code, rows = _doctor(test_cluster, "--launcher", "pytorchjob")
    assert code == 1 and "pytorchjobs.kubeflow.org" in rows["gang launcher CRDs (pytorchjob)"]["detail"]
    assert _doctor(test_cluster)[0] == 0


def test_doctor_without_a_cluster_exits_3(tmp_path):
    import os
    import subprocess

    from tests.cluster.test_control_plane import PIPECTL

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n"
                          "contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n")
    r = subprocess.run([str(PIPECTL), "doctor"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "KUBECONFIG": str(kubeconfig)})
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "did not answer" in r.stderr


def test_doctor_warns_when_no_gpu_node_is_reserved_for_the_urgent_lane_and_counts_those_that_are(test_cluster, k8s_api, ready):
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    code, rows = _doctor(test_cluster)
    assert code == 0 and rows["urgent reserve"]["status"] == "warn", rows["urgent reserve"]
    assert "kubectl taint nodes NODE pipectl.io/lane=urgent:NoSchedule" in rows["urgent reserve"]["fix"]
    node = core.list_node(label_selector="type=kwok").items[0]
    taint = {"key": "pipectl.io/lane", "value": "urgent", "effect": "NoSchedule"}
    core.patch_node(node.metadata.name, {"spec": {"taints": [*[t.to_dict() for t in node.spec.taints or []], taint]}})
    try:
        code, rows = _doctor(test_cluster)
        gpus = node.status.allocatable["nvidia.com/gpu"]
        assert rows["urgent reserve"] == {"check": "urgent reserve", "status": "ok", "fix": "",
                                          "detail": f"1 GPU node, {gpus} GPUs only the urgent lane uses"}, rows["urgent reserve"]
        # a cordoned node reserves nothing
        core.patch_node(node.metadata.name, {"spec": {"unschedulable": True}})
        assert _doctor(test_cluster)[1]["urgent reserve"]["status"] == "warn"
    finally:
        core.patch_node(node.metadata.name, {"spec": {"unschedulable": False, "taints": [t.to_dict() for t in node.spec.taints or []] or None}})


def test_doctor_reads_argos_version_from_the_argo_server_or_the_controllers_deployment(test_cluster, k8s_api, ready):
    """Argo Workflows >= 3.6: asked of the Argo Server when ARGO_SERVER is set (the test cluster's
    v4.0.5); without it, read from the image tag of a Deployment labelled app=workflow-controller
    (here one with no replicas naming v3.5.8: fail, with the version and the upgrade); neither: a
    warning (this cluster's controller runs as a process, not a Deployment)."""
    from kubernetes import client

    check = "Argo Workflows version"
    server = test_cluster.argo_server_url.split("://", 1)[1]
    code, rows = _doctor(test_cluster, env={"ARGO_SERVER": server, "ARGO_SECURE": "false"})
    assert code == 0 and rows[check]["status"] == "ok", rows[check]
    assert rows[check]["detail"].startswith("v4.0.5") and f"Argo Server http://{server}" in rows[check]["detail"], rows[check]
    code, rows = _doctor(test_cluster, env={})
    assert code == 0 and rows[check]["status"] == "warn" and "ARGO_SERVER" in rows[check]["fix"], rows[check]

    apps = client.AppsV1Api(k8s_api)
    old = {"metadata": {"name": "workflow-controller", "labels": {"app": "workflow-controller"}},
           "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "workflow-controller"}},
                    "template": {"metadata": {"labels": {"app": "workflow-controller"}},
                                 "spec": {"containers": [{"name": "workflow-controller",
                                                          "image": "quay.io/argoproj/workflow-controller:v3.5.8"}]}}}}
    apps.create_namespaced_deployment(NS, old)
    try:
        code, rows = _doctor(test_cluster, env={})
        assert code == 1 and rows[check]["status"] == "fail", rows[check]
        assert rows[check]["detail"] == f"v3.5.8 (Deployment {NS}/workflow-controller)" and ">= 3.6" in rows[check]["fix"], rows[check]
    finally:
        apps.delete_namespaced_deployment("workflow-controller", NS)
