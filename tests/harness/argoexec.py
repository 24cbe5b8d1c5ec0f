"""argoexec stand-in: what Argo's executor would do for pods on KWOK nodes, which run nothing.
Pods on a real node (tests/cluster/node.py: a kubelet, their own argoexec) are left alone.

* container templates: when KWOK ends the pod, create the node's WorkflowTaskResult labelled
  report-outputs-completed=true, as argoexec's `wait` container does (Argo >= 3.5 keeps a workflow
  Running until every pod's result is reported). Output parameters are those the TEST supplies in
  the ConfigMap ``pipectl-test-outputs`` of the pod's namespace (key: template name, value: JSON
  object parameter -> value); only parameters the template declares are reported, so a template
  whose outputs the test does not supply stays without them (and Argo fails the dependent
  substitution, as it would for a real step). Key ``<template>.pod-annotations`` (JSON object)
  adds annotations to the pods of the resource a resource template creates: KWOK's directions
  (``pipectl.io/run-duration``, ``pipectl.io/fail``...), nothing the scheduler or Volcano reads.
* the ``gang-release`` exit handler and ``gang-avoid`` (:data:`RUN_FOR_REAL`): KWOK leaves their pods Running; their
  command runs here, for real, against the API server, and the pod ends with its exit code.
* resource templates (`argoexec resource create|apply`): create the manifest Argo put in the
  template (owner reference included), then evaluate the template's successCondition /
  failureCondition on the live object with argoexec's own condition code (tests/tools/argoexpr,
  built from the Argo module) every 0.5 s, and end the pod as argoexec would: exit 0, or exit 1
  with the reason as termination message. Pods annotated ``pipectl.io/fail`` are left to KWOK.

Runs forever, a component of the test cluster: ``python tests/harness/argoexec.py KUBECONFIG``.
"""

from __future__ import annotations

import datetime
import json
import sys
import threading
import time
from pathlib import Path

WF_LABEL = "workflows.argoproj.io/workflow"
NODE_ID_ANNOTATION = "workflows.argoproj.io/node-id"
COMPLETED_LABEL = "workflows.argoproj.io/report-outputs-completed"
TEST_OUTPUTS_CONFIGMAP = "pipectl-test-outputs"


def _argo_template(pod) -> dict:
    """The template Argo gave this pod (env ARGO_TEMPLATE of its containers), or {}."""
    for c in list(pod.spec.containers or []) + list(pod.spec.init_containers or []):
        for e in c.env or []:
            if e.name == "ARGO_TEMPLATE" and e.value:
                return json.loads(e.value)
    return {}


def _is_resource_pod(pod) -> bool:
    """True for the pod of a resource template: ``... emissary -- argoexec resource <action>`` in
    its main container (with archiveLogs a wait container comes first)."""
    for c in pod.spec.containers or []:
        cmd = c.command or []
        if any(cmd[i:i + 2] == ["argoexec", "resource"] for i in range(len(cmd))):
            return True
    return False


def _pod_templates(obj: dict) -> list[dict]:
    """Pod templates inside a Volcano Job / PyTorchJob / batch Job manifest."""
    spec = obj.get("spec", {})
    if "tasks" in spec:
        return [t["template"] for t in spec["tasks"]]
    if "pytorchReplicaSpecs" in spec:
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    return [spec["template"]] if "template" in spec else []


RUN_FOR_REAL = (["python", "-m", "pipectl.components.gang"], ["python", "-m", "pipectl.components.gang.avoid"])
"""Container steps the stand-in runs for real (their command, from this checkout) while their pod
runs, ending the pod when the command ends and reporting the output parameters it wrote: the
``gang-release`` exit handler and ``gang-avoid``, whose effects on the cluster (the run's gang jobs
deleted, the next gang's affinity) are what the tests check; they need only the API server. KWOK's
pod-complete stage leaves these pods alone (tests/harness/manifests/kwok-pod-stages.yaml)."""


def _runs_for_real(tmpl: dict) -> bool:
    return (tmpl.get("container") or {}).get("command") in RUN_FOR_REAL


def _key(pod) -> tuple[str, str, str]:
    return (pod.metadata.namespace, pod.metadata.name, pod.metadata.uid)


class TaskResultReporter:
    """The stand-in's state: pods done, resource pods running; ``run()`` watches forever."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config, dynamic

        from tests.tools.argo import ArgoExpr

        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.dyn = dynamic.DynamicClient(self.api)
        self.argoexpr = ArgoExpr()
        self.done: set[tuple[str, str, str]] = set()
        # (namespace, pod name, pod uid) -> {"api": resource api, "name", "ns", "tmpl", "pod"}
        self.running: dict[tuple[str, str, str], dict] = {}
        self.real: set[tuple[str, str, str]] = set()  # pods whose command runs here (RUN_FOR_REAL)
        self.real_nodes: dict[str, bool] = {}  # node name -> run by a real kubelet (not KWOK)
        self.lock = threading.Lock()

    # -- what the test supplies ----------------------------------------------------------------

    def _test_data(self, pod, key: str) -> dict:
        from kubernetes import client

        try:
            cm = self.core.read_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, pod.metadata.namespace)
        except client.ApiException:
            return {}
        return json.loads((cm.data or {}).get(key, "{}"))

    def supplied_outputs(self, pod, tmpl: dict) -> dict:
        declared = (tmpl.get("outputs") or {}).get("parameters", [])
        if not declared:
            return {}
        values = self._test_data(pod, tmpl.get("name", ""))
        # as argoexec reports them: the template's parameter (globalName, valueFrom...) with its value
        params = [{**p, "value": str(values[p["name"]])} for p in declared if p["name"] in values]
        return {"parameters": params} if params else {}

    def test_pod_annotations(self, pod, tmpl: dict) -> dict:
        return self._test_data(pod, tmpl.get("name", "") + ".pod-annotations")

    # -- WorkflowTaskResults ---------------------------------------------------------------------

    def write_result(self, pod, outputs: dict) -> None:
        from kubernetes import client

        node_id = (pod.metadata.annotations or {})[NODE_ID_ANNOTATION]
        ns = pod.metadata.namespace
        owner = next((o for o in (pod.metadata.owner_references or []) if o.kind == "Workflow"), None)
        body = {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTaskResult",
            "metadata": {"name": node_id, "namespace": ns,
                         "labels": {WF_LABEL: pod.metadata.labels[WF_LABEL], COMPLETED_LABEL: "true"}},
            "outputs": outputs,
        }
        if owner is not None:
            body["metadata"]["ownerReferences"] = [{"apiVersion": "argoproj.io/v1alpha1",
                                                    "kind": "Workflow", "name": owner.name,
                                                    "uid": owner.uid}]
        try:
            self.custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflowtaskresults", body)
        except client.ApiException as e:
            if e.status != 409:
                raise
            self.custom.patch_namespaced_custom_object(
                "argoproj.io", "v1alpha1", ns, "workflowtaskresults", node_id,
                {"metadata": {"labels": {COMPLETED_LABEL: "true"}}, "outputs": outputs})

    def report(self, pod) -> None:
        """Handle one pod event: start a resource pod's manifest, or report an ended pod."""
        from kubernetes import client

        ann = pod.metadata.annotations or {}
        if not ann.get(NODE_ID_ANNOTATION) or not (pod.metadata.labels or {}).get(WF_LABEL):
            return
        key = _key(pod)
        if key in self.done or self._on_a_real_node(pod):
            return
        if _is_resource_pod(pod) and "pipectl.io/fail" not in ann and pod.status.phase == "Running":
            with self.lock:
                if key not in self.running and self._still_running(pod):
                    self.start_resource(pod)
            return
        tmpl = _argo_template(pod)
        if _runs_for_real(tmpl) and "pipectl.io/fail" not in ann and pod.status.phase == "Running":
            with self.lock:
                if key in self.real or not self._still_running(pod):
                    return
                self.real.add(key)
            threading.Thread(target=self.run_for_real, args=(pod, tmpl), daemon=True).start()
            return
        if pod.status.phase not in ("Succeeded", "Failed"):
            return
        outputs = self.supplied_outputs(pod, tmpl) if pod.status.phase == "Succeeded" else {}
        try:
            self.write_result(pod, outputs)
        except client.ApiException as e:
            print(f"taskresult {key}: {e.status} {e.body}", flush=True)
            return
        self.done.add(key)
        print(f"reported {key} ({pod.status.phase}) outputs={outputs}", flush=True)

    def _on_a_real_node(self, pod) -> bool:
        """True for a pod bound to a node KWOK does not manage (a real kubelet: tests/cluster/node.py):
        its own argoexec runs it, and anything done here would race it (a gang job created twice,
        as another user; a result or status written over the real one). A pod not bound yet is
        left to the rules above, as on a cluster of KWOK nodes only."""
        from kubernetes import client

        from tests.harness.kwok import FAKE_NODE_ANNOTATION

        name = pod.spec.node_name
        if not name:
            return False
        if name not in self.real_nodes:
            try:
                node = self.core.read_node(name)
            except client.ApiException:
                return False  # gone (a fake node Karpenter removed): as before
            self.real_nodes[name] = (node.metadata.annotations or {}).get(FAKE_NODE_ANNOTATION[0]) != FAKE_NODE_ANNOTATION[1]
        return self.real_nodes[name]

    def _still_running(self, pod) -> bool:
        """The pod, read again now, is Running and not being deleted: argoexec runs inside its pod,
        so a pod deleted while this event waited in the watch's queue never applies anything."""
        from kubernetes import client

        try:
            now = self.core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        except client.ApiException:
            return False
        return now.metadata.uid == pod.metadata.uid and now.status.phase == "Running" and not now.metadata.deletion_timestamp

    def run_for_real(self, pod, tmpl: dict) -> None:
        """Run the step's own command here (this checkout's interpreter, the cluster's kubeconfig)
        while its pod is Running, then end the pod with the command's exit code, as its container
        would (KWOK leaves these pods Running: kwok-pod-stages.yaml)."""
        import os
        import subprocess
        import tempfile

        key = _key(pod)
        c = tmpl["container"]
        with tempfile.TemporaryDirectory() as outputs:
            argv = [sys.executable, *c["command"][1:], *(a if a != "/tmp/outputs" else outputs for a in c.get("args", []))]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=600, env={**os.environ, "KUBECONFIG": self.kubeconfig})
            declared = [p for p in (tmpl.get("outputs") or {}).get("parameters", []) if r.returncode == 0]
            written = [{**p, "value": Path(outputs, p["name"]).read_text()} for p in declared if Path(outputs, p["name"]).is_file()]
        print(f"ran {key} for real: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}", flush=True)
        self.finish(pod, r.returncode, "" if r.returncode == 0 else r.stderr.strip()[-500:],
                    outputs={"parameters": written} if written else {})

    # -- resource templates ------------------------------------------------------------------

    def _create(self, obj: dict, ns: str, res: dict):
        """Create (or server-side apply) ``obj`` as `kubectl` would for the template's action."""
        action = res.get("action")
        if action not in ("create", "apply"):
            raise ValueError(f"stand-in supports actions create and apply only, not {action!r}")
        rapi = self.dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        flags = res.get("flags") or []
        if action == "apply" and "--server-side" in flags:
            # `kubectl apply --server-side`: one PATCH that creates or re-applies (as kubectl)
            manager = next((f.split("=", 1)[1] for f in flags if f.startswith("--field-manager=")), "kubectl")
            rapi.server_side_apply(body=obj, namespace=ns, field_manager=manager,
                                   force_conflicts="--force-conflicts" in flags)
            return rapi
        try:
            rapi.create(body=obj, namespace=ns)
        except Exception as e:  # noqa: BLE001
            # client-side `kubectl apply` of the same manifest onto the object that exists
            # changes nothing and waits for it; `kubectl create` fails with AlreadyExists.
            if action != "apply" or getattr(e, "status", None) != 409:
                raise
        return rapi

    def start_resource(self, pod) -> None:
        import yaml

        key = _key(pod)
        tmpl = _argo_template(pod)
        res = tmpl.get("resource") or {}
        obj = yaml.safe_load(res.get("manifest", "")) or {}
        ns = obj.get("metadata", {}).get("namespace") or pod.metadata.namespace
        extra = self.test_pod_annotations(pod, tmpl)
        if extra:  # KWOK directions only (run time, simulated failure): the manifest is Argo's
            for t in _pod_templates(obj):
                t.setdefault("metadata", {}).setdefault("annotations", {}).update(extra)
        try:
            rapi = self._create(obj, ns, res)
        except Exception as e:  # noqa: BLE001 - argoexec fails the step the same way
            reason = getattr(e, "reason", "") or type(e).__name__
            self.finish(pod, 1, f"{reason}: {getattr(e, 'body', '') or e}"[:500])
            return
        self.running[key] = {"api": rapi, "name": obj["metadata"]["name"], "ns": ns, "tmpl": tmpl, "pod": pod}
        print(f"resource {key}: created {obj['kind']} {ns}/{obj['metadata']['name']}", flush=True)

    def finish(self, pod, exit_code: int, message: str, pod_reason: str = "", outputs: dict | None = None) -> None:
        """End a resource pod as argoexec would: its result reported (``outputs``), containers
        terminated (``pod_reason``: the pod's own status.reason/message, as the kubelet sets them)."""
        from kubernetes import client

        key = _key(pod)
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        started = pod.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ") if pod.status.start_time else now
        term = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": started, "finishedAt": now}
        if message:
            term["message"] = message
        phase = "Succeeded" if exit_code == 0 else "Failed"
        try:
            self.write_result(pod, outputs or {})
            self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace, {"status": {
                "phase": phase,
                **({"reason": pod_reason, "message": message} if pod_reason else {}),
                "containerStatuses": [{"name": c.name, "image": c.image, "ready": False,
                                       "restartCount": 0, "state": {"terminated": term}}
                                      for c in pod.spec.containers]}})
        except client.ApiException as e:
            if e.status != 404:
                print(f"finish {key}: {e.status} {e.body}", flush=True)
                return
        self.done.add(key)
        self.running.pop(key, None)
        print(f"resource {key}: {phase} {message}", flush=True)

    def check_resource(self, key: tuple[str, str, str], r: dict) -> None:
        """One poll of a running resource pod: gone pod -> forget; gone object or a condition met
        -> finish the pod."""
        from kubernetes import client

        try:
            if self.core.read_namespaced_pod(key[1], key[0]).metadata.uid != key[2]:
                raise client.ApiException(status=404)
        except client.ApiException as e:
            if e.status == 404:  # the pod went away: stop, as argoexec would
                self.running.pop(key, None)
                self.done.add(key)
                return
            raise
        pod = r["pod"]
        deadline = pod.spec.active_deadline_seconds
        if deadline and pod.status.start_time and (
                datetime.datetime.now(datetime.timezone.utc) - pod.status.start_time).total_seconds() > deadline:
            # what the kubelet does with Argo's template timeout (activeDeadlineSeconds) on a real node
            with self.lock:
                self.finish(pod, 143, "Pod was active on the node longer than the specified deadline", "DeadlineExceeded")
            return
        try:
            obj = r["api"].get(name=r["name"], namespace=r["ns"]).to_dict()
        except client.ApiException as e:
            if e.status != 404:
                raise
            with self.lock:
                self.finish(r["pod"], 1, f"{r['name']} was deleted")
            return
        res = r["tmpl"]["resource"]
        state = self.argoexpr.resource_state(res.get("successCondition", ""), res.get("failureCondition", ""), obj)
        if state == "succeeded":
            with self.lock:
                self.finish(r["pod"], 0, "")
        elif state == "failed":
            with self.lock:
                self.finish(r["pod"], 1, f"{obj['kind']} {r['name']} failed condition "
                                         f"{res.get('failureCondition')!r}")

    def poll_resources(self) -> None:
        while True:
            time.sleep(0.5)
            with self.lock:
                items = list(self.running.items())
            for key, r in items:
                try:
                    self.check_resource(key, r)
                except Exception as e:  # noqa: BLE001 - keep polling the others
                    print(f"poll {key}: {e!r}", flush=True)

    def run(self) -> None:
        """Watch every workflow pod forever (list, then watch; relist after errors)."""
        from kubernetes import watch

        threading.Thread(target=self.poll_resources, daemon=True).start()
        while True:
            try:
                pods = self.core.list_pod_for_all_namespaces(label_selector=WF_LABEL)
                for p in pods.items:
                    self.report(p)
                w = watch.Watch()
                for ev in w.stream(self.core.list_pod_for_all_namespaces, label_selector=WF_LABEL,
                                   resource_version=pods.metadata.resource_version, timeout_seconds=300):
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        self.report(ev["object"])
            except Exception as e:  # noqa: BLE001 - API restarts, expired resource versions
                print(f"watch error: {e!r}", flush=True)
                time.sleep(1)


def run_taskresult_reporter(kubeconfig: str) -> None:
    """Run the stand-in for the cluster of ``kubeconfig`` forever (see the module docstring)."""
    TaskResultReporter(kubeconfig).run()


if __name__ == "__main__":
    sys.path[0] = str(Path(__file__).resolve().parents[2])  # the repository, not this folder
    run_taskresult_reporter(sys.argv[1])
