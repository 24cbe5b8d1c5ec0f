"""Gangs at the size of the clusters pipectl is for, on the project's own test cluster: a real
kube-apiserver, etcd, kube-scheduler, Argo controller and Volcano with the product's configuration;
nodes and pods by KWOK (8 fake GPUs per node). Every gang is the train step's Volcano Job exactly
as the training template renders it (tests/cluster/test_control_plane.py ``_lane_gang``).

Scenarios (``python -m tests.bench.run scheduling``):

S1  one 128-pod gang (minMember 128, 8 GPUs each, 1,024 GPUs) on an idle cluster: create -> every
    pod bound; peer: the same 128 pods as a plain Job under kube-scheduler (no gang).
    S1-wait: capacity one node short (all but 127 nodes cordoned): pods bound while it cannot fit
    (must be 0), then a node is added, as an autoscaler would: new node -> every pod bound.
S2  two 128-pod gangs where only one fits (200 schedulable nodes): one binds whole, the other
    stays Pending whole; the first is deleted -> the second bound. Peer: the same as two plain Jobs.
S3  an urgent 16-GPU gang while 128-pod batch gangs fill every schedulable node: create -> bound,
    the batch gangs it displaced and the GPUs idle once it settled (30 s), without and with a
    2-node buffer tainted ``pipectl.io/lane=urgent:NoSchedule`` (the urgent lane's reserve).
S4  100 training workflows at once (20 urgent, 40 standard, 40 batch) on 128 nodes: all reach a
    terminal phase; the most workflows Running at once (controller ``namespaceParallelism``) and
    train gangs per lane at once (the lanes' semaphores); peer: the same 100 submitted by hand in
    lane-sized batches (4 urgent + 8 standard + 16 batch, the next batch when one has ended).
S5  S1 at 250 / 500 / 1,000 / 2,000 nodes: bind time, kube-apiserver and etcd memory, the
    Volcano scheduler's CPU while idle and while binding.

KWOK's node heartbeat runs every 30-36 s up to 300 nodes and slower in proportion above
(:func:`heartbeat_s`: 1,000 nodes 100 s, 2,000 nodes 200 s; a real kubelet reports status every
5 min and renews a lease every 10 s): with 10-15 s heartbeats a 2,000-node cluster is mostly the
simulator updating nodes. Latencies are wall seconds on this machine, from the
create call returning to the watch event of the last pod seen with ``spec.nodeName``.

Environment: ``BENCH_SCHED_NODES`` (default ``250,500,1000,2000``; S1-wait, S2 and S3 run on the
1,000-node cluster, or the largest below it), ``BENCH_SCHED_ONLY`` (e.g. ``S4``), ``BENCH_RUNS``,
``BENCH_SCHED_KEEP_LOGS=1`` (the components' logs copied to ``.pipectl/bench-logs/`` after every
scenario, not only after a failed one).
"""

from __future__ import annotations

import contextlib
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

GPUS = 8
GANG = 128
NS = "pipectl"
HEARTBEAT_S = 30


def heartbeat_s(nodes: int) -> int:
    """KWOK's node heartbeat for a cluster of ``nodes``: 30 s up to 300 nodes, then slower in
    proportion (1,000 nodes: 100 s; 2,000: 200 s), so that the simulator renews about 10 node
    statuses a second at every size instead of keeping the 2 cores busy with them (an idle
    1,000-node cluster at 5 s renewals did; the harness's node-monitor grace period is 5 heartbeats)."""
    return max(HEARTBEAT_S, nodes // 10)
S4_NODES = 128
S4_MIX = {"urgent": 20, "standard": 40, "batch": 40}
SETTLE_S = 30
BUFFER_TAINT = {"key": "pipectl.io/lane", "value": "urgent", "effect": "NoSchedule"}


def _env_list(name: str, default: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, default).split(",") if x.strip()]


class Watch:
    """The latest state of every object of a list call, from a watch; ``on_event`` after each event."""

    def __init__(self, list_fn, *args, key=lambda o: o["metadata"]["name"], on_event=None) -> None:
        self.list_fn, self.args, self.key, self.on_event = list_fn, args, key, on_event
        self.items: dict[str, dict] = {}
        self.first_seen: dict[tuple[str, str], float] = {}  # (name, marker) -> time
        self.lock = threading.Lock()
        self._stop = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        from kubernetes import watch

        while not self._stop:
            try:  # list, then watch from the list's version: a re-list drops what was deleted meanwhile
                listed = self.list_fn(*self.args)
                items, version = ((listed["items"], listed["metadata"]["resourceVersion"]) if isinstance(listed, dict)
                                  else ([o.to_dict() for o in listed.items], listed.metadata.resource_version))
                with self.lock:
                    self.items = {self.key(o): o for o in items}
                    if self.on_event:
                        self.on_event(self)
                for ev in watch.Watch().stream(self.list_fn, *self.args, resource_version=version, timeout_seconds=30):
                    obj = ev["object"]
                    obj = obj if isinstance(obj, dict) else obj.to_dict()
                    with self.lock:
                        if ev["type"] == "DELETED":
                            self.items.pop(self.key(obj), None)
                        else:
                            self.items[self.key(obj)] = obj
                        if self.on_event:
                            self.on_event(self)
            except Exception:  # noqa: BLE001 - an expired watch: start again
                time.sleep(0.2)

    def stop(self) -> None:
        self._stop = True


class Pods:
    """Bind times of the namespace's pods (client clock, first event with ``spec.nodeName``)."""

    def __init__(self, core) -> None:
        self.bound: dict[str, float] = {}  # pod uid -> time (a recreated pod has a new uid)
        self.w = Watch(core.list_namespaced_pod, NS, key=lambda o: o["metadata"]["uid"], on_event=self._seen)

    def _seen(self, w: Watch) -> None:
        now = time.monotonic()
        for uid, p in w.items.items():
            if p["spec"].get("node_name") and uid not in self.bound:
                self.bound[uid] = now

    def of(self, label: str, value: str) -> list[dict]:
        with self.w.lock:
            return [p for p in self.w.items.values() if (p["metadata"].get("labels") or {}).get(label) == value]

    def bound_count(self, label: str, value: str) -> int:
        return sum(1 for p in self.of(label, value) if p["spec"].get("node_name") and not p["metadata"].get("deletion_timestamp"))

    def wait_bound(self, label: str, value: str, n: int, timeout_s: float = 300.0) -> float:
        """Time at which the n-th live pod with ``label=value`` was seen bound."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            uids = [p["metadata"]["uid"] for p in self.of(label, value)
                    if p["spec"].get("node_name") and not p["metadata"].get("deletion_timestamp")]
            times = sorted(self.bound[u] for u in uids if u in self.bound)
            if len(times) >= n:
                return times[n - 1]
            time.sleep(0.05)
        raise TimeoutError(f"fewer than {n} pods {label}={value} bound within {timeout_s:.0f} s")


def _stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": len(xs)} if xs else {}


def _fmt(s: dict, unit: str = "s") -> str:
    if not s:
        return "—"
    return f"{s['median']:.1f} {unit} ({s['min']:.1f}–{s['max']:.1f}, n={s['runs']})"


def _plain_job(name: str, pods: int) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NS},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0, "template": {
                "metadata": {"labels": {"bench": name}, "annotations": {"pipectl.io/run-duration": "1h"}},
                "spec": {"restartPolicy": "Never",  # the namespace enforces the restricted Pod Security Standard
                         "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
                         "containers": [{
                             "name": "main", "image": "busybox:1.36", "imagePullPolicy": "Never", "command": ["true"],
                             "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                             "resources": {"limits": {"nvidia.com/gpu": str(GPUS)}}}]}}}}


class Bench:
    """One test cluster of ``nodes`` KWOK nodes with the project applied, and the scenarios on it."""

    def __init__(self, c, nodes: int) -> None:
        from kubernetes import client

        from tests.cluster.cluster import TEST_OUTPUTS_CONFIGMAP
        from tests.cluster.test_control_plane import TRAINING_STEP_OUTPUTS, _project_manifests

        self.c, self.nodes = c, nodes
        c.apply([d for _, d in _project_manifests()], field_manager="bench")  # incl. training-v1
        self.api = c.api_client()
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.core.create_namespaced_config_map(NS, {"metadata": {"name": TEST_OUTPUTS_CONFIGMAP},
                                                    "data": {k: json.dumps(v) for k, v in TRAINING_STEP_OUTPUTS.items()}})
        # the namespace's GPU quota (a team's share: the site's namespace_max_gpus) is the whole cluster here
        self.core.patch_namespaced_resource_quota("pipectl-namespace-gpus", NS, {"spec": {"hard": {
            "requests.nvidia.com/gpu": str((nodes + 8) * GPUS)}}})
        self.pods = Pods(self.core)
        self.extra = 0
        self.node_state = {f"kwok-node-{i}": (False, False) for i in range(nodes)}  # (cordoned, buffer)
        time.sleep(1)

    # -- objects ---------------------------------------------------------------------------------

    def gang(self, name: str, lane: str, workers: int = GANG, duration: str = "1h") -> float:
        from tests.cluster.test_control_plane import _lane_gang

        self.custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                    _lane_gang(name, lane, workers, GPUS, duration))
        return time.monotonic()

    def delete_gang(self, name: str, wait: bool = True) -> None:
        self.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", name)
        if wait:
            self.c.wait_for(f"{name} gone", lambda: not self.pods.of("volcano.sh/job-name", name), timeout_s=300)

    def plain(self, name: str, pods: int = GANG) -> float:
        self.batch.create_namespaced_job(NS, _plain_job(name, pods))
        return time.monotonic()

    def delete_plain(self, name: str) -> None:
        self.batch.delete_namespaced_job(name, NS, propagation_policy="Background")
        self.c.wait_for(f"{name} gone", lambda: not self.pods.of("bench", name), timeout_s=300)

    def schedulable(self, keep: int, buffer: int = 0) -> None:
        """Cordon every node but the first ``keep``; the next ``buffer`` nodes are schedulable with
        the urgent lane's taint (uncordoned, untainted otherwise)."""
        for i in range(self.nodes):
            name, want = f"kwok-node-{i}", (i >= keep + buffer, keep <= i < keep + buffer)
            if self.node_state[name] != want:
                self.core.patch_node(name, {"spec": {"unschedulable": want[0], "taints": [BUFFER_TAINT] if want[1] else None}})
                self.node_state[name] = want

    def add_node(self) -> str:
        from tests.harness.kwok import fake_node

        name = f"kwok-node-extra-{self.extra}"
        self.extra += 1
        self.core.create_node(fake_node(name))
        return name

    def ready(self, node: str) -> bool:
        n = self.core.read_node(node)
        return any(c.type == "Ready" and c.status == "True" for c in (n.status.conditions or [])) and not any(
            t.key.startswith("node.kubernetes.io/") for t in (n.spec.taints or []))

    def gpus_idle(self) -> int:
        """GPUs of schedulable nodes (not cordoned) that no live pod holds."""
        nodes = [n for n in self.core.list_node(label_selector="type=kwok").items if not n.spec.unschedulable]
        cap = sum(int(n.status.allocatable.get("nvidia.com/gpu", "0")) for n in nodes)
        names = {n.metadata.name for n in nodes}
        held = 0
        with self.pods.w.lock:
            for p in self.pods.w.items.values():
                if p["spec"].get("node_name") in names and not p["metadata"].get("deletion_timestamp") \
                        and (p.get("status") or {}).get("phase") in ("Pending", "Running"):
                    for ctr in p["spec"]["containers"]:
                        held += int(((ctr.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        return cap - held

    def restarts(self, names: list[str]) -> int:
        """Restarts of the Volcano jobs ``names`` (``status.retryCount``)."""
        out = 0
        for n in names:
            j = self.custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", n)
            out += int((j.get("status") or {}).get("retryCount", 0))
        return out

    def proc_mib(self, name: str) -> float:
        import psutil

        p = psutil.Process(self.c.procs[name].pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**20

    def proc_cpu(self, name: str) -> float:
        import psutil

        p = psutil.Process(self.c.procs[name].pid)
        return sum(sum(q.cpu_times()[:2]) for q in [p, *p.children(recursive=True)])

    # -- scenarios -------------------------------------------------------------------------------

    def s1(self, runs: int) -> dict:
        """S1: one 128-pod gang on the idle cluster; peer: a plain Job of 128 pods."""
        gang, plain, cpu = [], [], []
        for i in range(runs + 1):  # the first round is the warm-up
            c0 = self.proc_cpu("vc-scheduler")
            t0 = self.gang(f"s1-gang-{i}", "batch")
            t = self.pods.wait_bound("volcano.sh/job-name", f"s1-gang-{i}", GANG) - t0
            c1 = self.proc_cpu("vc-scheduler")
            self.delete_gang(f"s1-gang-{i}")
            t0 = self.plain(f"s1-plain-{i}")
            tp = self.pods.wait_bound("bench", f"s1-plain-{i}", GANG) - t0
            self.delete_plain(f"s1-plain-{i}")
            if i:
                gang.append(t)
                plain.append(tp)
                cpu.append(c1 - c0)
        idle0, t_idle = self.proc_cpu("vc-scheduler"), time.monotonic()
        time.sleep(10)
        idle_cpu = (self.proc_cpu("vc-scheduler") - idle0) / (time.monotonic() - t_idle)
        return {"gang_bound_s": _stats(gang), "plain_job_bound_s": _stats(plain),
                "vc_scheduler_cpu_s_while_binding": _stats(cpu), "vc_scheduler_idle_cores": idle_cpu,
                "apiserver_mib": self.proc_mib("kube-apiserver"), "etcd_mib": self.proc_mib("etcd")}

    def s1_wait(self, runs: int) -> dict:
        """S1-wait: capacity one node short, then a node arrives."""
        self.schedulable(GANG - 1)
        partial, after_node, node_ready = [], [], []
        try:
            for i in range(runs):
                name = f"s1w-gang-{i}"
                self.gang(name, "batch")
                seen = 0
                end = time.monotonic() + 20
                while time.monotonic() < end:
                    seen = max(seen, self.pods.bound_count("volcano.sh/job-name", name))
                    time.sleep(0.25)
                partial.append(seen)
                t0 = time.monotonic()
                node = self.add_node()
                try:  # on a busy simulator the new node waits in KWOK's queue behind the heartbeats
                    self.c.wait_for(f"{node} ready", lambda n=node: self.ready(n), timeout_s=300, interval_s=0.1)
                    node_ready.append(time.monotonic() - t0)
                except TimeoutError:
                    node_ready.append(float("inf"))
                after_node.append(self.pods.wait_bound("volcano.sh/job-name", name, GANG, timeout_s=600) - t0)
                self.delete_gang(name)
                self.core.delete_node(node)
        finally:
            self.schedulable(self.nodes)
        return {"bound_while_short": max(partial), "node_ready_s": _stats(node_ready), "bound_after_node_s": _stats(after_node)}

    def _two(self, make, label: str, names: tuple[str, str], watch_s: float = 30) -> dict:
        """Two jobs of 128 pods at once on 200 schedulable nodes: samples of both bound counts."""
        for n in names:
            make(n)
        both_partial, loser_max, samples = 0, 0, 0
        end = time.monotonic() + watch_s
        while time.monotonic() < end:
            a, b = (self.pods.bound_count(label, n) for n in names)
            samples += 1
            both_partial += int(0 < a < GANG and 0 < b < GANG)
            if GANG in (a, b):
                loser_max = max(loser_max, min(a, b))
            time.sleep(0.25)
        a, b = (self.pods.bound_count(label, n) for n in names)
        return {"bound_after_s": [a, b], "samples_both_partial": both_partial, "samples": samples,
                "loser_max_bound": loser_max}

    def s2(self) -> dict:
        """S2: two gangs where one fits; the winner deleted -> the other bound. Peer: plain Jobs."""
        self.schedulable(200)
        try:
            g = self._two(lambda n: self.gang(n, "batch"), "volcano.sh/job-name", ("s2-a", "s2-b"))
            a, b = g.pop("bound_after_s")
            winner, loser = ("s2-a", "s2-b") if a >= b else ("s2-b", "s2-a")
            g["whole_and_pending"] = sorted([a, b]) == [0, GANG]
            t0 = time.monotonic()
            self.delete_gang(winner, wait=False)
            g["handover_s"] = self.pods.wait_bound("volcano.sh/job-name", loser, GANG) - t0
            self.delete_gang(loser)
            self.c.wait_for("s2-a gone", lambda: not self.pods.of("volcano.sh/job-name", winner), timeout_s=300)
            p = self._two(self.plain, "bench", ("s2-plain-a", "s2-plain-b"))
            p["bound_after"] = p.pop("bound_after_s")
            for n in ("s2-plain-a", "s2-plain-b"):
                self.delete_plain(n)
        finally:
            self.schedulable(self.nodes)
        return {"gangs": g, "plain_jobs": p}

    def s3(self, runs: int) -> dict:
        """S3: an urgent 2 x 8-GPU gang while 128-pod batch gangs fill the cluster; no buffer, then
        a 2-node urgent buffer."""
        fill = (self.nodes // GANG - (self.nodes % GANG < 2)) * GANG  # room for 2 buffer nodes
        out: dict = {"schedulable_nodes": fill, "batch_gangs": fill // GANG}
        try:
            for buffer in (2, 0):
                # new names each round: a Volcano job re-created under the name of one whose pods
                # are still being deleted can be left without pods or events (volcano-sh/volcano#5973)
                gangs = [f"s3-batch-b{buffer}-{i}" for i in range(fill // GANG)]
                self.schedulable(fill, buffer)
                for g in gangs:
                    self.gang(g, "batch")
                for g in gangs:
                    self.pods.wait_bound("volcano.sh/job-name", g, GANG, timeout_s=600)
                bound, displaced, idle = [], [], []
                for i in range(runs):
                    before = self.restarts(gangs)
                    name = f"s3-urgent-b{buffer}-{i}"
                    t0 = self.gang(name, "urgent", workers=2)
                    try:
                        bound.append(self.pods.wait_bound("volcano.sh/job-name", name, 2) - t0)
                    except TimeoutError as e:  # recorded with the other round's figures, not lost with them
                        out[f"buffer_{buffer}_error"] = str(e)
                        self.delete_gang(name)
                        break
                    time.sleep(SETTLE_S)
                    idle.append(self.gpus_idle())
                    displaced.append(self.restarts(gangs) - before)
                    self.delete_gang(name)
                    for g in gangs:  # the displaced gang back whole before the next round
                        self.pods.wait_bound("volcano.sh/job-name", g, GANG, timeout_s=600)
                out[f"buffer_{buffer}"] = {"urgent_bound_s": _stats(bound), "batch_gangs_displaced": displaced,
                                           "gpus_idle_after_settling": idle}
                for g in gangs:
                    self.delete_gang(g, wait=False)
                for g in gangs:
                    self.c.wait_for(f"{g} gone", lambda g=g: not self.pods.of("volcano.sh/job-name", g), timeout_s=300)
        finally:
            self.schedulable(self.nodes)
        return out

    def s4(self) -> dict:
        """S4: 100 training workflows at once vs. the same in lane-sized batches by hand."""
        from pipectl.components.contracts import TrainingParameters
        from pipectl.components.names import TEMPLATE_NAME
        from pipectl.pipelines.policy import LANES, Lane
        from pipectl.pipelines.workflows import workflow_for

        limits = {lane.value: spec.concurrency for lane, spec in LANES.items()}
        peak = {"workflows_running": 0, **{f"gangs_{lane}": 0 for lane in limits}}

        def on_wf(w: Watch) -> None:
            running = sum(1 for o in w.items.values() if (o.get("status") or {}).get("phase") == "Running")
            peak["workflows_running"] = max(peak["workflows_running"], running)

        def on_job(w: Watch) -> None:
            for lane in limits:
                n = sum(1 for o in w.items.values() if o["spec"].get("queue") == f"pipectl-{lane}"
                        and ((o.get("status") or {}).get("state") or {}).get("phase") not in ("Completed", "Failed", "Terminated", "Aborted"))
                peak[f"gangs_{lane}"] = max(peak[f"gangs_{lane}"], n)

        wfs = Watch(self.custom.list_namespaced_custom_object, "argoproj.io", "v1alpha1", NS, "workflows", on_event=on_wf)
        jobs = Watch(self.custom.list_namespaced_custom_object, "batch.volcano.sh", "v1alpha1", NS, "jobs", on_event=on_job)

        def submit(lane: str) -> str:
            params = TrainingParameters(lane=lane, workers=2, gpus_per_worker=GPUS, processes_per_worker=GPUS)
            wf = self.custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows",
                                                             workflow_for(TEMPLATE_NAME, NS, params))
            return wf["metadata"]["name"]

        def phase(name: str) -> str | None:
            with wfs.lock:
                return ((wfs.items.get(name) or {}).get("status") or {}).get("phase")

        def wait_all(names: list[str], timeout_s: float) -> None:
            self.c.wait_for(f"{len(names)} workflows ended", lambda: all(
                phase(n) in ("Succeeded", "Failed", "Error") for n in names), timeout_s=timeout_s, interval_s=1)

        order = [lane for group in itertools.zip_longest(*([lane] * n for lane, n in S4_MIX.items())) for lane in group if lane]
        try:
            t0 = time.monotonic()
            burst = [submit(lane) for lane in order]
            wait_all(burst, 1800)
            out = {"at_once_s": time.monotonic() - t0, "peaks_at_once": dict(peak),
                   "phases_at_once": {p: sum(1 for n in burst if phase(n) == p) for p in ("Succeeded", "Failed", "Error")}}
            for k in peak:
                peak[k] = 0
            queues = {lane: [lane] * n for lane, n in S4_MIX.items()}
            t0 = time.monotonic()
            batches = 0
            while any(queues.values()):
                batch = [submit(lane) for lane, q in queues.items() for _ in range(min(limits[lane], len(q)))]
                for lane in queues:
                    del queues[lane][:limits[lane]]
                wait_all(batch, 900)
                batches += 1
            out.update({"by_hand_s": time.monotonic() - t0, "by_hand_batches": batches, "peaks_by_hand": dict(peak),
                        "limits": {"namespace_parallelism": 50, **{f"gangs_{k}": v for k, v in limits.items()}}})
        finally:
            wfs.stop()
            jobs.stop()
        return out


@contextlib.contextmanager
def _closing(b: Bench):
    try:
        yield b
    finally:
        b.pods.w.stop()


def _keep_logs(c, name: str) -> str:
    """Copy the cluster's component logs (vc-scheduler, controllers) out of the temporary run
    directory, for a scenario that failed; returns where."""
    import shutil

    dest = REPO / ".pipectl" / "bench-logs" / name
    shutil.copytree(c.run_dir / "logs", dest, dirs_exist_ok=True)
    return str(dest)


def _cluster(tmp: str, nodes: int):
    from tests.cluster.cluster import TestCluster

    return TestCluster(Path(tmp) / f"k8s-{nodes}", nodes=nodes, verbose=False, start_timeout_s=1200,
                       node_heartbeat_s=heartbeat_s(nodes))


def run() -> dict:
    runs = int(os.environ.get("BENCH_RUNS", "3"))
    sizes = [int(n) for n in _env_list("BENCH_SCHED_NODES", "250,500,1000,2000")]
    only = set(_env_list("BENCH_SCHED_ONLY", "S1,S2,S3,S4,S5"))
    main_size = max([n for n in sizes if n <= 1000] or sizes[:1])
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": _commit(),
                 "heartbeat_s": HEARTBEAT_S, "loadavg_before": os.getloadavg(), "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="pipectl-bench-sched-") as tmp:
        for nodes in sizes if only & {"S1", "S2", "S3", "S5"} else []:
            if nodes != main_size and "S5" not in only:
                continue
            with _cluster(tmp, nodes) as c, _closing(Bench(c, nodes)) as b:
                r = {"heartbeat_s": heartbeat_s(nodes), "bring_up_s": c.startup_s, "apiserver_mib_idle": b.proc_mib("kube-apiserver"),
                     "etcd_mib_idle": b.proc_mib("etcd")}
                print(f"[scheduling] {nodes} nodes up in {c.startup_s:.0f} s", flush=True)
                out["sizes"][str(nodes)] = r
                r["S1"] = b.s1(runs)
                scenarios = {"S2": b.s2, "S3": lambda: b.s3(max(2, runs - 1)), "S1": lambda: b.s1_wait(max(2, runs - 1))}
                for key, scenario in scenarios.items() if nodes == main_size else []:
                    if key in only:
                        try:
                            r[key if key != "S1" else "S1_wait"] = scenario()
                        except (TimeoutError, RuntimeError) as e:  # recorded; the next scenarios still run
                            r[f"{key}_error"] = str(e)
                            r[f"{key}_logs"] = _keep_logs(c, f"{nodes}-{key}")
                        else:
                            if os.environ.get("BENCH_SCHED_KEEP_LOGS") == "1":
                                r[f"{key}_logs"] = _keep_logs(c, f"{nodes}-{key}")
                print(f"[scheduling] {nodes} nodes: {json.dumps(r)}", flush=True)
        if "S4" in only:
            with _cluster(tmp, S4_NODES) as c, _closing(Bench(c, S4_NODES)) as b:
                out["S4"] = {"nodes": S4_NODES, **b.s4()}
                print(f"[scheduling] S4: {json.dumps(out['S4'])}", flush=True)
    out["loadavg_after"] = os.getloadavg()
    return out


def _commit() -> str:
    import subprocess

    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return r.stdout.strip() or "?"


def table(r: dict) -> str:
    lines = [f"Measured {r['date']} at commit {r['commit']}; KWOK nodes x {GPUS} GPUs, node heartbeat "
             f"{r['heartbeat_s']}-{r['heartbeat_s'] * 1.2:.0f} s up to 300 nodes, nodes/10 s above (1,000: 100 s); "
             f"load average before/after "
             f"{r['loadavg_before'][0]:.1f}/{r['loadavg_after'][0]:.1f} on {os.cpu_count()} cores", ""]
    if r["sizes"]:
        lines += ["S1/S5: one 128-pod gang (1,024 GPUs), idle cluster: create -> every pod bound",
                  "| nodes | pipectl gang (Volcano) | peer: plain Job, kube-scheduler | ratio | kube-apiserver MiB (idle / after) "
                  "| etcd MiB (idle / after) | vc-scheduler idle, cores | bring-up |",
                  "|---|---|---|---|---|---|---|---|"]
        for n, s in r["sizes"].items():
            s1 = s["S1"]
            ratio = s1["gang_bound_s"]["median"] / s1["plain_job_bound_s"]["median"]
            lines.append(f"| {int(n):,} | {_fmt(s1['gang_bound_s'])} | {_fmt(s1['plain_job_bound_s'])} | {ratio:.2f}x "
                         f"| {s['apiserver_mib_idle']:.0f} / {s1['apiserver_mib']:.0f} | {s['etcd_mib_idle']:.0f} / {s1['etcd_mib']:.0f} "
                         f"| {s1['vc_scheduler_idle_cores']:.2f} | {s['bring_up_s']:.0f} s |")
        for n, s in r["sizes"].items():
            if "S1_wait" in s:
                w = s["S1_wait"]
                lines += ["", f"S1-wait ({int(n):,} nodes, all but 127 cordoned): pods bound while one node short: "
                          f"{w['bound_while_short']}; a node added -> Ready {_fmt(w['node_ready_s'])}, -> every pod bound "
                          f"{_fmt(w['bound_after_node_s'])}"]
            if "S2" in s:
                g, p = s["S2"]["gangs"], s["S2"]["plain_jobs"]
                lines += ["", f"S2 ({int(n):,} nodes, 200 schedulable): two 128-pod gangs, one fits: one whole and the "
                          f"other Pending whole: {g['whole_and_pending']} (samples with both partly bound: "
                          f"{g['samples_both_partial']} of {g['samples']}); handed over {g['handover_s']:.1f} s after the "
                          f"first was deleted. Peer, two plain Jobs: bound {p['bound_after'][0]} + {p['bound_after'][1]} "
                          f"after 30 s (samples with both partly bound: {p['samples_both_partial']} of {p['samples']})"]
            if "S3" in s:
                s3 = s["S3"]
                lines += ["", f"S3 ({int(n):,} nodes; {s3['batch_gangs']} batch gangs of 128 pods fill "
                          f"{s3['schedulable_nodes']} schedulable nodes): an urgent 2 x 8-GPU gang",
                          "| urgent reserve | create -> bound | batch gangs displaced (per run) | GPUs idle 30 s later (per run) |",
                          "|---|---|---|---|"]
                for b in ("buffer_0", "buffer_2"):
                    if b in s3:
                        x = s3[b]
                        lines.append(f"| {b.split('_')[1]} buffer nodes | {_fmt(x['urgent_bound_s'])} | "
                                     f"{x['batch_gangs_displaced']} | {x['gpus_idle_after_settling']} |")
    if "S4" in r:
        s4 = r["S4"]
        lines += ["", f"S4 ({s4['nodes']} nodes): 100 training workflows ({', '.join(f'{n} {l}' for l, n in S4_MIX.items())})",
                  "| | all ended | most workflows Running at once | most train gangs at once (urgent / standard / batch) |",
                  "|---|---|---|---|"]
        lim = s4["limits"]
        for k, label in (("at_once", "all submitted at once"), ("by_hand", f"by hand, {s4['by_hand_batches']} lane-sized batches")):
            pk = s4[f"peaks_{k}"]
            lines.append(f"| {label} | {s4[f'{k}_s']:.0f} s | {pk['workflows_running']} (limit {lim['namespace_parallelism']}) "
                         f"| {pk['gangs_urgent']} / {pk['gangs_standard']} / {pk['gangs_batch']} "
                         f"(limits {lim['gangs_urgent']} / {lim['gangs_standard']} / {lim['gangs_batch']}) |")
        lines.append(f"ratio at once ÷ by hand: {s4['at_once_s'] / s4['by_hand_s']:.2f}x; phases at once: {s4['phases_at_once']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    r = run()
    print(table(r))
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / "scheduling.json").write_text(json.dumps(r, indent=2))
    (results / "scheduling.md").write_text("### Cluster scheduling at the size of GPU clusters\n\n" + table(r) + "\n")
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
