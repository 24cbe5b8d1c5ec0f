"""A real Prometheus (Debian's ``prometheus`` 2.42, scripts/system-deps.sh group ``ui``) for the
monitoring tests (field case C12), and the product's rendered queries read back from what
``pipectl render`` writes.

    from tests.harness.prometheus import Prometheus, cluster_targets
    with Prometheus(tmp_path / "prom", cluster_targets(test_cluster), rules=rule_groups()) as prom:
        prom.query('argo_workflows_total_count')   # -> list of {"metric": {...}, "value": [t, "v"]}

What it scrapes (every 1 s; ``cluster_targets``):

  workflow-controller   Argo's /metrics on the test cluster's ``argo-metrics`` port. The controller
                        serves it over TLS with a self-signed certificate unless ``metricsConfig``
                        says ``secure: false`` (config.go ``MetricsConfig.GetSecure(true)``), so the
                        job uses https without verification, as an in-cluster ServiceMonitor with
                        ``insecureSkipVerify`` would.
  vc-scheduler          Volcano's /metrics on its ``--listen-address`` (cmd/scheduler/app/server.go).
                        vc-controller-manager 1.10 serves no metrics (only /healthz), so it is not
                        scraped.

The rendered PrometheusRule's groups are loaded as a rule file: Prometheus itself parses them, and
alerts and recording rules are evaluated every second against the scraped series.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from pipectl.pipelines.backends.processes import ProcessError, free_port, http_ok, listens, spawn, stop, wait_until

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"

# The exporters a metric name comes from, by prefix. Only the first two run in the test cluster.
LIVE_PREFIXES = ("argo_workflows_", "volcano_")
ABSENT_EXPORTERS = {"DCGM_": "NVIDIA dcgm-exporter (no GPUs in the test cluster)",
                    "kube_": "kube-state-metrics (not run in the test cluster)",
                    "pipectl_training_rank_": "the gang pods' own endpoint (KWOK's pods run no process; "
                                              "scraped live in tests/integration/test_rank_metrics.py)"}
_METRIC_NAME = re.compile(r"\b(?:argo_workflows_|volcano_|DCGM_|kube_|pipectl_training_rank_)[A-Za-z0-9_]+")
# a trailing top-level comparison with a number: `<query> > 0`, `<query> < 5`
_THRESHOLD = re.compile(r"^(?P<query>.*\S)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>-?[0-9.]+)\s*$", re.S)


def missing_binaries() -> list[str]:
    """Names of the Debian ``prometheus`` package's binaries not on PATH ([] when both are)."""
    return [b for b in (PROMETHEUS, PROMTOOL) if shutil.which(b) is None]


def require_binaries() -> None:
    """Skip the calling test when Debian's prometheus package is missing; fail it instead under
    ``PIPECTL_REQUIRE_CLUSTER=1`` (``make test`` installs the package: scripts/system-deps.sh ui)."""
    import os

    import pytest

    missing = missing_binaries()
    if missing:
        msg = f"Debian's prometheus package is missing ({', '.join(missing)}): scripts/system-deps.sh ui"
        if os.environ.get("PIPECTL_REQUIRE_CLUSTER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression, of the exporters the product queries (argo_workflows_*,
    volcano_*, DCGM_*, kube_*, the gang pods' pipectl_training_rank_*); label names and functions
    are not matched."""
    return {m for m in _METRIC_NAME.findall(expr) if not re.search(r"\b" + re.escape(m) + r"\s*=", expr)}


def absent_exporter(expr: str) -> str | None:
    """The exporter (words) that ``expr``'s metrics come from when it is one the test cluster does
    not run (:data:`ABSENT_EXPORTERS`); None when every metric it names is scraped here."""
    for name in sorted(metric_names(expr)):
        for prefix, exporter in ABSENT_EXPORTERS.items():
            if name.startswith(prefix):
                return exporter
    return None


def split_threshold(expr: str) -> tuple[str, str, float] | None:
    """``(query, operator, threshold)`` of an alert expression ending in a comparison with a number
    (``increase(x[10m]) > 0`` -> ``("increase(x[10m])", ">", 0.0)``); None when it does not end so.
    The query alone returns the series the alert watches, whether or not they cross the threshold."""
    m = _THRESHOLD.match(expr.strip())
    if not m:
        return None
    query = m["query"].strip()
    if query.count("(") != query.count(")"):
        return None
    return query, m["op"], float(m["value"])


# -- the rendered manifests -------------------------------------------------------------------

def rendered(argo_dir: Path) -> tuple[list[dict], list[dict]]:
    """``(rule_groups, panels)`` from a rendered ``argo/`` folder (``pipectl render cluster --write
    DIR``): the PrometheusRule's ``spec.groups`` and the Grafana dashboard's panels (from the
    ConfigMap's JSON)."""
    mon = argo_dir / "namespace" / "monitoring"
    rule_docs = [d for d in yaml.safe_load_all((mon / "prometheus-rules.yaml").read_text()) if d]
    groups = [g for d in rule_docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"]]
    cm_docs = [d for d in yaml.safe_load_all((mon / "grafana-dashboard.yaml").read_text()) if d]
    panels = [p for d in cm_docs for text in d["data"].values() for p in json.loads(text)["panels"]]
    return groups, panels


def panel_queries(panels: list[dict]) -> list[tuple[str, str]]:
    """``(panel title / refId, PromQL)`` of every target of every panel."""
    return [(f"{p['title']} / {t.get('refId', 'A')}", t["expr"]) for p in panels for t in p.get("targets", [])]


def rules(groups: list[dict]) -> list[dict]:
    """Every rule (alerting and recording) of the rule groups, in order."""
    return [r for g in groups for r in g["rules"]]


# -- promtool ---------------------------------------------------------------------------------

def promtool(*args: str, cwd: Path, timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """Run ``promtool ARGS`` in ``cwd``; the completed process (stdout and stderr as text)."""
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def write_rule_file(groups: list[dict], path: Path) -> Path:
    """A Prometheus rule file (``groups:``) with the PrometheusRule's groups; returns ``path``."""
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


# -- the server ---------------------------------------------------------------------------------

def cluster_targets(cluster) -> list[dict]:
    """Scrape jobs for a running tests.harness.controlplane.TestCluster: the workflow controller
    (https, self-signed) and, when Volcano runs, vc-scheduler (see the module docstring)."""
    jobs = [{"job_name": "workflow-controller", "scheme": "https", "tls_config": {"insecure_skip_verify": True},
             "static_configs": [{"targets": [f"127.0.0.1:{cluster.ports['argo-metrics']}"]}]}]
    if cluster.volcano and "vc-scheduler" not in cluster.errors:
        jobs.append({"job_name": "vc-scheduler",
                     "static_configs": [{"targets": [f"127.0.0.1:{cluster.ports['vc-sched-http']}"]}]})
    return jobs


class Prometheus:
    """One Prometheus server on 127.0.0.1 (free port), storage in ``run_dir``; a context manager.

    scrape_configs: Prometheus scrape jobs (``cluster_targets``); rules: rule groups loaded as a
    rule file; interval_s: scrape and rule-evaluation interval, seconds.
    Raises ProcessError when it exits or is not ready within ``start_timeout_s``.
    """

    def __init__(self, run_dir: Path, scrape_configs: list[dict], *, rules: list[dict] | None = None,
                 interval_s: int = 1, start_timeout_s: float = 30.0) -> None:
        self.run_dir = Path(run_dir)
        self.scrape_configs = scrape_configs
        self.groups = rules or []
        self.interval_s = interval_s
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log = self.run_dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": f"{self.interval_s}s", "scrape_timeout": f"{self.interval_s}s",
                             "evaluation_interval": f"{self.interval_s}s"},
                  "scrape_configs": self.scrape_configs}
        if self.groups:
            config["rule_files"] = [str(write_rule_file(self.groups, self.run_dir / "rules.yaml"))]
        conf = self.run_dir / "prometheus.yml"
        conf.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.proc = spawn([PROMETHEUS, f"--config.file={conf}", f"--storage.tsdb.path={self.run_dir / 'data'}",
                           f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1d",
                           "--log.level=warn"], self.log, cwd=self.run_dir)
        try:
            # ready when THIS Prometheus listens and answers (another process may have taken the port first)
            wait_until("prometheus /-/ready", lambda: listens(self.proc.pid, self.port) and http_ok(self.url + "/-/ready"),
                       self.start_timeout_s,
                       procs=[("prometheus", self.proc, self.log)])
        except ProcessError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc, grace_s=2.0)
            self.proc = None

    def __enter__(self) -> Prometheus:  # noqa: PYI034
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api(self, path: str, **params: str) -> dict | list:
        """GET ``/api/v1/<path>`` with ``params``; the response's ``data``. RuntimeError on an
        error status (the message has Prometheus's ``error``: a PromQL parse error, say)."""
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - loopback
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read() or b"{}")
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        """Instant query now: the result vector (``[{"metric": {...}, "value": [t, "v"]}, ...]``)."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr!r}: a {data['resultType']}, not an instant vector")
        return data["result"]

    def targets_up(self) -> dict[str, str]:
        """Scrape job -> health of its target (``up``, ``down``, ``unknown``) and last error."""
        active = self.api("targets", state="active")["activeTargets"]
        return {t["labels"]["job"]: t["health"] + (f" ({t['lastError']})" if t.get("lastError") else "") for t in active}

    def wait_for_series(self, expr: str, timeout_s: float = 30.0) -> list[dict]:
        """Poll ``expr`` until it returns a series; the result. TimeoutError naming the expression."""
        deadline = time.monotonic() + timeout_s
        while True:
            got = self.query(expr)
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"no series for {expr!r} within {timeout_s}s")
            time.sleep(0.5)
