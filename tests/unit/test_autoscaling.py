"""The autoscaling tables (pipelines/pipectl/pipelines/autoscaling.py) and the retry backoff that
must outlast a scale-up. The behaviour on a cluster: tests/cluster/test_autoscaler.py."""

from __future__ import annotations

import pytest

from pipectl.components.names import LANE_TAINT_KEY, Lane
from pipectl.pipelines.autoscaling import (
    BUFFER_NAME,
    DO_NOT_DISRUPT,
    GPU_TAINT,
    AutoscalingConfig,
    BufferSpec,
    buffer_node_pool,
    node_pools,
)
from pipectl.pipelines.policy import LANES, RetryPolicy
from pipectl.pipelines.builtin import build_training
from pipectl.pipelines.training import CompileConfig


@pytest.mark.parametrize("scale_up_s", list(range(30, 7201, 61)) + [7200])
def test_the_first_four_retry_delays_outlast_one_scale_up(scale_up_s):
    policy = RetryPolicy(scale_up_s=scale_up_s)
    assert sum(policy.delays_s()[:4]) >= scale_up_s
    assert max(policy.delays_s()) <= scale_up_s  # capped: never a delay longer than a scale-up


def test_gpu_pools_are_tainted_and_cpu_pools_are_not():
    pools = {p["metadata"]["name"]: p for p in node_pools(AutoscalingConfig())}
    assert pools["pipectl-gpu"]["spec"]["template"]["spec"]["taints"] == [GPU_TAINT]
    assert "taints" not in pools["pipectl-cpu"]["spec"]["template"]["spec"]
    # moving a gang is restarting it: the GPU pool consolidates only empty nodes
    assert pools["pipectl-gpu"]["spec"]["disruption"]["consolidationPolicy"] == "WhenEmpty"


def test_the_buffer_is_a_static_pool_only_the_reserved_lanes_tolerate():
    (pool,) = buffer_node_pool(AutoscalingConfig(buffer=BufferSpec(nodes=3)))
    assert pool["metadata"]["name"] == BUFFER_NAME and pool["spec"]["replicas"] == 3
    assert pool["spec"]["limits"] == {"nodes": "3"} and "disruption" not in pool["spec"]
    taints = pool["spec"]["template"]["spec"]["taints"]
    assert {"key": LANE_TAINT_KEY, "value": "urgent", "effect": "NoSchedule"} in taints and GPU_TAINT in taints
    assert [lane for lane, spec in LANES.items() if spec.tolerates_reserved] == [Lane.urgent]
    assert buffer_node_pool(AutoscalingConfig(buffer=BufferSpec(nodes=0))) == []
    with pytest.raises(ValueError, match="do not tolerate reserved nodes"):
        buffer_node_pool(AutoscalingConfig(buffer=BufferSpec(lane=Lane.batch)))


def test_gang_pods_carry_both_autoscalers_do_not_disrupt_annotations_and_tolerate_gpu_nodes():
    import re

    import yaml

    template = build_training(CompileConfig()).to_dict()
    train = next(t for t in template["spec"]["templates"] if t["name"] == "train")
    # unquoted integer tags (C03) are not YAML until Argo substitutes them
    job = yaml.safe_load(re.sub(r"\{\{[^}]*\}\}", "1", train["resource"]["manifest"]))
    pod = job["spec"]["tasks"][0]["template"]
    assert DO_NOT_DISRUPT.items() <= pod["metadata"]["annotations"].items()
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]
