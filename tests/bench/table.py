"""The shared part of every benchmark: timing loop, statistics, machine facts, table, results.

A benchmark module builds :class:`Row`\\ s (ours vs. the peer tool, measured in one run by
:func:`measure_pair`, which alternates the two so background load hits both alike) and hands
them to :func:`report`, which prints a table and writes ``results/<name>.json`` and
``results/<name>.md`` (a markdown table the README can include).

Statistics: median of ``runs`` (>= 5) timed runs after ``warmup`` untimed ones, with min-max.
Ratio: ours ÷ peer of the medians (for a throughput, >1 means ours is faster; for a time, <1).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DEFAULT_RUNS = int(os.environ.get("BENCH_RUNS", "5"))
DEFAULT_WARMUP = int(os.environ.get("BENCH_WARMUP", "1"))


@dataclass
class Stats:
    """Samples of one measured quantity (seconds, or a rate derived from seconds)."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    def rate(self, count: float) -> "Stats":
        """``count`` / each sample: seconds -> a throughput (per second)."""
        return Stats([count / s for s in self.samples])

    def scaled(self, factor: float) -> "Stats":
        return Stats([s * factor for s in self.samples])


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """The distribution-free confidence interval of the median of ``values``: the order statistics
    x(k) and x(n-k+1) (1-based) with the largest k for which P(Binomial(n, 1/2) <= k-1) is at most
    (1 - confidence) / 2 (the sign test's interval; Conover, Practical Nonparametric Statistics,
    3rd ed., section 3.2). ValueError when ``values`` are too few for ``confidence`` (fewer than 6
    at 95%)."""
    from math import comb

    xs, alpha = sorted(values), (1 - confidence) / 2
    n, k, cdf = len(xs), 0, 0.0
    while k < n // 2:
        below = cdf + comb(n, k) / 2 ** n  # P(Binomial <= k)
        if below > alpha:
            break
        cdf, k = below, k + 1
    if k == 0:
        raise ValueError(f"{n} values are too few for a {confidence:.0%} interval of the median")
    return xs[k - 1], xs[n - k]


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of ``fn()``; if ``fn`` returns a float, that value is the measurement instead
    (for a benchmark that times only part of what it does)."""
    t0 = time.perf_counter()
    value = fn()
    elapsed = time.perf_counter() - t0
    return float(value) if isinstance(value, float) else elapsed


def measure(fn: Callable[[], Any], runs: int = DEFAULT_RUNS, warmup: int = DEFAULT_WARMUP) -> Stats:
    """``warmup`` untimed calls, then ``runs`` timed calls of ``fn``."""
    for _ in range(warmup):
        fn()
    return Stats([timed(fn) for _ in range(runs)])


def measure_pair(
    ours: Callable[[], Any], peer: Callable[[], Any], runs: int = DEFAULT_RUNS, warmup: int = DEFAULT_WARMUP
) -> tuple[Stats, Stats]:
    """Like :func:`measure` for two commands, alternated (ours, peer, ours, peer, ...) so a
    change of background load during the run affects both series alike."""
    for _ in range(warmup):
        ours()
        peer()
    a, b = [], []
    for _ in range(runs):
        a.append(timed(ours))
        b.append(timed(peer))
    return Stats(a), Stats(b)


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been waited for
    (their children too). Far less sensitive to other jobs on the machine than wall time."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def with_cpu(fn: Callable[[], Any], sink: list[float]) -> Callable[[], Any]:
    """``fn``, also appending the CPU seconds (:func:`cpu_seconds`) each call used to ``sink``."""

    def wrapped() -> Any:
        c0 = cpu_seconds()
        value = fn()
        sink.append(cpu_seconds() - c0)
        return value

    return wrapped


def run_cmd(argv: list[str], env: dict[str, str] | None = None, cwd: str | Path | None = None, timeout_s: float = 900) -> float:
    """Run ``argv`` (output discarded unless it fails); return its wall seconds.

    Raises RuntimeError with the tail of its output when it exits non-zero: a benchmark of a
    failing command measures nothing.
    """
    t0 = time.perf_counter()
    proc = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = proc.stdout.decode(errors="replace")[-3000:]
        raise RuntimeError(f"{' '.join(argv[:6])} ... exited {proc.returncode}:\n{tail}")
    return elapsed


# ---------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return 0.0


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (other users of the machine show up here)."""
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """Facts about this machine that a figure depends on."""
    facts: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "gpus": len(list(Path("/proc/driver/nvidia/gpus").iterdir())) if Path("/proc/driver/nvidia/gpus").is_dir() else 0,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    for mod, dist in (("torch", "torch"), ("nvidia.dali", "nvidia-dali-cuda120"), ("PIL", "pillow"), ("mlflow", "mlflow")):
        try:
            from importlib.metadata import version

            facts[mod.split(".")[-1]] = version(dist)
        except Exception:
            pass
    return facts


# ---------------------------------------------------------------- rows and reports


@dataclass
class Row:
    """One line of a table: a case, measured for ours and (when there is one) for the peer.

    ``unit``: e.g. "images/s" or "s"; ``higher_is_better``: True for throughputs.
    """

    case: str
    unit: str
    ours: Stats | None
    peer: Stats | None = None
    higher_is_better: bool = False
    goal: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.ours is None or self.peer is None or self.peer.median == 0:
            return None
        return self.ours.median / self.peer.median


def fmt_value(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_stats(s: Stats | None, unit: str) -> str:
    if s is None:
        return "—"
    return f"{fmt_value(s.median)} {unit} ({fmt_value(s.min)}–{fmt_value(s.max)})"


def fmt_ratio(row: Row) -> str:
    """``1.88× (faster)``; for times close to 1, the difference in percent: ``1.04× (+4% time)``."""
    r = row.ratio
    if r is None:
        return "—"
    if abs(r - 1) < 0.005:
        return f"{r:.2f}× (same)"
    if not row.higher_is_better and row.unit != "s":  # a size (MiB, bytes): less or more, not faster
        return f"{r:.2f}× ({'less' if r < 1 else 'more'})"
    if not row.higher_is_better and abs(r - 1) < 0.5:
        return f"{r:.2f}× ({(r - 1) * 100:+.0f}% time)"
    faster = (r > 1) == row.higher_is_better
    return f"{r:.2f}× ({'faster' if faster else 'slower'})"


@dataclass
class Report:
    name: str
    title: str
    ours_label: str
    peer_label: str
    rows: list[Row]
    runs: int
    warmup: int
    setup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine)
    load_before: list[float] = field(default_factory=list)
    load_after: list[float] = field(default_factory=list)
    started_utc: str = ""
    seconds: float = 0.0

    def markdown(self) -> str:
        goal_col = any(r.goal for r in self.rows)
        head = ["case", self.ours_label, self.peer_label, "ours ÷ peer"] + (["goal"] if goal_col else [])
        lines = [f"**{self.title}** ({self.runs} runs after {self.warmup} warm-up; median (min–max))", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in self.rows:
            cells = [r.case + (f" ({r.note})" if r.note else ""), fmt_stats(r.ours, r.unit), fmt_stats(r.peer, r.unit), fmt_ratio(r)]
            if goal_col:
                cells.append(r.goal)
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines.append(f"Load average (1/5/15 min) before {self.load_before}, after {self.load_after}; {self.started_utc}, {self.seconds:.0f} s.")
        for n in self.notes:
            lines.append(f"- {n}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        def row(r: Row) -> dict[str, Any]:
            d: dict[str, Any] = {"case": r.case, "unit": r.unit, "higher_is_better": r.higher_is_better, "goal": r.goal, "note": r.note}
            for side in ("ours", "peer"):
                s = getattr(r, side)
                d[side] = None if s is None else {"median": s.median, "min": s.min, "max": s.max, "samples": s.samples}
            d["ratio"] = r.ratio
            return d

        out = {k: v for k, v in asdict(self).items() if k != "rows"}
        out["rows"] = [row(r) for r in self.rows]
        return out

    def print(self) -> None:
        try:
            from rich.console import Console
            from rich.table import Table
        except ImportError:
            print(self.markdown())
            return
        table = Table(title=f"{self.title}\n({self.runs} runs after {self.warmup} warm-up; median (min–max))")
        for col in ("case", self.ours_label, self.peer_label, "ours ÷ peer", "goal"):
            table.add_column(col)
        for r in self.rows:
            table.add_row(r.case + (f" ({r.note})" if r.note else ""), fmt_stats(r.ours, r.unit), fmt_stats(r.peer, r.unit), fmt_ratio(r), r.goal)
        console = Console(width=200)
        console.print(table)
        console.print(f"load average before {self.load_before}, after {self.load_after}")
        for n in self.notes:
            console.print(f"- {n}", markup=False)

    def write(self, results_dir: Path = RESULTS_DIR) -> Path:
        results_dir.mkdir(parents=True, exist_ok=True)
        (results_dir / f"{self.name}.json").write_text(json.dumps(self.to_json(), indent=2) + "\n")
        path = results_dir / f"{self.name}.md"
        path.write_text(self.markdown())
        return path


class Bench:
    """Context for one benchmark module: records load before/after and the start time.

    Use: ``with Bench("cli", "CLI latency", "pipectl", "argo") as b: b.rows.append(...)``;
    on a clean exit the report is printed and written.
    """

    def __init__(self, name: str, title: str, ours_label: str, peer_label: str, runs: int = DEFAULT_RUNS, warmup: int = DEFAULT_WARMUP) -> None:
        self.report = Report(name, title, ours_label, peer_label, [], runs, warmup)
        self.rows = self.report.rows
        self.notes = self.report.notes
        self.setup = self.report.setup
        self.runs, self.warmup = runs, warmup

    def __enter__(self) -> "Bench":
        self.report.load_before = load_average()
        self.report.started_utc = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.report.load_after = load_average()
        self.report.seconds = time.perf_counter() - self._t0
        if exc_type is None:
            self.report.print()
            self.report.write()
