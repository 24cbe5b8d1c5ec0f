"""The per-rank step anatomy in a real Prometheus, scraped from a real gang.

Two processes, each a gang pod of its own (its pod name, its node, its metrics port:
tests/tools/rank_metrics_run.py), run the train step's loop (TrainContext, DDP on gloo with the
gradient hooks, a real shard stream) for one epoch with rank 1 slowed by half its step (a straggler),
and keep serving their ``/metrics`` as the train step's endpoint does. Debian's Prometheus
(tests/harness/prometheus.py) scrapes both as the PodMonitor ``pipectl-train`` would (its target
labelled with the pod's namespace, the endpoint's own labels honoured), with the rendered
PrometheusRule as its rule file. Then, for what ``pipectl render cluster`` writes:

* every per-rank dashboard panel returns one row per rank, labelled with the run's workflow, the
  rank, its pod and its node, with the value the rank served (the heatmap's step time, the data
  and sync shares; memory growth 0, as nothing grows after the epoch);
* PipectlTrainingStraggler fires in Prometheus for exactly the ranks whose served ratio is over the
  rule (rank 1, which the train step's own verdict names too), and PipectlTrainingFabricBound does
  not (a straggler explains its gang's sync), nor PipectlTrainingMemoryGrowing (one epoch: no trend).

The cluster test (tests/cluster/test_monitoring.py) sets these series aside: KWOK's pods run no
process. promtool proves the same panels and alerts on recorded series in
tests/unit/test_monitoring_rules.py.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipectl.components.names import METRICS_PORT_ENV, NODE_NAME_ENV, POD_NAME_ENV
from pipectl.components.train.telemetry import STRAGGLER_RATIO
from pipectl.pipelines.backends.processes import free_port
from pipectl.pipelines.manifests import render_files
from pipectl.pipelines.rank_monitoring import rank_panels
from pipectl.pipelines.training import CompileConfig
from tests.harness.prometheus import Prometheus, rendered, require_binaries

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NS = CompileConfig().namespace
SLOWER = 0.5
"""Rank 1 sleeps this share of its own step's time at the end of each step."""


def _line(proc: subprocess.Popen, deadline: float) -> dict:
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                return json.loads(line)
        if proc.poll() is not None:
            break
    raise AssertionError(f"gang member pid {proc.pid} gave no result (exit {proc.poll()})")


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    """The two members' results (rank, port, served values, verdicts), serving until the module ends."""
    folder = tmp_path_factory.mktemp("rank-metrics")
    run = [sys.executable, "-m", "tests.tools.rank_metrics_run"]
    subprocess.run([*run, "prepare", str(folder)], cwd=ROOT, check=True, timeout=120)
    procs = []
    try:
        for rank in (0, 1):
            env = {**os.environ, "OMP_NUM_THREADS": "1", METRICS_PORT_ENV: str(free_port()),
                   POD_NAME_ENV: f"anatomy-worker-{rank}", NODE_NAME_ENV: f"node-{rank}"}
            procs.append(subprocess.Popen([*run, "member", str(folder), str(rank), str(SLOWER)], cwd=ROOT, env=env,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 300
        yield [_line(p, deadline) for p in procs]
    finally:
        for p in procs:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)


def test_per_rank_panels_and_the_straggler_alert_from_a_real_gang_in_a_real_prometheus(gang, tmp_path):
    require_binaries()
    served = {m["rank"]: m for m in gang}
    assert set(served) == {0, 1} and all(m["port"] for m in gang), gang
    out = tmp_path / "argo"
    for rel, text in render_files(CompileConfig()).items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    groups, _ = rendered(out)
    # what the PodMonitor pipectl-train makes of a gang pod: its namespace as a target label, the
    # endpoint's labels (pod, node of the rank) honoured
    jobs = [{"job_name": f"{NS}/pipectl-train", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{m['port']}" for m in gang], "labels": {"namespace": NS}}]}]
    with Prometheus(tmp_path / "prom", jobs, rules=groups) as prom:
        prom.wait_for_series("count(pipectl_training_rank_memory_bytes) == 2", timeout_s=30)
        time.sleep(3)  # a few samples: the memory panel's deriv() needs two

        def value(metric: str, rank: int) -> float:
            return served[rank]["values"][f"{metric}/{rank}"]

        expected = dict(zip(("step_seconds", "data_share", "sync_share", "memory_growth"),
                            [e for _, _, e, _ in rank_panels(NS)]))
        for name, expr in expected.items():
            rows = prom.wait_for_series(expr, timeout_s=15)
            got = {int(r["metric"]["rank"]): r for r in rows}
            assert set(got) == {0, 1}, (name, rows)
            for rank, row in got.items():
                labels = row["metric"]
                assert labels["workflow"] == "anatomy", labels
                if name != "step_seconds":  # the heatmap's rows are workflow and rank
                    assert (labels["pod"], labels["node"]) == (f"anatomy-worker-{rank}", f"node-{rank}"), labels
                want = 0.0 if name == "memory_growth" else value(name, rank)
                assert float(row["value"][1]) == pytest.approx(want, abs=1e-9), (name, rank, row, want)

        stragglers = {r for r in (0, 1) if value("step_ratio", r) >= STRAGGLER_RATIO}
        assert stragglers == {1}, {r: value("step_ratio", r) for r in (0, 1)}
        assert any(v.startswith("straggler: rank 1 on node node-1 (pod anatomy-worker-1)") for v in served[0]["verdicts"]), served[0]

        def firing(alert: str) -> list[dict]:
            return [a["labels"] for a in prom.api("alerts")["alerts"] if a["state"] == "firing" and a["labels"]["alertname"] == alert]

        deadline = time.monotonic() + 20
        while not firing("PipectlTrainingStraggler") and time.monotonic() < deadline:
            time.sleep(0.5)
        (alert,) = firing("PipectlTrainingStraggler")
        assert {k: alert[k] for k in ("namespace", "workflow", "rank", "pod", "node")} == \
            {"namespace": NS, "workflow": "anatomy", "rank": "1", "pod": "anatomy-worker-1", "node": "node-1"}, alert
        assert not firing("PipectlTrainingFabricBound")
        assert [value("memory_growing", r) for r in (0, 1)] == [0.0, 0.0] and not firing("PipectlTrainingMemoryGrowing")
        loaded = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        assert all(r["health"] == "ok" for r in loaded), [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
