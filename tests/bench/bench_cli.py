"""Benchmark 4, CLI latency: ``pipectl`` commands vs. the Argo CLI (v4.0.5) where it has one.

Wall time of a fresh process, output discarded, from the repository root (the checked-in
``argo/`` manifests are the input of the like-for-like lint). Peers:

- ``pipectl --help`` vs ``argo --help`` (goal: pipectl < 0.3 s; heavy imports stay lazy);
- ``pipectl render training``: the Argo CLI has no offline equivalent (no peer);
- ``pipectl lint`` (renders every manifest of ``argo/`` — 18 objects of Argo, Volcano,
  Kubernetes, Prometheus kinds — and validates schemas + policy) vs ``argo lint --offline argo/``
  (which checks only the Argo kinds in it: the WorkflowTemplate and the CronWorkflow);
- ``pipectl lint FILES`` vs ``argo lint --offline FILES`` on those same two Argo files.

The Argo CLI is the one ``tests/cluster/build.sh`` builds (``tests.harness.binaries.binary("argo")``);
without it the peer column stays empty.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.harness import binaries
from tests.bench.table import Bench, Row, Stats, measure, measure_pair, run_cmd, with_cpu

ROOT = Path(__file__).resolve().parents[2]
ARGO = Path(os.environ.get("BENCH_ARGO") or binaries.binary("argo"))
ARGO_FILES = ["argo/namespace/workflowtemplates/training-v1.yaml", "argo/namespace/cronworkflows/retrain.yaml"]


def main() -> None:
    pipectl = str(Path(sys.executable).parent / "pipectl")
    runs = max(int(os.environ.get("BENCH_RUNS", "5")), 7)  # cheap: a few more runs
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}

    def cmd(*argv: str):  # type: ignore[no-untyped-def]
        return lambda: run_cmd(list(argv), env=env, cwd=ROOT)

    cases: list[tuple[str, list[str], list[str] | None, str]] = [
        ("--help", [pipectl, "--help"], [str(ARGO), "--help"], "pipectl < 0.3 s"),
        ("render training", [pipectl, "render", "training"], None, ""),
        ("lint (pipectl: all 18 rendered objects; argo: argo/)", [pipectl, "lint"], [str(ARGO), "lint", "--offline", "argo/"], ""),
        ("lint the 2 Argo files of argo/", [pipectl, "lint", *ARGO_FILES], [str(ARGO), "lint", "--offline", *ARGO_FILES], ""),
    ]
    with Bench("cli", "CLI latency: wall time of one command", "pipectl", "argo v4.0.5 CLI", runs=runs) as b:
        if not ARGO.exists():
            b.notes.append(f"Argo CLI not found at {ARGO} (make cluster-build builds it): no peer figures.")
        for label, ours_argv, peer_argv, goal in cases:
            cpu_ours: list[float] = []
            cpu_peer: list[float] = []
            if peer_argv and ARGO.exists():
                ours, peer = measure_pair(with_cpu(cmd(*ours_argv), cpu_ours), with_cpu(cmd(*peer_argv), cpu_peer), b.runs, b.warmup)
            else:
                ours, peer = measure(with_cpu(cmd(*ours_argv), cpu_ours), b.runs, b.warmup), None
            b.rows.append(Row(label, "s", ours, peer, goal=goal))
            b.rows.append(Row(f"{label}: CPU time (user+sys)", "s", Stats(cpu_ours[b.warmup:]),
                              Stats(cpu_peer[b.warmup:]) if cpu_peer else None))
        b.notes.append("argo lint --offline checks only Argo kinds; pipectl lint also checks Volcano/Kubernetes/"
                       "Prometheus objects against their schemas and pipectl's policy rules.")


if __name__ == "__main__":
    main()
