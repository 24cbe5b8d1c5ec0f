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
