"""The pipeline on an autoscaled cluster: Karpenter (KWOK cloud provider) grows and shrinks the
nodes, Volcano gang-schedules, Argo runs the real training-v1 template.

The cluster starts with NO node: every node is created by Karpenter from the product's NodePools
(pipelines/pipectl/pipelines/autoscaling.py, rendered with the KWOK node class and instance types
of tests/harness/manifests/karpenter-instance-types.json). A node registers
``NODE_REGISTRATION_DELAY_S`` after Karpenter launches it (the KWOKNodeClass's stand-in for a
cloud VM's boot), so the scale-up times printed here are Karpenter's own loop plus that delay.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.cluster.cluster import TEST_OUTPUTS_CONFIGMAP, ClusterNotAvailable, TestCluster, ensure_available
from tests.cluster.test_control_plane import TRAINING_STEP_OUTPUTS, _custom, _pipectl, _project_manifests, _wait_phase
from tests.harness import karpenter

pytestmark = pytest.mark.cluster

NODE_REGISTRATION_DELAY_S = 5
GPUS_PER_NODE = 8
NS = "pipectl"


@pytest.fixture(scope="module")
def scaling_cluster(tmp_path_factory):
    """No nodes, Karpenter, Volcano, the project's manifests and NodePools applied, the template
    installed with `pipectl templates apply`, step outputs supplied for the argoexec stand-in."""
    try:
        ensure_available(volcano=True, autoscaler=True)
    except ClusterNotAvailable as e:
        if os.environ.get("PIPECTL_REQUIRE_CLUSTER") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))
    from kubernetes import client

    from pipectl.pipelines.autoscaling import node_pools

    with TestCluster(tmp_path_factory.mktemp("k8s-autoscaled") / "run", nodes=0, autoscaler=True,
                     node_registration_delay_s=NODE_REGISTRATION_DELAY_S) as c:
        if not c.volcano_ok:
            pytest.skip(f"Volcano did not start: {c.errors}")
        c.apply([d for _, d in _project_manifests()], field_manager="pipectl-tests")
        c.apply(node_pools(karpenter.autoscaling_config()), field_manager="pipectl-tests")
        api = c.api_client()
        core = client.CoreV1Api(api)
        c.wait_for("default ServiceAccount in pipectl", lambda: core.read_namespaced_service_account("default", NS))
        core.create_namespaced_config_map(NS, {"metadata": {"name": TEST_OUTPUTS_CONFIGMAP},
                                               "data": {k: json.dumps(v) for k, v in TRAINING_STEP_OUTPUTS.items()}})
        r = _pipectl(c, "templates", "apply", "-n", NS)
        assert r.returncode == 0, r.stdout + r.stderr
        c.core = core
        c.custom = _custom(api)
        yield c
        api.close()


def _gpu_nodes(core) -> list:
    return core.list_node(label_selector="karpenter.sh/nodepool=pipectl-gpu").items


def _ready(node) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or [])) and not any(
        t.key == "karpenter.sh/unregistered" for t in (node.spec.taints or []))


def _unschedulable(pod) -> bool:
    """What an autoscaler looks for: PodScheduled=False with reason Unschedulable (Karpenter
    pkg/utils/pod IsProvisionable; the Cluster Autoscaler filters the same way)."""
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in (pod.status.conditions or []))


def _gpu_limit(custom, gpus: int) -> None:
    """Cap the pipectl-gpu NodePool at ``gpus`` GPUs (Karpenter ``spec.limits``)."""
    custom.patch_cluster_custom_object("karpenter.sh", "v1", "nodepools", "pipectl-gpu",
                                       {"spec": {"limits": {"nvidia.com/gpu": str(gpus)}}})


def _gang_selector(workflow: str) -> str:
    """The train gang's pods of ``workflow``."""
    from pipectl.components.names import STEP_LABEL, WORKFLOW_LABEL

    return f"{WORKFLOW_LABEL}={workflow},{STEP_LABEL}=train"


def _submit(c, *params: str, lane: str = "standard") -> str:
    args = ["submit", "training", "-n", NS, "--lane", lane, "--output", "json"]
    for p in params:
        args += ["-p", p]
    r = _pipectl(c, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["name"]


def test_gang_scales_up_from_zero_binds_whole_and_the_workflow_succeeds(scaling_cluster):
    """`pipectl submit training` with a 2 x 8-GPU gang and no GPU node: the gang's pods exist and
    are marked Unschedulable (visible to the autoscaler: Volcano runs without its enqueue action),
    Karpenter launches two GPU nodes from the pipectl-gpu NodePool, Volcano binds the whole gang
    once they are Ready (never part of it for longer than one bind round), and the workflow
    succeeds."""
    c = scaling_cluster
    core = c.core
    assert _gpu_nodes(core) == []
    t0 = time.monotonic()
    name = _submit(c, "workers=2", f"gpus-per-worker={GPUS_PER_NODE}", f"processes-per-worker={GPUS_PER_NODE}",
                   "cpu-per-worker=4", "memory-gib-per-worker=16")
    gang = _gang_selector(name)
    seen: dict[str, float] = {}
    partial_since = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        now = time.monotonic()
        pods = core.list_namespaced_pod(NS, label_selector=gang).items
        nodes = _gpu_nodes(core)
        if len(pods) == 2 and "gang pods created" not in seen:
            seen["gang pods created"] = now
        if len(pods) == 2 and all(_unschedulable(p) for p in pods) and not nodes:
            seen.setdefault("gang pods Unschedulable, no GPU node", now)
        if c.custom.list_cluster_custom_object("karpenter.sh", "v1", "nodeclaims").get("items") and "nodeclaims" not in seen:
            seen["nodeclaims"] = now
        if len(nodes) >= 2 and all(_ready(n) for n in nodes):
            seen.setdefault("GPU nodes Ready", now)
        bound = sum(1 for p in pods if p.spec.node_name)
        if 0 < bound < len(pods) or (pods and len(pods) < 2):
            partial_since = partial_since or now
            assert now - partial_since < 3.0, f"gang part-bound ({bound} of {len(pods)}) for 3 s"
        else:
            partial_since = None
        if len(pods) == 2 and bound == 2:
            seen["gang bound"] = now
            break
        time.sleep(0.2)
    assert "gang bound" in seen, f"the gang never bound; saw {seen}"
    assert "gang pods Unschedulable, no GPU node" in seen, (
        f"the autoscaler must see the gang's pods pending before any GPU node exists; saw {seen}")
    nodes = _gpu_nodes(core)
    assert len(nodes) == 2, [n.metadata.name for n in nodes]
    for n in nodes:
        assert n.status.allocatable["nvidia.com/gpu"] == str(GPUS_PER_NODE)
        assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"} in [
            {"key": t.key, "effect": t.effect} for t in n.spec.taints or []]
    pods = core.list_namespaced_pod(NS, label_selector=gang).items
    assert {p.spec.node_name for p in pods} == {n.metadata.name for n in nodes}
    wf = _wait_phase(c.api_client(), NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=180)
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    created = seen["gang pods created"]
    scale_up = seen["GPU nodes Ready"] - created
    print(f"[timing] scale-up from zero: gang pods created -> 2 GPU nodes Ready {scale_up:.1f} s "
          f"(node registration delay {NODE_REGISTRATION_DELAY_S:.0f} s), -> gang bound "
          f"{seen['gang bound'] - created:.1f} s; submit -> gang bound {seen['gang bound'] - t0:.1f} s")
    c.scale_up_s = scale_up


def _plain_gpu_deployment(name: str) -> dict:
    """One pod holding a whole GPU node, WITHOUT the gang's do-not-disrupt annotation: the control
    that shows consolidation acting."""
    from pipectl.pipelines.autoscaling import GPU_TOLERATION

    res = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(GPUS_PER_NODE)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}, "annotations": {"pipectl.io/run-duration": "1h"}},
                                  "spec": {"tolerations": [dict(GPU_TOLERATION)],
                                           "containers": [{"name": "c", "image": "busybox",
                                                           "resources": {"requests": res, "limits": res}}]}}}}


def _running_on(core, ns: str, selector: str) -> list[str]:
    return [p.spec.node_name for p in core.list_namespaced_pod(ns, label_selector=selector).items
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp]


def test_consolidation_never_evicts_a_running_gang_and_a_lost_node_restarts_it_whole(scaling_cluster):
    """The GPU NodePool is switched to the most aggressive consolidation (WhenEmptyOrUnderutilized,
    5 s; the shipped pool consolidates only empty nodes). Control: a pod without the annotation is
    moved off its Karpenter node onto a static GPU node as soon as one has room (consolidation is
    live). A running gang pod (the product's Volcano Job, carrying karpenter.sh/do-not-disrupt) in
    the same position stays put for twice that long: its node is not disrupted and the job never restarts. Then the
    gang's node is deleted anyway (an interrupted instance): Volcano restarts the WHOLE job (policy
    PodEvicted -> RestartJob), with the same command, so the new pods resume from the same
    checkpoint, and it runs again on another node."""
    from kubernetes import client

    c = scaling_cluster
    core, custom = c.core, c.custom
    apps = client.AppsV1Api(c.api_client())
    c.wait_for("no GPU node left", lambda: not _gpu_nodes(core), timeout_s=180)
    custom.patch_cluster_custom_object("karpenter.sh", "v1", "nodepools", "pipectl-gpu", {
        "spec": {"disruption": {"consolidationPolicy": "WhenEmptyOrUnderutilized", "consolidateAfter": "5s"}}})
    try:
        _consolidation_and_node_loss(c, core, custom, apps)
    finally:
        custom.patch_cluster_custom_object("karpenter.sh", "v1", "nodepools", "pipectl-gpu", {
            "spec": {"disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "5s"}}})
        for delete in (lambda: apps.delete_namespaced_deployment("plain", "default"),
                       lambda: custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "gang-dnd"),
                       lambda: core.delete_node("static-gpu-0")):
            try:
                delete()
            except client.ApiException as e:
                if e.status != 404:
                    raise


def _consolidation_and_node_loss(c, core, custom, apps) -> None:
    from tests.cluster.test_control_plane import _lane_gang
    from tests.harness.kwok import fake_node

    # control: a plain pod on a Karpenter node moves to a static node once that has room
    apps.create_namespaced_deployment("default", _plain_gpu_deployment("plain"))
    first = c.wait_for("plain pod running on a Karpenter GPU node",
                       lambda: [n for n in _running_on(core, "default", "app=plain")
                                if n in {g.metadata.name for g in _gpu_nodes(core)}], timeout_s=90)[0]
    core.create_node(fake_node("static-gpu-0", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]))
    t0 = time.monotonic()
    c.wait_for("plain pod consolidated onto the static node, its Karpenter node removed",
               lambda: _running_on(core, "default", "app=plain") == ["static-gpu-0"]
               and first not in {n.metadata.name for n in core.list_node().items}, timeout_s=120)
    consolidated_s = time.monotonic() - t0

    # the gang: same position (the static node will have room), but do-not-disrupt
    gang = _lane_gang("gang-dnd", "batch", 1, GPUS_PER_NODE, "1h")
    assert gang["spec"]["tasks"][0]["template"]["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", gang)
    selector = "volcano.sh/job-name=gang-dnd"
    gang_node = c.wait_for("gang running on a new Karpenter node",
                           lambda: [n for n in _running_on(core, NS, selector) if n != "static-gpu-0"],
                           timeout_s=90)[0]
    apps.delete_namespaced_deployment("plain", "default")  # the static node is empty now
    c.wait_for("static node empty", lambda: not _running_on(core, "default", "app=plain"), timeout_s=30)
    # give consolidation twice what it needed for the control pod
    watch_s = max(30.0, 2 * consolidated_s)
    deadline = time.monotonic() + watch_s
    while time.monotonic() < deadline:
        assert _running_on(core, NS, selector) == [gang_node], "consolidation moved the running gang"
        time.sleep(1)
    assert gang_node in {n.metadata.name for n in core.list_node().items}
    job = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "gang-dnd")
    assert job["status"].get("retryCount", 0) == 0
    command = core.list_namespaced_pod(NS, label_selector=selector).items[0].spec.containers[0].command

    # the node is lost anyway (instance interrupted / deleted): the gang restarts whole
    t1 = time.monotonic()
    core.delete_node(gang_node)
    c.wait_for("gang restarted and running on another node", lambda: (
        custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "gang-dnd")["status"]
        .get("retryCount", 0) >= 1 and [n for n in _running_on(core, NS, selector) if n != gang_node]), timeout_s=120)
    restarted_s = time.monotonic() - t1
    pods = core.list_namespaced_pod(NS, label_selector=selector).items
    assert [p.spec.containers[0].command for p in pods if p.status.phase == "Running"] == [command]
    print(f"[timing] consolidation of an unannotated pod: {consolidated_s:.1f} s; a running gang untouched "
          f"for {watch_s:.0f} s; its node deleted -> gang running again {restarted_s:.1f} s")


def _restarted(custom, names: list[str]) -> int:
    return sum(1 for n in names if custom.get_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", NS, "jobs", n).get("status", {}).get("retryCount", 0) >= 1)


def _urgent_against_batch(c, batch: int, label: str, *, evictions_allowed: bool) -> tuple[float, int, set[str]]:
    """``batch`` batch gangs (2 x 8 GPUs, running 1 h) fill the GPU pool to its limit; then an
    urgent 2 x 8-GPU gang (the product's Volcano Job) is created. Returns the seconds from its
    creation to both pods bound, how many batch gangs were restarted, and the urgent pods' nodes.
    Without ``evictions_allowed`` a batch gang restarting in the watched cycles after the bind fails at once."""
    from tests.cluster.test_control_plane import _lane_gang

    core, custom = c.core, c.custom
    names = [f"{label}-batch-{i}" for i in range(batch)]
    for n in names:
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", _lane_gang(n, "batch", 2, GPUS_PER_NODE, "1h"))
    c.wait_for("batch gangs running", lambda: all(len(_running_on(core, NS, f"volcano.sh/job-name={n}")) == 2 for n in names),
               timeout_s=120)
    urgent = f"{label}-urgent"
    t0 = time.monotonic()
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", _lane_gang(urgent, "urgent", 2, GPUS_PER_NODE, "1h"))
    nodes = c.wait_for("urgent gang bound", lambda: (
        ns := [p.spec.node_name for p in core.list_namespaced_pod(NS, label_selector=f"volcano.sh/job-name={urgent}").items
               if p.spec.node_name]) and len(ns) == 2 and ns, timeout_s=120, interval_s=0.1)
    bound_s = time.monotonic() - t0
    try:
        deadline = time.monotonic() + 3  # what the same scheduling cycles did to the batch gangs
        while time.monotonic() < deadline:
            assert evictions_allowed or not _restarted(custom, names), "a batch gang was evicted and restarted"
            time.sleep(0.5)
        restarted = _restarted(custom, names)
    finally:
        for n in names + [urgent]:
            custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", n)
    return bound_s, restarted, set(nodes)


def test_urgent_gang_with_and_without_the_warm_buffer_while_batch_fills_the_gpu_pool(scaling_cluster):
    """Equal GPU capacity (4 nodes, 32 GPUs) both ways, batch work holding all that is not reserved:
    - no buffer: the GPU pool's limit is 32 GPUs, two batch gangs fill it, and an urgent gang can
      only get GPUs by Volcano reclaiming them from a batch gang (which restarts);
    - buffer: the product's static NodePool keeps 2 tainted GPU nodes warm (StaticCapacity), the
      GPU pool is limited to the other 16 GPUs, one batch gang fills it; the urgent gang binds on
      the buffer at once and no batch gang restarts.
    Prints both submit->bound times (README, "Autoscaling": the urgent-with-buffer row)."""
    from pipectl.pipelines.autoscaling import BUFFER_NAME, buffer_node_pool

    c = scaling_cluster
    core, custom = c.core, c.custom

    c.wait_for("no GPU node left", lambda: not _gpu_nodes(core), timeout_s=180)
    try:
        _gpu_limit(custom, 4 * GPUS_PER_NODE)
        no_buffer_s, no_buffer_restarted, _ = _urgent_against_batch(c, 2, "nobuf", evictions_allowed=True)
        assert no_buffer_restarted >= 1, "without a buffer the urgent gang can only have reclaimed a batch gang's GPUs"

        # the emptied GPU nodes go (consolidation: WhenEmpty after 5 s) before the pool shrinks
        c.wait_for("empty GPU nodes consolidated away", lambda: not _gpu_nodes(core), timeout_s=180)
        _gpu_limit(custom, 2 * GPUS_PER_NODE)
        (pool,) = buffer_node_pool(karpenter.autoscaling_config(nodes=2))
        c.apply([pool], field_manager="pipectl-tests")
        c.wait_for("2 warm buffer nodes Ready", lambda: len([
            n for n in core.list_node(label_selector=f"karpenter.sh/nodepool={BUFFER_NAME}").items if _ready(n)]) == 2,
            timeout_s=120)
        buffer_nodes = {n.metadata.name for n in core.list_node(label_selector=f"karpenter.sh/nodepool={BUFFER_NAME}").items}
        # nothing else lands on them: they carry the urgent lane's taint
        assert all({"key": "pipectl.io/lane", "value": "urgent", "effect": "NoSchedule"} in [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in n.spec.taints or []]
            for n in core.list_node(label_selector=f"karpenter.sh/nodepool={BUFFER_NAME}").items)
        buffer_s, buffer_restarted, urgent_nodes = _urgent_against_batch(c, 1, "buf", evictions_allowed=False)
        assert urgent_nodes == buffer_nodes
        assert buffer_restarted == 0, "with the buffer no batch gang may be evicted"
        print(f"[timing] urgent 2x8-GPU gang created -> bound, batch filling the GPU pool (32 GPUs in all): "
              f"without buffer {no_buffer_s:.1f} s ({no_buffer_restarted} batch gang evicted and restarted); "
              f"with a 2-node warm buffer {buffer_s:.1f} s (0 evicted)")
    finally:
        custom.delete_cluster_custom_object("karpenter.sh", "v1", "nodepools", BUFFER_NAME) if custom.list_cluster_custom_object(
            "karpenter.sh", "v1", "nodepools", field_selector=f"metadata.name={BUFFER_NAME}")["items"] else None
        _gpu_limit(custom, 64)


def test_a_pending_gang_waits_through_a_scale_up_and_one_that_never_fits_fails_within_the_timeout(scaling_cluster):
    """The template compiled with a short retry policy (scale_up_s 30, step_timeout_s 60: each
    train attempt may take 90 s, Pending included). Nodes now take 20 s to register. A gang that
    fits waits Pending through the scale-up and the workflow succeeds: the measured
    Pending -> Ready time is inside the policy's scale_up_s. A gang that can never fit (16 GPUs per
    pod; the largest instance type has 8) fails once its attempt's timeout passes, is not retried
    (a timeout is not an infrastructure failure), and `pipectl status` says why: the autoscaler's
    own reason for not launching a node."""
    from pipectl.pipelines.policy import RetryPolicy
    from pipectl.pipelines.builtin import build_training
    from pipectl.pipelines.training import CompileConfig

    c = scaling_cluster
    core, custom = c.core, c.custom
    policy = RetryPolicy(scale_up_s=30, step_timeout_s=60)
    # the shipped policy's claim: its first four delays together outlast one scale-up
    assert sum(RetryPolicy().delays_s()[:4]) >= RetryPolicy().scale_up_s
    c.apply([{**build_training(CompileConfig(retry=policy)).to_dict(), "metadata": {"name": "training-v1", "namespace": NS}}],
            field_manager="pipectl-tests")
    custom.patch_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", "default",
                                       {"spec": {"nodeRegistrationDelay": "20s"}})
    try:
        c.wait_for("no GPU node left", lambda: not _gpu_nodes(core), timeout_s=180)
        name = _submit(c, "workers=2", f"gpus-per-worker={GPUS_PER_NODE}", f"processes-per-worker={GPUS_PER_NODE}")
        selector = _gang_selector(name)
        c.wait_for("gang pods created", lambda: len(core.list_namespaced_pod(NS, label_selector=selector).items) == 2,
                   timeout_s=120)
        t0 = time.monotonic()
        c.wait_for("2 GPU nodes Ready", lambda: len(ns := _gpu_nodes(core)) >= 2 and all(_ready(n) for n in ns), timeout_s=120)
        scale_up_s = time.monotonic() - t0
        assert scale_up_s < policy.scale_up_s, f"scale-up took {scale_up_s:.0f} s, the policy assumes {policy.scale_up_s} s"
        wf = _wait_phase(c.api_client(), NS, name, {"Succeeded", "Failed", "Error"}, timeout_s=180)
        assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")

        never = _submit(c, "workers=1", "gpus-per-worker=16", "processes-per-worker=16")
        selector_never = _gang_selector(never)
        t1 = time.monotonic()
        wf = _wait_phase(c.api_client(), NS, never, {"Succeeded", "Failed", "Error"},
                         timeout_s=policy.attempt_timeout_s + 120)
        failed_after = time.monotonic() - t1
        assert wf["status"]["phase"] == "Failed"
        train = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n["displayName"].startswith("train(")]
        assert len(train) == 1, [n["displayName"] for n in train]  # not retried
        assert "deadline" in train[0].get("message", ""), train[0]
        # C19: the attempt past its timeout leaves no gang behind to be scheduled later (exit handler)
        left = custom.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                    label_selector=f"workflows.argoproj.io/workflow={never}")["items"]
        assert left == [] and core.list_namespaced_pod(NS, label_selector=selector_never).items == [], left
        r = _pipectl(c, "status", never, "-n", NS)
        assert r.returncode == 1
        out = r.stdout + r.stderr
        assert "was never scheduled" in out and "karpenter" in out and "nodepool" in out, out
        print(f"[timing] a Pending gang waited through a {scale_up_s:.1f} s scale-up (node registration delay 20 s) "
              f"and succeeded; a gang that never fits failed {failed_after:.0f} s after submit "
              f"(attempt timeout {policy.attempt_timeout_s} s)")
    finally:
        custom.patch_cluster_custom_object("karpenter.kwok.sh", "v1alpha1", "kwoknodeclasses", "default",
                                           {"spec": {"nodeRegistrationDelay": f"{NODE_REGISTRATION_DELAY_S}s"}})
        assert _pipectl(c, "templates", "apply", "-n", NS).returncode == 0


def test_a_partial_scale_up_binds_none_of_the_gang(scaling_cluster):
    """The GPU pool may grow by one node only (limit 8 GPUs) and a 2 x 8-GPU gang arrives: Karpenter
    launches the one node it may, and Volcano binds NO pod of the gang on it (a half-bound gang
    would hold 8 GPUs doing nothing); once the limit is raised the second node comes and the whole
    gang binds."""
    from tests.cluster.test_control_plane import _lane_gang

    c = scaling_cluster
    core, custom = c.core, c.custom

    c.wait_for("no GPU node left", lambda: not _gpu_nodes(core), timeout_s=180)
    _gpu_limit(custom, GPUS_PER_NODE)
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                           _lane_gang("gang-partial", "standard", 2, GPUS_PER_NODE, "1h"))
    selector = "volcano.sh/job-name=gang-partial"
    try:
        c.wait_for("one GPU node Ready", lambda: len(ns := _gpu_nodes(core)) == 1 and _ready(ns[0]), timeout_s=120)
        deadline = time.monotonic() + 20  # 20 Volcano sessions with a free 8-GPU node in reach
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(NS, label_selector=selector).items
            assert len(pods) == 2 and not any(p.spec.node_name for p in pods), [p.spec.node_name for p in pods]
            time.sleep(0.5)
        assert len(_gpu_nodes(core)) == 1
        _gpu_limit(custom, 64)
        c.wait_for("whole gang bound", lambda: len([p for p in core.list_namespaced_pod(NS, label_selector=selector).items
                                                    if p.spec.node_name]) == 2, timeout_s=120)
    finally:
        custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "gang-partial")
        _gpu_limit(custom, 64)


def test_doctor_checks_karpenters_node_pools_and_node_class(scaling_cluster, tmp_path):
    """Where Karpenter runs, `pipectl doctor` checks the NodePools argo/autoscaling/karpenter
    installs and the node class they launch with, as the site file sets them: this cluster's pools
    (applied without the urgent buffer) and its KWOKNodeClass pass; the buffer's pool, a node class
    the cluster lacks and a node class kind it does not know are each named, with the fix."""
    import yaml

    from pipectl.pipelines.autoscaling import AutoscalingConfig, NodeClassRef

    def karpenter_rows(cfg: AutoscalingConfig) -> dict[str, dict]:
        site = tmp_path / "site.yaml"
        site.write_text(yaml.safe_dump({"autoscaling": cfg.model_dump(mode="json")}))
        r = _pipectl(scaling_cluster, "--site", str(site), "doctor", "-n", NS, "-o", "json")
        assert r.returncode in (0, 1), r.stderr
        return {row["check"]: row for row in json.loads(r.stdout) if row["check"].startswith("Karpenter")}

    rows = karpenter_rows(karpenter.autoscaling_config(nodes=0))
    assert rows == {"Karpenter NodePools": {"check": "Karpenter NodePools", "status": "ok", "detail": "pipectl-cpu, pipectl-gpu", "fix": ""},
                    "Karpenter node class": {"check": "Karpenter node class", "status": "ok", "fix": "",
                                             "detail": "KWOKNodeClass default (karpenter.kwok.sh)"}}, rows

    rows = karpenter_rows(karpenter.autoscaling_config(nodes=1))
    assert rows["Karpenter NodePools"]["status"] == "fail", rows
    assert rows["Karpenter NodePools"]["detail"] == "missing: pipectl-urgent-buffer", rows
    assert rows["Karpenter NodePools"]["fix"] == "kubectl apply --server-side -k argo/autoscaling/karpenter", rows

    other = karpenter.autoscaling_config(nodes=0).model_copy(
        update={"node_class": NodeClassRef(group="karpenter.kwok.sh", kind="KWOKNodeClass", name="gpu-class")})
    row = karpenter_rows(other)["Karpenter node class"]
    assert row["status"] == "fail" and row["detail"] == "KWOKNodeClass gpu-class (karpenter.kwok.sh) missing", row
    assert "autoscaling.node_class.name" in row["fix"], row

    aws = karpenter.autoscaling_config(nodes=0).model_copy(update={"node_class": NodeClassRef()})
    row = karpenter_rows(aws)["Karpenter node class"]
    assert row["status"] == "fail" and row["detail"] == "EC2NodeClass (karpenter.k8s.aws) is not a kind of this cluster", row
