"""Karpenter with its KWOK cloud provider: the test cluster's autoscaler.

``sigs.k8s.io/karpenter/kwok`` (built by tests/cluster/build.sh as ``karpenter``) is Karpenter's
own controller with a cloud provider whose "instances" are Node objects annotated
``kwok.x-k8s.io/node: fake``: the same fake nodes our KWOK (kwok.py) already runs pods on. So a
pending pod -> NodeClaim -> Node (after the KWOKNodeClass's ``nodeRegistrationDelay``, the stand-in
for a cloud VM's boot) -> Ready (KWOK's node stages) -> registered (Karpenter removes its
``karpenter.sh/unregistered`` taint) is the real Karpenter loop, with no cloud.

GPUs: an instance type of the KWOK provider carries any resource in its ``resources`` list
(INSTANCE_TYPES_FILE_PATH, manifests/karpenter-instance-types.json: ``gpu-8x`` has
``nvidia.com/gpu: 8``); Karpenter's scheduler matches pods' GPU requests against it and the
node it creates has that capacity. The GPU taint comes from the NodePool (the product's
:mod:`pipectl.pipelines.autoscaling`), as on a real cluster.
"""

from __future__ import annotations

import json

from tests.harness.binaries import binary
from tests.harness.kwok import MANIFESTS

INSTANCE_TYPES = MANIFESTS / "karpenter-instance-types.json"
NAMESPACE = "karpenter"


def instance_types() -> list[dict]:
    return json.loads(INSTANCE_TYPES.read_text())


def instance_type_names(gpu: bool) -> tuple[str, ...]:
    """Names of the catalogue's GPU (or CPU-only) instance types."""
    return tuple(t["name"] for t in instance_types() if ("nvidia.com/gpu" in t["resources"]) == gpu)


def node_class(registration_delay_s: int) -> dict:
    """The KWOKNodeClass every NodePool of the test cluster launches with (its delay: whole seconds,
    the CRD's pattern ``^([0-9]+(s|m|h))+$``)."""
    return {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass",
            "metadata": {"name": "default"},
            "spec": {"nodeRegistrationDelay": f"{int(registration_delay_s)}s"}}


def autoscaling_config(**buffer: object):
    """The product's AutoscalingConfig for this cluster: its NodePools over the KWOK catalogue,
    consolidating after 5 s and deleting do-not-disrupt pods 10 s into a node's termination (so
    that a test sees both happen), and ``buffer`` overrides."""
    from pipectl.pipelines.autoscaling import KWOK_NODE_CLASS, AutoscalingConfig, BufferSpec

    default = AutoscalingConfig()
    pools = tuple(p.model_copy(update={"instance_types": instance_type_names(p.gpu), "consolidate_after_s": 5,
                                       "termination_grace_period_s": 10 if p.gpu else None})
                  for p in default.node_pools)
    return AutoscalingConfig(node_class=KWOK_NODE_CLASS, node_pools=pools, buffer=BufferSpec(**buffer))


def env(kubeconfig: str, metrics_port: int, health_port: int) -> dict[str, str]:
    """Karpenter's settings (its options are environment variables; pkg/operator/options)."""
    return {
        "KUBECONFIG": kubeconfig,
        "SYSTEM_NAMESPACE": NAMESPACE,
        "DISABLE_LEADER_ELECTION": "true",
        "INSTANCE_TYPES_FILE_PATH": str(INSTANCE_TYPES),
        "METRICS_PORT": str(metrics_port),
        "HEALTH_PROBE_PORT": str(health_port),
        "LOG_LEVEL": "info",
        # Karpenter's defaults, plus StaticCapacity: the urgent lane's warm buffer is a static NodePool
        "FEATURE_GATES": "NodeRepair=false,ReservedCapacity=true,SpotToSpotConsolidation=false,"
                         "NodeOverlay=false,StaticCapacity=true",
    }


def argv() -> list[str]:
    return [str(binary("karpenter"))]


def health_url(health_port: int) -> str:
    return f"http://127.0.0.1:{health_port}/readyz"
