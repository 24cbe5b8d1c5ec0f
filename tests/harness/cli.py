"""Command line of the test cluster (scripts/cluster-up.sh, scripts/cluster-down.sh)::

    python tests/cluster/cluster.py up RUN_DIR [--nodes N] [--no-volcano] [--argo-server]
    python tests/cluster/cluster.py down RUN_DIR
    python tests/cluster/cluster.py check        # exit 1 naming what is missing

``up`` starts a detached cluster (its process group ids in RUN_DIR/cluster.json) and prints shell
exports; ``down`` stops the groups recorded there and removes RUN_DIR.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from tests.harness.argoexec import run_taskresult_reporter
from tests.harness.binaries import missing
from tests.harness.controlplane import STATE_FILE, STOP_ORDER, TestCluster
from pipectl.pipelines.backends.processes import kill_group


def state(run_dir: Path) -> dict | None:
    """The cluster.json of a cluster started in ``run_dir``, or None."""
    p = run_dir / STATE_FILE
    return json.loads(p.read_text()) if p.exists() else None


def group_alive(pgid: int, marker: str | Path) -> bool:
    """True when process ``pgid`` runs and its command line contains ``marker`` (a run folder:
    a recycled pid of an unrelated process is not ours to kill)."""
    try:
        cmdline = Path(f"/proc/{pgid}/cmdline").read_bytes()
    except OSError:
        return False
    return str(marker).encode() in cmdline


def down(run_dir: Path) -> int:
    run_dir = run_dir.absolute()
    st = state(run_dir)
    if st is None:
        print(f"no {STATE_FILE} in {run_dir}: nothing running", file=sys.stderr)
        if run_dir.exists():
            shutil.rmtree(run_dir, ignore_errors=True)
        return 0
    pgids = st.get("pgids", {})
    for name in STOP_ORDER + [n for n in pgids if n not in STOP_ORDER]:
        pgid = pgids.get(name)
        if pgid and group_alive(pgid, run_dir):
            kill_group(pgid)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(group_alive(p, run_dir) for p in pgids.values()):
        time.sleep(0.05)
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"cluster in {run_dir} stopped", file=sys.stderr)
    return 0


def _print_exports(st: dict) -> None:
    print(f"export KUBECONFIG={st['kubeconfig']}")
    print(f"export PIPECTL_CLUSTER_DIR={st['run_dir']}")
    print(f"export PIPECTL_CLUSTER_SERVER={st['server']}")
    if st.get("argo_server_url"):
        print(f"export ARGO_SERVER={st['argo_server_url'].split('://', 1)[1]}")
        # auth mode server ignores the token, but the argo CLI refuses to run without one
        print("export ARGO_SECURE=false ARGO_HTTP1=true ARGO_TOKEN='Bearer unused'")


def _reuse_or_clear(run_dir: Path) -> bool:
    """True when ``run_dir`` holds a cluster that is up (exports printed); otherwise a stale
    cluster is stopped and a folder without cluster state removed."""
    st = state(run_dir)
    if st is not None:
        alive = [n for n, p in st["pgids"].items() if group_alive(p, run_dir)]
        dead = [n for n in st["pgids"] if n not in alive and n not in st.get("errors", {})]
        if not dead and st.get("startup_s"):
            print(f"cluster already running in {run_dir} ({', '.join(sorted(alive))})", file=sys.stderr)
            _print_exports(st)
            return True
        print(f"stale cluster in {run_dir} (not running: {', '.join(dead)}): restarting it", file=sys.stderr)
        down(run_dir)
    elif run_dir.exists() and any(run_dir.iterdir()):
        print(f"{run_dir} exists and holds no cluster state: removing it", file=sys.stderr)
        shutil.rmtree(run_dir)
    return False


def up(run_dir: Path, nodes: int, volcano: bool, argo_server: bool) -> int:
    run_dir = run_dir.absolute()
    if _reuse_or_clear(run_dir):
        return 0
    c = TestCluster(run_dir, nodes=nodes, volcano=volcano, argo_server=argo_server,
                    remove_on_stop=False, die_with_parent=False)
    c.start()
    c.components.detach()  # `down` finds the process groups through cluster.json
    _print_exports(state(run_dir))
    print(f"# cluster up in {c.startup_s:.1f}s; ready at (s since start): "
          f"{json.dumps(c.timings)}; start-to-ready (s): {json.dumps(c.durations)}",
          file=sys.stderr)
    if c.errors:
        print("# optional components failed: " + json.dumps(c.errors)[:4000], file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="cluster.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up")
    p_up.add_argument("run_dir", type=Path)
    p_up.add_argument("--nodes", type=int, default=4)
    p_up.add_argument("--no-volcano", action="store_true")
    p_up.add_argument("--argo-server", action="store_true")
    sub.add_parser("down").add_argument("run_dir", type=Path)
    sub.add_parser("check")
    sub.add_parser("taskresults").add_argument("kubeconfig")
    a = ap.parse_args(argv)
    if a.cmd == "up":
        return up(a.run_dir, a.nodes, not a.no_volcano, a.argo_server)
    if a.cmd == "down":
        return down(a.run_dir)
    if a.cmd == "taskresults":
        run_taskresult_reporter(a.kubeconfig)
        return 0
    m = missing()
    for x in m:
        print("missing:", x, file=sys.stderr)
    return 1 if m else 0
