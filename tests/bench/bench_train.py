"""Benchmark 2, training step: DDP on CPU (gloo) with 1 and 2 processes, launched by our local
backend vs. a bare ``torchrun`` of the same module with the same arguments.

- **ours**: :class:`pipectl.pipelines.backends.runner.LocalRunner` running the compiled ``training``
  WorkflowTemplate cut down to its ``train`` task (shards given as a literal): the Volcano Job
  manifest is substituted and parsed, each pod runs ``torchrun --nnodes=1 --node-rank=0
  --nproc-per-node=N --master-addr=127.0.0.1 --master-port=<free> -m pipectl.components.train …``
  as ``pipectl run`` does (its process-gang supervisor polls every 0.05 s).
- **peer**: ``torchrun --standalone --nproc-per-node=N -m pipectl.components.train …`` with the
  same arguments and environment, what a user would type.

Both talk to the same embedded S3 (moto) and MLflow servers, started once, with shards of the
digits set made once by the real stage and preprocess steps. Each launch trains a fresh run
(its own run URI and MLflow run: nothing resumed). Wall time is launch to exit of the whole
gang; samples/s and time per epoch are from the training loop only (rank 0's MLflow metric
``samples_per_s`` and the step count: epoch time = loop time / epochs, samples/s = train
images × epochs / loop time).
"""

from __future__ import annotations

import copy
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.bench.table import Bench, Row, Stats, measure_pair, run_cmd, with_cpu

EPOCHS = int(os.environ.get("BENCH_TRAIN_EPOCHS", "1"))


def only_tasks(template: dict[str, Any], keep: list[str], literals: dict[str, str]) -> dict[str, Any]:
    """A copy of compiled ``template`` whose DAG keeps only the tasks ``keep``; an argument value
    equal to a key of ``literals`` (e.g. ``{{tasks.preprocess.outputs.parameters.shards-uri}}``)
    is replaced by its value, and dependencies on dropped tasks are removed."""
    t = copy.deepcopy(template)
    entry = next(x for x in t["spec"]["templates"] if x["name"] == t["spec"]["entrypoint"])
    tasks = [task for task in entry["dag"]["tasks"] if task["name"] in keep]
    for task in tasks:
        task["dependencies"] = [d for d in task.get("dependencies", []) if d in keep]
        if not task["dependencies"]:
            task.pop("dependencies")
        for p in task.get("arguments", {}).get("parameters", []):
            p["value"] = literals.get(p.get("value"), p.get("value"))
    entry["dag"]["tasks"] = tasks
    return t


class TrainBench:
    """Embedded services + digits shards, and the two ways of launching the train step."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir

    def __enter__(self) -> "TrainBench":
        from pipectl.components.contracts import RunSettings, TrainingParameters
        from pipectl.pipelines.backends.services import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices
        from pipectl.pipelines.backends.runner import LocalRunner
        from pipectl.pipelines.builtin import build_training
        from pipectl.pipelines.training import CompileConfig

        self.services = EmbeddedServices(self.state_dir, s3=True, mlflow=True).__enter__()
        settings = RunSettings(s3_endpoint=self.services.s3_url, s3_access_key=S3_ACCESS_KEY, s3_secret_key=S3_SECRET_KEY,
                               mlflow_uri=self.services.mlflow_url)
        self.env = {**os.environ, **settings.step_env()}
        self.template = build_training(CompileConfig()).to_dict()
        self.defaults = TrainingParameters().as_arguments()
        # Shards once, by the real stage and preprocess steps through the local backend.
        prep = LocalRunner(only_tasks(self.template, ["stage", "preprocess"], {}), {}, self.env, self.state_dir / "runs")
        result = prep.run()
        if result.phase != "Succeeded":
            raise RuntimeError(f"stage/preprocess failed: see {result.workdir}")
        out = result.node("preprocess").outputs
        self.shards_uri, self.train_count = out["shards-uri"], int(out["train-count"])
        self.train_only = only_tasks(self.template, ["train"], {"{{tasks.preprocess.outputs.parameters.shards-uri}}": self.shards_uri})
        self.metrics: dict[tuple[str, int], list[float]] = {}
        return self

    def __exit__(self, *exc: object) -> None:
        self.services.stop()

    def _loop_seconds(self, outputs_dir: Path) -> float:
        """Seconds of rank 0's training loop, from its MLflow metric samples_per_s (see module doc)."""
        from mlflow import MlflowClient

        out = json.loads((outputs_dir / "output.json").read_text())
        metrics = MlflowClient(self.services.mlflow_url).get_run(out["mlflow_run_id"]).data.metrics
        batch = int(self.defaults["batch-size"])
        return out["steps_this_attempt"] * batch * out["world_size"] / metrics["samples_per_s"]

    def ours(self, processes: int) -> None:
        from pipectl.pipelines.backends.runner import LocalRunner

        runner = LocalRunner(self.train_only, {"epochs": str(EPOCHS), "processes-per-worker": str(processes)}, self.env,
                             self.state_dir / "runs")
        result = runner.run()
        if result.phase != "Succeeded":
            raise RuntimeError(f"train via LocalRunner failed: {result.node('train').message}; log {result.node('train').log_path}")
        self.metrics.setdefault(("ours", processes), []).append(self._loop_seconds(result.workdir / "train" / "outputs"))

    def peer(self, processes: int) -> None:
        name = f"bench-{secrets.token_hex(3)}"
        outputs = self.state_dir / "bare" / name
        d = self.defaults
        argv = [
            str(Path(sys.executable).parent / "torchrun"), "--standalone", f"--nproc-per-node={processes}",
            "-m", "pipectl.components.train",
            "--shards-uri", self.shards_uri, "--run-uri", f"s3://{d.get('bucket', 'pipectl')}/runs/{name}",
            "--model-name", d["model-name"], "--epochs", str(EPOCHS), "--batch-size", d["batch-size"],
            "--learning-rate", d["learning-rate"], "--checkpoint-every-steps", d["checkpoint-every-steps"],
            "--seed", d["seed"], "--workflow-name", name, "--outputs-dir", str(outputs),
        ]
        run_cmd(argv, env=self.env)
        self.metrics.setdefault(("peer", processes), []).append(self._loop_seconds(outputs))


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp, TrainBench(Path(tmp)) as tb, \
            Bench("train", f"Training step, DDP on CPU (gloo), digits {EPOCHS} epoch{'s' if EPOCHS != 1 else ''}", "pipectl local backend", "bare torchrun --standalone") as b:
        b.setup.update(epochs=EPOCHS, batch_size_per_process=int(tb.defaults["batch-size"]), train_images=tb.train_count)
        for n in (1, 2):
            tb.metrics.clear()
            cpu = {"ours": [], "peer": []}  # type: dict[str, list[float]]
            ours, peer = measure_pair(with_cpu(lambda: tb.ours(n), cpu["ours"]), with_cpu(lambda: tb.peer(n), cpu["peer"]), b.runs, b.warmup)
            # the warm-up runs' loop times are dropped like their wall times
            loop = {k: Stats(v[b.warmup:]) for k, v in tb.metrics.items()}
            samples = tb.train_count * EPOCHS
            label = f"{n} process{'es' if n > 1 else ''}"
            outside = {side: Stats([w - l for w, l in zip(wall.samples, loop[(side, n)].samples)])
                       for side, wall in (("ours", ours), ("peer", peer))}
            b.rows.append(Row(f"{label}: wall time of one launch", "s", ours, peer, goal="overhead < 5%"))
            b.rows.append(Row(f"{label}: CPU time of one launch (all processes, user+sys)", "s", Stats(cpu["ours"][b.warmup:]),
                              Stats(cpu["peer"][b.warmup:]), goal="overhead < 5%"))
            b.rows.append(Row(f"{label}: time outside the training loop", "s", outside["ours"], outside["peer"],
                              note="wall − loop: start-up, S3, MLflow, exit"))
            b.rows.append(Row(f"{label}: samples/s in the loop", "samples/s",
                              loop[("ours", n)].rate(samples), loop[("peer", n)].rate(samples), higher_is_better=True))
            b.rows.append(Row(f"{label}: time per epoch", "s",
                              loop[("ours", n)].scaled(1 / EPOCHS), loop[("peer", n)].scaled(1 / EPOCHS)))
        b.notes.append(f"{tb.train_count} training images, batch {tb.defaults['batch-size']} per process, SmallCNN; a launch "
                       "also imports torch, joins the process group, loads shards from S3, logs to MLflow and saves the model.")


if __name__ == "__main__":
    main()
