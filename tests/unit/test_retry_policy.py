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
    # the messages exactly as the kubelet writes them into the pod's status (Argo keeps
    # the pod's message as the node's). Node-pressure eviction's never contains "Evicted" (that is
    # the pod's reason): before the fix it was read as a code failure and never retried.
    "i-node-pressure-eviction": ("Failed", "The node was low on resource: memory. Threshold quantity: 100Mi, available: "
                                 "51200Ki. Container main was using 2Gi, request is 1Gi, has larger consumption of memory. ",
                                 "137", True),
    "j-node-pressure-eviction-disk": ("Failed", "The node was low on resource: ephemeral-storage. Threshold quantity: "
                                      "1Gi, available: 524288Ki. ", "-1", True),
    "k-graceful-node-shutdown": ("Failed", "Pod was terminated in response to imminent node shutdown.", "143", True),
    "l-admission-rejected-after-node-restart": ("Failed", "Pod was rejected: Node didn't have enough resource: cpu, "
                                                "requested: 250, used: 1900, capacity: 2000", "-1", True),
    "m-gpu-device-plugin-not-ready": ("Failed", "Allocate failed due to no healthy devices present; cannot allocate "
                                      "unhealthy devices nvidia.com/gpu, which is unexpected", "-1", True),
    # evictions the POD caused (its own limits): the same reason Evicted, but retrying repeats them
    "n-own-ephemeral-storage-limit": ("Failed", "Pod ephemeral local storage usage exceeds the total limit of "
                                      "containers 1Gi. ", "-1", False),
    "o-own-shm-limit": ("Failed", 'Usage of EmptyDir volume "dshm" exceeds the limit "2Gi". ', "-1", False),
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


@pytest.mark.parametrize("scale_up_s", [30, 60, 300, 600, 1800, 7200])
def test_a_container_step_waits_seconds_after_a_code_failure_and_a_scale_up_after_infra_losses(scale_up_s):
    """Argo waits out a retry node's backoff before it evaluates the retry expression, so a code
    failure holds its workflow through the first delay: 5 s. The first four delays still add up to
    a scale-up, none exceeds it, and the rendered backoff is exactly that schedule."""
    policy = RetryPolicy(scale_up_s=scale_up_s)
    delays = policy.step_delays_s()
    assert delays[0] == 5
    assert sum(delays[:4]) >= scale_up_s and max(delays) <= scale_up_s
    rs = policy.build()
    factor = int(rs.backoff.factor.root if hasattr(rs.backoff.factor, "root") else rs.backoff.factor)
    assert (rs.backoff.duration, rs.backoff.cap) == ("5s", f"{scale_up_s}s")
    assert [min(5 * factor**n, scale_up_s) for n in range(policy.infra_limit)] == delays


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
    # batch deserves nothing: every GPU it holds can be taken back, whatever else stands idle
    assert batch.queue_deserved_gpus == 0 and urgent.queue_deserved_gpus is None


def test_the_lanes_queues_carry_what_each_deserves_for_the_capacity_plugin():
    from pipectl.pipelines.manifests import VOLCANO_SCHEDULER_CONF, volcano_queues

    plugins = [p["name"] for tier in VOLCANO_SCHEDULER_CONF["tiers"] for p in tier["plugins"]]
    assert "capacity" in plugins and "proportion" not in plugins  # the two conflict
    queues = {q["metadata"]["name"]: q["spec"] for q in volcano_queues()}
    assert queues["pipectl-batch"]["deserved"] == {"nvidia.com/gpu": "0"}
    # a lane with no bound names every dimension a task requests (a missing one counts as 0)
    assert set(queues["pipectl-urgent"]["deserved"]) == {"cpu", "memory", "nvidia.com/gpu"}


def test_C11_an_attempt_without_exit_code_is_still_counted_by_class(argo):
    """C11: the controller substitutes a metric's labels with Argo's own code, strictly (an
    unresolved variable drops the metric: operator.go computeMetrics). An attempt whose pod was
    deleted has status Error and no exitCode: it must still give one attempts sample, class
    "infrastructure"; the exit-code counter is only for Failed attempts."""
    from pipectl.pipelines.builtin import build_training

    wt = build_training().to_dict()
    train = next(t for t in wt["spec"]["templates"] if t["name"] == "stage")
    metrics = {m["name"]: m for m in train["metrics"]["prometheus"]}
    scope = {"workflow.parameters.lane": "urgent", "duration": "12.5"}
    cases = [({"status": "Error"}, "infrastructure"),  # pod deleted / node lost: no exit code
             ({"status": "Failed", "exitCode": "1"}, "failed"),
             ({"status": "Failed", "exitCode": "75"}, "failed"),
             ({"status": "Succeeded", "exitCode": "0"}, "succeeded")]
    for attempt, cls in cases:
        m = argo.substitute(metrics["pipectl_step_attempts"], {**scope, **attempt}, strict=True)
        assert {l["key"]: l["value"] for l in m["labels"]} == {"step": "stage", "status": attempt["status"], "lane": "urgent", "class": cls}
        if "exitCode" in attempt:
            e = argo.substitute(metrics["pipectl_step_failures_by_exit_code"], {**scope, **attempt}, strict=True)
            assert e["when"] == f"{attempt['status']} == Failed"
            assert {l["key"]: l["value"] for l in e["labels"]}["exit_code"] == attempt["exitCode"]
    # the old label set: the attempt vanished (what C11 saw)
    with pytest.raises(ValueError, match="exitCode"):
        argo.substitute({"labels": [{"key": "exit_code", "value": "{{exitCode}}"}]}, {**scope, "status": "Error"}, strict=True)


def test_C12_dashboards_and_alerts_query_the_names_the_controller_exports():
    """C12: Argo >= 3.6 serves custom metrics as argo_workflows_<name>; every panel and rule that
    names a pipectl metric uses the exported name."""
    import json
    import re

    from pipectl.pipelines.manifests import grafana_dashboard, prometheus_rules
    from pipectl.pipelines.builtin import build_training
    from pipectl.pipelines.training import CompileConfig

    names = {m["name"] for t in build_training().to_dict()["spec"]["templates"] for m in (t.get("metrics") or {}).get("prometheus", [])}
    exprs = [p["targets"][0]["expr"] for p in json.loads(grafana_dashboard(CompileConfig())[0]["data"]["pipectl.json"])["panels"]]
    exprs += [r["expr"] for g in prometheus_rules(CompileConfig())[0]["spec"]["groups"] for r in g["rules"]]
    used = {n for e in exprs for n in re.findall(r"\b(?:argo_workflows_)?pipectl_step_[a-z_]+", e)}
    assert used and all(n.startswith("argo_workflows_") and n.removeprefix("argo_workflows_") in names for n in used), used


def test_C01_C10_the_train_step_gives_C01s_answers_through_its_two_retry_levels(argo):
    """C10 moved the train step's backoff off the template that holds the lane slot (training.py
    _train_retry_templates). The verdict for each C01 attempt, as the controller gives it: the
    attempt's own retry node (no backoff) reads status, message and exit code and retries in
    place; if it does not, the DAG around it retries after a backoff when the attempt's phase is
    the ``retry-on`` phase (a ``when`` sees the phase only: dag.go buildLocalScope has no message).
    Every answer is C01's except the Errors whose message shows a refused pod spec (f, h): they
    are retried too (bounded by the limit; the lane slot is free while they wait)."""
    from pipectl.pipelines.builtin import build_training

    templates = {t["name"]: t for t in build_training().to_dict()["spec"]["templates"]}
    in_place, step = templates["train"]["retryStrategy"], templates["train-retry"]
    assert "backoff" not in in_place and "synchronization" in templates["train"]
    assert not any("retryStrategy" in templates[n] or "synchronization" in templates[n] for n in ("train-retry", "train-backoff"))
    retry = next(t for t in step["dag"]["tasks"] if t["name"] == "retry")
    assert retry["when"] == "{{tasks.train.status}} == {{inputs.parameters.retry-on}}"
    retry_on = next(p["default"] for p in step["inputs"]["parameters"] if p["name"] == "retry-on")
    lost = {"f-spec-refused", "h-invalid-field"}
    for case, (status, message, exit_code, expected) in C01.items():
        now = argo.should_retry(in_place["expression"], retries=0, status=status, exit_code=exit_code, message=message)
        later = not now and status == retry_on
        assert (now or later) is (True if case in lost else expected), case
        # an Error waits out the backoff (slot free); a Failed one the policy retries goes at once
        assert (now, later) == ((False, True) if status == "Error" else (expected, False)), case
    transient = dict(status="Failed", exit_code="75", message="Error (exit code 75)")
    assert [argo.should_retry(in_place["expression"], retries=r, **transient) for r in range(5)] == [True] * 3 + [False] * 2
