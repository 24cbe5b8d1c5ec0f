"""Field case C12: the rendered alerts and dashboard panels, proven by Prometheus's own ``promtool``
(Debian's ``prometheus`` 2.42; scripts/system-deps.sh group ``ui``) on recorded series.

What the test cluster cannot have is proven here: dcgm-exporter's GPU series (no GPUs) and
kube-state-metrics' pod series (not run). The series are written in each exporter's own names and
labels (dcgm-exporter: etc/default-counters.csv; ``gpu``, ``UUID``, ``device``, ``modelName``,
``Hostname``, and ``pod``/``namespace``/``container`` for a GPU a container holds; kube-state-metrics:
``kube_pod_status_phase{namespace,pod,uid,phase}``, ``kube_pod_labels{namespace,pod,uid,label_*}``,
``kube_pod_info{...,priority_class}``). Each alert fires on the bad case and stays silent on a
healthy one; a GPU using 95 % of its memory is healthy (PyTorch's caching allocator holds that much).
Argo's counters are proven live in tests/cluster/test_monitoring.py; the case of a counter series
born with value 1 (C12's silent first failure) is also recorded here.

Without promtool these tests skip (fail under PIPECTL_REQUIRE_CLUSTER=1, as ``make test`` sets).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipectl.pipelines.manifests import render_files
from pipectl.pipelines.training import CompileConfig
from tests.harness.prometheus import (absent_exporter, metric_names, require_binaries, panel_queries, promtool, rendered,
                                      rules, split_threshold, write_rule_file)

NS = CompileConfig().namespace


@pytest.fixture(scope="module")
def product(tmp_path_factory) -> tuple[Path, list[dict], list[dict]]:
    """(folder, rule groups, panels): ``argo/`` as ``pipectl render cluster --write`` writes it, the
    rule file for promtool in the folder."""
    require_binaries()
    out = tmp_path_factory.mktemp("c12-unit")
    for rel, text in render_files(CompileConfig()).items():
        (out / "argo" / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / "argo" / rel).write_text(text)
    groups, panels = rendered(out / "argo")
    write_rule_file(groups, out / "rules.yaml")
    return out, groups, panels


def _promtool_test(folder: Path, tests: list[dict], name: str = "tests.yaml") -> None:
    (folder / name).write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                               "tests": tests}, sort_keys=False))
    r = promtool("test", "rules", name, cwd=folder)
    assert r.returncode == 0, r.stdout + r.stderr


def _series(name: str, labels: dict[str, str], values: str) -> dict:
    body = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{body}}}", "values": values}


# dcgm-exporter's labels for one GPU held by a container (pod mapping on), and for one no pod holds
def _gpu(i: int, pod: str | None, namespace: str = NS) -> dict[str, str]:
    labels = {"gpu": str(i), "UUID": f"GPU-0000000{i}-aaaa-bbbb-cccc-ddddeeeeffff", "device": f"nvidia{i}",
              "modelName": "NVIDIA H200", "Hostname": "gpu-node-a"}
    if pod:
        labels |= {"namespace": namespace, "pod": pod, "container": "main"}
    return labels


HEALTHY, IDLE, OTHER_TEAM_IDLE, FREE_GPU = _gpu(0, "tr-abc-train-0-x-worker-0"), _gpu(1, "tr-abc-train-0-x-worker-1"), \
    _gpu(2, "notebook-7", namespace="research"), _gpu(3, None)


def test_C12_promtool_checks_the_rendered_rules(product):
    folder, groups, _ = product
    r = promtool("check", "rules", "rules.yaml", cwd=folder)
    assert r.returncode == 0 and f"SUCCESS: {len(rules(groups))} rules found" in r.stdout, r.stdout + r.stderr


def test_C12_every_alert_ends_in_a_threshold_and_no_gpu_memory_alert(product):
    """The cluster test runs each alert's query without its threshold; and memory use is no alarm."""
    _, groups, _ = product
    for rule in rules(groups):
        assert "record" in rule or split_threshold(rule["expr"]), rule
        assert "DCGM_FI_DEV_FB_" not in rule["expr"], f"{rule.get('alert')}: high GPU memory is normal for PyTorch"


def test_C12_gpu_alerts_fire_on_trouble_and_stay_silent_on_a_healthy_gpu_at_95_percent_memory(product):
    folder, _, _ = product
    fb_total_mib = 143_771  # an H200's framebuffer
    series = [
        # healthy training GPU: busy, 95 % of its memory used, no XID, no remap trouble; 2 rows remapped
        # long ago (a counter that does not grow is history, not an alert)
        _series("DCGM_FI_DEV_GPU_UTIL", HEALTHY, "93x40"),
        _series("DCGM_FI_DEV_FB_USED", HEALTHY, f"{int(fb_total_mib * 0.95)}x40"),
        _series("DCGM_FI_DEV_FB_FREE", HEALTHY, f"{fb_total_mib - int(fb_total_mib * 0.95)}x40"),
        _series("DCGM_FI_DEV_XID_ERRORS", HEALTHY, "0x40"),
        _series("DCGM_FI_DEV_ROW_REMAP_FAILURE", HEALTHY, "0x40"),
        _series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", HEALTHY, "2x40"),
        # a training GPU that never works (dead data loader, hang before the first step), then XID 79
        # (fallen off the bus) at 30 min, a failed row remap at 32 min, an uncorrectable error at 34
        _series("DCGM_FI_DEV_GPU_UTIL", IDLE, "0x40"),
        _series("DCGM_FI_DEV_XID_ERRORS", IDLE, "0x29 79x10"),
        _series("DCGM_FI_DEV_ROW_REMAP_FAILURE", IDLE, "0x31 1x8"),
        _series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", IDLE, "0x33 1x6"),
        # idle GPUs that are not a pipectl training pod's: another namespace's, and one no pod holds
        _series("DCGM_FI_DEV_GPU_UTIL", OTHER_TEAM_IDLE, "0x40"),
        _series("DCGM_FI_DEV_GPU_UTIL", FREE_GPU, "0x40"),
    ]
    idle_summary = (f"GPU 1 of pod {IDLE['pod']} on gpu-node-a below 5% utilisation for 10 minutes: "
                    "data starvation or a hang")
    alerts = [
        # avg_over_time < 5 from the first sample, then `for: 10m`
        {"eval_time": "9m", "alertname": "PipectlTrainingGPUIdle", "exp_alerts": []},
        {"eval_time": "25m", "alertname": "PipectlTrainingGPUIdle",
         "exp_alerts": [{"exp_labels": {**IDLE, "severity": "warning"}, "exp_annotations": {"summary": idle_summary}}]},
        {"eval_time": "29m", "alertname": "PipectlGPUXidError", "exp_alerts": []},
        {"eval_time": "31m", "alertname": "PipectlGPUXidError", "exp_alerts": [{
            "exp_labels": {**IDLE, "severity": "critical"},
            "exp_annotations": {"summary": f"GPU 1 on gpu-node-a reported XID 79 (pod {IDLE['pod']}): a driver-reported "
                                           "GPU fault, see NVIDIA's XID catalogue"}}]},
        {"eval_time": "31m", "alertname": "PipectlGPURowRemapFailure", "exp_alerts": []},
        {"eval_time": "33m", "alertname": "PipectlGPURowRemapFailure", "exp_alerts": [{
            "exp_labels": {**IDLE, "severity": "critical"},
            "exp_annotations": {"summary": "GPU 1 on gpu-node-a can no longer remap failing memory rows: drain the node "
                                           "and replace the GPU"}}]},
        {"eval_time": "33m", "alertname": "PipectlGPUUncorrectableMemoryError", "exp_alerts": []},
        {"eval_time": "36m", "alertname": "PipectlGPUUncorrectableMemoryError", "exp_alerts": [{
            "exp_labels": {**IDLE, "severity": "critical"},
            "exp_annotations": {"summary": "GPU 1 on gpu-node-a had an uncorrectable memory error (rows remapped): "
                                           "drain the node and reset the GPU"}}]},
    ]
    # the healthy GPU (95 % memory) and the idle GPUs of others fire nothing, at any time
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}])
    healthy_only = [s for s in series if f'pod="{HEALTHY["pod"]}"' in s["series"] or "research" in s["series"]
                    or 'pod="' not in s["series"]]
    quiet = [{"eval_time": t, "alertname": a, "exp_alerts": []}
             for t in ("15m", "25m", "39m") for a in ("PipectlTrainingGPUIdle", "PipectlGPUXidError",
                                                      "PipectlGPURowRemapFailure", "PipectlGPUUncorrectableMemoryError")]
    _promtool_test(folder, [{"interval": "1m", "input_series": healthy_only, "alert_rule_test": quiet}], "quiet.yaml")


def test_C12_training_pending_too_long_joins_kube_state_metrics_on_namespace_and_pod(product):
    folder, _, _ = product
    pending_s = CompileConfig().retry.scale_up_s
    train = {"namespace": NS, "pod": "tr-abc-train-0-x-worker-0", "uid": "u1"}
    pre = {"namespace": NS, "pod": "tr-abc-preprocess-1", "uid": "u2"}
    same_name_elsewhere = {"namespace": "research", "pod": "tr-abc-preprocess-1", "uid": "u3"}
    series = [
        _series("kube_pod_status_phase", {**train, "phase": "Pending"}, "1x30"),
        _series("kube_pod_status_phase", {**pre, "phase": "Pending"}, "1x30"),
        _series("kube_pod_labels", {**train, "label_pipectl_io_step": "train"}, "1x30"),
        _series("kube_pod_labels", {**pre, "label_pipectl_io_step": "preprocess"}, "1x30"),
        # a train-labelled pod of the same name in another namespace must not make `pre` match
        _series("kube_pod_labels", {**same_name_elsewhere, "label_pipectl_io_step": "train"}, "1x30"),
    ]
    before, after = f"{pending_s // 60 - 1}m", f"{pending_s // 60 + 2}m"
    alerts = [
        {"eval_time": before, "alertname": "PipectlTrainingPendingTooLong", "exp_alerts": []},
        {"eval_time": after, "alertname": "PipectlTrainingPendingTooLong", "exp_alerts": [{
            "exp_labels": {"namespace": NS, "pod": train["pod"], "severity": "critical"},
            "exp_annotations": {"summary": f"training pod {train['pod']} Pending longer than the scale-up budget ({pending_s} s)"}}]},
    ]
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}])


def test_C12_workflow_failed_fires_on_the_first_failure_whose_counter_series_is_born_at_1(product):
    """What the real controller does (seen in tests/cluster/test_monitoring.py): the series
    ``argo_workflows_total_count{phase="Failed"}`` appears at the first failed workflow, with value 1.
    ``increase()`` alone counts that as 0 and the alert never fired on it."""
    folder, groups, _ = product
    failed = {"namespace": NS, "phase": "Failed", "instance": "c:9090", "job": "workflow-controller"}
    series = [_series("argo_workflows_total_count", failed, "_x5 1x20 2x15"),
              _series("argo_workflows_total_count", {**failed, "phase": "Succeeded"}, "3x40")]
    summary = "{v} pipectl workflow(s) ended Failed in the last 10 minutes"
    fired = {"namespace": NS, "phase": "Failed", "severity": "warning"}
    alerts = [
        {"eval_time": "4m", "alertname": "PipectlWorkflowFailed", "exp_alerts": []},
        {"eval_time": "7m", "alertname": "PipectlWorkflowFailed",
         "exp_alerts": [{"exp_labels": fired, "exp_annotations": {"summary": summary.format(v=1)}}]},
        {"eval_time": "20m", "alertname": "PipectlWorkflowFailed", "exp_alerts": []},  # > 10 min ago
        {"eval_time": "27m", "alertname": "PipectlWorkflowFailed",  # the second failure, on an old series
         "exp_alerts": [{"exp_labels": fired, "exp_annotations": {"summary": summary.format(v=1)}}]},
    ]
    old_expr = f'increase(argo_workflows_total_count{{phase="Failed", namespace="{NS}"}}[10m]) > 0'
    exprs = [{"expr": old_expr, "eval_time": "7m", "exp_samples": []}]  # the expression before C12: silent
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "alert_rule_test": alerts,
                             "promql_expr_test": exprs}])


def test_C12_panels_over_absent_exporters_return_what_they_promise(product):
    """Every panel the test cluster cannot feed (DCGM, kube-state-metrics) is evaluated by promtool on
    recorded series; the counter panels, too, for series born inside the window."""
    folder, _, panels = product
    by_title = {title.split(" / ")[0]: expr for title, expr in panel_queries(panels)}
    busy = _gpu(0, "tr-abc-train-0-x-worker-0")
    series = [
        _series("DCGM_FI_DEV_GPU_UTIL", busy, "90x20"),
        _series("DCGM_FI_DEV_GPU_UTIL", FREE_GPU, "0x20"),
        _series("kube_pod_status_phase", {"namespace": NS, "pod": "p1", "uid": "u1", "phase": "Pending"}, "1x20"),
        _series("kube_pod_status_phase", {"namespace": NS, "pod": "p2", "uid": "u2", "phase": "Pending"}, "0x20"),
        _series("kube_pod_info", {"namespace": NS, "pod": "p1", "uid": "u1", "node": "", "priority_class": "pipectl-urgent",
                                  "created_by_kind": "Workflow", "created_by_name": "w"}, "1x20"),
        _series("kube_pod_info", {"namespace": NS, "pod": "p2", "uid": "u2", "node": "n", "priority_class": "pipectl-batch",
                                  "created_by_kind": "Workflow", "created_by_name": "w"}, "1x20"),
        _series("argo_workflows_pipectl_step_attempts",
                {"step": "stage", "class": "infrastructure", "status": "Error", "lane": "batch"}, "_x10 1x10"),
        _series("argo_workflows_pipectl_step_failures_by_exit_code", {"step": "stage", "exit_code": "75"}, "_x10 1x10"),
        # a training pod whose GPU memory climbs 20 MiB a minute (a leak), and one that settled
        _series("DCGM_FI_DEV_FB_USED", IDLE, "40000+20x40"),
        _series("DCGM_FI_DEV_FB_USED", busy, "70000x40"),
    ]
    expected = {
        "GPU utilisation of the namespace's pods (%)": [{"labels": f'{{pod="{busy["pod"]}"}}', "value": 90}],
        "Pods waiting per lane (Pending, by PriorityClass)": [{"labels": '{priority_class="pipectl-urgent"}', "value": 1},
                                                              {"labels": '{priority_class="pipectl-batch"}', "value": 0}],
        "Attempts that did not succeed, by class (1h): infrastructure (Error: pod lost), failed":
            [{"labels": '{class="infrastructure", step="stage"}', "value": 1}],
        "Failed attempts by exit code (1h): 75 = declared transient, other = code":
            [{"labels": '{exit_code="75", step="stage"}', "value": 1}],
        "GPU memory growth of the namespace's pods (MiB per hour over 30 minutes; a steady climb: likely a leak)":
            [{"labels": f'{{pod="{IDLE["pod"]}"}}', "value": 1200}, {"labels": f'{{pod="{busy["pod"]}"}}', "value": 0}],
    }
    absent = {t for t, e in by_title.items() if absent_exporter(e)}
    proven = set(expected) | set(_rank_panels())  # the gang pods' panels: test_rank_panels_...
    assert absent <= proven, f"panels over exporters the test cluster lacks, not proven here: {absent - proven}"
    exprs = [{"expr": by_title[t], "eval_time": "15m", "exp_samples": s} for t, s in expected.items()]
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}])


def test_C12_every_alert_over_an_absent_exporter_has_a_promtool_case(product):
    """The cluster test sets these aside; this file must prove each of them."""
    _, groups, _ = product
    source = Path(__file__).read_text()
    absent = [r["alert"] for r in rules(groups) if "alert" in r and absent_exporter(r["expr"])]
    assert absent and all(f'"alertname": "{a}"' in source for a in absent), absent


DCGM_DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}
"""The series dcgm-exporter serves without a custom counters file (its etc/default-counters.csv, the
lines not commented out): a panel or alert over any other DCGM field would stay empty on a default install."""
ARGO_BUILTIN = {"argo_workflows_total_count"}
"""Argo's own controller metrics the product queries (the controller serves them on every install)."""


def test_every_panel_and_alert_names_a_metric_the_product_or_its_exporters_emit(product):
    """Each metric a panel or an alert names: a custom metric the rendered WorkflowTemplate defines
    (under Argo's prefix), Argo's own, one of dcgm-exporter's default counters, one the gang pods
    serve (pipectl.components.train.exporter), or kube-state-metrics' or Volcano's (the live
    cluster test scrapes the last). A misspelt or never-defined name fails here."""
    from pipectl.components.train.exporter import PREFIX as RANK_PREFIX
    from pipectl.components.train.exporter import RANK_METRICS, metric_name
    from pipectl.pipelines.policy import exported

    RANK_SERVED = {metric_name(m) for m in RANK_METRICS}
    folder, groups, panels = product
    templates = [d for f in (folder / "argo").rglob("*.yaml") for d in yaml.safe_load_all(f.read_text())
                 if d and d.get("kind") == "WorkflowTemplate"]

    def custom(node) -> set[str]:
        if isinstance(node, dict):
            found = {exported(m["name"]) for m in (node.get("metrics") or {}).get("prometheus", [])}
            return found.union(*(custom(v) for v in node.values()))
        return set().union(*(custom(v) for v in node)) if isinstance(node, list) else set()

    defined = set().union(*(custom(t) for t in templates)) | ARGO_BUILTIN
    assert exported("pipectl_training_sync_share") in defined and exported("pipectl_step_attempts") in defined, sorted(defined)
    queries = panel_queries(panels) + [(r.get("alert") or r["record"], r["expr"]) for r in rules(groups)]
    for what, expr in queries:
        for name in metric_names(expr):
            if name.startswith("argo_workflows_"):
                assert name in defined, f"{what}: {name} is no metric the rendered templates define"
            elif name.startswith("DCGM_"):
                assert name in DCGM_DEFAULT_COUNTERS, f"{what}: {name} is not among dcgm-exporter's default counters"
            elif name.startswith(RANK_PREFIX):
                assert name in RANK_SERVED, f"{what}: {name} is not served by the gang pods' endpoint"


# -- the gang pods' own figures per rank (pipectl.components.train.exporter), scraped through the
# PodMonitor pipectl-train: the labels the endpoint serves (workflow, rank, pod, node; honorLabels)
# and the ones prometheus-operator adds to a pod target (namespace, container, endpoint, job, instance)

def _rank(workflow: str, rank: int, node: str, namespace: str = NS) -> dict[str, str]:
    pod = f"{workflow}-train-0-x-worker-{rank}"
    return {"workflow": workflow, "rank": str(rank), "pod": pod, "node": node, "namespace": namespace,
            "container": "pytorch", "endpoint": "metrics", "job": f"{namespace}/pipectl-train", "instance": f"10.0.0.{rank}:9464"}


def _gang(workflow: str, ranks: list[tuple[str, float, float, float]], namespace: str = NS) -> list[dict]:
    """Series of one gang: per rank (node, step ratio, sync share, data share), 40 minutes."""
    out = []
    for i, (node, ratio, sync, data) in enumerate(ranks):
        labels = _rank(workflow, i, node, namespace)
        out += [_series("pipectl_training_rank_step_ratio", labels, f"{ratio}x40"),
                _series("pipectl_training_rank_sync_share", labels, f"{sync}x40"),
                _series("pipectl_training_rank_data_share", labels, f"{data}x40")]
    return out


# across two nodes, 23% sync: fabric-bound; 35%: and adding nodes will not pay; one node at 40%: no
# fabric verdict (the sync crosses no fabric); a straggler (rank 2 at 1.3x) explains its gang's
# 22% sync: named, and no fabric verdict; a healthy gang: nothing
FABRIC = _gang("tr-fabric", [("node-a", 1.0, 0.22, 0.05), ("node-b", 1.02, 0.24, 0.05)])
NO_SCALE = _gang("tr-noscale", [("node-a", 1.0, 0.35, 0.02), ("node-b", 1.0, 0.35, 0.02)])
ONE_NODE = _gang("tr-onenode", [("node-c", 1.0, 0.40, 0.02), ("node-c", 1.0, 0.40, 0.02)])
STRAGGLER = _gang("tr-straggler", [("node-a", 0.95, 0.30, 0.05), ("node-b", 1.0, 0.30, 0.05), ("node-d", 1.3, 0.05, 0.05)])
HEALTHY_GANG = _gang("tr-healthy", [("node-e", 1.0, 0.10, 0.03), ("node-f", 1.19, 0.12, 0.25)])
OTHER_TEAM = _gang("tr-other", [("node-g", 1.5, 0.5, 0.5), ("node-h", 1.0, 0.5, 0.5)], namespace="research")


def test_rank_alerts_fire_at_the_train_steps_rules_and_name_rank_pod_and_node(product):
    """PipectlTrainingStraggler, PipectlTrainingFabricBound and PipectlTrainingMemoryGrowing on what
    the gang pods serve: the thresholds are the train step's (telemetry.STRAGGLER_RATIO,
    FABRIC_SHARE, NO_SCALE_SHARE; the leak rule served as its verdict), a straggler's and a leak's
    alert carry the rank, its pod and node, the fabric verdict needs two nodes and no straggler, and
    another namespace's gangs are not this namespace's alerts."""
    folder, _, _ = product
    series = FABRIC + NO_SCALE + ONE_NODE + STRAGGLER + HEALTHY_GANG + OTHER_TEAM
    straggler = {k: v for k, v in _rank("tr-straggler", 2, "node-d").items() if k in ("namespace", "workflow", "rank", "pod", "node")}
    fabric = ("fabric-bound: {w} waits for gradient sync {p} of its step (rule: > 15%; > 30%: more nodes will not pay); "
              "{then}check InfiniBand/RoCE and NCCL_IB_DISABLE / NCCL_SOCKET_IFNAME")
    alerts = [
        {"eval_time": "5m", "alertname": "PipectlTrainingStraggler", "exp_alerts": [{
            "exp_labels": {**straggler, "severity": "warning"},
            "exp_annotations": {"summary": f"straggler: rank 2 of tr-straggler on node node-d (pod {straggler['pod']}) takes "
                                           "1.3x the other ranks' median step time (rule: >= 1.2x over >= 20 steps); every "
                                           "other rank waits for it at each all-reduce: check that node (GPU clocks, thermal, "
                                           "noisy neighbours) or its shards"}}]},
        {"eval_time": "5m", "alertname": "PipectlTrainingFabricBound", "exp_alerts": [
            {"exp_labels": {"namespace": NS, "workflow": "tr-fabric", "severity": "warning"},
             "exp_annotations": {"summary": fabric.format(w="tr-fabric", p="23%", then="")}},
            {"exp_labels": {"namespace": NS, "workflow": "tr-noscale", "severity": "warning"},
             "exp_annotations": {"summary": fabric.format(w="tr-noscale", p="35%", then="adding nodes will not pay: ")}}]},
    ]
    # a rank whose pod says its memory grew at each of its last epochs (from 10 min on), one whose did not
    leaking, settled = _rank("tr-fabric", 1, "node-b"), _rank("tr-fabric", 0, "node-a")
    series += [_series("pipectl_training_rank_memory_growing", leaking, "0x10 1x30"),
               _series("pipectl_training_rank_memory_growing", settled, "0x40")]
    where = {k: leaking[k] for k in ("namespace", "workflow", "rank", "pod", "node")}
    alerts += [
        {"eval_time": "9m", "alertname": "PipectlTrainingMemoryGrowing", "exp_alerts": []},
        {"eval_time": "12m", "alertname": "PipectlTrainingMemoryGrowing", "exp_alerts": [{
            "exp_labels": {**where, "severity": "warning"},
            "exp_annotations": {"summary": f"memory growing: rank 1 of tr-fabric on node node-b (pod {leaking['pod']}): its "
                                           "memory grew at each of its last 4 epochs (rule: every epoch, >= 64 MiB and 10% "
                                           "in all): likely a leak (tensors kept across steps: a loss appended without "
                                           ".item(), a list that grows); it ends in an out-of-memory kill"}}]},
    ]
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}], "rank-alerts.yaml")
    # the healthy gang alone (a rank at 1.19x, a data share of 25%: not these alerts), at any time
    quiet = [{"eval_time": t, "alertname": a, "exp_alerts": []}
             for t in ("1m", "20m", "39m") for a in ("PipectlTrainingStraggler", "PipectlTrainingFabricBound",
                                                      "PipectlTrainingMemoryGrowing")]
    _promtool_test(folder, [{"interval": "1m", "input_series": HEALTHY_GANG + ONE_NODE, "alert_rule_test": quiet}],
                   "rank-quiet.yaml")


def _rank_panels() -> dict[str, str]:
    from pipectl.pipelines.rank_monitoring import rank_panels

    return {title: expr for _, title, expr, _ in rank_panels(NS)}


def test_rank_panels_show_each_ranks_step_time_shares_and_memory_growth(product):
    """The per-rank panels (step time heatmap, data wait share, gradient-sync share, memory
    growth) on recorded series, by promtool: one row per rank with its pod and node, this
    namespace's only; memory climbing 20 MiB a minute reads 1200 MiB per hour."""
    folder, _, panels = product
    titles = {title.split(" / ")[0]: expr for title, expr in panel_queries(panels)}
    heatmap, data, sync, memory = list(_rank_panels())
    assert set(_rank_panels()) <= set(titles) and [p["type"] for p in panels if p["title"] == heatmap] == ["heatmap"]
    a0, a1 = _rank("tr-fabric", 0, "node-a"), _rank("tr-fabric", 1, "node-b")
    series = [
        _series("pipectl_training_rank_step_seconds", a0, "0.101x20"),
        _series("pipectl_training_rank_step_seconds", a1, "0.131x20"),
        _series("pipectl_training_rank_step_seconds", _rank("tr-other", 0, "node-g", "research"), "9x20"),
        _series("pipectl_training_rank_data_share", a0, "0.05x20"),
        _series("pipectl_training_rank_data_share", a1, "0.31x20"),
        _series("pipectl_training_rank_sync_share", a0, "0.22x20"),
        _series("pipectl_training_rank_sync_share", a1, "0.24x20"),
        # rank 0's memory climbs 20 MiB a minute (a leak), rank 1's settled
        _series("pipectl_training_rank_memory_bytes", a0, f"{40 * 2**20}+{20 * 2**20}x20"),
        _series("pipectl_training_rank_memory_bytes", a1, f"{70 * 2**20}x20"),
    ]

    def row(labels: dict[str, str], keys: tuple[str, ...], value: float) -> dict:
        return {"labels": "{" + ", ".join(f'{k}="{labels[k]}"' for k in sorted(keys)) + "}", "value": value}

    by_rank = ("workflow", "rank", "pod", "node")
    expected = {
        heatmap: [row(a0, ("workflow", "rank"), 0.101), row(a1, ("workflow", "rank"), 0.131)],
        data: [row(a0, by_rank, 0.05), row(a1, by_rank, 0.31)],
        sync: [row(a0, by_rank, 0.22), row(a1, by_rank, 0.24)],
        memory: [row(a0, by_rank, 1200), row(a1, by_rank, 0)],
    }
    exprs = [{"expr": titles[t], "eval_time": "15m", "exp_samples": s} for t, s in expected.items()]
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "promql_expr_test": exprs}], "rank-panels.yaml")


def test_starved_for_data_fires_above_the_train_steps_rule_for_that_model_only(product):
    """PipectlTrainingStarvedForData over the evaluate step's gauge (the last run's data-wait share,
    by model and lane): fires for the model whose run waited 25% of its step (rule: > 20%,
    telemetry.STARVED_SHARE), not for one at 20% exactly nor at 8%."""
    folder, _, _ = product
    gauge = "argo_workflows_pipectl_training_data_share"
    scrape = {"instance": "c:9090", "job": "workflow-controller"}
    series = [_series(gauge, {**scrape, "model": "digits-cnn", "lane": "standard"}, "0.08x10 0.25x20"),
              _series(gauge, {**scrape, "model": "resnet-pets", "lane": "batch"}, "0.2x30"),
              _series(gauge, {**scrape, "model": "vit-food", "lane": "urgent"}, "0.08x30")]
    summary = ("training of digits-cnn waited for data 25% of its step time in its last epoch: more loader workers, "
               "Alluxio warm-up, or a faster store")
    alerts = [{"eval_time": "9m", "alertname": "PipectlTrainingStarvedForData", "exp_alerts": []},
              {"eval_time": "12m", "alertname": "PipectlTrainingStarvedForData", "exp_alerts": [{
                  "exp_labels": {"model": "digits-cnn", "severity": "warning"}, "exp_annotations": {"summary": summary}}]}]
    _promtool_test(folder, [{"interval": "1m", "input_series": series, "alert_rule_test": alerts}], "starved.yaml")
