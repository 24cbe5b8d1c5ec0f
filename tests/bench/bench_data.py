"""Benchmark: the training split streamed shard by shard (ours) vs. loaded whole into memory
(a ``TensorDataset`` of the split and a shuffling ``DataLoader``, what a user writes first).

Generated 64x64 RGB shards (float16, as preprocess writes them, 2,048 images each) of 5k, 20k
and 50k images in the embedded S3 server (moto). Each measurement is one fresh process (one
epoch, batch 256, one training process) that prints its own peak RSS and its wall time from the
first read to the last batch, S3 reads included for both sides:

- **memory**: the loader alone (each batch converted to float32 tensors): peak RSS per size;
- **training**: a SmallCNN training step per batch on the 5k set: images/s.

Then the product end to end, no peer: the ``stage -> preprocess -> train`` tasks of the compiled
``training`` template through the local backend (as ``pipectl run`` runs them), on generated
64x64 JPEG shapes (``examples/image-classifier``) of 5k and 50k images, one epoch, two training
processes: the train step's ``peak_rss_mib`` (largest over the gang, from MLflow) and wall time.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.bench.table import Bench, Row, Stats

SIZES = (5_000, 20_000, 50_000)
IMAGE, SHARD, BATCH = 64, 2048, 256
HERE = Path(__file__).resolve().parents[2]


def make_split(s3, bucket: str, n: int) -> str:
    """``n`` random images in shards of :data:`SHARD` under ``s3://bucket/n<n>/``; returns the URI."""
    from pipectl.components.contracts import ShardIndex
    from pipectl.components.runtime import join_uri, write_json
    from pipectl.components.shards import put_npz

    uri = f"s3://{bucket}/n{n}/"
    rng = np.random.default_rng(n)
    uris, sizes = [], []
    for first in range(0, n, SHARD):
        k = min(SHARD, n - first)
        uris.append(join_uri(uri, f"train-{len(uris):05d}.npz"))
        put_npz(s3, uris[-1], rng.standard_normal((k, 3, IMAGE, IMAGE), dtype=np.float32).astype(np.float16),
                rng.integers(0, 10, k).astype(np.int64))
        sizes.append(k)
    index = ShardIndex(labels=[str(i) for i in range(10)], image_size=IMAGE, channels=3, mean=[0.0] * 3, std=[1.0] * 3,
                       train=uris, validation=uris[:1], train_count=n, validation_count=sizes[0],
                       train_sizes=sizes, validation_sizes=sizes[:1])
    write_json(s3, join_uri(uri, "index.json"), index.model_dump(mode="json"))
    return uri


def child(mode: str, shards_uri: str, train: bool) -> None:
    """One epoch in this process; prints {"seconds", "images", "peak_rss_mib"}."""
    import torch

    from pipectl.components.contracts import StoreSettings
    from pipectl.components.runtime import s3_client

    torch.manual_seed(0)
    s3 = s3_client(StoreSettings())
    model = opt = None
    if train:
        from pipectl.components.models import build_model

        model = build_model("small-cnn", 10, 3)
        opt = torch.optim.Adam(model.parameters())
    t0, seen = time.perf_counter(), 0
    for x, y in _batches(mode, s3, shards_uri):
        seen += len(y)
        if model is not None:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "images": seen,
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _batches(mode: str, s3, shards_uri: str):
    import torch

    if mode == "stream":
        from pipectl.components.shard_stream import ShardStream

        for images, labels in ShardStream(s3, shards_uri, "train", seed=0).batches(0, BATCH):
            yield torch.from_numpy(images).float(), torch.from_numpy(labels)
    else:
        from torch.utils.data import DataLoader, TensorDataset

        from pipectl.components.shards import load_split

        images, labels, _ = load_split(s3, shards_uri, "train")
        yield from DataLoader(TensorDataset(torch.from_numpy(images), torch.from_numpy(labels)), batch_size=BATCH,
                              shuffle=True, generator=torch.Generator().manual_seed(0))


def _run(env: dict[str, str], mode: str, uri: str, train: bool) -> dict:
    argv = [sys.executable, "-m", "tests.bench.bench_data", "--child", mode, uri] + (["--train"] if train else [])
    out = subprocess.run(argv, env=env, cwd=HERE, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{mode} {uri} exited {out.returncode}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def pipeline_rows(b: Bench, tmp: Path) -> None:
    """The end-to-end rows (module doc), one run per size."""
    from mlflow import MlflowClient

    from pipectl.components.contracts import RunSettings
    from pipectl.pipelines.backends.runner import LocalRunner
    from pipectl.pipelines.backends.services import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices
    from pipectl.pipelines.builtin import build_training
    from pipectl.pipelines.training import CompileConfig
    from tests.bench.bench_train import only_tasks

    sys.path.insert(0, str(HERE / "examples" / "image-classifier"))
    from shapes.generate import CLASSES, generate

    template = only_tasks(build_training(CompileConfig()).to_dict(), ["stage", "preprocess", "train"], {})
    with EmbeddedServices(tmp / "e2e", s3=True, mlflow=True) as svc:
        settings = RunSettings(s3_endpoint=svc.s3_url, s3_access_key=S3_ACCESS_KEY, s3_secret_key=S3_SECRET_KEY, mlflow_uri=svc.mlflow_url)
        env = {**os.environ, **settings.step_env()}
        for n in (5_000, 50_000):
            data = tmp / f"shapes-{n}"
            generate(data, n // len(CLASSES), size=IMAGE)
            t0 = time.perf_counter()
            result = LocalRunner(template, {"dataset-uri": str(data), "image-size": str(IMAGE), "epochs": "1",
                                            "processes-per-worker": "2", "model-name": "bench-data"}, env, tmp / "runs").run()
            wall = time.perf_counter() - t0
            if result.phase != "Succeeded":
                raise RuntimeError(f"pipeline on {n} images: {result.phase}; see {result.workdir}")
            out = json.loads((result.workdir / "train" / "outputs" / "output.json").read_text())
            peak = MlflowClient(svc.mlflow_url).get_run(out["mlflow_run_id"]).data.metrics["peak_rss_mib"]
            b.rows.append(Row(f"pipectl run, {n:,} images, 2 processes: train peak RSS", "MiB", Stats([peak]),
                              goal="flat (±10%) from 5k to 50k" if n == 50_000 else ""))
            b.rows.append(Row(f"pipectl run, {n:,} images, 2 processes: stage+preprocess+train wall", "s", Stats([wall])))


def main() -> None:
    from pipectl.components.contracts import StoreSettings
    from pipectl.components.runtime import s3_client
    from pipectl.pipelines.backends.services import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices

    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp, EmbeddedServices(Path(tmp), s3=True, mlflow=False) as svc, \
            Bench("data", "Training split: streamed shard by shard vs. loaded whole (64x64, float16 shards in S3)",
                  "streamed (ShardStream)", "whole split in memory (TensorDataset + DataLoader)") as b:
        settings = StoreSettings(s3_endpoint=svc.s3_url, s3_access_key=S3_ACCESS_KEY, s3_secret_key=S3_SECRET_KEY, bucket="bench")
        s3 = s3_client(settings)
        s3.create_bucket(Bucket="bench")
        uris = {n: make_split(s3, "bench", n) for n in SIZES}
        env = {**os.environ, **settings.step_env(), "OMP_NUM_THREADS": str(os.cpu_count() or 1)}
        runs = max(2, b.runs // 2)
        for n in SIZES:
            rss: dict[str, list[float]] = {"stream": [], "memory": []}
            for _ in range(runs):
                for mode in rss:
                    rss[mode].append(_run(env, mode, uris[n], False)["peak_rss_mib"])
            b.rows.append(Row(f"{n:,} images: peak RSS of the loader process", "MiB", Stats(rss["stream"]), Stats(rss["memory"]),
                              goal="flat (±10%) from 5k to 50k" if n == SIZES[-1] else ""))
        rate: dict[str, list[float]] = {"stream": [], "memory": []}
        for i in range(b.warmup + b.runs):
            for mode in rate:
                r = _run(env, mode, uris[SIZES[0]], True)
                if i >= b.warmup:
                    rate[mode].append(r["images"] / r["seconds"])
        b.rows.append(Row(f"{SIZES[0]:,} images, SmallCNN training, 1 process: images/s (S3 reads included)", "images/s",
                          Stats(rate["stream"]), Stats(rate["memory"]), higher_is_better=True, goal="≥ 0.9×"))
        pipeline_rows(b, Path(tmp))
        b.setup.update(sizes=list(SIZES), image_size=IMAGE, shard_images=SHARD, batch=BATCH, rss_runs=runs)
        b.notes.append("Peak RSS includes the Python interpreter, torch and numpy (~400 MiB before any data). "
                       "The streamed loader holds the shards of its current and next window (about 4 shards of "
                       f"{SHARD * 3 * IMAGE * IMAGE * 2 / 2**20:.0f} MiB here); the in-memory loader holds the split as float32.")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], "--train" in sys.argv[4:])
    else:
        main()
