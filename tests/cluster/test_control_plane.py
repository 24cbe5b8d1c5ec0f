"""The project's manifests and workflows on a real API server and a real Argo controller.

Pods never run: KWOK moves them Pending -> Running -> Succeeded (or Failed, for a pod annotated
``pipectl.io/fail``), and the cluster's argoexec stand-in reports each ended pod's
WorkflowTaskResult, as Argo's `wait` container would (with step outputs a test supplies), and runs
resource templates as argoexec would. See tests/cluster/cluster.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from pipectl.components.names import WORKFLOW_LABEL
from pipectl.pipelines.launchers.base import JOB_NAME
from pipectl.pipelines.manifests import TEMPLATE_FILE
from tests.cluster.cluster import NODE_CAPACITY

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
ARGO_DIR = REPO / "argo"
# controller/ (namespace argo), monitoring/ (needs prometheus-operator CRDs) and volcano/ (namespace
# volcano-system; the test cluster's vc-scheduler reads that file's configuration directly) are not applied,
# nor autoscaling/ (Karpenter's NodePools: tests/cluster/test_autoscaler.py applies them for the KWOK provider).
EXCLUDED_DIRS = {"controller", "monitoring", "volcano", "autoscaling"}
PIPECTL = REPO / ".venv" / "bin" / "pipectl"
TEST_NS = "cluster-test"
NODE_GPUS = NODE_CAPACITY["nvidia.com/gpu"]
# Cluster-scoped and namespace objects first, as `kubectl apply` users order them.
KIND_ORDER = {"Namespace": 0, "PriorityClass": 1, "ResourceQuota": 2, "ServiceAccount": 2, "Role": 3,
              "RoleBinding": 4, "ConfigMap": 5, "Queue": 6, "WorkflowTemplate": 7}


def _project_manifests() -> list[tuple[Path, dict]]:
    docs = []
    for f in sorted(ARGO_DIR.rglob("*.yaml")):
        rel = f.relative_to(ARGO_DIR)
        if set(rel.parts) & EXCLUDED_DIRS or f.name == "kustomization.yaml":
            continue
        docs.extend((rel, d) for d in yaml.safe_load_all(f.read_text()) if d)
    return sorted(docs, key=lambda x: KIND_ORDER.get(x[1]["kind"], 99))


def _last_json(text: str):
    """The last JSON document `pipectl … -o json` printed (pretty-printed, as kubectl -o json)."""
    dec, i, last = json.JSONDecoder(), 0, None
    while (j := text.find("{", i)) >= 0:
        last, i = dec.raw_decode(text, j)
    return last


def _custom(api):
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _delete_workflow(custom, name: str, ns: str = "pipectl") -> None:
    """Delete a test's workflow; already gone (404: its TTL or the garbage collector) is fine."""
    from kubernetes import client

    try:
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", name)
    except client.ApiException as e:
        if e.status != 404:
            raise


def _wait_phase(api, ns: str, name: str, phases: set[str], timeout_s: float = 90.0) -> dict:
    custom = _custom(api)
    deadline = time.monotonic() + timeout_s
    wf: dict = {}
    while time.monotonic() < deadline:
        wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", name)
        if wf.get("status", {}).get("phase") in phases:
            return wf
        time.sleep(0.5)
    raise AssertionError(f"workflow {ns}/{name} not in {phases} within {timeout_s}s; "
                         f"status: {wf.get('status')}")


@pytest.fixture(scope="session")
def project_applied(test_cluster):
    """Everything under argo/ except controller/ and monitoring/, server-side applied."""
    docs = _project_manifests()
    applied = test_cluster.apply([d for _, d in docs], field_manager="pipectl-tests")
    return docs, applied


@pytest.fixture(scope="session")
def test_namespace(test_cluster, k8s_api):
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": TEST_NS}})
    # kube-controller-manager creates the namespace's default ServiceAccount; pods need it.
    test_cluster.wait_for("default ServiceAccount in " + TEST_NS,
                          lambda: core.read_namespaced_service_account("default", TEST_NS))
    return TEST_NS


def test_cluster_started_every_component(test_cluster):
    print("bring-up: ready at (s since start):", test_cluster.timings,
          "start-to-ready per component (s):", test_cluster.durations,
          "optional failures:", test_cluster.errors)
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "workflow-controller", "kwok", "argoexec-stand-in"):
        assert test_cluster.procs[name].poll() is None, f"{name} is not running"
    assert test_cluster.kubeconfig.exists()


def test_fake_nodes_advertise_gpus(k8s_api, test_cluster):
    from kubernetes import client

    nodes = client.CoreV1Api(k8s_api).list_node(label_selector="type=kwok").items
    assert len(nodes) == test_cluster.nodes
    for n in nodes:
        assert n.status.allocatable["nvidia.com/gpu"] == "8"
        assert n.status.allocatable["cpu"] == "32"
        assert n.status.allocatable["memory"] == "256Gi"
        assert any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)


def test_project_manifests_accepted(project_applied, test_cluster, k8s_api):
    docs, applied = project_applied
    assert len(applied) == len(docs) > 0
    kinds = {d["kind"] for _, d in docs}
    assert {"Namespace", "PriorityClass", "WorkflowTemplate", "CronWorkflow"} <= kinds
    from kubernetes.dynamic import DynamicClient

    dyn = DynamicClient(k8s_api)
    for (rel, doc), obj in zip(docs, applied):
        assert obj["metadata"]["uid"], f"{rel}: {doc['kind']} {doc['metadata']['name']}"
        res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        got = res.get(name=doc["metadata"]["name"],
                      namespace=doc["metadata"].get("namespace") if res.namespaced else None)
        assert got.metadata.uid == obj["metadata"]["uid"]
    # Applying again changes nothing (idempotent, as `kubectl apply --server-side` is).
    again = test_cluster.apply([d for _, d in docs], field_manager="pipectl-tests")
    # (controllers write status, e.g. Volcano's queue state, the quota controller's usage, and the
    # token controller fills a ServiceAccount's token Secret whenever it gets to it: compare spec
    # generations where the kind has them, else the spec, else what the manifest sets of a token
    # Secret, else resource versions)
    def version(o):
        if o.get("type") == "kubernetes.io/service-account-token":
            return json.dumps([o["type"], o["metadata"]["annotations"]["kubernetes.io/service-account.name"]])
        return o["metadata"].get("generation") or (json.dumps(o["spec"], sort_keys=True) if "spec" in o else o["metadata"]["resourceVersion"])

    assert [version(o) for o in again] == [version(o) for o in applied]


def test_crd_schema_validation_is_real(test_cluster, k8s_api, test_namespace):
    """The full Argo CRDs reject a malformed Workflow: the acceptance above means something."""
    from kubernetes import client

    bad = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
           "metadata": {"generateName": "bad-", "namespace": test_namespace},
           "spec": {"entrypoint": "main", "templates": "not-a-list"}}
    with pytest.raises(client.ApiException) as e:
        _custom(k8s_api).create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", test_namespace, "workflows", bad)
    assert e.value.status == 422, e.value.body
    assert "templates" in e.value.body


def test_submit_dry_run_workflow_accepted(project_applied, k8s_api):
    out = subprocess.run([str(PIPECTL), "submit", "training", "--dry-run"], capture_output=True,
                         text=True, timeout=120, check=False, cwd=REPO)
    assert out.returncode == 0, out.stderr
    wf = yaml.safe_load(out.stdout)
    assert wf["kind"] == "Workflow"
    ns = wf["metadata"].get("namespace", "pipectl")
    custom = _custom(k8s_api)
    created = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows",
                                                     wf)
    name = created["metadata"]["name"]
    try:
        assert created["metadata"]["uid"]
        assert created["spec"]["workflowTemplateRef"]["name"] == wf["spec"]["workflowTemplateRef"]["name"]
        got = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", name)
        assert got["metadata"]["uid"] == created["metadata"]["uid"]
    finally:
        # The training template's steps declare outputs KWOK cannot produce: do not leave it
        # running on the shared session cluster.
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", name)


def _tiny_workflow(ns: str, prefix: str, annotations: dict | None = None) -> dict:
    tmpl: dict = {
        "name": "main",
        "container": {"image": "busybox:1.36", "imagePullPolicy": "Never",
                      "command": ["sh", "-c", "echo hello"]},
    }
    if annotations:
        tmpl["metadata"] = {"annotations": annotations}
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": prefix, "namespace": ns},
        "spec": {"entrypoint": "main", "templates": [tmpl]},
    }


def test_tiny_workflow_succeeds(k8s_api, test_namespace):
    custom = _custom(k8s_api)
    t0 = time.monotonic()
    wf = custom.create_namespaced_custom_object(
        "argoproj.io", "v1alpha1", test_namespace, "workflows",
        _tiny_workflow(test_namespace, "kwok-ok-"))
    done = _wait_phase(k8s_api, test_namespace, wf["metadata"]["name"],
                       {"Succeeded", "Failed", "Error"})
    print(f"tiny workflow {done['status']['phase']} after {time.monotonic() - t0:.1f}s")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    pods = [n for n in done["status"]["nodes"].values() if n["type"] == "Pod"]
    assert len(pods) == 1 and pods[0]["phase"] == "Succeeded"
    assert pods[0]["hostNodeName"].startswith("kwok-node-")
    assert pods[0].get("outputs", {}).get("exitCode") == "0"


def test_tiny_workflow_fails_on_annotation(k8s_api, test_namespace):
    custom = _custom(k8s_api)
    wf = custom.create_namespaced_custom_object(
        "argoproj.io", "v1alpha1", test_namespace, "workflows",
        _tiny_workflow(test_namespace, "kwok-fail-",
                       {"pipectl.io/fail": "simulated failure", "pipectl.io/exit-code": "1"}))
    done = _wait_phase(k8s_api, test_namespace, wf["metadata"]["name"],
                       {"Succeeded", "Failed", "Error"})
    assert done["status"]["phase"] == "Failed", done["status"]
    pods = [n for n in done["status"]["nodes"].values() if n["type"] == "Pod"]
    assert len(pods) == 1 and pods[0]["phase"] == "Failed"
    assert pods[0].get("outputs", {}).get("exitCode") == "1"
    assert "simulated failure" in pods[0]["message"]
    assert "exit code 1" in pods[0]["message"]


def _volcano_job(name: str, ns: str, replicas: int, gpus: int) -> dict:
    # No Volcano admission webhook runs here: set what it would default (queue, minAvailable).
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minAvailable": replicas, "schedulerName": "volcano", "queue": "default",
                 "tasks": [{"name": "worker", "replicas": replicas, "template": {"spec": {
                     "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox:1.36",
                                     "imagePullPolicy": "Never", "command": ["true"],
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
                 }}}]},
    }


def _vcjob(api, ns, name):
    return _custom(api).get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", ns, "jobs",
                                                     name)


def _gang_jobs(api, workflow: str, ns: str = "pipectl") -> list[str]:
    """Names of the workflow's Volcano Jobs, oldest first (one per run: launchers/base.py
    JOB_NAME; every job carries the workflow's label)."""
    items = _custom(api).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", ns, "jobs",
                                                       label_selector=f"{WORKFLOW_LABEL}={workflow}")["items"]
    return [j["metadata"]["name"] for j in sorted(items, key=lambda j: j["metadata"]["creationTimestamp"])]


def _gang_job(api, workflow: str, ns: str = "pipectl") -> str:
    """The name of the workflow's one Volcano Job (AssertionError if there is not exactly one)."""
    jobs = _gang_jobs(api, workflow, ns)
    assert len(jobs) == 1, jobs
    return jobs[0]


def test_volcano_gang_binds_together_and_completes(test_cluster, k8s_api, test_namespace):
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    name = "gang-fits"
    _custom(k8s_api).create_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", test_namespace, "jobs",
        _volcano_job(name, test_namespace, replicas=2, gpus=8))
    job = test_cluster.wait_for(
        "Volcano job Completed",
        lambda: (j := _vcjob(k8s_api, test_namespace, name)).get("status", {}).get(
            "state", {}).get("phase") == "Completed" and j, timeout_s=60)
    assert job["status"]["succeeded"] == 2
    pods = core.list_namespaced_pod(test_namespace,
                                    label_selector=f"volcano.sh/job-name={name}").items
    assert len(pods) == 2
    assert all(p.spec.scheduler_name == "volcano" and p.status.phase == "Succeeded" for p in pods)
    assert len({p.spec.node_name for p in pods}) == 2  # 8 GPUs each: one pod per fake node


def test_volcano_gang_too_big_binds_nothing(test_cluster, k8s_api, test_namespace):
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    name = "gang-too-big"
    replicas = test_cluster.nodes + 1  # each pod wants a whole node's 8 GPUs
    _custom(k8s_api).create_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", test_namespace, "jobs",
        _volcano_job(name, test_namespace, replicas=replicas, gpus=8))
    try:
        pods = test_cluster.wait_for(
            "gang pods created",
            lambda: (ps := core.list_namespaced_pod(
                test_namespace, label_selector=f"volcano.sh/job-name={name}").items)
            and len(ps) == replicas and ps, timeout_s=30)
        deadline = time.monotonic() + 5  # several scheduling cycles (1 s each)
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(test_namespace, label_selector=f"volcano.sh/job-name={name}").items
            bound = [(p.metadata.name, p.spec.node_name, p.status.phase) for p in pods
                     if p.spec.node_name or p.status.phase != "Pending"]
            assert not bound, f"a pod of a gang too big for the cluster was bound: {bound}"
            time.sleep(0.25)
        pods = core.list_namespaced_pod(test_namespace,
                                        label_selector=f"volcano.sh/job-name={name}").items
        assert [p.spec.node_name for p in pods] == [None] * replicas
        assert all(p.status.phase == "Pending" for p in pods)
    finally:
        _custom(k8s_api).delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1",
                                                         test_namespace, "jobs", name)


def _retry_workflow(ns: str, prefix: str, annotations: dict) -> dict:
    """One step carrying pipectl's rendered retryStrategy (short backoff for the test)."""
    from pipectl.pipelines.policy import RetryPolicy

    wf = _tiny_workflow(ns, prefix, annotations)
    strategy = RetryPolicy(scale_up_s=30, infra_limit=2, transient_limit=1).build().model_dump(by_alias=True, exclude_none=True, mode="json")
    strategy["backoff"]["duration"] = "1s"  # the real policy waits through a scale-up; the test need not
    wf["spec"]["templates"][0]["retryStrategy"] = strategy
    return wf


def _attempts(wf: dict) -> list[dict]:
    return [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod"]


def test_C01_on_a_real_controller_preemption_is_retried_on_another_node(k8s_api, test_namespace):
    custom = _custom(k8s_api)
    wf = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", test_namespace, "workflows", _retry_workflow(
        test_namespace, "c01-preempted-",
        {"pipectl.io/fail": "Pod was terminated due to imminent node shutdown",
         "pipectl.io/fail-reason": "Pod was terminated due to imminent node shutdown",
         "pipectl.io/exit-code": "143"}))
    done = _wait_phase(k8s_api, test_namespace, wf["metadata"]["name"], {"Succeeded", "Failed", "Error"}, timeout_s=120)
    attempts = _attempts(done)
    assert len(attempts) == 3, [a.get("message") for a in attempts]  # the first try + infra_limit (2) retries
    assert all("imminent node shutdown" in a.get("message", "") for a in attempts), [a.get("message") for a in attempts]
    hosts = [a.get("hostNodeName") for a in attempts]
    assert len(set(hosts)) == len(hosts), f"nodeAntiAffinity: each retry on another node, got {hosts}"


def test_C01_on_a_real_controller_a_code_failure_is_not_retried(k8s_api, test_namespace):
    custom = _custom(k8s_api)
    wf = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", test_namespace, "workflows", _retry_workflow(
        test_namespace, "c01-bug-", {"pipectl.io/fail": "bug", "pipectl.io/exit-code": "1"}))
    done = _wait_phase(k8s_api, test_namespace, wf["metadata"]["name"], {"Succeeded", "Failed", "Error"}, timeout_s=90)
    assert done["status"]["phase"] == "Failed"
    assert len(_attempts(done)) == 1


def _pipectl(test_cluster, *args: str) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "KUBECONFIG": str(test_cluster.kubeconfig)}
    return subprocess.run([str(PIPECTL), *args], capture_output=True, text=True, timeout=120, env=env)


def submit_a_run_whose_gang_fails(test_cluster, train_pod_annotations) -> str:
    """Apply the template and submit a 2-worker training whose gang pods exit 1 (a code failure);
    wait until it Failed (pipectl submit --wait: exit 1). Returns the workflow's name."""
    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    train_pod_annotations({"pipectl.io/fail": "Traceback: KeyError", "pipectl.io/exit-code": "1"})
    r = _pipectl(test_cluster, "submit", "training", "-p", "workers=2", "-p", "gpus-per-worker=1",
                 "-p", "processes-per-worker=1", "--wait", "--output", "json")
    assert r.returncode == 1, r.stderr
    return _last_json(r.stdout)["name"]


def test_cli_templates_cron_and_submit_against_the_api_server(project_applied, test_cluster, k8s_api):
    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    r = _pipectl(test_cluster, "cron", "apply")
    assert r.returncode == 0, r.stderr
    r = _pipectl(test_cluster, "cron", "list", "--output", "json")
    assert r.returncode == 0, r.stderr
    cron = next(c for c in json.loads(r.stdout) if c["name"] == "retrain")
    assert cron["timezone"] == "Europe/Berlin" and cron["schedules"] == ["30 5 * * *"]
    assert _pipectl(test_cluster, "cron", "suspend", "retrain").returncode == 0

    custom = _custom(k8s_api)
    before = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                                  label_selector="workflows.argoproj.io/cron-workflow=retrain")["items"]
    r = _pipectl(test_cluster, "cron", "trigger", "retrain")
    assert r.returncode == 0, r.stderr
    after = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                                 label_selector="workflows.argoproj.io/cron-workflow=retrain")["items"]
    assert len(after) == len(before) + 1  # exactly one workflow

    r = _pipectl(test_cluster, "submit", "training", "--lane", "urgent", "-p", "epochs=2", "--output", "json")
    assert r.returncode == 0, r.stderr
    name = json.loads(r.stdout)["name"]
    wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", name)
    assert wf["spec"]["priority"] == 100 and wf["metadata"]["labels"]["pipectl.io/lane"] == "urgent"
    r = _pipectl(test_cluster, "list", "--output", "json")
    assert name in r.stdout
    # the training steps declare outputs KWOK cannot produce: do not leave them running
    for w in after + [wf]:
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", w["metadata"]["name"])


def test_wait_and_status_follow_a_workflow_to_its_end(test_cluster, k8s_api, test_namespace):
    """What `pipectl submit --wait` runs (ArgoCluster.wait) and `pipectl status`, on real workflows."""
    import os

    from pipectl.pipelines.backends.kube import ArgoCluster

    os.environ["KUBECONFIG"] = str(test_cluster.kubeconfig)
    try:
        cluster = ArgoCluster(test_namespace)
        ok = cluster.create_workflow(_tiny_workflow(test_namespace, "wait-ok-"))
        changes: list[str] = []
        final = cluster.wait(ok["metadata"]["name"], lambda wf: changes.append(wf.get("status", {}).get("phase", "")), timeout_s=90)
        assert final["status"]["phase"] == "Succeeded" and changes, changes
        bad = cluster.create_workflow(_tiny_workflow(test_namespace, "wait-bad-", {"pipectl.io/fail": "boom", "pipectl.io/exit-code": "1"}))
        assert cluster.wait(bad["metadata"]["name"], lambda wf: None, timeout_s=90)["status"]["phase"] == "Failed"
    finally:
        del os.environ["KUBECONFIG"]
    r = _pipectl(test_cluster, "status", bad["metadata"]["name"], "-n", test_namespace, "--output", "json")
    assert r.returncode == 1, r.stderr  # a Failed workflow: exit 1
    assert "boom" in r.stdout
    r = _pipectl(test_cluster, "status", ok["metadata"]["name"], "-n", test_namespace)
    assert r.returncode == 0 and "Succeeded" in r.stderr
    r = _pipectl(test_cluster, "status", "no-such-workflow", "-n", test_namespace)
    assert r.returncode == 1 and "not found" in r.stderr


def test_a_run_the_controller_failed_for_want_of_its_new_template_is_created_again(test_cluster, k8s_api, test_namespace):
    """Argo's controller reads a run's WorkflowTemplate from its cache, which lags the API server:
    a run created right after its template can end in Error ('workflowtemplates.argoproj.io "..."
    not found'). ``create_workflow`` (submit, cron trigger, resubmit) then deletes it and creates
    it again. Here the test plays the controller, for runs labelled with another controller's
    instance id (this cluster's controller leaves them alone), on the real API server: it fails
    the first run as a controller with a stale cache does and starts the second."""
    import threading
    import uuid

    from kubernetes import watch

    from pipectl.pipelines.backends.kube import ArgoCluster

    custom = _custom(k8s_api)
    args = ("argoproj.io", "v1alpha1", test_namespace)
    name = f"fresh-{uuid.uuid4().hex[:6]}"
    instance = {"workflows.argoproj.io/controller-instanceid": f"elsewhere-{name}"}
    custom.create_namespaced_custom_object(*args, "workflowtemplates", {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate", "metadata": {"name": name},
        "spec": {"entrypoint": "main", "templates": [_tiny_workflow(test_namespace, "x")["spec"]["templates"][0]]}})
    run = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
           "metadata": {"generateName": f"{name}-", "labels": instance}, "spec": {"workflowTemplateRef": {"name": name}}}
    seen: list[str] = []
    selector = ",".join(f"{k}={v}" for k, v in instance.items())
    ready = threading.Event()

    def stale_controller() -> None:
        stream = watch.Watch().stream(custom.list_namespaced_custom_object, *args, "workflows",
                                      label_selector=selector, timeout_seconds=60)
        ready.set()
        for event in stream:
            if event["type"] != "ADDED":
                continue
            seen.append(event["object"]["metadata"]["name"])
            status = ({"phase": "Error", "message": f'workflowtemplates.argoproj.io "{name}" not found'}
                      if len(seen) == 1 else {"phase": "Running"})
            custom.patch_namespaced_custom_object(*args, "workflows", seen[-1], {"status": status})
            if len(seen) == 2:
                return

    thread = threading.Thread(target=stale_controller, daemon=True)
    thread.start()
    ready.wait(10)
    os.environ["KUBECONFIG"] = str(test_cluster.kubeconfig)
    try:
        created = ArgoCluster(test_namespace).create_workflow(run)
        thread.join(30)
        assert len(seen) == 2 and created["metadata"]["name"] == seen[1], (seen, created["metadata"]["name"])
        left = custom.list_namespaced_custom_object(*args, "workflows", label_selector=selector)["items"]
        assert [w["metadata"]["name"] for w in left] == [seen[1]]  # the failed run is gone
        # an old template: no wait for the controller, no second run
        seen.clear()
        again = ArgoCluster(test_namespace).create_workflow(run, settle_s=0)
        assert custom.get_namespaced_custom_object(*args, "workflows", again["metadata"]["name"])
    finally:
        del os.environ["KUBECONFIG"]
        for w in custom.list_namespaced_custom_object(*args, "workflows", label_selector=selector)["items"]:
            custom.delete_namespaced_custom_object(*args, "workflows", w["metadata"]["name"])
        custom.delete_namespaced_custom_object(*args, "workflowtemplates", name)


def test_two_gangs_that_fit_alone_but_not_together_never_bind_half(test_cluster, k8s_api, test_namespace):
    """Each gang needs 3 of the 4 fake nodes (8 GPUs per pod): one binds whole, the other waits
    whole, and binds whole once the first completes. Volcano issues a gang's bind calls one after
    another, so a reader can catch 1 of 3 bound for a moment; what must never happen is a gang that
    stays part-bound (holding GPUs while waiting for the rest: the deadlock)."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    replicas = test_cluster.nodes - 1
    names = ["gang-a", "gang-b"]
    for name in names:
        job = _volcano_job(name, test_namespace, replicas=replicas, gpus=8)
        job["spec"]["tasks"][0]["template"]["metadata"] = {"annotations": {"pipectl.io/run-duration": "3s"}}
        _custom(k8s_api).create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", test_namespace, "jobs", job)
    seen_full: set[str] = set()
    partial_since: dict[str, float] = {}
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and seen_full != set(names):
            for name in names:
                pods = core.list_namespaced_pod(test_namespace, label_selector=f"volcano.sh/job-name={name}").items
                bound = sum(1 for p in pods if p.spec.node_name)
                if bound in (0, replicas):
                    partial_since.pop(name, None)
                else:
                    since = partial_since.setdefault(name, time.monotonic())
                    assert time.monotonic() - since < 3.0, f"{name} stayed part-bound ({bound} of {replicas}) for 3 s"
                if bound == replicas:
                    seen_full.add(name)
            time.sleep(0.2)
        assert seen_full == set(names), f"both gangs must eventually run whole; saw {seen_full}"
    finally:
        for name in names:
            _custom(k8s_api).delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", test_namespace, "jobs", name)


# Output parameters the steps of training-v1 would write (what KWOK pods cannot produce): the
# cluster's argoexec stand-in reports them in each step's WorkflowTaskResult.
TRAINING_STEP_OUTPUTS = {
    "stage": {"dataset-uri": "s3://pipectl/datasets/d1/", "manifest-uri": "s3://pipectl/datasets/d1/manifest.json",
              "objects": 1797, "bytes": 1000000, "copied": 1797, "skipped": 0, "retries": 0},
    "preprocess": {"shards-uri": "s3://pipectl/runs/x/shards/", "train-count": 1617, "validation-count": 180,
                   "corrupt": 0, "images-per-s": 20000.0, "device": "cpu"},
    "evaluate": {"mlflow-run-id": "r1", "model-uri": "runs:/r1/model", "metrics": "{}", "metric": 0.98,
                 "champion-version": "", "champion-metric": "", "decision": "promote", "metric-name": "accuracy",
                 "model-sha256": "0" * 64, "evaluation-set": "s3://pipectl/runs/x/shards/", "evaluation-set-sha256": "1" * 64,
                 "training-images-per-s": 640.0, "training-data-share": 0.05,
                 "training-sync-share": 0.12, "training-slowest-rank-ratio": 1.04},
    "register": {"model-name": "digits-cnn", "version": "1", "alias": "champion", "created": "true",
                 "champion-version": "1"},
}


@pytest.fixture()
def training_outputs_supplied(k8s_api):
    """The ConfigMap the argoexec stand-in reads step outputs from, in the pipectl namespace."""
    from kubernetes import client
    from tests.cluster.cluster import TEST_OUTPUTS_CONFIGMAP

    core = client.CoreV1Api(k8s_api)
    body = {"metadata": {"name": TEST_OUTPUTS_CONFIGMAP},
            "data": {k: json.dumps(v) for k, v in TRAINING_STEP_OUTPUTS.items()}}
    core.create_namespaced_config_map("pipectl", body)
    yield
    core.delete_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, "pipectl")


def _training_wf(custom, name: str) -> dict:
    return custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", name)


def test_data_push_then_submit_runs_the_pushed_dataset_on_the_cluster(project_applied, training_outputs_supplied,
                                                                       test_cluster, k8s_api, small_digits_dir, tmp_path):
    """A user's own folder onto the cluster, as the README shows it: a local path on `submit` is
    refused (exit 2, naming `pipectl data push`, nothing sent); `pipectl data push DIR` copies the
    folder to the store (moto's S3 server here) and prints its URI; `pipectl submit training -p
    dataset-uri=URI --wait` passes validation, the lane's size check (which reads the staged
    manifest from the store) and the API server's admission, and the run Succeeds with that URI as
    its argument."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from pipectl.pipelines.backends.services import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices

    custom = _custom(k8s_api)

    def names() -> set[str]:
        return {w["metadata"]["name"] for w in custom.list_namespaced_custom_object(
            "argoproj.io", "v1alpha1", "pipectl", "workflows")["items"]}

    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    with EmbeddedServices(tmp_path / "services", s3=True, mlflow=False) as services:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PIPECTL_")},
               "KUBECONFIG": str(test_cluster.kubeconfig), "PIPECTL_S3_ENDPOINT": services.s3_url,
               "PIPECTL_S3_ACCESS_KEY": S3_ACCESS_KEY, "PIPECTL_S3_SECRET_KEY": S3_SECRET_KEY}

        def pipectl(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(PIPECTL), *args], capture_output=True, text=True, timeout=300, env=env)

        before = names()
        r = pipectl("submit", "training", "-p", f"dataset-uri={small_digits_dir}")
        assert r.returncode == 2 and "pipectl data push" in r.stderr, (r.returncode, r.stderr)
        assert names() == before  # nothing sent
        push = pipectl("data", "push", str(small_digits_dir))
        assert push.returncode == 0, push.stderr
        uri = push.stdout.strip()
        assert uri.startswith("s3://pipectl/datasets/") and "300 images" in push.stderr, (uri, push.stderr)
        r = pipectl("submit", "training", "-p", f"dataset-uri={uri}", "-p", "workers=1", "-p", "gpus-per-worker=1",
                    "-p", "processes-per-worker=1", "--wait", "--output", "json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = _last_json(r.stdout)
    wf = _training_wf(custom, out["name"])
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    args = {p["name"]: p.get("value") for p in wf["spec"]["arguments"]["parameters"]}
    assert args["dataset-uri"] == uri, args
    _delete_workflow(custom, out["name"])


def test_training_pipeline_reaches_succeeded_under_submit_wait(project_applied, training_outputs_supplied,
                                                               test_cluster, k8s_api):
    """The real training-v1 WorkflowTemplate (not a variant) under `pipectl submit --wait`: every
    step's pod is scheduled by the real scheduler and ended by KWOK; step outputs come from the
    test (WorkflowTaskResults written by the argoexec stand-in); the train step's resource
    template creates the real Volcano Job, Volcano gang-schedules its pods, and the step ends
    when argoexec's own condition code sees status.state.phase == Completed."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    r = _pipectl(test_cluster, "submit", "training", "--lane", "standard", "-p", "workers=2",
                 "-p", "gpus-per-worker=4", "-p", "processes-per-worker=4", "--wait", "--output", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    name = json.loads(r.stdout)["name"]
    wf = _training_wf(_custom(k8s_api), name)
    assert wf["status"]["phase"] == "Succeeded"
    # one pod per step, first attempt ("stage(0)": the attempt under the step's retry node)
    nodes = {n["displayName"].removesuffix("(0)"): n for n in wf["status"]["nodes"].values() if n["type"] == "Pod"}
    exit_handler = [n["phase"] for n in nodes.values() if n["templateName"] == "gang-release"]
    nodes = {k: n for k, n in nodes.items() if n["templateName"] != "gang-release"}
    assert set(nodes) == {"validate", "stage", "preprocess", "train", "evaluate", "register"}, set(nodes)
    assert exit_handler == ["Succeeded"], exit_handler  # ran, released nothing: the run succeeded
    # outputs flowed between steps through the controller's substitution
    pre = nodes["preprocess"]["inputs"]["parameters"]
    assert {p["name"]: p["value"] for p in pre}["manifest-uri"] == TRAINING_STEP_OUTPUTS["stage"]["manifest-uri"]
    # the gang: the Volcano Job the train step created, owned by the workflow, ran 2 pods together
    job_name = _gang_job(k8s_api, name)
    assert job_name == f"{name}-train", job_name
    job = _vcjob(k8s_api, "pipectl", job_name)
    assert job["status"]["state"]["phase"] == "Completed"
    assert job["metadata"]["ownerReferences"][0]["name"] == name
    assert job["spec"]["queue"] == "pipectl-standard" and job["spec"]["minAvailable"] == 2
    pods = client.CoreV1Api(k8s_api).list_namespaced_pod("pipectl", label_selector=f"volcano.sh/job-name={job_name}").items
    assert len(pods) == 2 and all(p.status.phase == "Succeeded" for p in pods)
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "4" for p in pods)
    assert nodes["evaluate"]["startedAt"] >= nodes["train"]["finishedAt"]


def test_a_user_pipeline_with_its_own_step_reaches_succeeded_on_the_cluster(project_applied, test_cluster, k8s_api):
    """The example project's pipeline (pipectl's steps less warm, plus the team's `report` step) by
    reference: `templates apply FILE.py:NAME`, then `submit FILE.py:NAME --log`; the user's step
    runs between train and evaluate and receives the run's folder; its output is kept. `--log`
    followed every pod of the run to its end (KWOK pods serve no log text: each followed pod shows
    one `(log unavailable ...)` line, which names it; the text itself: tests/cluster/test_real_pods.py)."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client
    from tests.cluster.cluster import TEST_OUTPUTS_CONFIGMAP

    ref = f"{REPO / 'examples' / 'custom-pipeline' / 'pipeline.py'}:pipeline"
    core = client.CoreV1Api(k8s_api)
    outputs = {**TRAINING_STEP_OUTPUTS, "report": {"report-uri": "s3://pipectl/runs/x/report.md"}}
    core.create_namespaced_config_map("pipectl", {"metadata": {"name": TEST_OUTPUTS_CONFIGMAP},
                                                  "data": {k: json.dumps(v) for k, v in outputs.items()}})
    try:
        r = _pipectl(test_cluster, "templates", "apply", ref)
        assert r.returncode == 0 and "applied WorkflowTemplate team-training-v1" in r.stderr, r.stdout + r.stderr
        r = _pipectl(test_cluster, "submit", ref, "--lane", "standard", "-p", "workers=2", "-p", "gpus-per-worker=1", "-p", "processes-per-worker=1",
                     "--log", "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        core.delete_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, "pipectl")
    name = _last_json(r.stdout)["name"]
    followed = {line.split(": ", 1)[0] for line in r.stdout.splitlines() if line.startswith(f"{name}-")}
    pods = {p.metadata.name for p in core.list_namespaced_pod("pipectl", label_selector=f"workflows.argoproj.io/workflow={name}").items}
    assert pods and pods <= followed, (sorted(pods - followed), r.stdout)
    assert "report Succeeded" in r.stderr and "register Succeeded" in r.stderr, r.stderr
    wf = _training_wf(_custom(k8s_api), name)
    assert wf["status"]["phase"] == "Succeeded" and wf["spec"]["workflowTemplateRef"] == {"name": "team-training-v1"}
    nodes = {n["displayName"].removesuffix("(0)"): n for n in wf["status"]["nodes"].values() if n["type"] == "Pod"}
    exit_handler = [n["phase"] for n in nodes.values() if n["templateName"] == "gang-release"]
    nodes = {k: n for k, n in nodes.items() if n["templateName"] != "gang-release"}
    assert set(nodes) == {"validate", "stage", "preprocess", "train", "report", "evaluate", "register"}, set(nodes)
    assert exit_handler == ["Succeeded"], exit_handler  # ran, released nothing: the run succeeded
    assert {p["name"]: p["value"] for p in nodes["report"]["inputs"]["parameters"]}["run-uri"] == f"s3://pipectl/runs/{name}"
    assert nodes["train"]["finishedAt"] <= nodes["report"]["startedAt"] and nodes["report"]["finishedAt"] <= nodes["evaluate"]["startedAt"]
    assert {p["name"]: p["value"] for p in nodes["report"]["outputs"]["parameters"]}["report-uri"] == "s3://pipectl/runs/x/report.md"
    assert _gang_job(k8s_api, name) == f"{name}-train"


def test_a_user_train_function_pipeline_with_its_own_defaults_reaches_succeeded_on_the_cluster(
        project_applied, training_outputs_supplied, test_cluster, k8s_api):
    """examples/image-classifier by reference: its defaults are the template's arguments and what
    submit sends; the gang runs pipectl's train step with the team's function in the team's image,
    and its own parameters reach the gang's pods."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    ref = f"{REPO / 'examples' / 'image-classifier' / 'pipeline.py'}:pipeline"
    r = _pipectl(test_cluster, "templates", "apply", ref)
    assert r.returncode == 0 and "applied WorkflowTemplate shapes-training-v1" in r.stderr, r.stdout + r.stderr
    r = _pipectl(test_cluster, "submit", ref, "-p", "gpus-per-worker=1", "-p", "processes-per-worker=1",
                 "-p", "weight-decay=0.001", "--wait", "--output", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    name = json.loads(r.stdout)["name"]
    custom = _custom(k8s_api)
    wf = _training_wf(custom, name)
    assert wf["status"]["phase"] == "Succeeded" and wf["spec"]["workflowTemplateRef"] == {"name": "shapes-training-v1"}
    sent = {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}
    assert (sent["image-size"], sent["learning-rate"], sent["model-name"]) == ("64", "0.02", "shapes-classifier")
    job = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", _gang_job(k8s_api, name))
    container = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.example.com/ml/shapes:0.1.0"
    assert container["command"][container["command"].index("--function") + 1] == "shapes.train:train"
    # the pipeline's own parameters, substituted by Argo into every gang pod: given and default
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["PIPECTL_PARAM_WEIGHT_DECAY"], env["PIPECTL_PARAM_RANDOM_FLIPS"]) == ("0.001", "true")


def _lane_gang(name: str, lane: str, workers: int, gpus: int, run_duration: str) -> dict:
    """The train gang exactly as the training template renders it (pipelines/pipectl/pipelines/launchers/volcano.py),
    its tags and expressions evaluated as Argo would for a workflow ``name`` of ``lane`` (the local
    backend's substitution), plus how long KWOK keeps its pods running."""
    from pipectl.components.contracts import TrainingParameters
    from pipectl.pipelines.launchers import LAUNCHERS
    from pipectl.pipelines.launchers.base import GANG_AFFINITY_INPUT
    from pipectl.pipelines.training import CompileConfig
    from tests.tools.gang import gang_job

    params = {**TrainingParameters().as_arguments(), "lane": lane, "workers": str(workers), "gpus-per-worker": str(gpus),
              "processes-per-worker": str(gpus), "cpu-per-worker": "2.0", "memory-gib-per-worker": "8",
              GANG_AFFINITY_INPUT: "{}", "run-uri": f"s3://pipectl/runs/{name}/", "shards-uri": f"s3://pipectl/runs/{name}/shards/"}
    job = gang_job(LAUNCHERS["volcano"].manifest(CompileConfig().gang()), workflow=name, inputs=params, namespace="pipectl")
    job["metadata"]["name"] = name
    assert "{{" not in yaml.safe_dump(job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"])
    job["spec"]["tasks"][0]["template"]["metadata"].setdefault("annotations", {})["pipectl.io/run-duration"] = run_duration
    return job


def test_urgent_lane_preempts_batch_gangs_filling_every_gpu(project_applied, training_outputs_supplied,
                                                            test_cluster, k8s_api):
    """Batch gangs hold every fake GPU; `pipectl submit training --lane urgent` must still get its
    gang bound: Volcano's reclaim action (argo/cluster/volcano/volcano-scheduler-configmap.yaml) evicts a
    batch gang (queue pipectl-batch is reclaimable, pipectl-urgent is not), the evicted gang restarts
    whole (policy PodEvicted -> RestartJob), and the urgent workflow reaches Succeeded."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    gpus_per_node = int(NODE_GPUS)
    batch = [f"batch-gang-{i}" for i in range(test_cluster.nodes // 2)]  # 2 nodes' GPUs each: all of them
    for name in batch:
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs",
                                               _lane_gang(name, "batch", 2, gpus_per_node, "1h"))
    try:
        def batch_running():
            pods = core.list_namespaced_pod("pipectl", label_selector="volcano.sh/queue-name=pipectl-batch").items
            return len([p for p in pods if p.status.phase == "Running"]) == 2 * len(batch)
        test_cluster.wait_for("batch gangs on every GPU", batch_running, timeout_s=60)

        t0 = time.monotonic()
        r = _pipectl(test_cluster, "submit", "training", "--lane", "urgent", "-p", "workers=2",
                     "-p", f"gpus-per-worker={gpus_per_node}", "-p", f"processes-per-worker={gpus_per_node}",
                     "--output", "json")
        assert r.returncode == 0, r.stderr
        name = json.loads(r.stdout)["name"]
        bound_after = None
        while time.monotonic() - t0 < 120:
            pods = core.list_namespaced_pod("pipectl", label_selector=f"volcano.sh/job-name,{WORKFLOW_LABEL}={name}").items
            if len(pods) == 2 and all(p.spec.node_name for p in pods):
                bound_after = time.monotonic() - t0
                break
            time.sleep(0.1)
        assert bound_after is not None, "the urgent gang never bound while batch work held the GPUs"
        print(f"urgent lane: submit -> all 2 gang pods bound (16 GPUs, batch holding all "
              f"{test_cluster.nodes * gpus_per_node}): {bound_after:.1f} s (includes the stage and preprocess steps)")
        wf = _wait_phase(k8s_api, "pipectl", name, {"Succeeded", "Failed", "Error"}, timeout_s=120)
        assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
        # a batch gang was evicted and restarted whole by its policy, not left half-running
        jobs = [custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", b) for b in batch]
        restarted = [j for j in jobs if j["status"].get("retryCount", 0) >= 1]
        assert restarted, [j["status"] for j in jobs]
        test_cluster.wait_for("every batch gang running whole again", batch_running, timeout_s=90)
    finally:
        for b in batch:
            custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", b)



@pytest.mark.parametrize("unusable", ["cordoned", "tainted-for-another-team"])
def test_urgent_lane_reclaims_from_batch_while_other_gpu_nodes_stand_idle(project_applied, test_cluster, k8s_api,
                                                                           unusable):
    """Half the GPU nodes are Ready but no gang can use them (cordoned for maintenance, or tainted
    for another team); batch gangs fill the other half. An urgent 2 x 8-GPU gang must still take
    GPUs back from batch. With Volcano's proportion plugin it never did: proportion counts the idle
    nodes in the cluster's total, so batch "deserved" everything it held. The capacity plugin with
    batch deserving 0 (policy.LANES) evicts a batch gang, which restarts whole."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core, custom = client.CoreV1Api(k8s_api), _custom(k8s_api)
    gpus = int(NODE_GPUS)
    idle = [f"kwok-node-{i}" for i in range(test_cluster.nodes // 2, test_cluster.nodes)]
    fence = ({"spec": {"unschedulable": True}} if unusable == "cordoned" else
             {"spec": {"taints": [{"key": "dedicated", "value": "other-team", "effect": "NoSchedule"}]}})
    batch = [f"idle-batch-{unusable[0]}-{i}" for i in range((test_cluster.nodes - len(idle)) // 2)]
    urgent = f"idle-urgent-{unusable[0]}"

    def bound(job: str) -> int:
        pods = core.list_namespaced_pod("pipectl", label_selector=f"volcano.sh/job-name={job}").items
        return sum(1 for p in pods if p.spec.node_name and not p.metadata.deletion_timestamp)

    try:
        for n in idle:
            core.patch_node(n, fence)
        for name in batch:
            custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs",
                                                   _lane_gang(name, "batch", 2, gpus, "1h"))
        test_cluster.wait_for("batch gangs on every usable GPU", lambda: all(bound(b) == 2 for b in batch), timeout_s=90)
        t0 = time.monotonic()
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs",
                                               _lane_gang(urgent, "urgent", 2, gpus, "1h"))
        test_cluster.wait_for("the urgent gang bound whole", lambda: bound(urgent) == 2, timeout_s=90)
        print(f"[timing] urgent gang bound {time.monotonic() - t0:.1f} s after creation, "
              f"{len(idle)} of {test_cluster.nodes} GPU nodes {unusable}")
        assert not any(n in {p.spec.node_name for p in core.list_namespaced_pod(
            "pipectl", label_selector=f"volcano.sh/job-name={urgent}").items} for n in idle)
        jobs = [custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", b) for b in batch]
        assert any(j["status"].get("retryCount", 0) >= 1 for j in jobs), [j["status"] for j in jobs]
    finally:
        for name in [*batch, urgent]:
            with contextlib.suppress(Exception):
                custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", name)
        for n in idle:
            core.patch_node(n, {"spec": {"unschedulable": None, "taints": None}})
        test_cluster.wait_for("the gangs' pods gone", lambda: not any(
            bound(j) for j in [*batch, urgent]), timeout_s=120)

C10_LANES = "pipectl-c10-lanes"
"""The test's own lane semaphore ConfigMap (urgent: 1 slot), so the shared ``pipectl-lanes`` stays as applied."""


def _c10_workflow(name: str, cfg) -> dict:
    """A Workflow running ONLY the compiled train step (entrypoint: the task's template, with its
    retries, its attempt template and its lane semaphore) for the urgent lane, a gang of 1 pod x 1
    GPU; the semaphore read from :data:`C10_LANES`."""
    from pipectl.components.names import SEMAPHORE_CONFIGMAP
    from pipectl.pipelines.builtin import build_training

    wt = build_training(cfg).to_dict()
    entry = next(t for t in wt["spec"]["templates"] if t["name"] == wt["spec"]["entrypoint"])
    step = next(t for t in entry["dag"]["tasks"] if t["name"] == "train")["template"]
    text = json.dumps(wt["spec"]).replace(json.dumps(SEMAPHORE_CONFIGMAP), json.dumps(C10_LANES))
    spec = json.loads(text)
    overrides = {"lane": "urgent", "workers": "1", "gpus-per-worker": "1", "processes-per-worker": "1",
                 "shards-uri": "s3://pipectl/runs/c10/shards/", "run-uri": f"s3://pipectl/runs/{name}"}
    params = {p["name"]: p.get("value", "") for p in spec["arguments"]["parameters"]} | overrides
    spec["arguments"] = {"parameters": [{"name": k, "value": v} for k, v in params.items()]}
    spec["entrypoint"] = step
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"name": name, "namespace": "pipectl"}, "spec": spec}


def _lose_running_launcher_pod(test_cluster, api, workflow: str, spared: set[str] = frozenset()) -> str:
    """Delete the pod of ``workflow``'s running train attempt as a lost node would (grace 0) and
    return its name: once Argo's node for it is Running (a node still Pending gets its pod created
    again: operator.go podReconciliation) and its gang job exists. Pods named in ``spared`` are older
    attempts'."""
    from kubernetes import client

    core, custom = client.CoreV1Api(api), _custom(api)

    def running() -> str | None:
        nodes = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", workflow)
        for n in (nodes.get("status", {}).get("nodes") or {}).values():
            if n["type"] == "Pod" and n["phase"] == "Running" and n["templateName"] == "train":
                pods = core.list_namespaced_pod("pipectl", label_selector=f"{WORKFLOW_LABEL}={workflow}").items
                mine = [p.metadata.name for p in pods if (p.metadata.annotations or {}).get("workflows.argoproj.io/node-id") == n["id"]
                        and p.status.phase == "Running" and p.metadata.name not in spared]
                if mine and _gang_jobs(api, workflow):
                    return mine[0]
        return None
    pod = test_cluster.wait_for(f"a running train attempt of {workflow}", running, timeout_s=90)
    core.delete_namespaced_pod(pod, "pipectl", grace_period_seconds=0)
    return pod


def test_C10_a_lane_slot_is_free_while_a_failed_train_attempt_waits_to_retry(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """C10 on the real controller: the urgent lane has ONE slot (semaphore size 1). Workflow A's
    train attempt holds it; B waits. A's launcher pod is deleted (a node loss: Error "pod deleted"),
    and A waits out its retry backoff (15 s: scale_up_s=225). Right: B acquires the slot and its
    gang job is created DURING A's backoff; A's retried attempt then waits for the slot again
    (its pod only after B's train step ended) and adopts A's gang (one job per run), and both
    Succeed. Before the fix (retry with
    backoff and semaphore on one template) A kept the slot through the backoff and B's job came
    only after A's retried attempt."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    from pipectl.pipelines.policy import RetryPolicy
    from pipectl.pipelines.training import CompileConfig

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    policy = RetryPolicy(scale_up_s=225, infra_limit=2, transient_limit=1, step_timeout_s=600)
    backoff_s = policy.delays_s()[0]
    assert backoff_s == 15
    cfg = CompileConfig(retry=policy)
    train_pod_annotations({"pipectl.io/run-duration": "20s"})  # B's gang outlasts A's backoff
    core.create_namespaced_config_map("pipectl", {"metadata": {"name": C10_LANES}, "data": {"urgent": "1"}})
    suffix = f"{int(time.time()) % 100000}"
    a, b = f"c10-a-{suffix}", f"c10-b-{suffix}"

    def jobs(wf: str) -> dict[str, str]:
        items = _custom(k8s_api).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs",
                                                               label_selector=f"{WORKFLOW_LABEL}={wf}")["items"]
        return {j["metadata"]["name"]: j["metadata"]["creationTimestamp"] for j in items}

    try:
        custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", _c10_workflow(a, cfg))
        test_cluster.wait_for("A's first gang job", lambda: jobs(a), timeout_s=60)
        custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", _c10_workflow(b, cfg))
        deadline = time.monotonic() + 3  # B is reconciled several times (1 s requeue) and must not get the slot
        while time.monotonic() < deadline:
            assert not jobs(b), "B got a gang job while A's attempt held the only slot"
            time.sleep(0.25)
        assert not jobs(b), "B got a gang job while A's attempt held the only slot"
        _lose_running_launcher_pod(test_cluster, k8s_api, a)
        t_deleted = time.monotonic()

        # watch until B's gang job exists: A must be waiting out its backoff then, its retry not started
        seen_wait, t_error, b_job_after, a_state = False, None, None, None
        while time.monotonic() - t_deleted < 60:
            nodes = (_training_wf(custom, a).get("status", {}).get("nodes") or {}).values()
            waiting = [n for n in nodes if n["type"] == "Suspend" and n["phase"] == "Running"]  # train-wait
            seen_wait |= bool(waiting)
            if t_error is None and any(n["type"] == "Pod" and n["phase"] == "Error" for n in nodes):
                t_error = time.monotonic() - t_deleted
            if jobs(b):
                b_job_after = time.monotonic() - t_deleted
                a_state = (len(waiting), sorted(jobs(a)), sorted((n["displayName"], n["type"], n["phase"]) for n in nodes))
                break
            time.sleep(0.2)
        assert b_job_after is not None, "B never got a gang job after A's attempt failed"
        print(f"[timing] C10: A's launcher pod deleted -> its attempt Error: "
              f"{'?' if t_error is None else f'{t_error:.1f}'} s; -> B's gang job created: {b_job_after:.1f} s "
              f"(A's backoff: {backoff_s} s from the Error)")
        waiting, a_jobs, a_nodes = a_state
        assert waiting == 1 and len(a_jobs) == 1, (
            f"B's job came {b_job_after:.1f} s after A's launcher pod was deleted; A then: jobs {a_jobs}, "
            f"nodes {a_nodes}: the slot was held through A's backoff")

        done_a = _wait_phase(k8s_api, "pipectl", a, {"Succeeded", "Failed", "Error"}, timeout_s=120)
        done_b = _wait_phase(k8s_api, "pipectl", b, {"Succeeded", "Failed", "Error"}, timeout_s=60)
        assert (done_a["status"]["phase"], done_b["status"]["phase"]) == ("Succeeded", "Succeeded"), (
            done_a["status"].get("message"), done_b["status"].get("message"))
        a_pods = sorted((n for n in done_a["status"]["nodes"].values() if n["type"] == "Pod" and n["templateName"] == "train"),
                        key=lambda n: n["startedAt"])
        assert [(n["phase"], n.get("message", "")) for n in a_pods][0] == ("Error", "pod deleted"), a_pods
        assert [n["phase"] for n in a_pods][1:] == ["Succeeded"], a_pods
        # the retried attempt took a slot again (its launcher pod only after B's train step had
        # ended) and adopted A's gang: one job for the run, never two
        b_end = max(n["finishedAt"] for n in done_b["status"]["nodes"].values() if n["type"] == "Pod" and n["templateName"] == "train")
        launchers = [p for p in core.list_namespaced_pod("pipectl", label_selector=f"{WORKFLOW_LABEL}={a}").items
                     if p.metadata.annotations.get("workflows.argoproj.io/node-name", "").rsplit(".", 1)[-1].startswith("train(")]
        assert launchers and all(p.metadata.creation_timestamp.strftime("%Y-%m-%dT%H:%M:%SZ") >= b_end for p in launchers), (
            [(p.metadata.name, p.metadata.creation_timestamp) for p in launchers], b_end)
        assert len(jobs(a)) == 1, jobs(a)
    finally:
        for wf in (a, b):
            _delete_workflow(custom, wf)
        core.delete_namespaced_config_map(C10_LANES, "pipectl")


def test_C10_a_train_step_whose_backoff_retries_are_used_up_fails_the_workflow(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """The other end of C10's recursion (training.py _train_retry_templates): infra_limit=1, the
    launcher pod of the attempt AND of its one retry deleted: the workflow ends Error — the attempt
    task's continueOn must not turn used-up retries into a success — after one wait of the policy's
    delay (5 s), with two attempts, both Error "pod deleted"."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    from pipectl.pipelines.policy import RetryPolicy
    from pipectl.pipelines.training import CompileConfig

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    policy = RetryPolicy(scale_up_s=30, infra_limit=1, transient_limit=1, step_timeout_s=600)
    assert policy.delays_s() == [5]
    train_pod_annotations({"pipectl.io/run-duration": "60s"})
    core.create_namespaced_config_map("pipectl", {"metadata": {"name": C10_LANES}, "data": {"urgent": "1"}})
    name = f"c10-used-up-{int(time.time()) % 100000}"

    try:
        custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                               _c10_workflow(name, CompileConfig(retry=policy)))
        first = _lose_running_launcher_pod(test_cluster, k8s_api, name)
        _lose_running_launcher_pod(test_cluster, k8s_api, name, spared={first})
        done = _wait_phase(k8s_api, "pipectl", name, {"Succeeded", "Failed", "Error"}, timeout_s=90)
        nodes = done["status"]["nodes"].values()
        pods = [(n["phase"], n.get("message", "")) for n in sorted(nodes, key=lambda n: n["startedAt"])
                if n["type"] == "Pod" and n["templateName"] == "train"]
        assert done["status"]["phase"] == "Error" and pods == [("Error", "pod deleted")] * 2, (done["status"]["phase"], pods)
        assert [n["type"] for n in nodes].count("Suspend") == 1
        # both attempts applied the run's one job (the second adopted the gang of the first); the
        # exit handler deleted it when the retries were used up
        left = _custom(k8s_api).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs",
                                                             label_selector=f"{WORKFLOW_LABEL}={name}")["items"]
        exit_handler = [(n["phase"], n.get("startedAt"), n.get("finishedAt")) for n in nodes if n["templateName"] == "gang-release" and n["type"] == "Pod"]
        assert left == [], ([(j["metadata"]["name"], j["metadata"]["creationTimestamp"], j.get("status", {}).get("state")) for j in left], exit_handler)
    finally:
        _delete_workflow(custom, name)
        core.delete_namespaced_config_map(C10_LANES, "pipectl")


def _small_pod(name: str, priority_class: str, gpus: int = 0) -> dict:
    from pipectl.pipelines.security import restricted_container_security_context, restricted_pod_security_context

    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {"metadata": {"name": name},
            "spec": {"priorityClassName": priority_class, "securityContext": restricted_pod_security_context(),
                     "containers": [{"name": "c", "image": "busybox:1.36", "command": ["true"],
                                     "securityContext": restricted_container_security_context(),
                                     "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": limits}}]}}


def _argo_server(test_cluster, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(test_cluster.argo_server_url + path, method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_argo_server_shows_typed_described_parameters_and_submits_the_template(
        project_applied, training_outputs_supplied, test_cluster, k8s_api):
    """What the Argo UI does, through the real `argo server` API: read training-v1's parameters
    (descriptions, enums) and submit the WorkflowTemplate. Seen here: Argo's submit API does NOT
    enforce parameter enums (the UI offers a drop-down), so a lane outside the enum is created;
    its first pod is refused by the API server (no such PriorityClass) and the retry policy must
    treat that as the spec's fault: one attempt, workflow Failed at once, not ~40 min of backoff."""
    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    status, tmpl = _argo_server(test_cluster, "GET", "/api/v1/workflow-templates/pipectl/training-v1")
    assert status == 200, tmpl
    params = {p["name"]: p for p in tmpl["spec"]["arguments"]["parameters"]}
    assert params["lane"]["enum"] == ["urgent", "standard", "batch"]
    assert all(p.get("description") for p in params.values()), [n for n, p in params.items() if not p.get("description")]

    status, bad = _argo_server(test_cluster, "POST", "/api/v1/workflows/pipectl/submit", {
        "resourceKind": "WorkflowTemplate", "resourceName": "training-v1",
        "submitOptions": {"parameters": ["lane=bogus"]}})
    assert status == 200, bad
    done = _wait_phase(k8s_api, "pipectl", bad["metadata"]["name"], {"Succeeded", "Failed", "Error"}, timeout_s=60)
    assert done["status"]["phase"] in ("Failed", "Error")
    attempts = [n for n in done["status"]["nodes"].values() if n["type"] == "Pod" and n["templateName"] != "gang-release"]
    assert len(attempts) == 1 and "no PriorityClass with name pipectl-bogus" in attempts[0]["message"], attempts

    status, wf = _argo_server(test_cluster, "POST", "/api/v1/workflows/pipectl/submit", {
        "resourceKind": "WorkflowTemplate", "resourceName": "training-v1",
        "submitOptions": {"parameters": ["lane=batch", "workers=1", "gpus-per-worker=1", "processes-per-worker=1"]}})
    assert status == 200, wf
    done = _wait_phase(k8s_api, "pipectl", wf["metadata"]["name"], {"Succeeded", "Failed", "Error"}, timeout_s=120)
    assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
    status, listed = _argo_server(test_cluster, "GET", "/api/v1/workflows/pipectl?listOptions.labelSelector="
                                  "workflows.argoproj.io/workflow-template=training-v1")
    assert status == 200 and wf["metadata"]["name"] in {w["metadata"]["name"] for w in listed["items"]}


@pytest.fixture()
def train_pod_annotations(k8s_api, training_outputs_supplied):
    """Set KWOK directions for the train gang's pods (read by the argoexec stand-in)."""
    from kubernetes import client
    from tests.cluster.cluster import TEST_OUTPUTS_CONFIGMAP

    core = client.CoreV1Api(k8s_api)

    def set_(annotations: dict) -> None:
        core.patch_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, "pipectl",
                                         {"data": {"train.pod-annotations": json.dumps(annotations)}})
    return set_


def submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s: int) -> tuple[str, str, list]:
    """`pipectl submit training` with a 2-pod gang whose pods KWOK keeps running ``run_s`` seconds;
    returns (workflow name, gang job name, the gang's two Running pods) once both run."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    train_pod_annotations({"pipectl.io/run-duration": f"{run_s}s"})
    r = _pipectl(test_cluster, "submit", "training", "-p", "workers=2", "-p", "gpus-per-worker=1",
                 "-p", "processes-per-worker=1", "--output", "json")
    assert r.returncode == 0, r.stderr
    name = json.loads(r.stdout)["name"]
    job = test_cluster.wait_for("the gang job", lambda: _gang_jobs(k8s_api, name), timeout_s=90)[0]

    def running_pods():
        pods = core.list_namespaced_pod("pipectl", label_selector=f"volcano.sh/job-name={job}").items
        running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return running if len(running) == 2 else None
    return name, job, test_cluster.wait_for("the gang running", running_pods, timeout_s=90)


def test_evicted_gang_pod_restarts_the_whole_gang_and_the_workflow_succeeds(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """Delete one running pod of the train gang (what preemption, a drain or a scale-down does):
    Volcano's PodEvicted -> RestartJob policy restarts every pod of the gang (DDP cannot go on with
    a replaced member; the restarted pods resume from the checkpoint), the Argo step keeps waiting,
    and the workflow Succeeds without an Argo-level retry."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    name, job, first = submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s=6)
    core.delete_namespaced_pod(first[1].metadata.name, "pipectl")
    wf = _wait_phase(k8s_api, "pipectl", name, {"Succeeded", "Failed", "Error"}, timeout_s=120)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    vj = _vcjob(k8s_api, "pipectl", job)
    assert vj["status"]["retryCount"] == 1 and vj["status"]["state"]["phase"] == "Completed", vj["status"]
    train_attempts = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n["displayName"].startswith("train(")]
    assert len(train_attempts) == 1  # restarted by Volcano, not retried by Argo
    # the survivor was restarted too: no pod of the first generation completed
    uids = {p.metadata.uid for p in first}
    final = core.list_namespaced_pod("pipectl", label_selector=f"volcano.sh/job-name={job}").items
    assert not uids & {p.metadata.uid for p in final}


def test_code_failure_in_the_gang_fails_the_workflow_without_retries(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """A gang pod exiting 1 is the code's fault: Volcano terminates the job (PodFailed ->
    TerminateJob), argoexec's failureCondition fails the step, Argo does not retry it,
    `pipectl submit --wait` exits 1, and the run's gang job and pods are gone (the gang-release
    exit handler, its command run for real by the argoexec stand-in)."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    train_pod_annotations({"pipectl.io/fail": "Traceback: ZeroDivisionError", "pipectl.io/exit-code": "1"})
    r = _pipectl(test_cluster, "submit", "training", "-p", "workers=2", "-p", "gpus-per-worker=1",
                 "-p", "processes-per-worker=1", "--wait", "--output", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    out = _last_json(r.stdout)
    assert out["phase"] == "Failed"
    wf = _training_wf(_custom(k8s_api), out["name"])
    train_attempts = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n["displayName"].startswith("train(")]
    assert len(train_attempts) == 1 and train_attempts[0]["phase"] == "Failed", train_attempts
    # the gang ended with the run: the exit handler deleted the run's one job (Terminated by
    # Volcano, never restarted) and waited for its pods, before the workflow ended
    release = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName") == "gang-release"]
    assert [n["phase"] for n in release] == ["Succeeded"], release
    assert _gang_jobs(k8s_api, out["name"]) == []
    pods = client.CoreV1Api(k8s_api).list_namespaced_pod("pipectl", label_selector=f"{WORKFLOW_LABEL}={out['name']},pipectl.io/step=train").items
    assert pods == [], [p.metadata.name for p in pods]
    assert not any(n["type"] == "Pod" and n["displayName"].startswith("evaluate") for n in wf["status"]["nodes"].values())


def test_pipectl_retry_in_place_through_the_argo_server_and_resubmit(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """`pipectl retry` has one meaning, in place: with no Argo Server configured (no ARGO_SERVER, no
    site file) it exits 2 naming what to set and `pipectl resubmit`, and the Failed workflow is
    left as it was (same resourceVersion, no new Workflow). With ARGO_SERVER the SAME workflow runs
    its failed train step again (stage and preprocess are not re-run) and Succeeds; a Succeeded
    workflow cannot be retried (exit 2, naming resubmit); `pipectl resubmit` creates a new Workflow
    labelled retry-of. The template as compiled now: C10's train-retry must keep a plain Argo retry
    working (a retryStrategy with backoff on a DAG around the attempt did not: the omitted
    evaluate/register stayed below that DAG's node, which the retry keeps, and the workflow stayed
    Running)."""
    import os

    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    name = submit_a_run_whose_gang_fails(test_cluster, train_pod_annotations)
    train_pod_annotations({})  # the "fix"
    custom = _custom(k8s_api)

    bare = {k: v for k, v in os.environ.items() if k not in ("ARGO_SERVER", "PIPECTL_SITE")}
    bare["KUBECONFIG"] = str(test_cluster.kubeconfig)
    before = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", name)
    r = subprocess.run([str(PIPECTL), "retry", name], capture_output=True, text=True, timeout=60, env=bare)
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    text = " ".join(r.stderr.split())
    assert "none is configured" in text and "ARGO_SERVER" in text and f"pipectl resubmit {name}" in text, text
    after = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", name)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]  # nothing changed
    retried = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                                   label_selector=f"pipectl.io/retry-of={name}")["items"]
    assert retried == []

    env = {**bare, "ARGO_SERVER": test_cluster.argo_server_url.split("://", 1)[1], "ARGO_SECURE": "false"}
    r = subprocess.run([str(PIPECTL), "retry", name], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0 and r.stdout.strip() == name, r.stderr
    wf = _wait_phase(k8s_api, "pipectl", name, {"Succeeded", "Failed", "Error"}, timeout_s=120)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    pods = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod"]
    names = sorted(n["displayName"] for n in pods)
    assert names.count("stage(0)") == 1 and names.count("preprocess(0)") == 1, names  # kept, not re-run
    assert any(n["displayName"].startswith("register") and n["phase"] == "Succeeded" for n in pods)

    r = subprocess.run([str(PIPECTL), "retry", name], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and f"pipectl resubmit {name}" in " ".join(r.stderr.split()), (r.returncode, r.stderr)

    r = _pipectl(test_cluster, "resubmit", name)  # a new Workflow with the same arguments
    assert r.returncode == 0, r.stderr
    new = r.stdout.strip()
    assert new != name
    wf2 = _training_wf(custom, new)
    assert wf2["metadata"]["labels"]["pipectl.io/retry-of"] == name
    assert wf2["spec"]["arguments"] == wf["spec"]["arguments"]
    custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", new)


def _train_template(path: Path = ARGO_DIR / TEMPLATE_FILE) -> tuple[dict, dict]:
    """(the checked-in training WorkflowTemplate, its ``train`` resource template)."""
    wt = yaml.safe_load(path.read_text())
    return wt, next(t for t in wt["spec"]["templates"] if t["name"] == "train")


def _gang_manifest(wt: dict, train: dict, job: str, **params: str) -> str:
    """The train step's manifest as Argo substitutes it for a job named ``job`` (its random
    per-attempt suffix: the tail of ``job``): workflow parameters' defaults, then ``params``
    (kebab names), ``{{workflow.name}}`` (``job`` up to ``-train-``) and ``{{retries}}`` = 0."""
    from tests.tools.gang import gang_job_text, template_defaults

    workflow = job.rsplit("-train-", 1)[0]
    defaults = template_defaults(wt)
    inputs = {**defaults, "shards-uri": "s3://pipectl/runs/x/shards/", "run-uri": "s3://pipectl/runs/x",
              **params, "gang-affinity": "{}"}
    manifest = train["resource"]["manifest"]
    assert manifest.count(JOB_NAME) == 1, manifest
    return gang_job_text(manifest.replace(JOB_NAME, job), workflow=workflow, inputs=inputs, workflow_parameters=defaults)


def test_C16_gang_job_write_resent_after_a_lost_response_attaches_to_the_job(project_applied, test_cluster, k8s_api, tmp_path):
    """C16, the path that created the job twice, reproduced with the real kubectl
    (v1.34.4, the library argoexec runs in-process) as the train step's ServiceAccount: the API
    server commits the first write of the gang job but its response is lost as a ServerTimeout
    500 with Retry-After (tests/tools/kube_fault_proxy.py), and client-go re-sends the request.

    - client-side ``kubectl apply`` (what the step used to run): GET 404, POST 201 (answered 500),
      POST again -> 409, exit 1 ``Error from server (AlreadyExists): error when creating`` while the
      job exists — exactly the field failure. The audit log shows the two creates.
    - the step's own action and flags, read from the checked-in template (server-side apply):
      PATCH 201 (answered 500), PATCH again -> 200, exit 0, one job; a whole second run of
      kubectl (argoexec's own re-send on a transient error) answers 200 with the same object."""
    import os

    from kubernetes import client

    from tests.cluster.cluster import binary
    from tests.tools.kube_fault_proxy import KubeFaultProxy

    kubectl = binary("kubectl")
    if not os.access(kubectl, os.X_OK):
        pytest.fail(f"{kubectl} missing (run tests/cluster/build.sh kubectl)")
    wt, train = _train_template()
    assert train["resource"]["action"] == "apply"
    flags = train["resource"]["flags"]
    core = client.CoreV1Api(k8s_api)
    sa = train["serviceAccountName"]  # the train step's own account (pipectl-launcher)
    token = core.create_namespaced_service_account_token(sa, "pipectl", client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    custom = _custom(k8s_api)
    who = f"system:serviceaccount:pipectl:{sa}"

    def run(name: str, kubectl_flags: list[str]) -> tuple[subprocess.CompletedProcess, list, list]:
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(_gang_manifest(wt, train, name, workers="1"))
        with KubeFaultProxy(test_cluster.ports["apiserver"], test_cluster.pki,
                            fail=lambda m, p: m in ("POST", "PATCH") and "/jobs" in p) as px:
            kc = tmp_path / f"{name}.kubeconfig"
            kc.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "sa",
                "clusters": [{"name": "c", "cluster": {"server": px.url, "certificate-authority": str(test_cluster.pki / "ca.crt")}}],
                "users": [{"name": "sa", "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa", "namespace": "pipectl"}}]}))
            r = subprocess.run([str(kubectl), "--kubeconfig", str(kc), "apply", *kubectl_flags, "-f", str(manifest), "-o", "json"],
                               capture_output=True, text=True, timeout=120)
            writes = px.writes()
        audit = [(e["verb"], e["responseStatus"]["code"], e["user"]["username"])
                 for e in test_cluster.audit_events(name)
                 if e.get("stage") == "ResponseComplete" and e["user"]["username"] == who]
        return r, writes, audit

    try:
        # the field failure, reproduced: client-side apply
        old, writes, audit = run("c16-client-side-train-0", [])
        print("client-side apply:", old.returncode, old.stderr.strip()[-300:], writes, audit)
        assert old.returncode != 0 and "AlreadyExists" in old.stderr and "error when creating" in old.stderr, old.stderr
        assert [(m, up, ans) for m, _, up, ans in writes] == [("POST", 201, 500), ("POST", 409, 409)], writes
        assert audit == [("create", 201, who), ("create", 409, who)], audit
        custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", "c16-client-side-train-0")

        # what the step runs now
        name = "c16-server-side-train-0"
        new, writes, audit = run(name, flags)
        print("server-side apply:", new.returncode, writes, audit)
        assert new.returncode == 0, new.stderr
        assert [(m, up, ans) for m, _, up, ans in writes] == [("PATCH", 201, 500), ("PATCH", 200, 200)], writes
        assert audit == [("patch", 201, who), ("patch", 200, who)], audit
        job = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", name)
        assert json.loads(new.stdout)["metadata"]["uid"] == job["metadata"]["uid"]
        assert job["spec"]["minAvailable"] == 1 and job["spec"]["tasks"][0]["replicas"] == 1
        # argoexec's own re-send (a second kubectl run): the same object, nothing new
        again, writes, _ = run(name, flags)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["metadata"]["uid"] == job["metadata"]["uid"]
    finally:
        for n in ("c16-client-side-train-0", "c16-server-side-train-0"):
            try:
                custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs", n)
            except client.ApiException:
                pass


def test_least_privilege_auth_can_i_list_per_service_account(project_applied, test_cluster, capsys):
    """What each of the pipeline's ServiceAccounts may do in its namespace, as the API
    server's own authorizer answers (`kubectl auth can-i --list --as=...`, kubectl v1.34.4): step
    pods only report results, the train step's account also creates/gets/patches the one gang job
    kind and lists/watches/deletes it and lists/watches pods (the gang-release exit handler), the
    training pods' account nothing, the gang reaper's reads and watches workflows, lists, watches
    and deletes the gang job kind and lists and watches pods. The tables are printed (docs/security.md shows them)."""
    from pipectl.pipelines.gang_reaper import GANG_REAPER, gang_reaper
    from pipectl.pipelines.manifests import rbac
    from pipectl.pipelines.training import CompileConfig
    from tests.cluster.cluster import binary

    cfg = CompileConfig()
    always = {"selfsubjectreviews.authentication.k8s.io": "[create]",
              "selfsubjectaccessreviews.authorization.k8s.io": "[create]",
              "selfsubjectrulesreviews.authorization.k8s.io": "[create]"}
    expected = {
        cfg.service_account: {"workflowtaskresults.argoproj.io": "[create patch]"},
        cfg.launcher_service_account: {"workflowtaskresults.argoproj.io": "[create patch]",
                                       "jobs.batch.volcano.sh": "[create get patch list watch delete]",
                                       "pods": "[list watch]"},
        cfg.training_service_account: {},
        GANG_REAPER: {"workflows.argoproj.io": "[get list watch]", "jobs.batch.volcano.sh": "[list watch delete]",
                      "pods": "[list watch]"},
    }
    assert {o["metadata"]["name"] for o in rbac(cfg) + gang_reaper(cfg) if o["kind"] == "ServiceAccount"} == set(expected)
    tables = {}
    for sa, want in expected.items():
        r = subprocess.run([str(binary("kubectl")), "--kubeconfig", str(test_cluster.kubeconfig), "auth", "can-i", "--list",
                            "-n", "pipectl", f"--as=system:serviceaccount:pipectl:{sa}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        tables[sa] = r.stdout
        rows = {}
        for line in r.stdout.splitlines()[1:]:
            cols = line.split()
            if cols and not cols[0].startswith("["):  # resource rows (non-resource URLs start with "[")
                rows[cols[0]] = line[line.rindex("["):].strip()  # verbs, e.g. "[create get patch]"
        assert rows == {**always, **want}, (sa, r.stdout)  # exactly these: no other resource, no "*"
    with capsys.disabled():
        for sa, table in tables.items():
            print(f"\n$ kubectl auth can-i --list -n pipectl --as=system:serviceaccount:pipectl:{sa}\n{table}")


PROMETHEUS_OPERATOR = "github.com/prometheus-operator/prometheus-operator@v0.80.1"


@pytest.mark.session_last  # applies the product's controller configuration: later workflows on KWOK never end
def test_kubectl_apply_k_argo_as_a_user_would(test_cluster, k8s_api, tmp_path):
    """`kubectl apply --server-side -k argo/` (kubectl v1.34.4 built by build.sh, its own kustomize)
    on a cluster that has what argo/ expects installed: Argo (namespace argo), Volcano (namespace
    volcano-system) and prometheus-operator's PrometheusRule and PodMonitor CRDs (from its Go module). The shared
    controller ConfigMap is patched, not replaced: another tenant's key stays, and a key
    the cluster's admin set differently is a conflict, not a silent overwrite. Every object is
    accepted; a second apply changes nothing. Runs last: it applies the controller configuration
    the other tests do not expect."""
    import os
    import shutil

    from kubernetes import client
    from tests.cluster.cluster import binary

    kubectl = binary("kubectl")
    if not os.access(kubectl, os.X_OK):
        msg = f"{kubectl} missing (run tests/cluster/build.sh kubectl)"
        if os.environ.get("PIPECTL_REQUIRE_CLUSTER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    dl = subprocess.run([go, "mod", "download", "-json", PROMETHEUS_OPERATOR], capture_output=True, text=True,
                        cwd=tmp_path, env={**os.environ, "GOFLAGS": ""}, timeout=300)
    assert dl.returncode == 0, dl.stderr
    crds = Path(json.loads(dl.stdout)["Dir"]) / "example/prometheus-operator-crd-full"
    env = {**os.environ, "KUBECONFIG": str(test_cluster.kubeconfig)}

    def kc(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(kubectl), *args], capture_output=True, text=True, timeout=120, env=env)

    for kind in ("prometheusrules", "podmonitors"):  # argo/namespace/monitoring/: the alerts, the gang pods' endpoint
        r = kc("apply", "--server-side", "-f", str(crds / f"monitoring.coreos.com_{kind}.yaml"))  # too large for client-side apply
        assert r.returncode == 0, r.stderr
    core = client.CoreV1Api(k8s_api)
    if "volcano-system" not in {n.metadata.name for n in core.list_namespace().items}:
        core.create_namespace({"metadata": {"name": "volcano-system"}})
    test_cluster.wait_for("PrometheusRule and PodMonitor CRDs served",
                          lambda: kc("get", "prometheusrules,podmonitors", "-A").returncode == 0, timeout_s=60)

    # Another tenant's key in the shared controller ConfigMap, written by its own field manager.
    other = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "workflow-controller-configmap", "namespace": "argo"},
             "data": {"otherTenantLinks": "keep-me"}}
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    r = kc("apply", "--server-side", "--field-manager=other-tenant", "-f", str(tmp_path / "other.yaml"))
    assert r.returncode == 0, r.stderr
    before = core.read_namespaced_config_map("workflow-controller-configmap", "argo").data

    # As the README says: server-side. The test cluster's admin set metricsConfig (its own port):
    # pipectl's value differs, so the API server refuses to take it over silently (a conflict
    # naming the field) and applies everything else.
    r = kc("apply", "--server-side", "-k", str(ARGO_DIR))
    assert r.returncode != 0 and "conflict" in r.stderr and ".data.metricsConfig" in r.stderr, r.stdout + r.stderr
    # the admin decides to take the field over
    r = kc("apply", "--server-side", "--force-conflicts", "-k", str(ARGO_DIR))
    assert r.returncode == 0, r.stdout + r.stderr
    applied = [line for line in r.stdout.splitlines() if line.strip()]
    expected = sum(1 for f in ARGO_DIR.rglob("*.yaml") if f.name != "kustomization.yaml"
                   and not {"kube-apiserver", "autoscaling"} & set(f.parts)  # not in the top-level kustomization
                   for d in yaml.safe_load_all(f.read_text()) if d)
    assert len(applied) == expected, r.stdout
    after = core.read_namespaced_config_map("workflow-controller-configmap", "argo").data
    assert after["otherTenantLinks"] == "keep-me"  # patched, not replaced: other tenants' keys stay
    assert after["telemetryConfig"] == before["telemetryConfig"]  # a key pipectl does not set stays too
    assert "links" in after and "executor" in after
    # nothing that sets other tenants' workflows' defaults or their namespaces' limits
    assert "workflowDefaults" not in after and "namespaceParallelism" not in after, sorted(after)

    def versions() -> dict:
        out = kc("get", "-k", str(ARGO_DIR), "-o", "json")
        assert out.returncode == 0, out.stderr
        return {(i["kind"], i["metadata"]["name"]): i["metadata"]["resourceVersion"] for i in json.loads(out.stdout)["items"]}

    first = versions()
    r = kc("apply", "--server-side", "-k", str(ARGO_DIR))  # again: no conflict now, and nothing changes
    assert r.returncode == 0, r.stdout + r.stderr
    assert versions() == first
    r = kc("get", "workflowtemplate", "training-v1", "-n", "pipectl", "-o", "name")
    assert r.stdout.strip() == "workflowtemplate.argoproj.io/training-v1"
    _readme_install_commands_run_verbatim(test_cluster, core, env, Path(kubectl).parent, tmp_path)


def _readme_install_commands_run_verbatim(test_cluster, core, env: dict, kubectl_dir: Path, tmp_path: Path) -> None:
    """The README's cluster install block (the one marked ``<!-- tested verbatim``, from the site
    file to doctor; tests/tools/doc_blocks.py), run as written in one bash, in a fresh copy of a
    checkout (argo/ as checked in, the venv), kubectl and the cluster's kubeconfig as a user has
    them: every command exits 0 (the site file written, argo/ rendered from it and applied, the
    Secret created, lint and templates apply with the exported PIPECTL_SITE), and doctor answers with its table (exit 0, or 1 for what this test cluster lacks: no MLflow, no
    store). The doc cannot drift from what works."""
    import shutil

    from tests.tools.doc_blocks import run_block, tested_blocks

    (commands,) = tested_blocks(REPO / "README.md")
    with contextlib.suppress(Exception):  # the README creates it: as on a fresh cluster
        core.delete_namespaced_secret("pipectl-s3-credentials", "pipectl")
    work = tmp_path / "checkout"
    shutil.copytree(ARGO_DIR, work / "argo")
    (work / ".venv").symlink_to(REPO / ".venv")
    shell_env = {k: v for k, v in env.items() if k not in ("PIPECTL_SITE", "PIPECTL_NAMESPACE", "ARGO_SERVER")}
    shell_env["PATH"] = f"{kubectl_dir}{os.pathsep}{REPO / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    run = run_block(commands, work, shell_env, timeout_s=600)
    print(run.output[-6000:])
    assert not run.failed({" doctor": (0, 1)}), (run.failed({" doctor": (0, 1)}), run.output[-4000:])
    assert re.search(r"ready: nothing failed|\d+ check\(s\) failed", run.output), run.output[-3000:]  # doctor's verdict
    assert "namespace: pipectl" in (work / "site.yaml").read_text()
    assert "wrote argo/kustomization.yaml" in run.output  # the install applied argo/ as rendered from the site file
    secret = core.read_namespaced_secret("pipectl-s3-credentials", "pipectl")
    assert set(secret.data) == {"PIPECTL_S3_ACCESS_KEY", "PIPECTL_S3_SECRET_KEY"}
