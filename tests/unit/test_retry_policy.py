"""Retry policy (C01), evaluated by the Argo controller's own expression code, and lanes."""

import pytest
from pydantic import ValidationError

from pipectl.components.contracts import Lane
from pipectl.pipelines.policy import LANES, RetryPolicy
from tests.tools.argo import ArgoExpr


@pytest.fixture(scope="module")
def argo():
    evaluator = ArgoExpr()
    yield evaluator
    evaluator.close()


# Field case C01: (status, message, exit code) -> retried?
C01 = {
    "a-imminent-node-shutdown": ("Failed", "Pod was terminated due to imminent node shutdown", "-1", True),
    "b-pod-deleted": ("Error", "pod deleted", "-1", True),
    "c-code-bug": ("Failed", "Error (exit code 1)", "1", False),
    "d-declared-transient": ("Failed", "Error (exit code 75)", "75", True),
    "e-evicted": ("Failed", "The node was low on resource: memory. Container main was using 9Gi. Evicted", "137", True),
    # seen on the test cluster: lane=bogus submitted through the Argo Server API (no enum check)
    "f-spec-refused": ("Error", 'pods "training-v1-htwpr-stage-264922588" is forbidden: no PriorityClass with name '
                       "pipectl-bogus was found", "-1", False),
    "g-quota-frees-up": ("Error", 'pods "x" is forbidden: exceeded quota: gpu, requested: nvidia.com/gpu=8', "-1", True),
    "h-invalid-field": ("Error", 'Pod "x" is invalid: spec.containers[0].resources.limits: Invalid value', "-1", False),
}


@pytest.mark.parametrize("case", sorted(C01))
def test_C01_exactly_the_right_failures_are_retried(argo, case):
    status, message, exit_code, expected = C01[case]
    assert argo.should_retry(RetryPolicy().expression(), retries=0, status=status, exit_code=exit_code, message=message) is expected


def test_C01_budgets_are_separate(argo):
    policy = RetryPolicy(infra_limit=6, transient_limit=2)
    expr = policy.expression()
    transient = dict(status="Failed", exit_code="75", message="Error (exit code 75)")
    assert [argo.should_retry(expr, retries=r, **transient) for r in range(4)] == [True, True, False, False]
    infra = dict(status="Failed", exit_code="-1", message="Pod was terminated due to imminent node shutdown")
    assert all(argo.should_retry(expr, retries=r, **infra) for r in range(6))  # the limit (6) stops infra
    assert policy.build().limit.root == 6


def test_oom_kills_are_code_failures_unless_configured(argo):
    oom = dict(retries=0, status="Failed", exit_code="137", message="OOMKilled (exit code 137)")
    assert argo.should_retry(RetryPolicy().expression(), **oom) is False
    assert argo.should_retry(RetryPolicy(retry_oom=True).expression(), **oom) is True


@pytest.mark.parametrize("scale_up_s", [60, 300, 600, 1800])
def test_backoff_outlasts_a_scale_up_and_is_bounded(scale_up_s):
    policy = RetryPolicy(scale_up_s=scale_up_s)
    delays = policy.delays_s()
    assert sum(delays[:4]) >= scale_up_s * 0.9  # four infra retries wait through one scale-up
    assert max(delays) <= scale_up_s  # no single delay longer than a scale-up
    assert policy.attempt_timeout_s >= scale_up_s  # a Pending pod waits through a scale-up...
    assert policy.max_duration_s < 10**7  # ...and nothing waits forever
    rs = policy.build()
    assert rs.backoff.cap == f"{scale_up_s}s" and rs.retry_policy == "Always"
    assert rs.affinity.node_anti_affinity is not None


def test_transient_budget_cannot_exceed_the_limit():
    with pytest.raises(ValidationError):
        RetryPolicy(infra_limit=2, transient_limit=3)


def test_lanes_urgent_preempts_batch_never_does():
    assert [lane for lane in Lane] == list(LANES)
    urgent, standard, batch = LANES[Lane.urgent], LANES[Lane.standard], LANES[Lane.batch]
    assert urgent.preemption_policy == "PreemptLowerPriority"
    assert batch.preemption_policy == "Never"
    assert urgent.priority_value > standard.priority_value > batch.priority_value
    assert urgent.argo_priority > standard.argo_priority > batch.argo_priority
    assert urgent.tolerates_reserved and not batch.tolerates_reserved
    assert batch.queue_reclaimable and not urgent.queue_reclaimable
