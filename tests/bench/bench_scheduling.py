"""Cluster scheduling on 128 fake nodes x 8 GPUs (1,024 GPUs): the loopback control plane of
tests/cluster (real kube-apiserver, kube-scheduler, Argo controller, Volcano; pods by KWOK).

Scenarios:

1. idle:    submit -> every pod bound for a 16-GPU gang (2 pods x 8 GPUs), the project's Volcano Job
            (pipelines/pipectl/pipelines/launchers/volcano.py); peer: the same 2 pods as a plain Kubernetes Job under the default
            kube-scheduler (no gang: what a user without Volcano gets).
2. preempt: the same, lane urgent, with batch-lane gangs holding every one of the 1,024 GPUs:
            Volcano must reclaim a batch gang first. Peer: the idle figure (the cost of preemption).
3. lanes:   50 `training` workflows (the real WorkflowTemplate, KWOK pods, step outputs supplied
            as in tests/cluster) submitted at once, 10 urgent / 20 standard / 20 batch: per lane,
            submit -> train gang bound and submit -> Succeeded; CPU seconds used by the Argo
            workflow-controller and the Volcano scheduler during the burst.

Latencies are wall seconds on this machine's clock, from the create call returning to the pod
watch event that shows the last pod with ``spec.nodeName`` (the watch adds a few ms). Run with
``python -m tests.bench.run scheduling`` or ``python tests/bench/bench_scheduling.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NODES = 128
GPUS_PER_NODE = 8
RUNS = 5
NS = "pipectl"
LANE_MIX = {"urgent": 10, "standard": 20, "batch": 20}


class BindWatch:
    """Client-side time at which each pod in ``NS`` was first seen bound (``spec.nodeName``)."""

    def __init__(self, api) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.bound: dict[str, float] = {}
        self.labels: dict[str, dict] = {}
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop:
            try:
                for ev in watch.Watch().stream(self.core.list_namespaced_pod, NS, timeout_seconds=30):
                    p = ev["object"]
                    if p.spec.node_name and p.metadata.name not in self.bound:
                        self.bound[p.metadata.name] = time.monotonic()
                        self.labels[p.metadata.name] = dict(p.metadata.labels or {})
            except Exception:  # noqa: BLE001 - expired watch: start again
                time.sleep(0.2)

    def wait_bound(self, selector, n: int, timeout_s: float = 180.0) -> float:
        """Time the n-th pod whose labels satisfy ``selector`` was bound."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            times = [t for name, t in list(self.bound.items()) if selector(self.labels[name])]
            if len(times) >= n:
                return sorted(times)[n - 1]
            time.sleep(0.02)
        raise TimeoutError(f"fewer than {n} pods bound within {timeout_s}s")


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)}


def _fmt(s: dict) -> str:
    return f"{s['median']:.2f} s ({s['min']:.2f}-{s['max']:.2f}, n={s['runs']})"


def _plain_job(name: str, pods: int, gpus: int) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
                "metadata": {"labels": {"bench": name}, "annotations": {"pipectl.io/run-duration": "1h"}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "main", "image": "busybox:1.36", "imagePullPolicy": "Never", "command": ["true"],
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}}}


def _delete_and_wait(c, custom, core, group: str, plural: str, name: str, selector: str) -> None:
    from kubernetes import client

    if group == "batch":
        client.BatchV1Api(c.api_client()).delete_namespaced_job(name, NS, propagation_policy="Background")
    else:
        custom.delete_namespaced_custom_object(group, "v1alpha1", NS, plural, name)
    c.wait_for(f"{name} gone", lambda: not core.list_namespaced_pod(NS, label_selector=selector).items, timeout_s=120)


def run(runs: int = RUNS) -> dict:
    from kubernetes import client

    from pipectl.pipelines.workflows import workflow_for
    from pipectl.components.names import TEMPLATE_NAME
    from pipectl.components.contracts import TrainingParameters
    from tests.cluster.cluster import TEST_OUTPUTS_CONFIGMAP, TestCluster
    from tests.cluster.test_control_plane import TRAINING_STEP_OUTPUTS, _lane_gang, _project_manifests

    import psutil

    out: dict = {"nodes": NODES, "gpus": NODES * GPUS_PER_NODE, "loadavg_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="pipectl-bench-sched-") as tmp, \
            TestCluster(Path(tmp) / "k8s", nodes=NODES, verbose=False, start_timeout_s=600) as c:
        out["bring_up_s"] = c.startup_s
        c.apply([d for _, d in _project_manifests()], field_manager="bench")  # incl. training-v1
        api = c.api_client()
        core = client.CoreV1Api(api)
        custom = client.CustomObjectsApi(api)
        batchv1 = client.BatchV1Api(api)
        core.create_namespaced_config_map(NS, {"metadata": {"name": TEST_OUTPUTS_CONFIGMAP},
                                               "data": {k: json.dumps(v) for k, v in TRAINING_STEP_OUTPUTS.items()}})
        bw = BindWatch(api)
        time.sleep(1)

        def time_gang(name: str, lane: str) -> float:
            """Create a 2 x 8-GPU gang of ``lane``; seconds until both pods are bound; delete it."""
            t0 = time.monotonic()
            custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                   _lane_gang(name, lane, 2, GPUS_PER_NODE, "1h"))
            t = bw.wait_bound(lambda l: l.get("volcano.sh/job-name") == name, 2) - t0
            _delete_and_wait(c, custom, core, "batch.volcano.sh", "jobs", name, f"volcano.sh/job-name={name}")
            return t

        # 1. idle: Volcano gang vs plain Job under kube-scheduler, alternating, warm-up first
        gang, plain = [], []
        for i in range(runs + 1):
            t = time_gang(f"idle-gang-{i}", "standard")
            name = f"idle-plain-{i}"
            t0 = time.monotonic()
            batchv1.create_namespaced_job(NS, _plain_job(name, 2, GPUS_PER_NODE))
            tp = bw.wait_bound(lambda l, n=name: l.get("bench") == n, 2) - t0
            _delete_and_wait(c, custom, core, "batch", "jobs", name, f"bench={name}")
            if i:  # the first round is the warm-up
                gang.append(t)
                plain.append(tp)
        out["idle_gang"] = _stats(gang)
        out["idle_plain_job"] = _stats(plain)

        # 2. preempt: batch gangs on every GPU, then an urgent gang
        batch = [f"fill-{i}" for i in range(NODES // 2)]
        for b in batch:
            custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                   _lane_gang(b, "batch", 2, GPUS_PER_NODE, "1h"))

        def all_batch_running() -> bool:
            """Every fill gang running whole. A gang preempted more than its restart budget
            (infra_limit: maxRetry = infra_limit + 1) ends Failed, as it would in production: replace it so the
            GPUs stay full for the next round."""
            for j in custom.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs")["items"]:
                n = j["metadata"]["name"]
                if n in batch and j.get("status", {}).get("state", {}).get("phase") == "Failed":
                    custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", n)
                    batch[batch.index(n)] = new = f"{n.split('-r')[0]}-r{time.monotonic_ns() % 10**8}"
                    out["batch_gangs_failed_after_budget"] = out.get("batch_gangs_failed_after_budget", 0) + 1
                    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                           _lane_gang(new, "batch", 2, GPUS_PER_NODE, "1h"))
            pods = core.list_namespaced_pod(NS, label_selector="volcano.sh/queue-name=pipectl-batch").items
            return sum(1 for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp) == 2 * len(batch)

        t0 = time.monotonic()
        c.wait_for("batch gangs on every GPU", all_batch_running, timeout_s=300)
        out["fill_1024_gpus_s"] = time.monotonic() - t0
        pre = []
        for i in range(runs + 1):
            t = time_gang(f"urgent-gang-{i}", "urgent")
            c.wait_for("batch refilled", all_batch_running, timeout_s=300)
            if i:
                pre.append(t)
        out["preempt_urgent_gang"] = _stats(pre)
        for b in batch:
            custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", b)
        c.wait_for("batch gone", lambda: not core.list_namespaced_pod(
            NS, label_selector="volcano.sh/queue-name=pipectl-batch").items, timeout_s=300)

        # 3. lanes: 50 training workflows at once
        ctrl = psutil.Process(c.procs["workflow-controller"].pid)
        vcs = psutil.Process(c.procs["vc-scheduler"].pid) if "vc-scheduler" in c.procs else None
        cpu0 = (sum(ctrl.cpu_times()[:2]), sum(vcs.cpu_times()[:2]) if vcs else 0.0)
        submitted: dict[str, tuple[str, float]] = {}
        t_burst = time.monotonic()
        # interleaved (u s b s b u s b ...), not lane by lane
        queues = [[lane] * n for lane, n in LANE_MIX.items()]
        order = [lane for group in itertools.zip_longest(*queues) for lane in group if lane]
        for lane in order:
            params = TrainingParameters(lane=lane, workers=2, gpus_per_worker=GPUS_PER_NODE,
                                        processes_per_worker=GPUS_PER_NODE)
            wf = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows",
                                                        workflow_for(TEMPLATE_NAME, NS, params))
            submitted[wf["metadata"]["name"]] = (lane, time.monotonic())
        out["submit_50_s"] = time.monotonic() - t_burst
        done: dict[str, float] = {}
        deadline = time.monotonic() + 900
        while len(done) < len(submitted) and time.monotonic() < deadline:
            for w in custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows")["items"]:
                n = w["metadata"]["name"]
                if n in submitted and n not in done and w.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error"):
                    done[n] = time.monotonic()
                    if w["status"]["phase"] != "Succeeded":
                        raise RuntimeError(f"{n}: {w['status']['phase']} {w['status'].get('message')}")
            time.sleep(0.5)
        if len(done) < len(submitted):
            raise TimeoutError(f"only {len(done)} of {len(submitted)} workflows ended in 900 s")
        out["burst_wall_s"] = max(done.values()) - t_burst
        cpu1 = (sum(ctrl.cpu_times()[:2]), sum(vcs.cpu_times()[:2]) if vcs else 0.0)
        out["controller_cpu_s"] = cpu1[0] - cpu0[0]
        out["vc_scheduler_cpu_s"] = cpu1[1] - cpu0[1]
        lanes = {}
        for lane in LANE_MIX:
            names = [n for n, (l, _) in submitted.items() if l == lane]
            bound = [bw.wait_bound(lambda l, n=n: l.get("volcano.sh/job-name", "").startswith(f"{n}-train"), 2, 1) - submitted[n][1]
                     for n in names]
            lanes[lane] = {"gang_bound": _stats(bound), "succeeded": _stats([done[n] - submitted[n][1] for n in names])}
        out["lanes"] = lanes
    out["loadavg_after"] = os.getloadavg()
    return out


def table(r: dict) -> str:
    idle, plain, pre = r["idle_gang"], r["idle_plain_job"], r["preempt_urgent_gang"]
    lines = [
        f"Cluster scheduling: {r['nodes']} KWOK nodes x {GPUS_PER_NODE} GPUs = {r['gpus']} GPUs "
        f"(bring-up {r['bring_up_s']:.1f} s; load average before/after "
        f"{r['loadavg_before'][0]:.1f}/{r['loadavg_after'][0]:.1f} on {os.cpu_count()} cores)",
        "| scenario | pipectl (Volcano gang) | peer | ratio |",
        "|---|---|---|---|",
        f"| idle, 16-GPU gang: submit -> all pods bound | {_fmt(idle)} | plain Job, kube-scheduler: {_fmt(plain)} "
        f"| {idle['median'] / plain['median']:.2f}x |",
        f"| urgent 16-GPU gang, batch holding all {r['gpus']} GPUs | {_fmt(pre)} | same gang, idle cluster: "
        f"{idle['median']:.2f} s | {pre['median'] / idle['median']:.2f}x |",
        f"(batch gangs that hit their restart budget and were replaced: {r.get('batch_gangs_failed_after_budget', 0)})",
        "",
        f"50 training workflows at once ({', '.join(f'{n} {l}' for l, n in LANE_MIX.items())}); all ended "
        f"{r['burst_wall_s']:.1f} s after the first submit; workflow-controller {r['controller_cpu_s']:.1f} CPU-s, "
        f"vc-scheduler {r['vc_scheduler_cpu_s']:.1f} CPU-s",
        "| lane | submit -> train gang bound | submit -> Succeeded |",
        "|---|---|---|",
    ]
    for lane, s in r["lanes"].items():
        lines.append(f"| {lane} | {_fmt(s['gang_bound'])} | {_fmt(s['succeeded'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    r = run()
    print(table(r))
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / "scheduling.json").write_text(json.dumps(r, indent=2))
    (results / "scheduling.md").write_text("### Cluster scheduling\n\n" + table(r) + "\n")
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
