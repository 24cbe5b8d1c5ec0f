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
    assert argo.resource_state(launcher.success_condition, launcher.failure_condition, {"kind": "PyTorchJob", "status": status}) == expected


def test_C02_a_condition_on_a_transient_state_would_fail_healthy_jobs(argo):
    """The wrong answer from the field case, shown with the same evaluator."""
    wrong_failure = "status.state.phase in (Failed, Restarting)"
    assert argo.resource_state("status.state.phase == Completed", wrong_failure, {"status": {"state": {"phase": "Restarting"}}}) == "failed"
