"""Benchmark 1, preprocess: the step's DALI path vs. DALI's own ceiling and vs. PIL + DataLoader.

Every variant does the same work on the same JPEGs: decode to RGB → resize to ``image_size``²
(linear, antialiased) → uint8 CHW [N, 3, S, S] (what the shards store; readers normalise a batch
at a time on their device).

- **Step path** (ours): :func:`pipectl.components.preprocess.core.decode_to_shards`, what the
  step runs between fetching and the store: batches fed from Python into DALI's external source,
  one pipeline for both splits, every image copied into its split's shard file, the file
  finished (headers, CRC, zip directory) and read to its end in a writer thread as an upload
  would read it, with the step's batch size and DALI threads. Fed from bytes in memory.
- **DALI alone** (the ceiling): ``fn.readers.file`` over the same files written to a
  temporary folder (page cache) + the same decode/resize/transpose, batch 256, CPU, as many
  threads as the step; its outputs are not copied anywhere.
- **Steady state**: images after the first batch ÷ seconds from the first batch out to the last
  (the step's own figure); for DALI alone, ``ceil(N / 256)`` batches timed after 2 warm-up
  batches. **Start-up**: pipeline build + first batch out, for both.
- **Whole step from the store**: ``preprocess_timed`` against a Ceph RGW started here (moto's
  S3 server where Ceph is not installed), on the same cores: the store's CPU is taken from
  decoding, and is counted; the data set staged once; wall time from reading the manifest to
  ``index.json`` written (fetch, sha256 checks, decode, shard PUTs). Beside it: CPU per image of
  the step, of DALI alone and of the store, and this machine's limit for a client that cost only
  DALI's CPU (cores ÷ (DALI + store CPU per image)). Then again with the store on half the cores
  and the step and DALI alone on the other half (every thread's affinity set; DALI with as many
  threads as it has cores), as on a cluster where the store runs on machines of its own.
- **PIL DataLoader** (the peer a PyTorch user picks without DALI), as a careful user writes it:
  a ``Dataset`` whose ``__getitem__`` uses PIL with ``Image.draft`` (reduced-size JPEG decode) and
  returns uint8, a ``DataLoader`` with as many worker processes as DALI has threads (worker
  start-up included, as the step's pipeline build is).

Data sets: the bundled digits (1,797 JPEGs, 32×32 → 32×32, the pipeline's default) and
deterministic 512×512 "photo-like" JPEGs (smooth colour waves plus noise, quality 90) → 224×224,
at the sizes in ``BENCH_PREPROCESS_SIZES`` (default ``500,2000``).
"""

from __future__ import annotations

import io
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tests.bench.table import Bench, Row, Stats, cpu_seconds, measure_pair, with_cpu

SIZES = [int(x) for x in os.environ.get("BENCH_PREPROCESS_SIZES", "500,2000").split(",")]
S3_RUNS = int(os.environ.get("BENCH_PREPROCESS_S3_RUNS", "3"))
CEILING_BATCH = 256


def digits_jpegs() -> list[bytes]:
    """The digits example exactly as ``pipectl data example`` writes it (sorted by path)."""
    from pipectl.components.data import write_example

    with tempfile.TemporaryDirectory(prefix="bench-digits-") as d:
        write_example("digits", Path(d))
        return [p.read_bytes() for p in sorted(Path(d).rglob("*.jpg"))]


@lru_cache(maxsize=2)
def _large(count: int, side_px: int, seed: int) -> tuple[bytes, ...]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side_px, 0:side_px].astype(np.float32) / side_px
    out = []
    for _ in range(count):
        img = np.empty((side_px, side_px, 3), np.float32)
        for c in range(3):
            fx, fy = rng.uniform(0.5, 6.0, 2)
            phase = rng.uniform(0, 2 * np.pi)
            img[..., c] = 127.5 + 70 * np.sin(2 * np.pi * (fx * xx + fy * yy) + phase) + 30 * np.cos(2 * np.pi * fy * xx * yy)
        img += rng.normal(0, 10, img.shape).astype(np.float32)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return tuple(out)


def large_jpegs(count: int = 500, side_px: int = 512, seed: int = 0) -> list[bytes]:
    """``count`` deterministic RGB JPEGs of ``side_px``² (quality 90): a few smooth colour waves
    per channel plus Gaussian noise, so they compress like photos rather than like flat colour
    or pure noise. The first ``k`` of a larger set equal ``large_jpegs(k)`` (one generator
    stream), so the largest size is generated once (~25 ms per image on one core)."""
    biggest = max([count, *SIZES])
    return list(_large(biggest, side_px, seed)[:count])


class PilJpegs:
    """torch ``Dataset`` of encoded JPEGs as a careful PyTorch user writes it: ``Image.draft``
    (libjpeg decodes at 1/2, 1/4 or 1/8 scale when that still covers the target size) → RGB →
    resize (bilinear; PIL's resize antialiases when shrinking) → uint8 CHW out of the worker (a
    quarter of float32's bytes through the DataLoader's shared memory; normalising is a batch
    operation on the device, as the step's readers do)."""

    def __init__(self, blobs: list[bytes], image_size: int) -> None:
        self.blobs, self.image_size = blobs, image_size

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        import torch
        from PIL import Image

        with Image.open(io.BytesIO(self.blobs[i])) as img:
            img.draft("RGB", (self.image_size, self.image_size))
            rgb = img.convert("RGB").resize((self.image_size, self.image_size), Image.BILINEAR)
        return torch.from_numpy(np.asarray(rgb, dtype=np.uint8)).permute(2, 0, 1)


def pil_dataloader(blobs: list[bytes], image_size: int, batch_size: int, workers: int) -> np.ndarray:
    """The peer: uint8 [N, 3, S, S] via a DataLoader with ``workers`` worker processes."""
    from torch.utils.data import DataLoader

    out = np.empty((len(blobs), 3, image_size, image_size), np.uint8)
    filled = 0
    for batch in DataLoader(PilJpegs(blobs, image_size), batch_size=batch_size, num_workers=workers, shuffle=False):
        out[filled:filled + len(batch)] = batch.numpy()
        filled += len(batch)
    assert filled == len(blobs)
    return out


# ---------------------------------------------------------------- the step's path, DALI alone


def _splits(blobs: list[bytes], fraction: float = 0.2) -> tuple[list[str], np.ndarray]:
    import hashlib

    from pipectl.components.preprocess.split import in_validation

    splits = ["validation" if in_validation(hashlib.sha256(b).hexdigest(), fraction) else "train" for b in blobs]
    return splits, (np.arange(len(blobs)) % 10).astype(np.int64)


def _read_to_end(uri: str, body: Any) -> None:
    """Stand-in for the store in the in-memory runs: reads the shard file as an upload would."""
    while body.read(1 << 20):
        pass


def step_path(blobs: list[bytes], image_size: int, batch_size: int, threads: int, startup: list[float] | None = None,
              keep: list[np.ndarray] | None = None, use_gpu: bool = False) -> float:
    """One run of the step's decode-to-shards path on in-memory bytes (``use_gpu``: ``mixed`` decode).

    Returns N ÷ steady-state images/s (seconds, so that ``Stats.rate(N)`` is the steady rate);
    appends start-up seconds to ``startup``; with ``keep``, also the shard images (for checking).
    """
    from pipectl.components.preprocess.core import StepTimings, decode_to_shards

    splits, labels = _splits(blobs)
    timings = StepTimings()

    def put(uri: str, body: Any) -> None:
        if keep is not None:
            with np.load(io.BytesIO(body.read())) as z:
                keep.append(z["images"])
        else:
            _read_to_end(uri, body)

    decode_to_shards(enumerate(blobs), splits, labels, output_uri="s3://bench/shards/", image_size=image_size,
                     batch_size=batch_size, shard_size=2048, use_gpu=use_gpu, put=put,
                     on_undecodable=lambda i, b: None, timings=timings, num_threads=threads)
    if startup is not None:
        startup.append(timings.decode.startup_s)
    rate = timings.decode.steady_images_per_s
    if rate <= 0:
        raise RuntimeError(f"no steady state with {len(blobs)} images in batches of {batch_size}")
    return len(blobs) / rate


def dali_ceiling(files: list[str], image_size: int, threads: int, device: str = "cpu", startup: list[float] | None = None,
                 cpu_per_image: list[float] | None = None) -> float:
    """DALI alone: file reader → decode (``cpu`` or ``mixed``) → resize → normalise, batch 256.

    Returns seconds for ``len(files)`` images at the steady rate (``ceil(N / 256)`` batches timed
    after 2 warm-up batches); appends build + first batch seconds to ``startup``.
    """
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=CEILING_BATCH, num_threads=threads, device_id=None if device == "cpu" else 0)
    def pipe():  # type: ignore[no-untyped-def]
        encoded, _ = fn.readers.file(files=files)
        images = fn.decoders.image(encoded, device=device, output_type=types.RGB)
        images = fn.resize(images, resize_x=image_size, resize_y=image_size, antialias=True)
        return fn.transpose(images, perm=[2, 0, 1])  # uint8 CHW, as the step stores it

    t0 = time.perf_counter()
    p = pipe()
    p.build()
    p.run()
    if startup is not None:
        startup.append(time.perf_counter() - t0)
    p.run()
    batches = math.ceil(len(files) / CEILING_BATCH)
    t1, c1 = time.perf_counter(), cpu_seconds()
    for _ in range(batches):
        (out,) = p.run()
    if device != "cpu":
        out.as_cpu()  # outputs are not copied out; this one waits for the GPU's queue to drain
    seconds = time.perf_counter() - t1
    if cpu_per_image is not None:
        cpu_per_image.append((cpu_seconds() - c1) / (batches * CEILING_BATCH))
    del p
    return seconds * len(files) / (batches * CEILING_BATCH)


def write_files(blobs: list[bytes], folder: Path) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, b in enumerate(blobs):
        p = folder / f"{i:05d}.jpg"
        p.write_bytes(b)
        paths.append(str(p))
    return paths


# ---------------------------------------------------------------- whole step from the store


@dataclass
class Store:
    """An S3 server for the whole-step runs: ``url``, a client, and ``cpu()``: its CPU seconds so far."""

    name: str
    url: str
    client: Any
    cpu: Callable[[], float]
    pids: Callable[[], list[int]]


@contextmanager
def store(work: Path) -> Iterator[Store]:
    """Ceph RGW (tests/ceph: the store the product targets, its daemons' CPU counted) when its
    packages are installed, else moto's S3 server (a Python process; its CPU counted too)."""
    from tests.bench.bench_storage import _ceph_cpu, _ceph_pids, _group_pids, pids_cpu
    from tests.ceph.ceph import CephCluster, missing_packages

    if not missing_packages():
        with CephCluster(work / "ceph", memstore_bytes=8 << 30) as ceph:
            yield Store("Ceph RGW", ceph.s3_endpoint, ceph.s3_client(), lambda: _ceph_cpu(ceph), lambda: _ceph_pids(ceph))
        return
    with moto_process() as (url, proc):
        from pipectl.components.contracts import StoreSettings
        from pipectl.components.runtime import s3_client

        client = s3_client(StoreSettings(s3_endpoint=url, s3_access_key="bench", s3_secret_key="bench-secret",
                                         bucket="unused", mlflow_uri="http://127.0.0.1:1"))
        yield Store("moto", url, client, lambda: pids_cpu(_group_pids(proc.pid) or [proc.pid]),
                    lambda: _group_pids(proc.pid) or [proc.pid])


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 server in a child process on a free loopback port; yields its URL."""
    with moto_process() as (url, _):
        yield url


@contextmanager
def moto_process() -> Iterator[tuple[str, subprocess.Popen]]:
    """:func:`moto_server`, yielding its URL and process."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/moto-api/", timeout=1)
                break
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError("moto's S3 server exited at start")
                time.sleep(0.05)
        yield url, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def stage_blobs(url: str, blobs: list[bytes], work: Path) -> tuple[Any, str, str]:
    """Stage ``blobs`` (ImageFolder, 10 classes) into moto's server at ``url``; returns (client, bucket, manifest URI)."""
    from pipectl.components.contracts import StoreSettings
    from pipectl.components.runtime import s3_client

    return stage_into(s3_client(StoreSettings(s3_endpoint=url, s3_access_key="bench", s3_secret_key="bench-secret",
                                              bucket="unused", mlflow_uri="http://127.0.0.1:1")), blobs, work)


def stage_into(s3: Any, blobs: list[bytes], work: Path) -> tuple[Any, str, str]:
    """Stage ``blobs`` (ImageFolder, 10 classes) with the stage step through ``s3`` into a new bucket."""
    from pipectl.components.contracts import StageInput
    from pipectl.components.stage.core import stage

    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    for i, b in enumerate(blobs):
        p = work / str(i % 10) / f"img_{i:05d}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b)
    return s3, bucket, stage(StageInput(source_uri=str(work), bucket=bucket), s3).manifest_uri


def step_from_s3(s3: Any, bucket: str, manifest_uri: str, image_size: int, parts: list[Any] | None = None, device: str = "cpu") -> float:
    """One run of the whole step (``preprocess_timed`` on ``device``); returns its wall seconds."""
    from pipectl.components.contracts import PreprocessInput
    from pipectl.components.preprocess.core import preprocess_timed

    inp = PreprocessInput(manifest_uri=manifest_uri, output_uri=f"s3://{bucket}/runs/{uuid.uuid4().hex[:8]}/shards/",
                          image_size=image_size, validation_fraction=0.2, max_corrupt_fraction=0.01, device=device)
    _, timings = preprocess_timed(inp, s3)
    if parts is not None:
        parts.append(timings)
    return timings.wall_s


def _pin(pids: list[int], cores: set[int]) -> None:
    """Every thread of the processes ``pids`` onto ``cores`` (the threads they start later inherit it)."""
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                os.sched_setaffinity(int(tid), cores)
            except OSError:  # a thread that has ended
                pass


@contextmanager
def store_apart(st: "Store") -> Iterator[int]:
    """The store on the first half of this machine's cores, this process (the step, DALI alone)
    on the other half, as on a cluster where the store runs on machines of its own; yields the
    client's cores. Every thread's affinity is restored after."""
    every = sorted(os.sched_getaffinity(0))
    half = max(1, len(every) // 2)
    _pin(st.pids(), set(every[:half]))
    _pin([os.getpid()], set(every[half:]))
    try:
        yield len(every) - half
    finally:
        _pin([os.getpid(), *st.pids()], set(every))


def whole_step_rows(label: str, n: int, blobs: list[bytes], files: list[str], threads: int, work: Path,
                    parts: list[Any], apart: bool = False) -> list[Row]:
    """The whole step from the store against DALI alone, alternated, with where the CPU went: the
    step's own (client), the store's, and DALI alone's per image; the limit of this machine for a
    client that cost only DALI's CPU (the store shares the cores); per-round ratios.
    ``apart``: the store on half the cores, the step and DALI alone (with as many threads as they
    have cores) on the other half (:func:`store_apart`); the limit rows are left out (the store
    takes no CPU from the client)."""
    with store(work) as st:
        s3, bucket, manifest_uri = stage_into(st.client, blobs, work / "staged")
        if not apart:
            return _whole_step(label, n, files, threads, st, s3, bucket, manifest_uri, parts, apart)
        with store_apart(st) as client_cores:
            return _whole_step(label, n, files, client_cores, st, s3, bucket, manifest_uri, parts, apart)


def _whole_step(label: str, n: int, files: list[str], threads: int, st: "Store", s3: Any, bucket: str,
                manifest_uri: str, parts: list[Any], apart: bool) -> list[Row]:
    cores = threads
    client: list[float] = []
    served: list[float] = []
    dali: list[float] = []

    def whole() -> float:
        c0, k0 = cpu_seconds(), st.cpu()
        wall = step_from_s3(s3, bucket, manifest_uri, 224, parts)
        client.append(cpu_seconds() - c0)
        served.append(st.cpu() - k0)
        return wall

    ours, peer = measure_pair(whole, lambda: dali_ceiling(files, 224, threads, cpu_per_image=dali), S3_RUNS, 1)
    client, served, dali = client[1:], served[1:], dali[1:]  # after the warm-up pair
    ms = lambda xs, per=n: Stats([1000 * x / per for x in xs])  # noqa: E731
    limit = Stats([cores / (d + s / n) for d, s in zip(dali, served)])
    at = f"{label}, whole step from the store" + (f" on its own core{'s' if cores > 1 else ''}" if apart else "")
    where = (f"{st.name} on other cores; the step and DALI alone on {cores} core{'s' if cores > 1 else ''}, "
             f"{cores} DALI thread{'s' if cores > 1 else ''}" if apart else f"{st.name} on the same cores")
    rows = [
        Row(f"{at} ({where}), end to end: vs DALI alone steady state", "images/s", ours.rate(n),
            peer.rate(n), higher_is_better=True, goal="≥ 0.80×"),
        Row(f"{at} ÷ DALI alone, per round", "×", Stats([b_ / a_ for a_, b_ in zip(ours.samples, peer.samples)]), None,
            higher_is_better=True),
        Row(f"{at}: client CPU per image vs DALI alone's (user+sys, all threads)", "ms", ms(client), ms(dali, 1)),
        Row(f"{at}: the store's own CPU per image ({st.name}: GETs of the JPEGs, PUTs of the shards)", "ms", ms(served), None),
    ]
    if apart:
        return rows
    return rows + [
        Row(f"{at}: limit here, a client costing only DALI's CPU ({cores} cores ÷ (DALI + store CPU per image))",
            "images/s", limit, None, higher_is_better=True),
        Row(f"{at} ÷ that limit", "×", Stats([n / w / lim for w, lim in zip(ours.samples, limit.samples)]), None,
            higher_is_better=True),
    ]


def growth(sizes: list[int], runs: int) -> None:
    """The growth curve of the whole step from the store: ``sizes`` images of 128² (the same
    generator, quality 90, ~11 KiB each) → 64², staged once each into one Ceph RGW; wall and CPU
    per image, and the marginal cost of an image between sizes (linear: the slope stays flat; the
    per-image figure at the smallest size still carries the start-up)."""
    threads = _available_cpus()
    with Bench("preprocess-growth", "Preprocess, whole step from the store: growth with the number of images",
               "whole step (DALI CPU)", "—", runs=runs, warmup=1) as b, \
            tempfile.TemporaryDirectory(prefix="bench-preprocess-growth-") as tmp, store(Path(tmp)) as st:
        b.setup.update(sizes=sizes, runs=runs, side_px=128, image_size=64, dali_threads=threads, store=st.name)
        walls: dict[int, list[float]] = {}
        for n in sizes:
            blobs = list(_large(n, 128, 1))
            s3, bucket, manifest_uri = stage_into(st.client, blobs, Path(tmp) / f"staged-{n}")
            if n == sizes[0]:
                step_from_s3(s3, bucket, manifest_uri, 64)  # warm-up: imports, RGW pools
            walls[n], client, served = [], [], []
            for _ in range(runs):
                c0, k0 = cpu_seconds(), st.cpu()
                walls[n].append(step_from_s3(s3, bucket, manifest_uri, 64))
                client.append(cpu_seconds() - c0)
                served.append(st.cpu() - k0)
            kib = sum(map(len, blobs)) / n / 1024
            b.rows.append(Row(f"{n:,} images (128² → 64², {kib:.1f} KiB each): ms per image, end to end", "ms",
                              Stats([1000 * w / n for w in walls[n]]), None))
            b.rows.append(Row(f"{n:,} images: client CPU per image", "ms", Stats([1000 * c / n for c in client]), None))
            b.rows.append(Row(f"{n:,} images: the store's CPU per image ({st.name})", "ms", Stats([1000 * s / n for s in served]), None))
            del blobs
        slopes = []
        for a, z in zip(sizes, sizes[1:]):
            slope = Stats([1000 * (wz - wa) / (z - a) for wa, wz in zip(walls[a], walls[z])])
            slopes.append(slope.median)
            b.rows.append(Row(f"marginal ms per image from {a:,} to {z:,} images", "ms", slope, None))
        if len(slopes) > 1 and min(slopes) > 0:
            b.rows.append(Row("largest ÷ smallest marginal cost", "×", Stats([max(slopes) / min(slopes)]), None, goal="≤ 1.10 (linear)"))
        b.notes.append(f"{threads} DALI threads; the store on the same cores; one run per size after one warm-up unless "
                       "--growth-runs says otherwise")


def _wall_note(at: str, mine: list[Any], jpeg_bytes: float) -> str:
    """Where the whole step's wall time went (medians of ``mine``, the runs' StepTimings)."""
    med = lambda xs: float(np.median(xs))  # noqa: E731
    return (f"{at} (median of {len(mine)}): wall {med([p.wall_s for p in mine]):.2f} s = start-up "
            f"{med([p.decode.startup_s for p in mine]):.2f} s + steady decode {med([p.decode.steady_s for p in mine]):.2f} s "
            f"({med([p.decode.steady_images_per_s for p in mine]):.0f} images/s) + last shard PUTs "
            f"{med([p.tail_s for p in mine]):.2f} s (+ manifest, index); decoding waited "
            f"{med([p.decode.feed_wait_s for p in mine]):.2f} s for bytes; shard PUTs {med([p.put_s for p in mine]):.2f} s "
            f"in the writer thread; {jpeg_bytes / 1024:.1f} KiB per JPEG")


def _available_cpus() -> int:
    from pipectl.components.runtime import available_cpus

    return available_cpus()


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--growth", default="", help="sizes of the growth curve (comma-separated, e.g. 1000,10000,50000): "
                    "run only it, into results/preprocess-growth.{md,json}")
    ap.add_argument("--growth-runs", type=int, default=1)
    args = ap.parse_args([] if argv is None else argv)  # tests.bench.run calls main()
    if args.growth:
        growth([int(x) for x in args.growth.split(",") if x.strip()], args.growth_runs)
        return
    from pipectl.components.contracts import PreprocessInput
    from pipectl.components.preprocess.decode import decode_all
    from pipectl.components.runtime import available_cpus

    batch_size = PreprocessInput.model_fields["batch_size"].default
    threads = available_cpus()  # DALI's threads in the step (build_pipeline's default)
    digits = digits_jpegs()

    with Bench("preprocess", "Preprocess on CPU: images/s, decode → resize → uint8 shards",
               f"step path (DALI CPU, {threads} threads)", "peer (named in each case)") as b, \
            tempfile.TemporaryDirectory(prefix="bench-preprocess-") as tmp:
        b.setup.update(batch_size=batch_size, dali_threads=threads, dataloader_workers=threads, sizes=SIZES,
                       ceiling_batch=CEILING_BATCH, s3_runs=S3_RUNS)
        for n in SIZES:
            blobs = large_jpegs(n)
            files = write_files(blobs, Path(tmp) / f"files-{n}")
            label = f"{n:,} × 512² → 224²"
            # same work, same result: the step's shards equal DALI alone's outputs, image by image
            kept: list[np.ndarray] = []
            step_path(blobs, 224, batch_size, threads, keep=kept)
            splits, _ = _splits(blobs)
            ref, _ = decode_all(blobs, 224, batch_size, False)
            by_split = {s: ref[[i for i, x in enumerate(splits) if x == s]] for s in ("train", "validation")}
            assert sum(len(k) for k in kept) == n and any(np.array_equal(k, by_split["train"]) for k in kept)
            s_ours: list[float] = []
            s_peer: list[float] = []
            ours, peer = measure_pair(lambda: step_path(blobs, 224, batch_size, threads, s_ours),
                                      lambda: dali_ceiling(files, 224, threads, "cpu", s_peer), b.runs, b.warmup)
            b.rows.append(Row(f"{label}, steady state: vs DALI alone (file reader, batch {CEILING_BATCH})", "images/s",
                              ours.rate(n), peer.rate(n), higher_is_better=True, goal="≥ 0.70×"))
            b.rows.append(Row(f"{label}, start-up (pipeline build + first batch): vs DALI alone", "s",
                              Stats(s_ours[b.warmup:]), Stats(s_peer[b.warmup:])))
            for apart in (False, True) if threads >= 2 else (False,):
                parts: list[Any] = []
                b.rows += whole_step_rows(label, n, blobs, files, threads, Path(tmp) / f"store-{n}-{apart}", parts, apart)
                b.notes.append(_wall_note(f"{label}, whole step from the store" + (" on its own cores" if apart else ""),
                                          parts[1:], sum(map(len, blobs)) / n))

        # the peer a PyTorch user would pick: PIL + DataLoader, set-up included on both sides
        for label, blobs, size in [("digits 1,797 × 32² → 32²", digits, 32), (f"{SIZES[0]:,} × 512² → 224²", large_jpegs(SIZES[0]), 224)]:
            ours_img, _ = decode_all(blobs, size, batch_size, False)
            peer_img = pil_dataloader(blobs, size, batch_size, threads)
            diff = float(np.abs(ours_img.astype(np.float32) - peer_img.astype(np.float32)).mean())
            cpu_ours: list[float] = []
            cpu_peer: list[float] = []

            # wall time of the whole call (start-up included): the lambda returns None, not step_path's figure
            ours, peer = measure_pair(with_cpu(lambda: step_path(blobs, size, batch_size, threads) and None, cpu_ours),
                                      with_cpu(lambda: pil_dataloader(blobs, size, batch_size, threads), cpu_peer), b.runs, b.warmup)
            b.rows.append(Row(f"{label}: vs PIL DataLoader ({threads} workers), set-up included", "images/s",
                              ours.rate(len(blobs)), peer.rate(len(blobs)), higher_is_better=True))
            b.rows.append(Row(f"{label}: CPU time per 1,000 images vs PIL DataLoader", "s", Stats(cpu_ours[b.warmup:]).scaled(1000 / len(blobs)),
                              Stats(cpu_peer[b.warmup:]).scaled(1000 / len(blobs)), note="user+sys, all threads and workers"))
            b.notes.append(f"{label}: {sum(map(len, blobs)) / len(blobs) / 1024:.1f} KiB per JPEG; mean |DALI − PIL| "
                           f"{diff:.2f} of 255 (PIL's draft decodes at a reduced scale first)")
        b.notes.append(
            f"Step path: decode_to_shards fed from memory (batch {batch_size}, both splits in one pipeline, shard files "
            "assembled and read to the end in a writer thread); DALI alone: fn.readers.file from the page cache, outputs not "
            "copied. Ratios from runs alternated in one process. GPU (`mixed` decode): `make gpu-check` on a GPU machine; "
            "not measured here (no GPU).")


if __name__ == "__main__":
    main(sys.argv[1:])
