"""C02: the train step's success/failure conditions, evaluated with argoexec's own logic
(k8s label-selector requirements over gjson lookups) against the states a gang job goes through."""

import pytest

from pipectl.pipelines.launchers import LAUNCHERS
from tests.tools.argo import ArgoExpr


@pytest.fixture(scope="module")
def argo():
    evaluator = ArgoExpr()
    yield evaluator
    evaluator.close()


VOLCANO = [  # every phase of a Volcano Job (volcano.sh batch/v1alpha1 JobPhase)
    ("Pending", "waiting"), ("Running", "waiting"), ("Restarting", "waiting"), ("Completing", "waiting"),
    ("Aborting", "waiting"), ("Terminating", "waiting"),
    ("Completed", "succeeded"), ("Failed", "failed"), ("Aborted", "failed"), ("Terminated", "failed"),
]


@pytest.mark.parametrize("phase,expected", VOLCANO)
def test_C02_volcano_job(argo, phase, expected):
    launcher = LAUNCHERS["volcano"]
    job = {"kind": "Job", "status": {"state": {"phase": phase}, "running": 2}}
    assert argo.resource_state(launcher.success_condition, launcher.failure_condition, job) == expected
    # the launcher's own reading of its failure condition (retry clean-up) agrees with Argo's
    assert launcher.failed(job) == (expected == "failed")


def test_C02_volcano_job_without_status_yet_waits(argo):
    launcher = LAUNCHERS["volcano"]
    assert argo.resource_state(launcher.success_condition, launcher.failure_condition, {"kind": "Job"}) == "waiting"


PYTORCHJOB = [
    ({}, "waiting"),  # just created
    ({"conditions": [{"type": "Created", "status": "True"}]}, "waiting"),
    ({"conditions": [{"type": "Running", "status": "True"}], "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 3}}}, "waiting"),
    ({"conditions": [{"type": "Restarting", "status": "True"}], "replicaStatuses": {"Master": {"active": 1}}}, "waiting"),
    ({"replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"succeeded": 3}}}, "succeeded"),
    ({"replicaStatuses": {"Master": {"failed": 1}, "Worker": {"active": 3}}}, "failed"),
    # C09: backoffLimit 0, a Worker failed while the Master still runs (blocked in a collective):
    # the step must fail now, not after torch's timeouts (10-30 min) or the step timeout
    ({"conditions": [{"type": "Failed", "status": "True"}], "replicaStatuses": {"Master": {"active": 1}, "Worker": {"failed": 1}}}, "failed"),
    ({"replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 2, "failed": 1}}}, "failed"),
]


@pytest.mark.parametrize("status,expected", PYTORCHJOB)
def test_C02_pytorchjob(argo, status, expected):
    launcher = LAUNCHERS["pytorchjob"]
    job = {"kind": "PyTorchJob", "status": status}
    assert argo.resource_state(launcher.success_condition, launcher.failure_condition, job) == expected
    assert launcher.failed(job) == (expected == "failed")


CONDITIONS = [  # (condition, object): the grammar condition_holds reads, against Argo's evaluator
    ("status.phase == Done", {"status": {"phase": "Done"}}),
    ("status.phase == Done", {"status": {"phase": "Running"}}),
    ("status.phase != Done", {"status": {}}),
    ("status.phase in (A, B)", {"status": {"phase": "B"}}),
    ("status.phase notin (A, B)", {"status": {"phase": "C"}}),
    ("status.phase notin (A, B)", {"status": {"phase": "A"}}),
    ("status.count > 2", {"status": {"count": 3}}),
    ("status.count > 2", {"status": {"count": 2}}),
    ("status.count < 2", {"status": {}}),
    ("status.phase == Done,status.count > 0", {"status": {"phase": "Done", "count": 1}}),
    ("status.phase == Done,status.count > 0", {"status": {"phase": "Done", "count": 0}}),
]


@pytest.mark.parametrize("condition,obj", CONDITIONS)
def test_condition_holds_reads_conditions_as_argo_does(argo, condition, obj):
    from pipectl.pipelines.launchers.base import condition_holds

    argo_says = argo.resource_state(condition, "status.never == true", obj) == "succeeded"
    assert condition_holds(condition, obj) == argo_says


def test_C02_a_condition_on_a_transient_state_would_fail_healthy_jobs(argo):
    """The wrong answer from the field case, shown with the same evaluator."""
    wrong_failure = "status.state.phase in (Failed, Restarting)"
    assert argo.resource_state("status.state.phase == Completed", wrong_failure, {"status": {"state": {"phase": "Restarting"}}}) == "failed"


def test_C09_failure_terms_are_alternatives_as_argoexec_reads_them(argo):
    """argoexec fails the step when ANY term of a failureCondition holds (success terms must all
    hold): checked with its own code on a two-term condition, and the launchers' reading agrees."""
    from pipectl.pipelines.launchers.base import failure_condition_holds

    cond = "status.a > 0,status.b > 0"
    for obj, fails in (({"status": {"a": 1}}, True), ({"status": {"b": 1}}, True), ({"status": {"a": 0, "b": 0}}, False)):
        assert (argo.resource_state("status.never == true", cond, obj) == "failed") is fails
        assert failure_condition_holds(cond, obj) is fails


def test_C09_pytorchjob_cleans_up_the_running_replicas_of_a_failed_job():
    """cleanPodPolicy Running: when the job fails the training operator deletes the replicas still
    running (the Master blocked in a collective), and keeps finished pods for their logs."""
    import re

    from pipectl.pipelines.launchers.base import GangConfig

    text = LAUNCHERS["pytorchjob"].manifest(GangConfig(image="i", service_account="s", shm_gib=1))
    run_policy = text.split("runPolicy:")[1].split("pytorchReplicaSpecs:")[0]
    assert re.search(r"^\s+cleanPodPolicy: Running$", run_policy, re.M), run_policy
    assert re.search(r"^\s+backoffLimit: 0$", run_policy, re.M), run_policy


def test_pytorchjob_is_refused_where_it_cannot_restart_the_gang():
    """The PyTorchJob launcher cannot restart the whole gang after an infrastructure
    loss; `pipectl render` says why and renders it only when told to accept that (exit 2 otherwise)."""
    import subprocess
    import sys

    from pipectl.pipelines.launchers import LAUNCHERS as ALL

    assert ALL["pytorchjob"].gang_restart_limitation and not ALL["volcano"].gang_restart_limitation
    from pathlib import Path

    pipectl = [str(Path(sys.executable).parent / "pipectl")]
    refused = subprocess.run([*pipectl, "render", "training", "--launcher", "pytorchjob"], capture_output=True, text=True)
    assert refused.returncode == 2 and "cannot restart the whole gang" in refused.stderr and not refused.stdout
    accepted = subprocess.run([*pipectl, "render", "training", "--launcher", "pytorchjob", "--accept-no-gang-restart"],
                              capture_output=True, text=True)
    assert accepted.returncode == 0 and "kind: PyTorchJob" in accepted.stdout
