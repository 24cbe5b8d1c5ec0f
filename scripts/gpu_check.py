"""The GPU check: the training pipeline's step entrypoints on a GPU, and preprocess vs DALI's ceiling.

    python scripts/gpu_check.py [--sizes 500,2000] [--epochs 15] [--runs 3] [--json PATH]

What it runs, in order, each timed, and ONE table at the end (also ``$OUT/gpu-check.md`` and
``.json`` when ``$OUT`` is set, else beside ``--json``):

1. Services: moto's S3 server (a child process on loopback) and an MLflow file store
   (``file:`` URI; MLflow >= 3.x refuses it unless ``MLFLOW_ALLOW_FILE_STORE=true``, set here).
2. The pipeline through the same entrypoints the pods run (``python -m pipectl.components.<step>``):
   stage (the bundled digits) → preprocess ``--device gpu`` (``cpu`` without a GPU) → train under
   ``pipectl.components.train.launch`` (torchrun, 1 process: nccl on a GPU, gloo otherwise) →
   evaluate → register, twice (the second finds its own version: ``created`` false).
3. DDP: train again with 2 processes (``--nproc-per-node 2``, nccl) when the machine has >= 2 GPUs.
4. Preprocess benchmark at each size (512² JPEGs → 224², tests/bench/bench_preprocess.py's set),
   runs alternated: the step's decode-to-shards path from memory vs DALI alone (file reader,
   batch 256) — ``mixed`` on the GPU and ``cpu`` with every core — steady state and start-up; the
   whole step from S3 (``preprocess_timed``) on each device. Goals: GPU steady state
   >= 0.50× DALI's GPU ceiling, CPU >= 0.70× its ceiling, GPU step faster than CPU step from
   2,000 images up.

Without a GPU (this 2-core machine) every GPU-only row says ``no GPU: skipped`` and the rest runs
on the CPU, so the script itself is checked where it is written. Exit status: 0 when every row
that ran passed, 1 otherwise. Needs: the ``pipectl`` package importable (``scripts/gpu_check.sh``
arranges it on the GPU machine), torch, NVIDIA DALI, moto, mlflow-skinny, Pillow, boto3, pydantic.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.bench.* (the benchmark's data set and measured paths)


@dataclass
class Line:
    """One row of the table: ``part`` (pipeline / ddp / bench), what was run, on which device,
    the figure, what it is compared with, and ``status`` (ok / FAIL / skipped: why / goal met or not)."""

    part: str
    what: str
    device: str
    figure: str
    compared: str = ""
    status: str = "ok"
    seconds: float = 0.0


ROWS: list[Line] = []


def row(part: str, what: str, device: str, fn: Callable[[], tuple[str, str, str]]) -> Any:
    """Run ``fn`` (returns figure, compared-with, status); a failure becomes a FAIL row, not an abort."""
    t0 = time.perf_counter()
    try:
        figure, compared, status = fn()
    except Exception as e:  # the table must still be printed
        traceback.print_exc()
        figure, compared, status = "—", "", f"FAIL: {type(e).__name__}: {str(e)[-300:]}"
    ROWS.append(Line(part, what, device, figure, compared, status, time.perf_counter() - t0))
    print(f"[gpu-check] {part}: {what} [{device}]: {figure} {compared} -> {status} ({time.perf_counter() - t0:.1f} s)", flush=True)


def skipped(part: str, what: str, why: str) -> None:
    ROWS.append(Line(part, what, "gpu", "—", "", f"skipped: {why}"))
    print(f"[gpu-check] {part}: {what}: skipped: {why}", flush=True)


# ---------------------------------------------------------------- machine


def gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def dali_sees_gpu() -> bool:
    from pipectl.components.preprocess.core import gpu_available

    return gpu_available()


def machine() -> dict[str, Any]:
    facts: dict[str, Any] = {"python": platform.python_version(), "cores": os.cpu_count(), "gpus": gpus()}
    try:
        import torch

        facts["torch"] = torch.__version__
        if facts["gpus"]:
            facts["gpu"] = torch.cuda.get_device_name(0)
    except Exception as e:
        facts["torch"] = f"missing ({e})"
    try:
        import nvidia.dali

        facts["dali"] = nvidia.dali.__version__
    except Exception as e:
        facts["dali"] = f"missing ({e})"
    return facts


# ---------------------------------------------------------------- services and step entrypoints


class Services:
    """moto's S3 server (child process) + an MLflow file store under ``work``."""

    def __init__(self, work: Path) -> None:
        from tests.bench.bench_preprocess import moto_server

        self._cm = moto_server()
        self.s3_url = self._cm.__enter__()
        self.bucket = f"gpu-check-{uuid.uuid4().hex[:8]}"
        self.mlflow_uri = (work / "mlruns").as_uri()
        self.env = {
            **os.environ,
            "PIPECTL_S3_ENDPOINT": self.s3_url,
            "PIPECTL_S3_ACCESS_KEY": "gpu-check",
            "PIPECTL_S3_SECRET_KEY": "gpu-check-secret",
            "PIPECTL_BUCKET": self.bucket,
            "PIPECTL_MLFLOW_URI": self.mlflow_uri,
            "MLFLOW_ALLOW_FILE_STORE": "true",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "4"),
        }
        import boto3

        boto3.client("s3", endpoint_url=self.s3_url, aws_access_key_id="gpu-check", aws_secret_access_key="gpu-check-secret",
                     region_name="us-east-1").create_bucket(Bucket=self.bucket)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def step(env: dict[str, str], module: str, args: list[str], work: Path, timeout_s: float = 600, launch: list[str] | None = None) -> dict[str, Any]:
    """Run ``python -m <module> <args>`` (under ``train.launch`` when ``launch`` is given: its
    torchrun arguments); returns the step's output (the JSON its rank 0 prints last on stdout).
    Raises RuntimeError with the output's tail when it exits non-zero."""
    outputs = work / f"outputs-{module.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-m"] + (["pipectl.components.train.launch", *launch, "-m", module] if launch else [module])
    argv += args + ["--outputs-dir", str(outputs)]
    proc = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout_s, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} exited {proc.returncode}: {proc.stdout[-1500:]}")
    if launch:
        return json.loads((outputs / "output.json").read_text()) if (outputs / "output.json").exists() else _last_json(proc.stdout)
    return _last_json(proc.stdout)


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no output JSON in: {text[-800:]}")


def pipeline(svc: Services, work: Path, device: str, epochs: int, n_gpus: int) -> None:
    """stage → preprocess → train (1 process) → evaluate → register ×2, then DDP with 2 processes."""
    from pipectl.components.data import write_example

    env, b = svc.env, svc.bucket
    run_uri = f"s3://{b}/runs/gpu-check"
    model = f"gpu-check-{uuid.uuid4().hex[:6]}"
    state: dict[str, Any] = {}
    source = work / "digits"
    write_example("digits", source)

    def stage() -> tuple[str, str, str]:
        out = step(env, "pipectl.components.stage", ["--source-uri", str(source), "--bucket", b], work)
        state["manifest"] = out["manifest_uri"]
        return f"{out['objects']} objects, {out['bytes'] / 1e6:.1f} MB", "", "ok"

    def preprocess() -> tuple[str, str, str]:
        out = step(env, "pipectl.components.preprocess", [
            "--manifest-uri", state["manifest"], "--output-uri", f"s3://{b}/runs/gpu-check/shards/", "--image-size", "32",
            "--validation-fraction", "0.2", "--max-corrupt-fraction", "0.01", "--device", device], work)
        state["shards"] = out["shards_uri"]
        ok = out["device"].startswith("gpu") == (device == "gpu")
        return (f"{out['train_count']} + {out['validation_count']} images, {out['images_per_s']:,.0f} images/s steady, "
                f"on {out['device']}"), "", "ok" if ok else f"FAIL: ran on {out['device']}"

    def train(nproc: int, uri: str) -> Callable[[], tuple[str, str, str]]:
        def go() -> tuple[str, str, str]:
            t0 = time.perf_counter()
            out = step(env, "pipectl.components.train", [
                "--shards-uri", state["shards"], "--run-uri", uri, "--workflow-name", f"gpu-check-{nproc}",
                "--model-name", model, "--epochs", str(epochs), "--batch-size", "32", "--learning-rate", "0.002",
                "--checkpoint-every-steps", "200", "--seed", "0"], work, launch=["--standalone", "--nproc-per-node", str(nproc)])
            wall = time.perf_counter() - t0
            ok = out["world_size"] == nproc
            return (f"{out['steps']} steps, world size {out['world_size']}, train accuracy {out['train_accuracy']:.3f}, "
                    f"{wall:.1f} s wall"), "", "ok" if ok else f"FAIL: world size {out['world_size']}"
        return go

    def stopped() -> tuple[str, str, str]:
        """The gang's stop on this device: SIGTERM to the launcher after epoch 1 (periodic
        checkpoints far apart): 143 with a checkpoint of the step it was in; the rerun resumes there."""
        args = [
            "--shards-uri", state["shards"], "--run-uri", f"s3://{b}/runs/gpu-check-stop", "--workflow-name", "gpu-check-stop",
            "--model-name", model, "--epochs", "4", "--batch-size", "32", "--learning-rate", "0.002",
            "--checkpoint-every-steps", "100000", "--seed", "0"]
        argv = [sys.executable, "-m", "pipectl.components.train.launch", "--standalone", "--nproc-per-node", "1",
                "-m", "pipectl.components.train", *args, "--outputs-dir", str(work / "outputs-stop")]
        log = work / "stop.log"
        with log.open("w") as f:
            proc = subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while "epoch 1 of 4 done" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                return "", "", f"FAIL: no epoch 1 (exit {proc.poll()}): {log.read_text()[-600:]}"
            time.sleep(0.05)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
        took = time.perf_counter() - t0
        told = [ln for ln in log.read_text().splitlines() if "told to stop at step" in ln]
        if code != 143 or not told:
            return "", "", f"FAIL: exit {code}, no checkpoint line: {log.read_text()[-600:]}"
        at = int(told[-1].split("told to stop at step ")[1].split()[0])
        out = step(env, "pipectl.components.train", args, work, launch=["--standalone", "--nproc-per-node", "1"])
        ok = out["resumed_from_step"] == at and out["steps"] > at
        return (f"exit 143 {took:.1f} s after SIGTERM, checkpoint at step {at}; rerun resumed from "
                f"{out['resumed_from_step']}, {out['steps']} steps"), "periodic checkpoints every 100000 steps", \
            "ok" if ok else f"FAIL: resumed from {out['resumed_from_step']}"

    def evaluate() -> tuple[str, str, str]:
        out = step(env, "pipectl.components.evaluate", [
            "--shards-uri", state["shards"], "--run-uri", run_uri, "--model-name", model,
            "--promotion-metric", "accuracy", "--promotion-threshold", "0.5"], work)
        state["evaluation"] = out
        return f"held-out accuracy {out['metric']:.3f}, decision {out['decision']}", "threshold 0.5", "ok"

    def register(n: int) -> Callable[[], tuple[str, str, str]]:
        def go() -> tuple[str, str, str]:
            from pipectl.components.contracts import EvaluateOutput, RegisterInput

            handed_over = [k for k in RegisterInput.model_fields if k in EvaluateOutput.model_fields]  # as the pipeline does
            handed = [arg for key in handed_over if state["evaluation"].get(key) is not None
                      for arg in (f"--{key.replace('_', '-')}", str(state["evaluation"][key]))]
            out = step(env, "pipectl.components.register", [
                "--model-name", model, "--run-key", "gpu-check-run", "--promotion-metric", "accuracy", *handed], work)
            want_created = n == 1
            ok = out["created"] == want_created
            return (f"version {out['version']}, alias {out['alias']}, created {out['created']}", "",
                    "ok" if ok else f"FAIL: created should be {want_created}")
        return go

    steps: list[tuple[str, Callable[[], tuple[str, str, str]]]] = [
        ("stage (digits)", stage), (f"preprocess --device {device}", preprocess),
        (f"train, 1 process ({'nccl' if device == 'gpu' else 'gloo'})", train(1, run_uri)),
        ("evaluate", evaluate), ("register", register(1)), ("register again (retry)", register(2)),
        ("train told to stop (SIGTERM after epoch 1), then resumed", stopped),
    ]
    for name, fn in steps:
        before = len([r for r in ROWS if r.status.startswith("FAIL")])
        row("pipeline", name, device, fn)
        if len([r for r in ROWS if r.status.startswith("FAIL")]) > before:
            break  # later steps need this one's output
    if n_gpus >= 2 and "shards" in state:
        row("ddp", "train, 2 processes (nccl)", "gpu", train(2, f"s3://{b}/runs/gpu-check-ddp"))
    else:
        skipped("ddp", "train, 2 processes (nccl)", "no GPU" if not n_gpus else f"{n_gpus} GPU (needs 2)")


# ---------------------------------------------------------------- preprocess benchmark


def same_shards(blobs: list[bytes], batch: int, threads: int) -> tuple[str, str, str]:
    """The GPU step's shards (outputs copied straight into page-locked shard memory) against the
    same images decoded on the GPU and copied out with ``as_cpu()``, image by image, per split."""
    import numpy as np

    from tests.bench import bench_preprocess as bp

    from pipectl.components.preprocess.decode import decode_all

    kept: list[Any] = []
    bp.step_path(blobs, 224, batch, threads, keep=kept, use_gpu=True)
    splits, _ = bp._splits(blobs)
    ref, _ = decode_all(blobs, 224, batch, True)
    want = {s: ref[[i for i, x in enumerate(splits) if x == s]] for s in ("train", "validation")}
    got = {s: next((k for k in kept if k.shape == w.shape and np.array_equal(k, w)), None) for s, w in want.items()}
    equal = all(g is not None for g in got.values())
    return (f"{sum(len(k) for k in kept):,} images in {len(kept)} shards",
            f"train {len(want['train']):,}, validation {len(want['validation']):,}: "
            + ("equal, image by image" if equal else "DIFFERENT"), "ok" if equal else "FAIL")


def bench(svc: Services, work: Path, sizes: list[int], runs: int, has_gpu: bool) -> None:
    """Step path vs DALI alone at each size, on the GPU (when there is one) and on the CPU."""
    import statistics

    from tests.bench import bench_preprocess as bp

    from pipectl.components.contracts import PreprocessInput
    from pipectl.components.runtime import available_cpus

    threads = available_cpus()
    batch = PreprocessInput.model_fields["batch_size"].default
    med = statistics.median
    rates: dict[tuple[str, int], float] = {}
    for n in sizes:
        blobs = bp.large_jpegs(n)
        files = bp.write_files(blobs, work / f"jpegs-{n}")
        for device in ("gpu", "cpu"):
            label = f"{n:,} × 512² → 224²"
            if device == "gpu" and not has_gpu:
                skipped("bench", f"{label}: the step's shards vs as_cpu() copies of the same decode", "no GPU")
                skipped("bench", f"{label}: step path vs DALI alone (mixed), steady state", "no GPU")
                skipped("bench", f"{label}: whole step from S3 (--device gpu)", "no GPU")
                continue
            goal = 0.50 if device == "gpu" else 0.70
            ceiling_device = "mixed" if device == "gpu" else "cpu"

            def versus(device: str = device, n: int = n, blobs: list[bytes] = blobs, files: list[str] = files,
                       goal: float = goal, ceiling_device: str = ceiling_device) -> tuple[str, str, str]:
                ours, peer, s_ours, s_peer = [], [], [], []
                bp.step_path(blobs, 224, batch, threads, use_gpu=device == "gpu")  # warm-up (imports, first build)
                bp.dali_ceiling(files, 224, threads, ceiling_device)
                for _ in range(runs):
                    ours.append(n / bp.step_path(blobs, 224, batch, threads, s_ours, use_gpu=device == "gpu"))
                    peer.append(n / bp.dali_ceiling(files, 224, threads, ceiling_device, s_peer))
                ratio = med(ours) / med(peer)
                rates[(device, n)] = med(ours)
                return (f"{med(ours):,.0f} images/s steady (start-up {med(s_ours):.2f} s)",
                        f"DALI alone {med(peer):,.0f} images/s (start-up {med(s_peer):.2f} s): {ratio:.2f}×",
                        f"{'met' if ratio >= goal else 'NOT met'} (goal ≥ {goal:.2f}×)")

            if device == "gpu":
                row("bench", f"{label}: the step's shards vs as_cpu() copies of the same decode", device,
                    lambda blobs=blobs: same_shards(blobs, batch, threads))
            row("bench", f"{label}: step path vs DALI alone ({ceiling_device}), steady state", device, versus)

            def whole(device: str = device, n: int = n, blobs: list[bytes] = blobs) -> tuple[str, str, str]:
                key = f"staged-{n}"
                if key not in svc.__dict__:
                    svc.__dict__[key] = bp.stage_blobs(svc.s3_url, blobs, work / key)
                s3c, bucket, manifest = svc.__dict__[key]
                parts: list[Any] = []
                walls = [bp.step_from_s3(s3c, bucket, manifest, 224, parts, device) for _ in range(max(1, runs - 1))]
                p = parts[-1]
                return (f"{n / med(walls):,.0f} images/s end to end ({med(walls):.2f} s)",
                        f"start-up {p.decode.startup_s:.2f} s, steady {p.decode.steady_images_per_s:,.0f} images/s, "
                        f"waited for bytes {p.decode.feed_wait_s:.2f} s, last PUTs {p.tail_s:.2f} s", "ok")

            row("bench", f"{label}: whole step from S3 (moto, same machine)", device, whole)
        if has_gpu and ("gpu", n) in rates and ("cpu", n) in rates:
            g, c = rates[("gpu", n)], rates[("cpu", n)]
            status = ("met" if g > c else "NOT met") + " (goal: GPU faster from 2,000 images)" if n >= 2000 else "ok"
            ROWS.append(Line("bench", f"{n:,} × 512² → 224²: GPU step vs CPU step, steady state", "gpu/cpu",
                             f"{g / c:.2f}×", f"{g:,.0f} vs {c:,.0f} images/s", status))


# ---------------------------------------------------------------- table


def table(facts: dict[str, Any], started: str, wall_s: float) -> str:
    head = ["part", "what", "device", "figure", "compared with", "status", "s"]
    lines = [f"**GPU check** ({started}, {wall_s:.0f} s): " + ", ".join(f"{k} {v}" for k, v in facts.items()), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ROWS:
        lines.append("| " + " | ".join([r.part, r.what, r.device, r.figure, r.compared, r.status, f"{r.seconds:.0f}"]) + " |")
    if not facts.get("gpus"):
        lines += ["", "no GPU: the GPU rows were skipped; everything else ran on the CPU."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=None, help="image counts for the benchmark (default 500,2000 on a GPU, 500 without)")
    ap.add_argument("--epochs", type=int, default=None, help="train epochs (default 15 on a GPU, 2 without)")
    ap.add_argument("--runs", type=int, default=3, help="alternated runs per benchmark pair")
    ap.add_argument("--json", default=None, help="write rows here too (default $OUT/gpu-check.json when $OUT is set)")
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args(argv)

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    t0 = time.perf_counter()
    facts = machine()
    has_gpu = bool(facts["gpus"]) and dali_sees_gpu()
    if not has_gpu:
        print("[gpu-check] no GPU: GPU-only rows are skipped, the rest runs on the CPU", flush=True)
    sizes = [int(x) for x in (args.sizes or ("500,2000" if has_gpu else "500")).split(",")]
    os.environ.setdefault("BENCH_PREPROCESS_SIZES", ",".join(map(str, sizes)))  # large_jpegs generates the largest once
    epochs = args.epochs or (15 if has_gpu else 2)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    svc = Services(work)
    try:
        if not args.skip_pipeline:
            pipeline(svc, work, "gpu" if has_gpu else "cpu", epochs, facts["gpus"])
        if not args.skip_bench:
            bench(svc, work, sizes, args.runs, has_gpu)
    finally:
        svc.close()
        shutil.rmtree(work, ignore_errors=True)
    text = table(facts, started, time.perf_counter() - t0)
    print("\n" + text, flush=True)
    target = Path(args.json) if args.json else (Path(os.environ["OUT"]) / "gpu-check.json" if os.environ.get("OUT") else None)
    if target:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps({"machine": facts, "started_utc": started, "rows": [asdict(r) for r in ROWS]}, indent=2) + "\n")
        target.with_suffix(".md").write_text(text)
    return 1 if any(r.status.startswith("FAIL") for r in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())
