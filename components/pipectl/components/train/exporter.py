"""The gang's step anatomy per rank for Prometheus: a small ``/metrics`` endpoint on each gang pod.

The first process of each pod (``LOCAL_RANK`` 0) serves, on :data:`~pipectl.components.names.METRICS_PORT_ENV`
(the pod's ``metrics`` port, scraped through the PodMonitor ``pipectl-train``), the figures of the
ranks of its own pod, as Prometheus gauges with the labels ``workflow``, ``rank``, ``pod`` and
``node``:

================================================  ==============================================================
``pipectl_training_rank_step_seconds``            the rank's own time per step (data wait + compute + optimizer:
                                                  not the time it waits for its peers), its median step over the
                                                  last straggler window (:data:`~.telemetry.STRAGGLER_STEPS` steps)
                                                  or epoch
``pipectl_training_rank_step_ratio``              the same over the median of the other ranks' (the straggler
                                                  rule: >= :data:`~.telemetry.STRAGGLER_RATIO`)
``pipectl_training_rank_data_share``              share of the rank's step time waiting for data, last epoch
``pipectl_training_rank_sync_share``              share of the rank's step time in exposed gradient sync, last epoch
``pipectl_training_rank_memory_bytes``            GPU memory its tensors hold (a GPU rank) or its resident memory
                                                  (a CPU rank) at the last epoch's end
``pipectl_training_rank_memory_growing``          1 when that memory grew at each of the last epoch ends as the
                                                  train step's leak rule says (:func:`~.telemetry.growing_memory`), else 0
================================================  ==============================================================

The figures are the ones the loop already gathers (every rank receives every rank's numbers at
each straggler check and each epoch's end), so serving them costs no collective and nothing per
step: a few dictionary writes every :data:`~.telemetry.STRAGGLER_STEPS` steps and per epoch, and
prometheus_client's daemon thread that answers the scrapes (the exposition format, escaping and
HTTP are the library's). The endpoint never stops the training: a port that cannot
be bound is a warning in the step's log.
"""

from __future__ import annotations

import logging
import os
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

from pipectl.components.names import METRICS_HOST_ENV, METRICS_PORT_ENV
from pipectl.components.train.telemetry import LEAK_EPOCHS, growing_memory

log = logging.getLogger("pipectl.train")

PREFIX = "pipectl_training_rank_"
RANK_METRICS = {
    "step_seconds": "A training rank's own time per step (data wait, compute, optimizer), its median step over the last window",
    "step_ratio": "A training rank's own step time over the other ranks' median (a straggler: >= 1.2)",
    "data_share": "Share of a training rank's step time waiting for data, last epoch",
    "sync_share": "Share of a training rank's step time in exposed gradient sync, last epoch",
    "memory_bytes": "GPU memory a training rank's tensors hold (a GPU rank) or its resident memory (a CPU rank), last epoch's end",
    "memory_growing": "1 when a training rank's memory grew at each of its last 4 epoch ends, by at least 64 MiB and 10% in all "
                      "(a likely leak), else 0",
}
"""Metric (without :data:`PREFIX`) -> its help text."""
LABELS = ("workflow", "rank", "pod", "node")


def metric_name(short: str) -> str:
    """``step_seconds`` -> ``pipectl_training_rank_step_seconds``."""
    return PREFIX + short


def others_ratio(own: list[float]) -> list[float]:
    """Each rank's ``own`` seconds per step over the median of the others' (1.0 for a rank alone or
    when the others' median is 0): the straggler rule's ratio (:func:`~.telemetry.stragglers`)."""
    out = []
    for i, mine in enumerate(own):
        others = own[:i] + own[i + 1:]
        median = statistics.median(others) if others else 0.0
        out.append(mine / median if median > 0 else 1.0)
    return out


@dataclass(eq=False)  # hashable by identity: prometheus_client keys its registry by collector
class RankExporter:
    """The gauges of the ranks of one pod (``node``, ``pod``: this process's whereabouts) and,
    once :meth:`serve` is called, the HTTP endpoint that serves them."""

    workflow: str
    node: str
    pod: str
    values: dict[tuple[str, int], float] = field(default_factory=dict)
    """(metric, rank) -> value."""
    history: dict[int, list[Any]] = field(default_factory=dict, repr=False)
    """This pod's ranks' last epochs (oldest first), as many as the leak rule looks at."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _server: Any = field(default=None, repr=False)
    _registry: Any = field(default=None, repr=False)

    def mine(self, node: str, pod: str) -> bool:
        """Whether a rank at ``node``/``pod`` runs in this exporter's pod."""
        return (node, pod) == (self.node, self.pod)

    def set(self, metric: str, rank: int, value: float) -> None:
        if metric not in RANK_METRICS:
            raise KeyError(f"no rank metric {metric!r}: one of {sorted(RANK_METRICS)}")
        with self._lock:
            self.values[(metric, rank)] = float(value)

    def window(self, own: list[float], where: list[tuple[str, str]]) -> None:
        """A straggler check's figures: ``own[r]`` seconds per step of rank ``r`` (its median over
        the window), ``where[r]`` its (node, pod)."""
        for rank, (seconds, ratio) in enumerate(zip(own, others_ratio(own))):
            if self.mine(*where[rank]):
                self.set("step_seconds", rank, seconds)
                self.set("step_ratio", rank, ratio)

    def epoch(self, ranks: list[Any]) -> None:
        """An epoch's figures: every rank's :class:`~.telemetry.RankEpoch`."""
        own = [r.own_median or r.own_per_step for r in ranks]
        for r, seconds, ratio in zip(ranks, own, others_ratio(own)):
            if not self.mine(r.node, r.pod):
                continue
            total = r.total or 1.0
            self.set("step_seconds", r.rank, seconds)
            self.set("step_ratio", r.rank, ratio)
            self.set("data_share", r.rank, r.seconds["data"] / total)
            self.set("sync_share", r.rank, r.seconds["sync"] / total)
            self.set("memory_bytes", r.rank, r.memory_mib * 2**20)
            kept = self.history[r.rank] = (self.history.get(r.rank, []) + [r])[-(LEAK_EPOCHS + 1):]
            self.set("memory_growing", r.rank, 1.0 if growing_memory(kept) else 0.0)

    def collect(self) -> Iterator[Any]:
        """The gauges, one family per metric with a sample per rank of this pod (prometheus_client's
        collector protocol: called at each scrape)."""
        from prometheus_client.core import GaugeMetricFamily

        with self._lock:
            values = dict(self.values)
        for short, help_ in RANK_METRICS.items():
            rows = sorted((rank, v) for (m, rank), v in values.items() if m == short)
            if not rows:
                continue
            family = GaugeMetricFamily(metric_name(short), help_, labels=LABELS)
            for rank, v in rows:
                family.add_metric([self.workflow, str(rank), self.pod, self.node], v)
            yield family

    def registry(self) -> Any:
        """A registry of its own holding only these gauges (not the process's default one, which
        would add the Python runtime's metrics to every gang pod's scrape)."""
        from prometheus_client import CollectorRegistry

        if self._registry is None:
            self._registry = CollectorRegistry(auto_describe=False)
            self._registry.register(self)
        return self._registry

    def text(self) -> str:
        """The gauges in Prometheus's text exposition format, as a scrape gets them."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry()).decode()

    def serve(self, port: int, host: str = "") -> int:
        """Serve the gauges at ``/metrics`` on ``port`` (0: any free port; ``host`` empty: every
        IPv4 address) from prometheus_client's daemon thread; returns the port. OSError when it
        cannot be bound."""
        from prometheus_client import start_http_server

        self._server, _ = start_http_server(port, addr=host or "0.0.0.0", registry=self.registry())
        return self._server.server_address[1]

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def from_env(workflow: str, node: str, pod: str, environ: dict[str, str] | None = None) -> RankExporter | None:
    """The exporter of this process when it serves its pod's ranks (``LOCAL_RANK`` 0 and
    :data:`~pipectl.components.names.METRICS_PORT_ENV` set to a port), started; None otherwise,
    and None (with a warning) when the port cannot be bound."""
    env = os.environ if environ is None else environ
    port = env.get(METRICS_PORT_ENV, "")
    if not port or env.get("LOCAL_RANK", "0") != "0":
        return None
    exporter = RankExporter(workflow, node, pod)
    try:
        bound = exporter.serve(int(port), host=env.get(METRICS_HOST_ENV, ""))
    except (OSError, ValueError) as e:
        log.warning("no step-anatomy metrics for Prometheus: cannot serve on port %s (%s)", port, e)
        return None
    except ImportError as e:  # a team's own image built without the steps' requirements
        log.warning("no step-anatomy metrics for Prometheus: %s (install prometheus-client in the training image)", e)
        return None
    log.info("step-anatomy metrics for Prometheus on port %d (/metrics)", bound)
    return exporter
