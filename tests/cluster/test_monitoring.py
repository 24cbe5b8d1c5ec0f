"""Field case C12: the dashboards and alerts query what the controller really exports.

Argo (3.6 and later) serves a workflow's custom metrics under ``argo_workflows_<name>``; a panel that
queries the bare name (``pipectl_step_attempts``) is always empty, and nothing but a real
Prometheus scraping a real controller shows it. Here Debian's Prometheus 2.42
(tests/harness/prometheus.py) scrapes the shared test cluster's workflow-controller and
vc-scheduler every second, with the rendered PrometheusRule loaded as its rule file, while the real
training-v1 template runs once to the end (``pipectl submit --wait``) and once fails in its first
step (exit 1, the code's fault). Then, for what ``pipectl render cluster`` writes:

* every Grafana panel query returns at least one series; one over a counter (``increase``,
  ``rate``) a non-zero one: the run's events are counted (Argo creates a counter's series at its
  first event with value 1, and ``increase()`` alone counted that event as 0);
* every alert's query (the expression without its final threshold) returns at least one series,
  Prometheus evaluates every rule without an error, and the alert that the run provokes (a failed
  workflow) fires in Prometheus itself;
* the bare custom-metric name (the wrong query of C12) returns nothing;
* ``pipectl status`` of the finished run shows the training's step anatomy and verdicts (what the
  train step hands on through evaluate's outputs, as the controller recorded them);
* expressions over exporters this cluster cannot have (DCGM: no GPUs; kube-state-metrics: not
  run) are set aside only when none of their metric names exists in this Prometheus; they are
  proven on recorded series with ``promtool test rules`` (tests/unit/test_monitoring_rules.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.test_control_plane import EXCLUDED_DIRS, KIND_ORDER, TRAINING_STEP_OUTPUTS
from tests.harness.argoexec import TEST_OUTPUTS_CONFIGMAP
from tests.harness.prometheus import (Prometheus, absent_exporter, cluster_targets, metric_names, require_binaries,
                                      panel_queries, rendered, rules, split_threshold)

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
PIPECTL = REPO / ".venv" / "bin" / "pipectl"


def _pipectl(cluster, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run([str(PIPECTL), *args], capture_output=True, text=True, timeout=timeout_s, env=env)


def _last_json(text: str):
    dec, i, last = json.JSONDecoder(), 0, None
    while (j := text.find("{", i)) >= 0:
        last, i = dec.raw_decode(text, j)
    return last


@pytest.fixture(scope="module")
def monitored(test_cluster, tmp_path_factory):
    """(cluster, Prometheus, rule groups, panels): the product rendered now (``pipectl render cluster
    --write``), its manifests applied, Prometheus scraping the cluster with the rendered rules."""
    require_binaries()
    t0 = time.monotonic()
    out = tmp_path_factory.mktemp("c12-render") / "argo"
    r = subprocess.run([str(PIPECTL), "render", "cluster", "--write", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    docs = []
    for f in sorted(out.rglob("*.yaml")):
        if set(f.relative_to(out).parts) & EXCLUDED_DIRS or f.name == "kustomization.yaml":
            continue
        docs.extend(d for d in yaml.safe_load_all(f.read_text()) if d)
    test_cluster.apply(sorted(docs, key=lambda d: KIND_ORDER.get(d["kind"], 99)), field_manager="pipectl-tests")
    from kubernetes import client

    core = client.CoreV1Api(test_cluster.api_client())
    # kube-controller-manager creates the namespace's default ServiceAccount; pods need it
    test_cluster.wait_for("default ServiceAccount in pipectl", lambda: core.read_namespaced_service_account("default", "pipectl"))
    groups, panels = rendered(out)
    with Prometheus(tmp_path_factory.mktemp("c12-prometheus"), cluster_targets(test_cluster), rules=groups) as prom:
        print(f"[timing] C12: render, apply and Prometheus up in {time.monotonic() - t0:.1f}s")
        yield test_cluster, prom, groups, panels


# what the train step hands on through evaluate (a gang on KWOK trains nothing): the last epoch's
# anatomy and a verdict, which `pipectl status` of the finished run must show
STEP_TIME = "data 5%, compute 80%, sync 12%, optimizer 2%, checkpoint 1%; 640 images/s (per rank: 0: 330, 1: 310); GPU memory 2210 MiB (peak 2890 MiB)"
VERDICT = ("starved: 25% of the step waits for data (rule: > 20%); decode on the GPU (DALI mixed), give the workers more CPU "
           "(cpu-per-worker), or warm the cache (warm-cache=true)")
STEP_OUTPUTS = {**TRAINING_STEP_OUTPUTS, "evaluate": {**TRAINING_STEP_OUTPUTS["evaluate"], "training-step-time": STEP_TIME,
                                                      "training-verdicts": json.dumps([VERDICT])}}


def _run_one_good_and_one_bad_pipeline(cluster, k8s_api) -> tuple[str, str]:
    """training-v1 once to Succeeded (``pipectl submit --wait``, a 2-pod gang through Volcano) and
    once to Failed (its first step exits 1: a code failure, not retried). Returns both names."""
    from kubernetes import client

    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    body = {"metadata": {"name": TEST_OUTPUTS_CONFIGMAP}, "data": {k: json.dumps(v) for k, v in STEP_OUTPUTS.items()}}
    try:
        core.create_namespaced_config_map("pipectl", body)
    except client.ApiException as e:
        if e.status != 409:
            raise
        core.replace_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, "pipectl", body)
    try:
        # the failing run first: Argo waits out the step's first retry backoff (5 s) before it
        # evaluates the retry expression that turns a code failure down (operator.go
        # processNodeRetries); the good run runs meanwhile.
        # The same template, every pod told by KWOK to exit 1 ("bad dataset"): validate fails.
        t0 = time.monotonic()
        bad = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", {
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "c12-bad-", "namespace": "pipectl", "labels": {"pipectl.io/lane": "batch"}},
            "spec": {"workflowTemplateRef": {"name": "training-v1"},
                     "arguments": {"parameters": [{"name": "lane", "value": "batch"}]},
                     "podMetadata": {"annotations": {"pipectl.io/fail": "bad dataset", "pipectl.io/exit-code": "1"}}},
        })["metadata"]["name"]
        r = _pipectl(cluster, "submit", "training", "--lane", "standard", "-p", "workers=2", "-p", "gpus-per-worker=1",
                     "-p", "processes-per-worker=1", "--wait", "--output", "json")
        assert r.returncode == 0, r.stdout + r.stderr
        good = _last_json(r.stdout)["name"]
        t_good = time.monotonic() - t0
        deadline = time.monotonic() + 120
        while True:
            wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", bad)
            if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error"):
                break
            assert time.monotonic() < deadline, f"{bad} did not end: {wf.get('status')}"
            time.sleep(0.5)
        assert wf["status"]["phase"] == "Failed", wf["status"]
        print(f"[timing] C12: good run Succeeded after {t_good:.1f}s, bad run Failed after {time.monotonic() - t0:.1f}s")
    finally:
        core.delete_namespaced_config_map(TEST_OUTPUTS_CONFIGMAP, "pipectl")
    return good, bad


def test_C12_every_panel_and_alert_returns_series_from_a_real_controller_and_volcano(monitored, k8s_api):
    """C12, on the real workflow-controller and vc-scheduler: see the module docstring."""
    cluster, prom, groups, panels = monitored
    if not cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {cluster.errors}")
    t0 = time.monotonic()
    try:
        cluster.wait_for("both scrape targets up", lambda: set(prom.targets_up().values()) == {"up"}, timeout_s=30)
    except TimeoutError as e:
        raise AssertionError(f"scrape targets: {prom.targets_up()}") from e
    assert set(prom.targets_up()) == {"workflow-controller", "vc-scheduler"}, prom.targets_up()
    good, _ = _run_one_good_and_one_bad_pipeline(cluster, k8s_api)
    t_run = time.monotonic() - t0
    # the finished run's status shows the training's anatomy and verdicts (evaluate's outputs, as
    # the controller recorded them)
    r = _pipectl(cluster, "status", good)
    lines = [" ".join(line.split()) for line in r.stdout.splitlines() + r.stderr.splitlines()]
    assert r.returncode == 0 and f"training step time (last epoch): {STEP_TIME}" in lines and f"verdict: {VERDICT}" in lines, \
        r.stdout + r.stderr

    live_names = set(prom.api("label/__name__/values"))
    assert any(n.startswith("argo_workflows_pipectl_") for n in live_names), sorted(live_names)
    # the wrong name of field case C12 (the bare custom metric name) would be empty here
    assert not prom.query("pipectl_step_attempts"), "the bare name must not exist (Argo >= 3.6 prefixes it)"

    proven_elsewhere, empty = [], []

    def must_return_series(what: str, expr: str) -> None:
        exporter = absent_exporter(expr)
        if exporter:
            present = metric_names(expr) & live_names
            assert not present, f"{what}: set aside as {exporter}, yet {present} are scraped here: query them"
            proven_elsewhere.append(f"{what} ({exporter})")
            return
        # a counter's increase must show the run's events, not only a 0 (C12: increase() counted
        # the first event of every new series as 0)
        counts_events = "increase(" in expr or "rate(" in expr
        check = f"({expr}) > 0" if counts_events else expr
        try:
            prom.wait_for_series(check, timeout_s=15)
        except TimeoutError:
            names = {n: [s["value"][1] for s in prom.query(n)] for n in metric_names(expr)}
            got = [s["value"][1] for s in prom.query(expr)]
            empty.append(f"{what}: {check!r} returned nothing (the query alone: {got}; its metrics: {names})")

    for title, expr in panel_queries(panels):
        must_return_series(f"panel {title!r}", expr)
    for rule in rules(groups):
        if "record" in rule:
            must_return_series(f"recording rule {rule['record']}", rule["expr"])
            continue
        split = split_threshold(rule["expr"])
        assert split, f"alert {rule['alert']}: expression does not end in a threshold: {rule['expr']!r}"
        must_return_series(f"alert {rule['alert']} (query without its threshold)", split[0])
    assert not empty, "queries that return no series from a real Prometheus:\n" + "\n".join(empty)
    # how training went reaches Prometheus from evaluate's outputs (the gang itself is not Argo's pod)
    supplied = TRAINING_STEP_OUTPUTS["evaluate"]
    for metric, output in (("images_per_second", "training-images-per-s"), ("data_share", "training-data-share")):
        got = prom.query(f'argo_workflows_pipectl_training_{metric}{{model="digits-cnn", lane="standard"}}')
        assert [float(s["value"][1]) for s in got] == [supplied[output]], (metric, got)

    # Prometheus evaluated every rule without an error (a join that matches many-to-many, say, is
    # an error only at evaluation time)
    loaded = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert len(loaded) == len(rules(groups)), loaded
    assert all(r["health"] == "ok" for r in loaded), [(r["name"], r["health"], r.get("lastError")) for r in loaded]

    # the run's failed workflow makes the workflow-failure alert fire in Prometheus itself
    def firing():
        return {a["labels"]["alertname"] for a in prom.api("alerts")["alerts"] if a["state"] == "firing"}
    assert "PipectlWorkflowFailed" in cluster.wait_for("PipectlWorkflowFailed firing", firing, timeout_s=20)
    panel_count, rule_count = len(panel_queries(panels)), len(rules(groups))
    print(f"[timing] C12: pipelines {t_run:.1f}s, all queries {time.monotonic() - t0 - t_run:.1f}s; "
          f"{panel_count} panel queries, {rule_count} rules; proven by promtool instead: {proven_elsewhere}")
    assert len(proven_elsewhere) < panel_count + rule_count  # most are proven live
