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


VOLCANO_CRDS = ("jobs.batch.volcano.sh", "queues.scheduling.volcano.sh", "podgroups.scheduling.volcano.sh")
WORKFLOW_CRD = "workflows.argoproj.io"


def _crd_doc(name: str) -> dict:
    """The CRD ``name`` as the test cluster installed it (the Go modules' files, tests/harness/binaries.py)."""
    import yaml

    from tests.cluster.cluster import crd_files

    for module in ("argo", "volcano"):
        for f in crd_files(module):
            for doc in yaml.safe_load_all(f.read_text()):
                if doc and doc.get("kind") == "CustomResourceDefinition" and doc["metadata"]["name"] == name:
                    return doc
    raise AssertionError(f"no CRD file defines {name}")


def _delete_crds(test_cluster, k8s_api, names: tuple[str, ...]) -> None:
    """Delete the CRDs and wait until they are gone: the API server deletes every object of theirs
    first, so finalizers still held on one (a controller that no longer sees its kind will not
    remove them) are dropped meanwhile."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext, custom = client.ApiextensionsV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    crds = {n: ext.read_custom_resource_definition(n) for n in names}
    for n in names:
        ext.delete_custom_resource_definition(n)

    def gone() -> bool:
        left = {c.metadata.name for c in ext.list_custom_resource_definition().items} & set(names)
        for n in left:
            spec = crds[n].spec
            version = next(v.name for v in spec.versions if v.storage)
            try:
                items = custom.list_cluster_custom_object(spec.group, version, spec.names.plural)["items"]
                for o in items:
                    if o["metadata"].get("finalizers"):
                        ns = o["metadata"].get("namespace")
                        patch = {"metadata": {"finalizers": None}}
                        if ns:
                            custom.patch_namespaced_custom_object(spec.group, version, ns, spec.names.plural,
                                                                  o["metadata"]["name"], patch)
                        else:
                            custom.patch_cluster_custom_object(spec.group, version, spec.names.plural,
                                                               o["metadata"]["name"], patch)
            except ApiException as e:
                if e.status != 404:
                    raise
        return not left
    test_cluster.wait_for(f"CRDs {', '.join(names)} deleted", gone, timeout_s=180, interval_s=1)


def _restore_crds(test_cluster, k8s_api, names: tuple[str, ...]) -> None:
    """Create the CRDs again from the files the cluster was started with and wait until each is
    Established and served."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(k8s_api)
    have = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    missing = [n for n in names if n not in have]
    if missing:
        test_cluster.apply([_crd_doc(n) for n in missing], field_manager="pipectl-tests")

    def established() -> bool:
        for n in names:
            conds = {c.type: c.status for c in (ext.read_custom_resource_definition(n).status.conditions or [])}
            if conds.get("Established") != "True":
                return False
        return True
    test_cluster.wait_for(f"CRDs {', '.join(names)} established", established, timeout_s=120, interval_s=0.5)


def _wait_queues_settled(test_cluster, custom) -> None:
    """Volcano's controller, its watch on Queues broken by the CRD's deletion, catches up on the
    Queues put back (status Open); wait until it has and they stop changing, so that a later test
    comparing their resourceVersions sees a cluster at rest."""
    if test_cluster.procs.get("vc-controller-manager") is None or test_cluster.procs["vc-controller-manager"].poll() is not None:
        return
    last: dict = {}

    def settled() -> bool:
        items = custom.list_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues")["items"]
        now = {q["metadata"]["name"]: q["metadata"]["resourceVersion"] for q in items}
        opened = all(q.get("status", {}).get("state") == "Open" for q in items)
        done = opened and now == last
        last.clear()
        last.update(now)
        return done
    test_cluster.wait_for("Queues Open and unchanged for 5 s", settled, timeout_s=180, interval_s=5)


@pytest.mark.session_last  # deletes CRDs every other test uses; puts them back, but not the objects of theirs it took
def test_doctor_names_missing_volcano_and_argo_crds_and_how_to_install_them(test_cluster, k8s_api, ready):
    """Volcano's job, queue and PodGroup CRDs deleted: doctor names each, says to install the
    launcher's operator, exits 1; then Argo's Workflow CRD deleted: named, with the Argo install.
    Each put back (with the Queues the cluster had: Volcano's own and argo/'s) before the next,
    so whatever runs after this finds them; the rows that failed before failing no more than
    they did (this runs last, so it does not assume everything else left the cluster ready)."""
    from kubernetes import client

    custom = client.CustomObjectsApi(k8s_api)
    before_code, before = _doctor(test_cluster)
    assert before["Argo Workflows CRDs"]["status"] == "ok" and before["gang launcher CRDs (volcano)"]["status"] == "ok", before
    failing_before = {k for k, r in before.items() if r["status"] == "fail"}
    queues = [{"apiVersion": q["apiVersion"], "kind": q["kind"],
               "metadata": {k: v for k, v in q["metadata"].items() if k in ("name", "labels", "annotations")},
               "spec": q.get("spec", {})}
              for q in custom.list_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues")["items"]]
    assert {"default", "pipectl-urgent"} <= {q["metadata"]["name"] for q in queues}

    _delete_crds(test_cluster, k8s_api, VOLCANO_CRDS)
    try:
        code, rows = _doctor(test_cluster)
        row = rows["gang launcher CRDs (volcano)"]
        assert code == 1 and row["status"] == "fail", row
        assert all(n in row["detail"] for n in VOLCANO_CRDS), row
        assert "install the volcano launcher's operator" in row["fix"], row
        assert rows["Argo Workflows CRDs"]["status"] == "ok", rows["Argo Workflows CRDs"]
    finally:
        _restore_crds(test_cluster, k8s_api, VOLCANO_CRDS)
        test_cluster.wait_for("Queues put back", lambda: test_cluster.apply(queues, field_manager="pipectl-tests"),
                              timeout_s=60, interval_s=1)
        _wait_queues_settled(test_cluster, custom)
    code, rows = _doctor(test_cluster)
    assert rows["gang launcher CRDs (volcano)"]["status"] == "ok", rows["gang launcher CRDs (volcano)"]
    assert {k for k, r in rows.items() if r["status"] == "fail"} <= failing_before, rows

    _delete_crds(test_cluster, k8s_api, (WORKFLOW_CRD,))
    try:
        code, rows = _doctor(test_cluster)
        row = rows["Argo Workflows CRDs"]
        assert code == 1 and row["status"] == "fail", row
        assert row["detail"] == f"missing: {WORKFLOW_CRD}" and "install Argo Workflows (>= 3.6" in row["fix"], row
        assert rows["gang launcher CRDs (volcano)"]["status"] == "ok", rows["gang launcher CRDs (volcano)"]
    finally:
        _restore_crds(test_cluster, k8s_api, (WORKFLOW_CRD,))
    code, rows = _doctor(test_cluster)
    assert rows["Argo Workflows CRDs"]["status"] == "ok", rows["Argo Workflows CRDs"]
    assert {k for k, r in rows.items() if r["status"] == "fail"} <= failing_before, rows
    assert (code == 0) == (before_code == 0), rows
