"""Benchmark 1, preprocess: the DALI step (CPU) vs. a PIL + ``torch.utils.data.DataLoader``.

Both do the same work on the same JPEG bytes held in memory: decode to RGB → resize to
``image_size``² (linear, antialiased) → normalise ``(x - 127.5) / 127.5`` to float CHW,
collected into one float16 array [N, 3, S, S] in order. Ours is
:func:`pipectl.components.preprocess.core.decode_all` (what the step runs, pipeline build
included) with the step's default batch size; the peer is what a PyTorch user writes without
DALI: a ``Dataset`` whose ``__getitem__`` uses PIL, and a ``DataLoader`` with as many worker
processes as DALI has threads (worker start-up included, as DALI's pipeline build is).

Data sets: the bundled digits (1,797 JPEGs, 32×32 → 32×32, the pipeline's default) and
``LARGE_COUNT`` deterministic 512×512 "photo-like" JPEGs (smooth colour waves plus noise,
quality 90) → 224×224.
"""

from __future__ import annotations

import io
import os
import tempfile
from pathlib import Path

import numpy as np

from tests.bench.table import Bench, Row, Stats, measure_pair, with_cpu

LARGE_COUNT = int(os.environ.get("BENCH_LARGE_IMAGES", "300"))


def digits_jpegs() -> list[bytes]:
    """The digits example exactly as ``pipectl data example`` writes it (sorted by path)."""
    from pipectl.components.data import write_example

    with tempfile.TemporaryDirectory(prefix="bench-digits-") as d:
        write_example("digits", Path(d))
        return [p.read_bytes() for p in sorted(Path(d).rglob("*.jpg"))]


def large_jpegs(count: int = LARGE_COUNT, side_px: int = 512, seed: int = 0) -> list[bytes]:
    """``count`` deterministic RGB JPEGs of ``side_px``² (quality 90): a few smooth colour waves
    per channel plus Gaussian noise, so they compress like photos rather than like flat colour
    or pure noise."""
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
    return out


class PilJpegs:
    """torch ``Dataset`` of encoded JPEGs: PIL decode → RGB → resize (bilinear; PIL's resize
    antialiases when shrinking) → float CHW normalised like the step."""

    def __init__(self, blobs: list[bytes], image_size: int) -> None:
        self.blobs, self.image_size = blobs, image_size

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        import torch
        from PIL import Image

        with Image.open(io.BytesIO(self.blobs[i])) as img:
            rgb = img.convert("RGB").resize((self.image_size, self.image_size), Image.BILINEAR)
        t = torch.from_numpy(np.asarray(rgb, dtype=np.float32)).permute(2, 0, 1)
        return (t - 127.5) / 127.5


def pil_dataloader(blobs: list[bytes], image_size: int, batch_size: int, workers: int) -> np.ndarray:
    """The peer: float16 [N, 3, S, S] via a DataLoader with ``workers`` worker processes."""
    from torch.utils.data import DataLoader

    out = np.empty((len(blobs), 3, image_size, image_size), np.float16)
    filled = 0
    for batch in DataLoader(PilJpegs(blobs, image_size), batch_size=batch_size, num_workers=workers, shuffle=False):
        out[filled:filled + len(batch)] = batch.numpy()
        filled += len(batch)
    assert filled == len(blobs)
    return out


def main() -> None:
    from pipectl.components.contracts import PreprocessInput
    from pipectl.components.preprocess.core import decode_all
    from pipectl.components.runtime import available_cpus

    batch_size = PreprocessInput.model_fields["batch_size"].default
    threads = available_cpus()  # DALI's threads in the step (build_pipeline's default)
    sets = [("digits 1,797 × 32² → 32²", digits_jpegs(), 32), (f"generated {LARGE_COUNT} × 512² → 224²", large_jpegs(), 224)]

    with Bench("preprocess", "Preprocess on CPU: images/s, decode → resize → normalise",
               f"DALI step (CPU, {threads} threads)", f"PIL DataLoader ({threads} workers)") as b:
        b.setup.update(batch_size=batch_size, dali_threads=threads, dataloader_workers=threads)
        for label, blobs, size in sets:
            # Same work, same result: both outputs agree to within resize-filter differences.
            ours_img, _ = decode_all(blobs, size, batch_size, use_gpu=False)
            peer_img = pil_dataloader(blobs, size, batch_size, threads)
            diff = float(np.abs(ours_img.astype(np.float32) - peer_img.astype(np.float32)).mean())
            cpu_ours: list[float] = []
            cpu_peer: list[float] = []
            ours, peer = measure_pair(with_cpu(lambda: decode_all(blobs, size, batch_size, use_gpu=False) and None, cpu_ours),
                                      with_cpu(lambda: pil_dataloader(blobs, size, batch_size, threads), cpu_peer), b.runs, b.warmup)
            b.rows.append(Row(label, "images/s", ours.rate(len(blobs)), peer.rate(len(blobs)), higher_is_better=True))
            b.rows.append(Row(f"{label}: CPU time per 1,000 images", "s", Stats(cpu_ours[b.warmup:]).scaled(1000 / len(blobs)),
                              Stats(cpu_peer[b.warmup:]).scaled(1000 / len(blobs)), note="user+sys, all threads and workers"))
            b.notes.append(f"{label}: {sum(map(len, blobs)) / len(blobs) / 1024:.1f} KiB per JPEG; mean |DALI − PIL| "
                           f"after normalisation {diff:.4f} (of a range of 2)")
        b.notes.append(f"Both include set-up (DALI pipeline build; DataLoader worker start), batch {batch_size}. "
                       "GPU (`mixed` decode) not measured: no GPU on this machine.")


if __name__ == "__main__":
    main()
