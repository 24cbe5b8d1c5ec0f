"""Benchmark 3, local backend overhead: ``pipectl run training`` vs. its steps run directly.

- **ours**: ``pipectl run training -p epochs=E --state-dir <fresh> --output json`` (a fresh
  state folder each time, so the embedded S3 server starts empty and stage copies everything,
  and MLflow starts on a new sqlite store, as on a first ``make demo``).
- **peer**: the same work by hand: start the same two servers (``python -m moto.server`` and
  ``mlflow server`` with the arguments and environment :mod:`pipectl.pipelines.backends.services` uses),
  both at once, readiness polled every 0.05 s; then each step's exact argv as the previous
  ``pipectl run`` executed it (its ``runs/<workflow>/<task>/argv.json``), with a new workflow
  name, uid, state folder and master port, one after the other; then stop the servers.
- **Σ steps**: the same direct step runs, servers excluded: the literal "sum of its steps".

The per-step rows compare the local backend's own timing of each task (``duration_s`` in the
summary: spawn to exit of the step's processes) with the direct run of the same argv.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from tests.bench.table import Bench, Row, Stats, measure_pair, run_cmd, with_cpu

EPOCHS = int(os.environ.get("BENCH_PIPELINE_EPOCHS", "1"))
STEPS = ("stage", "preprocess", "train", "evaluate", "register")


def _free_port() -> int:
    from pipectl.pipelines.backends.processes import free_port

    return free_port()


def _wait(url: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.05)
    raise RuntimeError(f"{url} not ready after {timeout_s} s")


class ByHand:
    """The peer: servers started by hand, steps run directly."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.last_run: Path | None = None  # runs/<workflow>/ of the latest `pipectl run`
        self.services_s: list[float] = []
        self.steps_s: dict[str, list[float]] = {s: [] for s in STEPS}

    def run(self) -> None:
        assert self.last_run is not None, "needs a pipectl run first (for the argv of each step)"
        state = self.root / f"hand-{secrets.token_hex(3)}"
        logs = state / "logs"
        logs.mkdir(parents=True)
        t0 = time.perf_counter()
        s3_port, mlflow_port = _free_port(), _free_port()
        mlflow_root = state / "mlflow"
        mlflow_root.mkdir()
        procs = [
            subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
                             stdout=open(logs / "s3.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True),
            subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server",
                              "--backend-store-uri", f"sqlite:///{mlflow_root / 'mlflow.db'}",
                              "--artifacts-destination", (mlflow_root / "artifacts").as_uri(),
                              "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"],
                             env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
                             stdout=open(logs / "mlflow.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True),
        ]
        try:
            _wait(f"http://127.0.0.1:{s3_port}/moto-api/", procs[0])
            _wait(f"http://127.0.0.1:{mlflow_port}/health", procs[1])
            self.services_s.append(time.perf_counter() - t0)
            env = {**os.environ, "PIPECTL_S3_ENDPOINT": f"http://127.0.0.1:{s3_port}", "PIPECTL_S3_ACCESS_KEY": "pipectl",
                   "PIPECTL_S3_SECRET_KEY": "pipectl-embedded", "PIPECTL_S3_REGION": "us-east-1", "PIPECTL_BUCKET": "pipectl",
                   "PIPECTL_MLFLOW_URI": f"http://127.0.0.1:{mlflow_port}", "MLFLOW_DISABLE_TELEMETRY": "true"}
            old = json.loads((self.last_run / "workflow.json").read_text())
            new_name, new_uid = f"training-{secrets.token_hex(3)[:5]}", str(uuid.uuid4())
            workdir = state / "runs" / new_name
            for step in STEPS:
                (argv,) = json.loads((self.last_run / step / "argv.json").read_text())
                text = json.dumps(argv).replace(str(self.last_run), str(workdir)).replace(old["name"], new_name).replace(old["uid"], new_uid)
                argv = json.loads(text)
                argv = [re.sub(r"^--master-port=\d+$", f"--master-port={_free_port()}", a) for a in argv]
                exe = Path(sys.executable).parent / ("python" if argv[0] == "python" else argv[0])
                (workdir / step / "outputs").mkdir(parents=True, exist_ok=True)
                self.steps_s[step].append(run_cmd([str(exe), *argv[1:]], env=env))
        finally:
            for p in procs:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            for p in procs:
                p.wait(timeout=30)


def main() -> None:
    pipectl = str(Path(sys.executable).parent / "pipectl")
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp, \
            Bench("pipeline", f"Local backend: `pipectl run training -p epochs={EPOCHS}` vs. its steps run directly",
                  "pipectl run", "by hand (servers + steps)") as b:
        root = Path(tmp)
        hand = ByHand(root)
        ours_steps: dict[str, list[float]] = {s: [] for s in STEPS}

        def ours() -> None:
            state = root / f"ours-{secrets.token_hex(3)}"
            proc = subprocess.run([pipectl, "run", "training", "-p", f"epochs={EPOCHS}", "--state-dir", str(state), "--output", "json"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"pipectl run exited {proc.returncode}: {proc.stderr[-3000:]}")
            summary = json.loads(proc.stdout)
            for s in summary["steps"]:
                ours_steps[s["task"]].append(s["duration_s"])
            hand.last_run = Path(summary["workdir"])

        # warm-up by hand: a pipectl run first, so there is an argv to replay
        ours()
        cpu_ours: list[float] = []
        cpu_hand: list[float] = []
        ours_wall, hand_wall = measure_pair(with_cpu(ours, cpu_ours), with_cpu(hand.run, cpu_hand), b.runs, b.warmup)
        keep = slice(-b.runs, None)  # drop the warm-up runs' figures
        steps_sum = Stats([sum(hand.steps_s[s][i] for s in STEPS) for i in range(len(hand.services_s))][keep])
        b.rows.append(Row("whole pipeline, wall", "s", ours_wall, hand_wall, goal="overhead < 10%"))
        b.rows.append(Row("whole pipeline, CPU time of every process (user+sys)", "s", Stats(cpu_ours[keep]), Stats(cpu_hand[keep]),
                          goal="overhead < 10%"))
        b.rows.append(Row("whole pipeline vs Σ of the 5 steps alone (servers not counted)", "s", ours_wall, steps_sum))
        # Outside the steps: what orchestration adds, without the (noisy, CPU-bound) steps themselves.
        ours_in_steps = [sum(ours_steps[s][i] for s in STEPS) for i in range(len(ours_steps["stage"]))][keep]
        ours_outside = Stats([w - x for w, x in zip(ours_wall.samples, ours_in_steps)])
        hand_outside = Stats([w - x for w, x in zip(hand_wall.samples, steps_sum.samples)])
        b.rows.append(Row("time outside the steps (wall − Σ step times)", "s", ours_outside, hand_outside,
                          note="CLI, checks, servers up/down, gaps"))
        for s in STEPS:
            b.rows.append(Row(f"step {s}", "s", Stats(ours_steps[s][keep]), Stats(hand.steps_s[s][keep]),
                              note="local backend's duration_s vs the same argv run directly"))
        b.rows.append(Row("servers up (moto S3 + MLflow, by hand, both at once)", "s", None, Stats(hand.services_s[keep])))
        b.setup.update(epochs=EPOCHS)
        extra = ours_outside.median - hand_outside.median
        b.notes.append(f"Orchestration overhead estimated without the steps' noise: median time outside the steps, ours − by hand "
                       f"= {extra:+.2f} s = {extra / hand_wall.median * 100:+.1f}% of the by-hand wall time (goal < 10%).")
        b.notes.append("Both start from nothing each time: an empty S3 server (stage copies all 1,797 files) and a new "
                       "MLflow sqlite store; `pipectl run` also imports its CLI, validates the dataset and compiles the template.")


if __name__ == "__main__":
    main()
