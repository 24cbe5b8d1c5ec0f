"""Run the benchmarks: every ``tests/bench/bench_*.py`` module's ``main()``, or those named.

    python -m tests.bench.run                 # all, in file-name order
    python -m tests.bench.run cli preprocess  # a subset, by the part after ``bench_``

Each prints its table and writes ``tests/bench/results/<name>.{json,md}``; at the end
``results/README.md`` gathers every ``results/*.md`` (the latest of each) under the machine's
facts. Exit 1 when a benchmark failed (the others still run), 2 for an unknown name.
"""

from __future__ import annotations

import importlib
import signal
import sys
import time
import traceback
from pathlib import Path

from tests.bench.table import RESULTS_DIR, load_average, machine

HERE = Path(__file__).resolve().parent


def available() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in HERE.glob("bench_*.py"))


def summary_markdown() -> str:
    """``results/README.md``: machine facts, then each benchmark's latest table."""
    m = machine()
    lines = [
        "# Benchmark results (latest run of each)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, {m['gpus']} GPU; "
        f"Python {m['python']}, torch {m.get('torch', '?')}, DALI {m.get('dali', '?')}, Pillow {m.get('PIL', '?')}. "
        "Shared machine: see each table's load average.",
        "",
    ]
    for name in available():
        md = RESULTS_DIR / f"{name}.md"
        if md.exists():
            lines += [md.read_text(), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    names = argv or available()
    unknown = [n for n in names if n not in available()]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(available())}", file=sys.stderr)
        return 2
    def on_sigterm(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds: servers and gangs a benchmark started are stopped

    signal.signal(signal.SIGTERM, on_sigterm)
    m = machine()
    print(f"machine: {m}; load average {load_average()}", flush=True)
    failed = []
    for name in names:
        print(f"\n=== bench {name} ===", flush=True)
        t0 = time.perf_counter()
        try:
            importlib.import_module(f"tests.bench.bench_{name}").main()
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"=== bench {name}: {time.perf_counter() - t0:.0f} s ===", flush=True)
    (RESULTS_DIR / "README.md").write_text(summary_markdown())
    print(f"\nresults: {RESULTS_DIR}/ (README.md gathers the tables)")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
