"""What a test module left running on the shared control plane.

Every module of tier 2 shares one control plane (the session's ``test_cluster``). A module may
leave history behind (a Succeeded workflow, a Completed gang job: a real cluster keeps those
too), but nothing that still runs or waits for capacity: a Workflow not yet finished, a Volcano
Job not in a final state, a Pod Pending or Running (not one a Deployment, DaemonSet or
StatefulSet keeps: an installed service, such as the gang reaper, runs on by design). Such an object would hold fake GPUs and
quota the next module counts on, and the next module's result would depend on the order the
modules ran in. :func:`active` lists them; the fixture in ``tests/cluster/conftest.py`` takes a
snapshot before a module and fails the module's teardown when, after a deadline, objects the
module created are still active (then deletes them, so the next module starts clean).
"""

from __future__ import annotations

from dataclasses import dataclass

WORKFLOW_DONE = {"Succeeded", "Failed", "Error"}
# batch.volcano.sh/v1alpha1 Job status.state.phase values after which the job holds nothing
VOLCANO_DONE = {"Completed", "Failed", "Terminated", "Aborted"}
POD_ACTIVE = {"Pending", "Running"}
SERVICE_OWNERS = {"ReplicaSet", "DaemonSet", "StatefulSet"}  # a Deployment's pods are owned by its ReplicaSet
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease", "volcano-system")


@dataclass(frozen=True)
class Active:
    kind: str
    namespace: str
    name: str
    uid: str
    state: str

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name} ({self.state or 'no phase yet'})"


def _custom_items(api, group: str, version: str, plural: str) -> list[dict]:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        return client.CustomObjectsApi(api).list_cluster_custom_object(group, version, plural)["items"]
    except ApiException as e:
        if e.status == 404:  # the CRD is not installed (a control plane without Volcano)
            return []
        raise


def _a_service(pod) -> bool:
    """A pod a Deployment, DaemonSet or StatefulSet keeps running: part of an install (the gang
    reaper that `kubectl apply -k argo/namespace` brings), meant to run on after the module that
    applied it, not work a test left behind."""
    return any(o.controller and o.kind in SERVICE_OWNERS for o in pod.metadata.owner_references or [])


def active(api) -> list[Active]:
    """Every Workflow, Volcano Job and Pod outside the system namespaces that still runs or waits."""
    from kubernetes import client

    found: list[Active] = []
    for wf in _custom_items(api, "argoproj.io", "v1alpha1", "workflows"):
        phase = (wf.get("status") or {}).get("phase", "")
        if phase not in WORKFLOW_DONE:
            m = wf["metadata"]
            found.append(Active("Workflow", m["namespace"], m["name"], m["uid"], phase))
    for job in _custom_items(api, "batch.volcano.sh", "v1alpha1", "jobs"):
        phase = ((job.get("status") or {}).get("state") or {}).get("phase", "")
        if phase not in VOLCANO_DONE:
            m = job["metadata"]
            found.append(Active("Volcano Job", m["namespace"], m["name"], m["uid"], phase))
    for pod in client.CoreV1Api(api).list_pod_for_all_namespaces().items:
        if pod.metadata.namespace not in SYSTEM_NAMESPACES and pod.status.phase in POD_ACTIVE and not _a_service(pod):
            found.append(Active("Pod", pod.metadata.namespace, pod.metadata.name, pod.metadata.uid, pod.status.phase))
    return found


def delete(api, objects: list[Active]) -> None:
    """Delete ``objects`` (background propagation: a Workflow takes its pods and gang job along)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    for o in objects:
        try:
            if o.kind == "Workflow":
                custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", o.namespace, "workflows", o.name)
            elif o.kind == "Volcano Job":
                custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", o.namespace, "jobs", o.name)
            else:
                core.delete_namespaced_pod(o.name, o.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise
