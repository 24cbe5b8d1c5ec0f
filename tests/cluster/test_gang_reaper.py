"""The gang reaper on the KWOK control plane with Argo's and Volcano's real controllers: a run ended
the way the Argo UI's TERMINATE ends it (``spec.shutdown: Terminate`` written on the Workflow, no
exit handler) leaves no gang, and the reaper never touches the gang of a retried run or the job of a
Succeeded one.

KWOK cannot run the Deployment's container, so the test runs the same command
(:func:`pipectl.pipelines.gang_reaper.gang_reaper_command`) as a process, authenticated as the
reaper's ServiceAccount with a token from the TokenRequest API: its Role is what lets it work.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from pipectl.pipelines.backends.processes import die_with_parent, spawn, stop, wait_until
from pipectl.pipelines.gang_reaper import GANG_REAPER, gang_reaper_command
from pipectl.pipelines.training import CompileConfig
from tests.cluster.test_control_plane import (  # noqa: F401 - fixtures
    PIPECTL,
    _custom,
    _delete_workflow,
    _gang_jobs,
    _vcjob,
    _wait_phase,
    project_applied,
    submit_a_run_whose_gang_fails,
    submit_two_worker_training,
    train_pod_annotations,
    training_outputs_supplied,
)
from tests.cluster.test_gang_restarts import _gang_left

NS = "pipectl"
REAPER_USER = f"system:serviceaccount:{NS}:{GANG_REAPER}"
RESYNC_S = 5
"""The test's reaper lists and sweeps everything this often (the Deployment's: 600 s), so a test can
wait for a sweep that saw a run instead of waiting an arbitrary time."""


class ReaperProcess:
    """The reaper's command as a process of this test; ``sweeps()`` counts its completed sweeps."""

    def __init__(self, proc: subprocess.Popen, log) -> None:
        self.proc, self.log = proc, log

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def sweeps(self) -> int:
        return self.text().count(" swept ")

    def wait_for_sweep_after(self, count: int, timeout_s: float = 30) -> None:
        wait_until("a sweep of the gang reaper", lambda: self.sweeps() > count, timeout_s,
                   procs=[("gang reaper", self.proc, self.log)])


@pytest.fixture(scope="module")
def reaper(project_applied, test_cluster, k8s_api, tmp_path_factory):
    """The reaper as the Deployment runs it, as its own ServiceAccount, until the module's tests end."""
    from kubernetes import client

    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    token = client.CoreV1Api(k8s_api).create_namespaced_service_account_token(
        GANG_REAPER, NS, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(
            audiences=[], expiration_seconds=3600))).status.token
    folder = tmp_path_factory.mktemp("gang-reaper")
    kubeconfig = folder / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "reaper",
        "clusters": [{"name": "c", "cluster": {"server": test_cluster.server,
                                               "certificate-authority": str(test_cluster.pki / "ca.crt")}}],
        "users": [{"name": "reaper", "user": {"token": token}}],
        "contexts": [{"name": "reaper", "context": {"cluster": "c", "user": "reaper", "namespace": NS}}]}))
    command = gang_reaper_command(CompileConfig())
    assert command[0] == "python"
    log = folder / "reaper.log"
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    proc = spawn(die_with_parent([sys.executable, *command[1:], "--resync-s", str(RESYNC_S)]), log,
                 env={**env, "KUBECONFIG": str(kubeconfig)})
    process = ReaperProcess(proc, log)
    try:
        process.wait_for_sweep_after(0)
        yield process
    finally:
        code = stop(proc, grace_s=10)
        print(f"gang reaper log:\n{process.text()[-4000:]}")
    assert code == 0, f"the reaper exited {code} on SIGTERM"


def _reaper_deletes(test_cluster, job: str) -> list[tuple[str, int]]:
    """(verb, answer) of every delete of ``job`` the reaper's ServiceAccount sent (the API server's audit log)."""
    return [(e["requestReceivedTimestamp"], e["responseStatus"]["code"]) for e in test_cluster.audit_events(job)
            if e.get("stage") == "ResponseComplete" and e["verb"] == "delete" and e["user"]["username"] == REAPER_USER]


def _exit_handler_pods(wf: dict) -> list[str]:
    return [n["phase"] for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName") == "gang-release"]


def test_a_run_terminated_as_the_argo_ui_does_leaves_no_gang_within_30_s(
        reaper, project_applied, train_pod_annotations, test_cluster, k8s_api):
    """A training run whose gang trains (pods that would run 10 more minutes) is terminated the way
    the Argo UI's TERMINATE and `argo terminate` do it: ``spec.shutdown: Terminate`` patched onto
    the Workflow (no pipectl command). Argo runs no exit handler; within 30 s no gang job and no
    gang pod of the run is left, deleted by the reaper's ServiceAccount, and none comes back."""
    from kubernetes import client

    core, custom = client.CoreV1Api(k8s_api), _custom(k8s_api)
    name, job, _ = submit_two_worker_training(test_cluster, k8s_api, train_pod_annotations, run_s=600)
    try:
        t0 = time.monotonic()
        custom.patch_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name, {"spec": {"shutdown": "Terminate"}})
        test_cluster.wait_for("no gang job or pod of the run", lambda: _gang_left(core, k8s_api, name) == ([], []), timeout_s=30)
        gone_s = time.monotonic() - t0
        wf = _wait_phase(k8s_api, NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=60)
        sweeps = reaper.sweeps()
        reaper.wait_for_sweep_after(sweeps)  # a whole sweep after the run ended: nothing of it is left to release
        print(f"[timing] UI-style terminate: no gang job or pod {gone_s:.1f} s after the patch; workflow {wf['status']['phase']}")
        assert wf["status"]["phase"] in ("Failed", "Error")
        assert _exit_handler_pods(wf) == []  # Argo ran no exit handler: the reaper released the gang
        deletes = _reaper_deletes(test_cluster, job)
        assert deletes and deletes[0][1] in (200, 202), deletes
        assert _gang_left(core, k8s_api, name) == ([], [])  # nothing came back
    finally:
        _delete_workflow(custom, name)


def test_a_retried_run_keeps_its_new_gang_and_a_succeeded_runs_job_is_left(
        reaper, project_applied, train_pod_annotations, test_cluster, k8s_api):
    """A run whose gang fails (exit 1) ends Failed: its gang goes (the exit handler, the reaper or
    both). Retried in place (`pipectl retry` through the Argo Server, as the UI's RETRY), the run is
    Running again and its train step creates a new gang under the same name: the reaper leaves it
    (one job, one uid, from its creation to the run's success: a deleted gang fails the step) and,
    once the run has Succeeded, leaves its completed job through a whole sweep after that. Deleting
    the workflow then takes the job and its pods with it."""
    from kubernetes import client

    custom = _custom(k8s_api)
    name = submit_a_run_whose_gang_fails(test_cluster, train_pod_annotations)
    try:
        job = f"{name}-train"
        test_cluster.wait_for("the failed run's gang gone", lambda: not _gang_jobs(k8s_api, name), timeout_s=30)
        before = _reaper_deletes(test_cluster, job)
        train_pod_annotations({"pipectl.io/run-duration": "8s"})  # the "fix"
        env = {**os.environ, "KUBECONFIG": str(test_cluster.kubeconfig),
               "ARGO_SERVER": test_cluster.argo_server_url.split("://", 1)[1], "ARGO_SECURE": "false"}
        r = subprocess.run([str(PIPECTL), "retry", name], capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0 and r.stdout.strip() == name, r.stderr
        uid = test_cluster.wait_for("the retried run's gang job", lambda: _gang_jobs(k8s_api, name)
                                    and _vcjob(k8s_api, NS, job)["metadata"]["uid"], timeout_s=90)
        wf = _wait_phase(k8s_api, NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=120)
        assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
        sweeps = reaper.sweeps()
        reaper.wait_for_sweep_after(sweeps)  # the reaper has listed the Succeeded run and its job since
        assert _vcjob(k8s_api, NS, job)["metadata"]["uid"] == uid  # the new gang, never replaced
        assert not _vcjob(k8s_api, NS, job)["metadata"].get("deletionTimestamp")
        assert _reaper_deletes(test_cluster, job) == before  # no delete of the new gang's job
        print(f"retried run: reaper deletes of the failed gang {before}; new gang {uid} kept through Succeeded")
        # the workflow deleted: the job it owns goes with it (garbage collector, and the reaper)
        _delete_workflow(custom, name)
        test_cluster.wait_for("the deleted run's job and pods gone",
                              lambda: _gang_left(client.CoreV1Api(k8s_api), k8s_api, name) == ([], []), timeout_s=30)
    finally:
        _delete_workflow(custom, name)
