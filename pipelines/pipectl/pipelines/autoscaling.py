"""Autoscaled capacity as typed tables: Karpenter NodePools and the urgent lane's buffer.

Pure: no I/O. :mod:`pipectl.pipelines.manifests` renders these under ``argo/autoscaling/``
(``karpenter/``: the NodePools, the urgent lane's warm buffer among them, for clusters that run
Karpenter). It is not in the top-level kustomization: a platform team applies it on purpose.

What the rest of the product does for autoscalers (one place each):

- gang pods carry :data:`DO_NOT_DISRUPT` (Karpenter's ``karpenter.sh/do-not-disrupt`` and the
  Cluster Autoscaler's ``safe-to-evict: "false"``) and :data:`GPU_TOLERATION`
  (``pipectl.pipelines.launchers.base.pod_template``);
- Volcano's scheduler runs without its ``enqueue`` action (``manifests.VOLCANO_SCHEDULER_CONF``):
  with it, a gang whose GPUs exceed what the cluster has NOW is never enqueued, so no pod exists
  and no autoscaler ever sees a pending pod (measured on the test cluster, README "Autoscaling");
- retries back off for ``RetryPolicy.scale_up_s`` (policy.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from pipectl.components.names import LANE_TAINT_KEY, PART_OF, Lane, lane_object_name

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource of NVIDIA's device plugin."""

GPU_TAINT = {"key": GPU_RESOURCE, "effect": "NoSchedule"}
"""The taint GPU node groups carry so that only pods that asked for GPUs land there (Karpenter
docs "NodePools: GPU", EKS/AKS GPU node groups; GKE adds ``nvidia.com/gpu=present``)."""

GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
"""Tolerates :data:`GPU_TAINT` with or without a value (what Kubernetes' ExtendedResourceToleration
admission plugin would add; written out because that plugin is off by default)."""

DO_NOT_DISRUPT = {
    "karpenter.sh/do-not-disrupt": "true",
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
}
"""Pod annotations that keep voluntary disruption (Karpenter consolidation and drift, Cluster
Autoscaler scale-down) off a node while a gang pod runs on it. A node that goes anyway (expired,
interrupted, deleted: Karpenter drains it within the pool's terminationGracePeriod) takes the gang
with it, which restarts whole from its checkpoint (Volcano policy PodEvicted -> RestartJob)."""

BUFFER_NAME = lane_object_name("urgent-buffer")
"""The urgent lane's warm NodePool."""


class NodeClassRef(BaseModel):
    """The cloud's node class a NodePool launches with (Karpenter ``spec.template.spec.nodeClassRef``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group: str = "karpenter.k8s.aws"
    kind: str = "EC2NodeClass"
    name: str = "default"


KWOK_NODE_CLASS = NodeClassRef(group="karpenter.kwok.sh", kind="KWOKNodeClass", name="default")
"""Karpenter's KWOK provider (the test cluster)."""


class NodePoolSpec(BaseModel):
    """One Karpenter NodePool.

    - ``instance_types``: ``node.kubernetes.io/instance-type`` values it may launch (the cloud's
      names; the KWOK provider's are in tests/harness/manifests/karpenter-instance-types.json);
    - ``gpu``: the pool's nodes carry :data:`GPU_TAINT`;
    - ``limit_cpu``/``limit_gpus``: the pool's ceiling (Karpenter ``spec.limits``);
    - ``consolidation_policy``/``consolidate_after_s``: Karpenter ``spec.disruption``. GPU pools
      consolidate only empty nodes: moving a gang is a restart of the whole gang;
    - ``expire_after_h``: nodes are replaced after this long;
    - ``termination_grace_period_s``: once a node's deletion has begun (expired, interrupted,
      deleted by hand), how long pods with :data:`DO_NOT_DISRUPT` may hold it before Karpenter
      deletes them (Karpenter docs, "NodePools: terminationGracePeriod"). Without it a deleted
      node waits for a running gang to end, however long (seen on the test cluster: the Node
      stayed Terminating with the gang running). A gang deleted this way restarts whole from its
      checkpoint (Volcano PodEvicted -> RestartJob).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    gpu: bool
    instance_types: tuple[str, ...] = Field(min_length=1)
    capacity_types: tuple[Literal["on-demand", "spot", "reserved"], ...] = ("on-demand",)
    limit_cpu: int | None = Field(default=None, ge=1)
    limit_gpus: int | None = Field(default=None, ge=1)
    consolidation_policy: Literal["WhenEmpty", "WhenEmptyOrUnderutilized"]
    consolidate_after_s: int = Field(ge=0)
    expire_after_h: int = Field(720, ge=1)
    termination_grace_period_s: int | None = Field(default=None, ge=0)


class BufferSpec(BaseModel):
    """Warm headroom for the urgent lane: a NodePool of ``nodes`` GPU nodes that Karpenter keeps
    running whether or not anything runs on them (static capacity: ``spec.replicas``, Karpenter's
    ``StaticCapacity`` feature gate), tainted ``pipectl.io/lane=<lane>:NoSchedule`` so that only
    the lanes with ``tolerates_reserved`` (policy.LANES: urgent) land there. An urgent gang binds on
    them in Volcano's first action (allocate), with no preemption and no scale-up; batch work never
    occupies them. Placeholder pods that urgent gangs preempt (the Cluster Autoscaler FAQ's
    "overprovisioning") were tried first and are NOT used: in the same scheduling cycle Volcano's
    preempt action evicted the placeholders AND its reclaim action evicted a batch gang, and the
    recreated placeholders took the batch gang's nodes (seen on the test cluster). With the Cluster
    Autoscaler the equivalent is a node group with this taint and a minimum size of ``nodes``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(2, ge=0, le=64)
    lane: Lane = Lane.urgent
    name: str = BUFFER_NAME


class AutoscalingConfig(BaseModel):
    """What ``argo/autoscaling/`` is rendered from. Defaults: an AWS Karpenter install (the
    ``EC2NodeClass`` named ``default``; p5.48xlarge = 8 x H100 GPUs, m7i CPU nodes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_class: NodeClassRef = NodeClassRef()
    node_pools: tuple[NodePoolSpec, ...] = (
        NodePoolSpec(name="pipectl-cpu", gpu=False, instance_types=("m7i.2xlarge", "m7i.4xlarge"),
                     limit_cpu=256, consolidation_policy="WhenEmptyOrUnderutilized", consolidate_after_s=60),
        NodePoolSpec(name="pipectl-gpu", gpu=True, instance_types=("p5.48xlarge",),
                     limit_gpus=64, consolidation_policy="WhenEmpty", consolidate_after_s=300,
                     termination_grace_period_s=3600),
    )
    buffer: BufferSpec = BufferSpec()


def node_pools(cfg: AutoscalingConfig) -> list[dict]:
    """Karpenter ``karpenter.sh/v1`` NodePools of ``cfg`` (Karpenter docs, "NodePools")."""
    out = []
    for pool in cfg.node_pools:
        limits = {}
        if pool.limit_cpu:
            limits["cpu"] = str(pool.limit_cpu)
        if pool.limit_gpus:
            limits[GPU_RESOURCE] = str(pool.limit_gpus)
        template_spec = {
            "requirements": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(pool.instance_types)},
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(pool.capacity_types)},
            ],
            "nodeClassRef": cfg.node_class.model_dump(),
            "expireAfter": f"{pool.expire_after_h}h",
        }
        if pool.gpu:
            template_spec["taints"] = [dict(GPU_TAINT)]
        if pool.termination_grace_period_s is not None:
            template_spec["terminationGracePeriod"] = f"{pool.termination_grace_period_s}s"
        out.append({
            "apiVersion": "karpenter.sh/v1",
            "kind": "NodePool",
            "metadata": {"name": pool.name, "labels": dict(PART_OF)},
            "spec": {
                "template": {"metadata": {"labels": dict(PART_OF)}, "spec": template_spec},
                "limits": limits,
                "disruption": {"consolidationPolicy": pool.consolidation_policy,
                               "consolidateAfter": f"{pool.consolidate_after_s}s"},
            },
        })
    return out


def buffer_node_pool(cfg: AutoscalingConfig) -> list[dict]:
    """The urgent lane's buffer (:class:`BufferSpec`) as a static NodePool: the GPU pool's template
    (instance types, node class, GPU taint) with ``replicas`` and the lane taint; [] when
    ``buffer.nodes`` is 0."""
    from pipectl.pipelines.policy import LANES

    b = cfg.buffer
    if not b.nodes:
        return []
    if not LANES[b.lane].tolerates_reserved:
        raise ValueError(f"buffer lane {b.lane.value!r}: its pods do not tolerate reserved nodes (policy.LANES)")
    gpu_pool = next(p for p in cfg.node_pools if p.gpu)
    (pool,) = node_pools(cfg.model_copy(update={"node_pools": (gpu_pool.model_copy(update={"name": b.name}),)}))
    spec = pool["spec"]
    spec["template"]["spec"]["taints"].append({"key": LANE_TAINT_KEY, "value": b.lane.value, "effect": "NoSchedule"})
    spec["replicas"] = b.nodes
    spec["limits"] = {"nodes": str(b.nodes)}  # the only limit a static pool takes
    del spec["disruption"]  # ignored with replicas
    return [pool]
