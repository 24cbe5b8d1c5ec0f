"""Field case C07 on the KWOK cluster: every way the infrastructure loses a gang pod
restarts the WHOLE gang (Volcano policy, pipelines/pipectl/pipelines/launchers/volcano.py), and a
code failure ends it at once.

Each case writes onto one running pod of the product's Volcano Job the pod status exactly as the
kubelet (or the control plane) leaves it — no pod is deleted: a node-pressure eviction keeps the
pod object, phase Failed, reason Evicted, which Volcano reports as PodFailed with the first
container's exit code (0 when it has no terminated state), never as PodEvicted. The statuses
follow the kubelet's code (Kubernetes v1.34): pkg/kubelet/eviction (reason "Evicted", message
"The node was low on resource: ...", condition DisruptionTarget/TerminationByKubelet),
pkg/kubelet/nodeshutdown (reason "Terminated", "Pod was terminated in response to imminent node
shutdown."), pkg/kubelet/lifecycle admission (reason UnexpectedAdmissionError, no container ran),
and the scheduler's preemption (DisruptionTarget/PreemptionByScheduler) whose victim outlived its
grace period (SIGKILL, 137: what Volcano >= 1.14 reports as PodFailed).
"""

from __future__ import annotations

import json
import time

import pytest

from pipectl.components.names import STEP_LABEL, WORKFLOW_LABEL
from tests.cluster.test_control_plane import (  # noqa: F401 - fixtures
    C10_LANES,
    _c10_workflow,
    _custom,
    _lose_running_launcher_pod,
    _delete_workflow,
    _gang_jobs,
    _lane_gang,
    _pipectl,
    _vcjob,
    _wait_phase,
    project_applied,
    submit_two_worker_training,
    train_pod_annotations,
    training_outputs_supplied,
)

NS = "pipectl"
EVICTION_MESSAGE = ("The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. "
                    "Container pytorch was using 7Gi, request is 8Gi, has larger consumption of memory. ")


def _terminated(exit_code: int, reason: str = "Error") -> dict:
    return {"running": None, "terminated": {"exitCode": exit_code, "reason": reason,
                                            "startedAt": "2026-12-01T00:00:00Z", "finishedAt": "2026-12-01T00:00:01Z"}}


def _disruption(reason: str, message: str) -> dict:
    return {"type": "DisruptionTarget", "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-12-01T00:00:01Z"}


# (pod status the kubelet / control plane writes, whole gang restarts?)
LOSSES = {
    "node-pressure-eviction-137": ({
        "phase": "Failed", "reason": "Evicted", "message": EVICTION_MESSAGE,
        "conditions": [_disruption("TerminationByKubelet", EVICTION_MESSAGE)],
        "containerStatuses": [{"name": "pytorch", "ready": False, "state": _terminated(137)}]}, True),
    "node-pressure-eviction-no-exit-code": ({
        "phase": "Failed", "reason": "Evicted", "message": EVICTION_MESSAGE,
        "conditions": [_disruption("TerminationByKubelet", EVICTION_MESSAGE)],
        "containerStatuses": [{"name": "pytorch", "ready": False,
                               "state": {"running": None, "waiting": {"reason": "ContainerCreating"}}}]}, True),
    "graceful-node-shutdown-143": ({
        "phase": "Failed", "reason": "Terminated", "message": "Pod was terminated in response to imminent node shutdown.",
        "conditions": [_disruption("TerminationByKubelet", "Pod was terminated in response to imminent node shutdown.")],
        "containerStatuses": [{"name": "pytorch", "ready": False, "state": _terminated(143)}]}, True),
    "preempted-past-grace-period-137": ({
        "phase": "Failed",
        "conditions": [_disruption("PreemptionByScheduler", "volcano: preempting to make room for a higher priority gang")],
        "containerStatuses": [{"name": "pytorch", "ready": False, "state": _terminated(137)}]}, True),
    "admission-rejected-after-node-restart": ({
        "phase": "Failed", "reason": "UnexpectedAdmissionError",
        "message": "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices nvidia.com/gpu, "
                   "which is unexpected"}, True),
    "code-failure-exit-1": ({
        "phase": "Failed",
        "containerStatuses": [{"name": "pytorch", "ready": False, "state": _terminated(1)}]}, False),
}


def _running_pods(core, job: str, n: int):
    pods = core.list_namespaced_pod(NS, label_selector=f"volcano.sh/job-name={job}").items
    running = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
    return running if len(running) == n else None


def test_C07_a_gang_pod_lost_to_the_infrastructure_restarts_the_whole_gang(project_applied, test_cluster, k8s_api):
    """For each case of :data:`LOSSES`, its own 2-pod gang (all at once): one running pod gets the
    case's status (the pod object stays, as the kubelet leaves it). An infrastructure loss restarts
    every pod of the gang (retryCount 1, no pod of the first generation left) and the job
    completes; a code failure (exit 1) terminates it, not restarted."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    jobs = {case: f"c07-{case}"[:50].rstrip("-") for case in LOSSES}
    for job in jobs.values():
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", _lane_gang(job, "standard", 2, 1, "8s"))
    try:
        first = {case: test_cluster.wait_for(f"{job} running", lambda job=job: _running_pods(core, job, 2), timeout_s=90)
                 for case, job in jobs.items()}
        t0 = time.monotonic()
        for case, (status, _) in LOSSES.items():
            patched = core.patch_namespaced_pod_status(first[case][1].metadata.name, NS, {"status": status})
            assert patched.status.phase == "Failed"  # not deleted: only Volcano's restart deletes it

        def ended(job):
            j = _vcjob(k8s_api, NS, job)
            return j if j.get("status", {}).get("state", {}).get("phase") in ("Completed", "Failed", "Terminated", "Aborted") else None
        outcome = {}
        for case, job in jobs.items():
            done = test_cluster.wait_for(f"{job} to end", lambda job=job: ended(job), timeout_s=120)
            outcome[case] = (done["status"]["state"]["phase"], done["status"].get("retryCount", 0))
            final = core.list_namespaced_pod(NS, label_selector=f"volcano.sh/job-name={job}").items
            replaced = not {p.metadata.uid for p in first[case]} & {p.metadata.uid for p in final}
            outcome[case] += (replaced,)
        print(f"C07 outcomes (phase, retryCount, every first-generation pod replaced) after {time.monotonic() - t0:.1f} s: {outcome}")
        expected = {case: ("Completed", 1, True) if restarts else ("Terminated", 0, False) for case, (_, restarts) in LOSSES.items()}
        assert outcome == expected
    finally:
        for job in jobs.values():
            custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job)


def test_C07_node_pressure_eviction_mid_training_and_the_workflow_succeeds(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """Through `pipectl submit training`: a gang pod evicted by the kubelet under memory pressure
    (Failed, Evicted, 137; the pod stays) restarts the gang inside its Volcano Job, the Argo step
    keeps waiting (one attempt), and the workflow Succeeds. A PodFailed -> TerminateJob policy would
    leave the job Terminated and the run Failed."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    name, job, first = submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s=8)
    core.patch_namespaced_pod_status(first[0].metadata.name, NS, {"status": LOSSES["node-pressure-eviction-137"][0]})
    wf = _wait_phase(k8s_api, NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=150)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    vj = _vcjob(k8s_api, NS, job)
    assert vj["status"]["retryCount"] == 1 and vj["status"]["state"]["phase"] == "Completed", vj["status"]
    train_attempts = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName", "").startswith("train")]
    assert len(train_attempts) == 1, [n["displayName"] for n in train_attempts]


@pytest.mark.parametrize("infra_limit", [0, 1])
def test_C17_the_gang_survives_exactly_infra_limit_losses(project_applied, test_cluster, k8s_api, infra_limit):
    """The Volcano Job as pipectl renders it for ``infra_limit = n``, on Volcano's real controller:
    each of the first n node-pressure evictions restarts the whole gang; the (n+1)-th ends the job
    Failed. (n = 0: the first loss ends it; Volcano's webhook would make a maxRetry of 0 three.)"""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    from pipectl.pipelines.launchers.volcano import max_retry

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    job = f"c17-limit-{infra_limit}"
    body = _lane_gang(job, "standard", 2, 1, "600s")
    body["spec"]["maxRetry"] = max_retry(infra_limit)
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", body)
    try:
        for loss in range(infra_limit + 1):
            pods = test_cluster.wait_for(f"{job} running (generation {loss})", lambda: _running_pods(core, job, 2), timeout_s=90)
            core.patch_namespaced_pod_status(pods[0].metadata.name, NS, {"status": LOSSES["node-pressure-eviction-137"][0]})
            if loss < infra_limit:  # restarted whole: retryCount counts it and the gang runs again
                test_cluster.wait_for(f"{job} restart {loss + 1}", lambda: _vcjob(k8s_api, NS, job).get("status", {})
                                      .get("retryCount", 0) == loss + 1, timeout_s=90)
        done = test_cluster.wait_for(f"{job} Failed", lambda: (_vcjob(k8s_api, NS, job)["status"]["state"]["phase"] == "Failed"
                                                                and _vcjob(k8s_api, NS, job)), timeout_s=90)
        assert done["spec"]["maxRetry"] == infra_limit + 1
        assert done["status"].get("retryCount", 0) == infra_limit + 1  # the losses the gang took, the last one ended it
    finally:
        custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job)


def _gang_left(core, api, workflow: str) -> tuple[list, list]:
    """(the run's gang jobs, its gang pods) still in the API."""
    pods = core.list_namespaced_pod(NS, label_selector=f"{WORKFLOW_LABEL}={workflow},{STEP_LABEL}=train").items
    return _gang_jobs(api, workflow), [p.metadata.name for p in pods]


@pytest.mark.parametrize("how", ["stop", "terminate"])
def test_a_stopped_or_terminated_run_leaves_no_gang_within_30_s(
        project_applied, train_pod_annotations, test_cluster, k8s_api, how):
    """A run stopped or terminated while its gang trains (pods that would run 10 more minutes):
    within 30 s no gang job and no gang pod of the run is left, and none comes back. `stop` runs
    the exit handler (gang-release: its command run for real by the argoexec stand-in);
    `terminate` runs none, so `pipectl terminate` releases the gang itself before it returns."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    name, job, _ = submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s=600)
    try:
        t0 = time.monotonic()
        r = _pipectl(test_cluster, how, name)
        assert r.returncode == 0, r.stderr
        if how == "terminate":
            assert _gang_left(core, k8s_api, name) == ([], []), "pipectl terminate returned with the gang still there"
        test_cluster.wait_for("no gang job or pod of the run", lambda: _gang_left(core, k8s_api, name) == ([], []), timeout_s=30)
        gone_s = time.monotonic() - t0
        wf = _wait_phase(k8s_api, NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=60)
        release = [n["phase"] for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName") == "gang-release"]
        print(f"[timing] {how}: no gang job or pod {gone_s:.1f} s after the command; workflow {wf['status']['phase']}; "
              f"exit handler pods {release}")
        assert wf["status"]["phase"] in ("Failed", "Error")
        assert release == (["Succeeded"] if how == "stop" else []), release
        assert _gang_left(core, k8s_api, name) == ([], [])  # nothing came back
    finally:
        _delete_workflow(_custom(k8s_api), name)


def test_a_gang_the_preflight_ended_is_retried_away_from_the_named_node(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """The gang preflight finds a slow link on node X: one gang pod ends as the launcher ends it
    (exit 76, termination message ``avoid nodes: X``, written here onto the running pod as the
    kubelet would). Volcano ends the job (no restart onto the same nodes), the train attempt
    Fails, ``gang-avoid`` (its command run for real by the argoexec stand-in) deletes the failed
    job and hands the next attempt a preferred anti-affinity to X: the second job's pods carry it,
    are bound to other nodes, and the workflow Succeeds."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    from pipectl.components.gang.avoid import gang_affinity

    core = client.CoreV1Api(k8s_api)
    name, job, first = submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s=600)
    try:
        uid = _vcjob(k8s_api, NS, job)["metadata"]["uid"]
        slow = first[0].spec.node_name
        train_pod_annotations({"pipectl.io/run-duration": "3s"})  # the next gang trains and completes
        verdict = f"gang preflight: a slow link in the gang's ring: rank 0 on node {slow} (502 ms)\navoid nodes: {slow}"
        core.patch_namespaced_pod_status(first[0].metadata.name, NS, {"status": {
            "phase": "Failed", "containerStatuses": [{"name": "pytorch", "ready": False,
                                                      "state": {"terminated": {**_terminated(76)["terminated"], "message": verdict}}}]}})
        wf = _wait_phase(k8s_api, NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=180)
        pods = sorted((n["templateName"], n["phase"]) for n in wf["status"]["nodes"].values() if n["type"] == "Pod")
        assert wf["status"]["phase"] == "Succeeded", (wf["status"].get("message"), pods)
        assert [p for p in pods if p[0] in ("train", "gang-avoid")] == [("gang-avoid", "Succeeded"), ("train", "Failed"),
                                                                         ("train", "Succeeded")], pods
        second = _vcjob(k8s_api, NS, job)
        assert second["metadata"]["uid"] != uid and second["status"]["state"]["phase"] == "Completed"
        assert second["spec"]["tasks"][0]["template"]["spec"]["affinity"] == json.loads(gang_affinity([slow]))
        bound = [p.spec.node_name for p in core.list_namespaced_pod(NS, label_selector=f"volcano.sh/job-name={job}").items]
        print(f"preflight named {slow}: second gang bound to {bound}")
        assert len(bound) == 2 and slow not in bound, bound
    finally:
        _delete_workflow(_custom(k8s_api), name)


def test_resubmitting_a_run_whose_gang_still_trains_releases_that_gang_first(
        project_applied, train_pod_annotations, test_cluster, k8s_api):
    """A run terminated the way the Argo UI's TERMINATE does it (``spec.shutdown: Terminate``, no
    exit handler, nothing released) keeps its gang training. `pipectl resubmit NAME` starts it
    again: when the command returns, the old run has no gang job and no gang pod, and the new run
    exists. A run that has not ended is refused (exit 2) and nothing changes."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    name, job, _ = submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s=600)
    new = ""
    try:
        r = _pipectl(test_cluster, "resubmit", name)  # still Running: refused, the gang untouched
        assert r.returncode == 2 and "stop it first" in r.stderr, (r.returncode, r.stderr)
        assert _gang_left(core, k8s_api, name)[0] == [job]
        custom.patch_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name,
                                              {"spec": {"shutdown": "Terminate"}})
        wf = _wait_phase(k8s_api, NS, name, {"Failed", "Error"}, timeout_s=60)
        jobs, pods = _gang_left(core, k8s_api, name)
        assert jobs == [job] and len(pods) == 2, (wf["status"].get("message"), jobs, pods)  # the gang outlived its run
        r = _pipectl(test_cluster, "resubmit", name)
        assert r.returncode == 0, r.stderr
        new = r.stdout.strip()
        assert _gang_left(core, k8s_api, name) == ([], []), "pipectl resubmit returned with the old run's gang still there"
        assert new and new != name
        assert custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", new)[
            "metadata"]["labels"]["pipectl.io/retry-of"] == name
    finally:
        _delete_workflow(custom, name)
        if new:
            _delete_workflow(custom, new)


def test_a_lost_launcher_pod_never_gives_the_run_a_second_gang(project_applied, train_pod_annotations, test_cluster, k8s_api):
    """The train step's launcher pod is lost while its gang trains (deleted as a consolidated node's
    pod is: Error "pod deleted", retried after the policy's 5 s backoff): the step's next attempt
    adopts the run's gang (one job name per run) instead of creating a second one. Sampled every
    0.2 s until the workflow Succeeds: never more than one gang job or than the gang's pod; the job
    is the first one (same uid). The compiled train step alone (C10's workflow)."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    from kubernetes import client

    from pipectl.pipelines.policy import RetryPolicy
    from pipectl.pipelines.training import CompileConfig

    core = client.CoreV1Api(k8s_api)
    custom = _custom(k8s_api)
    train_pod_annotations({"pipectl.io/run-duration": "20s"})
    core.create_namespaced_config_map(NS, {"metadata": {"name": C10_LANES}, "data": {"urgent": "2"}})
    name = f"c18-{int(time.time()) % 100000}"
    cfg = CompileConfig(retry=RetryPolicy(scale_up_s=30, infra_limit=2, transient_limit=1, step_timeout_s=600))
    try:
        custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", _c10_workflow(name, cfg))
        _lose_running_launcher_pod(test_cluster, k8s_api, name)
        job = _gang_jobs(k8s_api, name)[0]
        uid = _vcjob(k8s_api, NS, job)["metadata"]["uid"]
        most_jobs, most_pods, deadline = 0, 0, time.monotonic() + 120
        while True:
            jobs, pods = _gang_left(core, k8s_api, name)
            most_jobs, most_pods = max(most_jobs, len(jobs)), max(most_pods, len(pods))
            wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
            if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error"):
                break
            assert time.monotonic() < deadline, wf.get("status")
            time.sleep(0.2)
        attempts = sorted((n["phase"], n.get("message", "")) for n in wf["status"]["nodes"].values()
                          if n["type"] == "Pod" and n["templateName"] == "train")
        print(f"lost launcher: attempts {attempts}; at most {most_jobs} gang job(s), {most_pods} gang pod(s)")
        assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
        assert attempts == [("Error", "pod deleted"), ("Succeeded", "")], attempts
        assert (most_jobs, most_pods) == (1, 1)
        assert _gang_jobs(k8s_api, name) == [job] and _vcjob(k8s_api, NS, job)["metadata"]["uid"] == uid
    finally:
        _delete_workflow(custom, name)
        core.delete_namespaced_config_map(C10_LANES, NS)
