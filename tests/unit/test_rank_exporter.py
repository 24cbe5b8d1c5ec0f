"""The gang pods' step anatomy per rank for Prometheus (pipectl.components.train.exporter): what
the endpoint serves, that each pod serves its own ranks only, and that the gang pods, the
PodMonitor and the dashboard agree on the port, the pod labels and the metric names. The panels and
alerts over these series are proven by promtool in tests/unit/test_monitoring_rules.py, and
scraped live from a real gang in tests/integration/test_rank_metrics.py."""

from __future__ import annotations

import socket
import sys
import urllib.request

import pytest

from pipectl.components.names import METRICS_HOST_ENV, METRICS_PORT, METRICS_PORT_ENV, METRICS_PORT_NAME, STEP_LABEL
from pipectl.components.train.exporter import RANK_METRICS, RankExporter, from_env, metric_name, others_ratio
from pipectl.components.train.telemetry import STRAGGLER_RATIO, RankEpoch, stragglers
from pipectl.pipelines.launchers.base import GangConfig, job_labels, pod_template
from pipectl.pipelines.rank_monitoring import pod_monitor, rank_alerts, rank_panels


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(metric, sorted labels) -> value of every sample in an exposition text, read by
    prometheus_client's own parser (what Prometheus reads, whatever the label order)."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _at(workflow: str, rank: int, pod: str, node: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted({"workflow": workflow, "rank": str(rank), "pod": pod, "node": node}.items()))


def _epoch(rank: int, node: str, pod: str, data: float, compute: float, sync: float, own_ms: float, memory_mib: float) -> RankEpoch:
    seconds = {"data": data, "compute": compute, "sync": sync, "optimizer": 0.0, "checkpoint": 0.0}
    return RankEpoch(rank, node, 20, 320, seconds, True, memory_mib=memory_mib, pod=pod, own_median=own_ms / 1000)


GANG = [_epoch(0, "node-a", "w-worker-0", 1.0, 7.0, 2.0, 100, 512.0),
        _epoch(1, "node-a", "w-worker-0", 1.0, 8.0, 1.0, 100, 520.0),
        _epoch(2, "node-b", "w-worker-1", 3.0, 6.5, 0.5, 130, 600.0)]


def test_a_pod_serves_its_own_ranks_with_workflow_rank_pod_and_node():
    exporter = RankExporter("train-x7", "node-a", "w-worker-0")
    exporter.epoch(GANG)
    text = exporter.text()
    got = _samples(text)
    assert got[(metric_name("data_share"), _at("train-x7", 0, "w-worker-0", "node-a"))] == pytest.approx(0.1)
    assert got[(metric_name("sync_share"), _at("train-x7", 1, "w-worker-0", "node-a"))] == pytest.approx(0.1)
    assert got[(metric_name("step_seconds"), _at("train-x7", 0, "w-worker-0", "node-a"))] == pytest.approx(0.1)
    assert got[(metric_name("memory_bytes"), _at("train-x7", 1, "w-worker-0", "node-a"))] == 520.0 * 2**20
    assert 'rank="2"' not in text  # rank 2 is the other pod's
    for short, help_ in RANK_METRICS.items():
        assert f"# HELP {metric_name(short)} {help_}\n# TYPE {metric_name(short)} gauge\n" in text
    other = RankExporter("train-x7", "node-b", "w-worker-1")
    other.epoch(GANG)
    assert {rank for (_, rank) in other.values} == {2}
    assert other.values[("data_share", 2)] == pytest.approx(0.3) and other.values[("sync_share", 2)] == pytest.approx(0.05)


def test_the_step_ratio_is_the_straggler_rules_own():
    """Each rank's own step over the median of the OTHER ranks' (a rank at 1.3x a gang of two is 1.3,
    not 1.3 / 1.15): the exported ratio crosses STRAGGLER_RATIO exactly where the verdict fires."""
    for own in ([0.100, 0.130], [0.100, 0.100, 0.130], [0.1, 0.1, 0.1, 0.119], [0.1, 0.1, 0.1, 0.12], [0.2]):
        ratios = others_ratio(own)
        named = {int(v.split()[2]) for v in stragglers(own, [f"rank {i} on node n" for i in range(len(own))], "over the epoch")}
        assert {i for i, r in enumerate(ratios) if r >= STRAGGLER_RATIO} == named, (own, ratios)
    exporter = RankExporter("w", "node-b", "w-worker-1")
    exporter.epoch(GANG)
    assert exporter.values[("step_ratio", 2)] == pytest.approx(1.3)
    exporter.window([0.1, 0.1, 0.25], [("node-a", "w-worker-0"), ("node-a", "w-worker-0"), ("node-b", "w-worker-1")])
    assert exporter.values[("step_ratio", 2)] == pytest.approx(2.5) and exporter.values[("step_seconds", 2)] == 0.25


def test_a_pod_serves_the_leak_verdict_of_its_ranks_by_the_train_steps_rule():
    """``memory_growing`` is 1 exactly when telemetry.growing_memory names the rank: memory up at each
    of the last 4 epoch ends by >= 64 MiB and 10% in all; not after 4 epochs, not when it settles."""
    import dataclasses

    exporter = RankExporter("w", "node-b", "w-worker-1")
    growing = [dataclasses.replace(GANG[2], memory_mib=600.0 + 40 * e) for e in range(6)]
    seen = []
    for epoch in growing:
        exporter.epoch([GANG[0], GANG[1], epoch])
        seen.append(exporter.values[("memory_growing", 2)])
    assert seen == [0.0, 0.0, 0.0, 0.0, 1.0, 1.0]  # named at the 5th epoch end: 4 growths of 40 MiB (160 >= 64 and 10%)
    assert ("memory_growing", 0) not in exporter.values  # another pod's rank
    exporter.epoch([GANG[0], GANG[1], dataclasses.replace(GANG[2], memory_mib=800.0)])
    assert exporter.values[("memory_growing", 2)] == 0.0  # settled: no longer every epoch
    slow = RankExporter("w", "node-b", "w-worker-1")
    for e in range(6):
        slow.epoch([dataclasses.replace(GANG[2], memory_mib=600.0 + 10 * e)])  # 40 MiB in 4 epochs: under 64
    assert slow.values[("memory_growing", 2)] == 0.0


def test_label_values_are_escaped():
    exporter = RankExporter('w"x\\y', "n\nm", "p")
    exporter.set("data_share", 0, 0.5)
    assert 'workflow="w\\"x\\\\y"' in exporter.text() and 'node="n\\nm"' in exporter.text()
    assert _samples(exporter.text()) == {(metric_name("data_share"), _at('w"x\\y', 0, "p", "n\nm")): 0.5}
    exporter.set("step_seconds", 0, float("nan"))
    exporter.set("step_ratio", 0, float("inf"))
    assert "} NaN\n" in exporter.text() and "} +Inf\n" in exporter.text()  # the exposition format's spelling, not Python's


def test_the_endpoint_serves_the_gauges_at_metrics():
    exporter = RankExporter("w", "n", "p")
    exporter.set("step_seconds", 0, 0.25)
    port = exporter.serve(0, "127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:  # noqa: S310 - loopback
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            got = _samples(r.read().decode())
        # only this pod's gauges: a registry of its own, not the Python runtime's default metrics
        assert got == {(metric_name("step_seconds"), _at("w", 0, "p", "n")): 0.25}
    finally:
        exporter.close()


def test_only_a_pods_first_process_serves_and_a_busy_port_never_stops_training(caplog):
    assert from_env("w", "n", "p", {}) is None  # not asked for (a team's own code, a plain torchrun)
    assert from_env("w", "n", "p", {METRICS_PORT_ENV: "0", "LOCAL_RANK": "1"}) is None
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert from_env("w", "n", "p", {METRICS_PORT_ENV: str(port), "LOCAL_RANK": "0"}) is None
    assert f"cannot serve on port {port}" in caplog.text
    caplog.clear()
    with pytest.MonkeyPatch.context() as mp:  # an image without prometheus-client: a warning, training goes on
        mp.setitem(sys.modules, "prometheus_client", None)
        assert from_env("w", "n", "p", {METRICS_PORT_ENV: "0"}) is None
    assert "install prometheus-client in the training image" in caplog.text
    served = from_env("w", "n", "p", {METRICS_PORT_ENV: "0"})
    try:
        assert served is not None and served._server is not None
        assert served._server.server_address[0] in ("", "0.0.0.0")  # a pod: every interface, for Prometheus
    finally:
        served.close()
    local = from_env("w", "n", "p", {METRICS_PORT_ENV: "0", METRICS_HOST_ENV: "127.0.0.1"})
    try:
        assert local is not None and local._server.server_address[0] == "127.0.0.1"
    finally:
        local.close()


def _container(entry: tuple[str, ...] = ()) -> dict:
    return pod_template(GangConfig(image="img", service_account="sa", shm_gib=1, entry=entry), "0", [])["spec"]["containers"][0]


def test_gang_pods_pod_monitor_and_dashboard_agree():
    """The gang pod carries the label the PodMonitor selects and the port it names, with the env
    that turns the endpoint on; a team's own torchrun code (which serves nothing) gets neither."""
    c = _container()
    monitor = pod_monitor("pipectl")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= job_labels().items()
    assert monitor["spec"]["selector"]["matchLabels"] == {STEP_LABEL: "train"}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == METRICS_PORT_NAME and endpoint["honorLabels"] is True
    assert {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT} in c["ports"]
    assert {"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)} in c["env"]
    own = _container(("-m", "team.train"))
    assert METRICS_PORT_NAME not in {p["name"] for p in own["ports"]} and METRICS_PORT_ENV not in {e["name"] for e in own["env"]}
    served = {metric_name(m) for m in RANK_METRICS}
    queried = " ".join(e for _, _, e, _ in rank_panels("pipectl")) + " ".join(a["expr"] for a in rank_alerts("pipectl"))
    assert {m for m in served if m in queried} == served, "a served metric no panel or alert shows"


def test_locally_each_gang_pod_serves_on_a_port_of_its_own(tmp_path):
    """``pipectl run`` runs every pod of the gang on this one machine: the pods' metrics port (one
    number in the manifest) becomes a free port per pod, as the rendezvous port does, so each
    pod's first process can serve."""
    import json

    from pipectl.pipelines.backends.runner import LocalRunner
    from tests.unit.test_local_backend import _wf

    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "{{workflow.name}}-j"},
           "spec": {"minAvailable": 3, "tasks": [{"name": "worker", "replicas": 3, "template": {"spec": {"containers": [{
               "name": "c", "env": [{"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)}],
               "command": ["python", "-c", "import os,sys; open(sys.argv[1] + '/pod-' + os.environ['VC_TASK_INDEX'], 'w')"
                           f".write(os.environ['{METRICS_PORT_ENV}'] + ' ' + os.environ['{METRICS_HOST_ENV}'])", str(tmp_path)]}]}}}]}}
    tmpl = {"name": "gang", "resource": {"action": "create", "manifest": json.dumps(job)}}
    result = LocalRunner(_wf([{"name": "g", "template": "gang"}], [tmpl]), {}, {}, tmp_path / "runs").run()
    assert result.phase == "Succeeded", result.node("g").log_path.read_text()
    ports, hosts = zip(*((tmp_path / f"pod-{i}").read_text().split() for i in range(3)))
    assert len(set(ports)) == 3 and all(p.isdigit() and int(p) > 0 for p in ports), ports
    assert set(hosts) == {"127.0.0.1"}, "a local run serves its metrics to this machine only"
