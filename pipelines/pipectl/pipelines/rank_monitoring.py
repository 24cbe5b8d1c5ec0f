"""The step anatomy per rank in Prometheus: the PodMonitor that scrapes the gang pods, the dashboard
panels over it and the alerts that say what the train step's verdicts say, while the run goes.

Each gang pod of pipectl's training loop serves its ranks' figures on its ``metrics`` port
(:mod:`pipectl.components.train.exporter`: ``pipectl_training_rank_*``, labels ``workflow``,
``rank``, ``pod``, ``node``). The rules are the train step's own (:mod:`pipectl.components.train.telemetry`):

- straggler: a rank whose own step time (its median over at least ``STRAGGLER_STEPS`` steps) is
  ``STRAGGLER_RATIO`` times the other ranks' median — the rank, its pod and its node as the alert's labels;
- fabric-bound: the gang's exposed gradient sync above ``FABRIC_SHARE`` of the step (above
  ``NO_SCALE_SHARE``: more nodes will not pay), only for a gang on more than one node and only
  without a straggler (the others' sync is then the wait for it). The gang's share is the mean
  of its ranks' shares: in a data-parallel gang every rank's epoch takes the same wall time (they
  meet at every all-reduce), so that mean is the train step's share (all ranks' sync over all
  their time).

- memory growing: a rank's memory grew at each of its last ``LEAK_EPOCHS`` epoch ends, by at least
  ``LEAK_MIN_MIB`` and ``LEAK_MIN_FRACTION`` in all (the rule needs the epochs' ends, which only the
  gang knows: the pod serves the verdict itself, ``pipectl_training_rank_memory_growing``).

The starved verdict is the alert ``PipectlTrainingStarvedForData`` (the last run, from evaluate).
Pure: no I/O; the dashboard and the rule file are assembled in :mod:`pipectl.pipelines.manifests`.
"""

from __future__ import annotations

from typing import Any

from pipectl.components.names import METRICS_PORT_NAME, PART_OF, STEP_LABEL
from pipectl.components.train.exporter import metric_name
from pipectl.components.train.telemetry import (FABRIC_SHARE, LEAK_EPOCHS, LEAK_MIN_FRACTION, LEAK_MIN_MIB, NO_SCALE_SHARE,
                                                STARVED_SHARE, STRAGGLER_RATIO, STRAGGLER_STEPS)

SCRAPE_INTERVAL = "30s"
"""How often Prometheus reads the gang pods' figures (they change every ``STRAGGLER_STEPS`` steps and per epoch)."""
POD_MONITOR = "pipectl-train"


def pod_monitor(namespace: str) -> dict:
    """PodMonitor ``pipectl-train`` (prometheus-operator's CRD): every train pod of the namespace
    (label ``pipectl.io/step: train``), its ``metrics`` port. ``honorLabels``: the figures carry
    their own ``pod`` and ``node`` (of the rank, as the verdicts name them)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": POD_MONITOR, "namespace": namespace, "labels": dict(PART_OF)},
        "spec": {
            "selector": {"matchLabels": {STEP_LABEL: "train"}},
            "podMetricsEndpoints": [{"port": METRICS_PORT_NAME, "path": "/metrics", "interval": SCRAPE_INTERVAL,
                                     "honorLabels": True}],
        },
    }


def _m(short: str, namespace: str) -> str:
    return f'{metric_name(short)}{{namespace="{namespace}"}}'


def rank_panels(namespace: str) -> list[tuple[str, str, str, str]]:
    """``(type, title, PromQL, legend)`` of the dashboard's per-rank panels."""
    by_rank = "workflow, rank, pod, node"
    return [
        ("heatmap", "Training step time per rank (s: each rank's own median step; a hot row is a straggler, "
                    f"at {STRAGGLER_RATIO}x the other ranks')",
         f"max by (workflow, rank) ({_m('step_seconds', namespace)})", "{{workflow}} rank {{rank}}"),
        ("timeseries", f"Training step time waiting for data, per rank (share of the last epoch; above {STARVED_SHARE}: starved)",
         f"max by ({by_rank}) ({_m('data_share', namespace)})", "{{workflow}} rank {{rank}} ({{node}})"),
        ("timeseries", "Training step time in exposed gradient sync, per rank (share of the last epoch; "
                       f"above {FABRIC_SHARE}: fabric-bound, above {NO_SCALE_SHARE}: more nodes will not pay)",
         f"max by ({by_rank}) ({_m('sync_share', namespace)})", "{{workflow}} rank {{rank}} ({{node}})"),
        ("timeseries", "Training memory growth per rank (MiB per hour over 30 minutes: GPU memory its tensors hold, "
                       "or resident memory on a CPU; a steady climb: likely a leak)",
         f"max by ({by_rank}) (deriv({_m('memory_bytes', namespace)}[30m])) * 3600 / 1048576",
         "{{workflow}} rank {{rank}} ({{node}})"),
    ]


def rank_alerts(namespace: str) -> list[dict[str, Any]]:
    """The alerts ``PipectlTrainingStraggler``, ``PipectlTrainingFabricBound`` and
    ``PipectlTrainingMemoryGrowing`` (see the module doc)."""
    ratio, sync = _m("step_ratio", namespace), _m("sync_share", namespace)
    gang = "namespace, workflow"
    across_nodes = f"count by ({gang}) (count by ({gang}, node) ({sync})) > 1"
    straggler = f"max by ({gang}) ({ratio}) >= {STRAGGLER_RATIO}"
    return [
        {"alert": "PipectlTrainingStraggler",
         "expr": f"max by ({gang}, rank, pod, node) ({ratio}) >= {STRAGGLER_RATIO}",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "straggler: rank {{ $labels.rank }} of {{ $labels.workflow }} on node {{ $labels.node }} "
                                    "(pod {{ $labels.pod }}) takes {{ $value | printf \"%.1f\" }}x the other ranks' median "
                                    f"step time (rule: >= {STRAGGLER_RATIO}x over >= {STRAGGLER_STEPS} steps); every other "
                                    "rank waits for it at each all-reduce: check that node (GPU clocks, thermal, noisy "
                                    "neighbours) or its shards"}},
        {"alert": "PipectlTrainingFabricBound",
         "expr": f"(avg by ({gang}) ({sync}) and on ({gang}) ({across_nodes}) unless on ({gang}) ({straggler})) > {FABRIC_SHARE}",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "fabric-bound: {{ $labels.workflow }} waits for gradient sync {{ $value | humanizePercentage }} "
                                    f"of its step (rule: > {FABRIC_SHARE:.0%}; > {NO_SCALE_SHARE:.0%}: more nodes will not pay); "
                                    f"{{{{ if gt $value {NO_SCALE_SHARE} }}}}adding nodes will not pay: {{{{ end }}}}"
                                    "check InfiniBand/RoCE and NCCL_IB_DISABLE / NCCL_SOCKET_IFNAME"}},
        {"alert": "PipectlTrainingMemoryGrowing",
         "expr": f"max by ({gang}, rank, pod, node) ({_m('memory_growing', namespace)}) > 0",
         "labels": {"severity": "warning"},
         "annotations": {"summary": "memory growing: rank {{ $labels.rank }} of {{ $labels.workflow }} on node {{ $labels.node }} "
                                    f"(pod {{{{ $labels.pod }}}}): its memory grew at each of its last {LEAK_EPOCHS} epochs (rule: every epoch, "
                                    f">= {LEAK_MIN_MIB:.0f} MiB and {LEAK_MIN_FRACTION:.0%} in all): likely a leak (tensors kept "
                                    "across steps: a loss appended without .item(), a list that grows); it ends in an "
                                    "out-of-memory kill"}},
    ]
