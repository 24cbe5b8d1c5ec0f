"""Decode, resize and normalise staged images with NVIDIA DALI; write train/validation shards.

Shards: ``<output_uri>/<split>-<nnnnn>.npz`` with ``images`` float16 [N, 3, H, W] (normalised
to [-1, 1]: (x - 127.5) / 127.5) and ``labels`` int64 [N]; ``<output_uri>/index.json``
(:class:`ShardIndex`) lists them. Corrupt images are copied to ``<output_uri>/quarantine/``
and listed in ``quarantine.json``; more than ``max_corrupt_fraction`` of them fails the step.

The split is a pure function of each image's sha256 (no leakage between splits of duplicates,
the same split on every run of the same dataset, so champion and candidate are compared on
the same held-out images).

DALI device: ``mixed`` decode (nvJPEG) + GPU resize/normalise when a CUDA device is visible;
otherwise a CPU pipeline built with ``device_id=None`` (DALI refuses a GPU pipeline without
CUDA: REFERENCE.md §1).
"""

from __future__ import annotations

import io
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pipectl.components.contracts import (
    DatasetManifest,
    PreprocessInput,
    PreprocessOutput,
    ShardIndex,
    StoreSettings,
)
from pipectl.components.runtime import StepError, available_cpus, join_uri, parse_s3_uri, read_json, s3_client, write_json
from pipectl.components.shards import put_npz

log = logging.getLogger("pipectl.preprocess")

MEAN = [127.5, 127.5, 127.5]
STD = [127.5, 127.5, 127.5]


def in_validation(sha256: str, fraction: float) -> bool:
    """True when the image with content hash ``sha256`` belongs to the held-out split.

    Uses the first 32 bits of the hash as a uniform number in [0, 1).
    """
    return int(sha256[:8], 16) / 2**32 < fraction


def is_corrupt(data: bytes) -> str | None:
    """A reason string when ``data`` is not a decodable JPEG/PNG, else None.

    Cheap checks before DALI (which fails a whole batch on one bad image): format markers
    (JPEG SOI ``FFD8``; an EOI ``FFD9`` after the last start-of-scan ``FFDA``; the PNG signature)
    and PIL's ``verify()`` of the header and structure. Does not decode pixels.

    Bytes after the end-of-image marker are not corruption: decoders (libjpeg, PIL, DALI/nvJPEG)
    stop at EOI, and real files carry such tails — a CR LF from a text-mode copy (field case C13),
    zero padding, vendor trailers, a second image (MPO). A truncated JPEG lacks the EOI after its
    last scan; entropy-coded data cannot contain ``FFDA``/``FFD9`` (0xFF is byte-stuffed, ITU T.81
    B.1.1.5), so ``rfind`` finds real markers.
    """
    from PIL import Image

    if data[:2] == b"\xff\xd8":
        last_scan = data.rfind(b"\xff\xda")
        if last_scan < 0:
            return "truncated JPEG (no start-of-scan marker: no image data)"
        if data.rfind(b"\xff\xd9") < last_scan:
            return "truncated JPEG (no end-of-image marker after the last scan)"
    elif not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "neither a JPEG nor a PNG"
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.verify()
    except Exception as e:  # PIL raises many types for bad files
        return f"unreadable image: {e}"
    return None


def gpu_available() -> bool:
    """True when DALI sees at least one CUDA device."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:
        return False


def build_pipeline(batches: list[list[np.ndarray]], batch_size: int, image_size: int, use_gpu: bool, num_threads: int | None = None) -> Any:
    """DALI pipeline: external source of encoded bytes -> decode -> resize -> normalise (CHW).

    ``batches``: encoded images as uint8 arrays, at most ``batch_size`` per batch; the pipeline
    raises ``StopIteration`` after the last one. Output per batch: float [B, 3, image_size, image_size].
    ``num_threads``: DALI's CPU worker threads; default :func:`available_cpus` (the CPUs this
    pod may use: CPU decode scales with them, tests/bench/bench_preprocess.py).
    """
    if num_threads is None:
        num_threads = available_cpus()
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=0 if use_gpu else None)
    def pipe():  # type: ignore[no-untyped-def]
        encoded = fn.external_source(source=iter(batches), dtype=types.UINT8, ndim=1, batch=True, cycle=False)
        images = fn.decoders.image(encoded, device="mixed" if use_gpu else "cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=image_size, resize_y=image_size, antialias=True)
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mean=MEAN, std=STD)

    p = pipe()
    p.build()
    return p


def decode_all(encoded: list[bytes], image_size: int, batch_size: int, use_gpu: bool) -> tuple[np.ndarray, float]:
    """Run the DALI pipeline over ``encoded`` images (order kept).

    Returns (float16 array [N, 3, image_size, image_size], seconds spent in DALI).
    """
    if not encoded:
        return np.zeros((0, 3, image_size, image_size), np.float16), 0.0
    batches = [
        [np.frombuffer(b, dtype=np.uint8) for b in encoded[start:start + batch_size]]
        for start in range(0, len(encoded), batch_size)
    ]
    out = np.empty((len(encoded), 3, image_size, image_size), np.float16)
    t0 = time.perf_counter()
    pipe = build_pipeline(batches, batch_size, image_size, use_gpu)
    filled = 0
    while True:
        try:
            (result,) = pipe.run()
        except StopIteration:
            break
        if use_gpu:
            result = result.as_cpu()
        arr = np.asarray(result.as_tensor(), dtype=np.float32)
        out[filled:filled + len(arr)] = arr
        filled += len(arr)
    if filled != len(encoded):
        raise StepError(f"DALI returned {filled} images for {len(encoded)} inputs", "report this as a bug")
    return out, time.perf_counter() - t0


def decode_robust(encoded: list[bytes], image_size: int, batch_size: int, use_gpu: bool) -> tuple[np.ndarray, list[int], float]:
    """:func:`decode_all`, but an image DALI cannot decode is isolated instead of failing the lot.

    DALI fails a whole pipeline on one bad sample; on failure the list is split in halves and
    each half decoded with a fresh pipeline, down to single images. Cost: a clean list decodes
    once; each bad image adds ~log2(N) pipeline builds. Returns (images of the decodable ones in
    order [M, 3, S, S], indices of the undecodable ones, seconds in DALI).
    """
    try:
        images, seconds = decode_all(encoded, image_size, batch_size, use_gpu)
        return images, [], seconds
    except RuntimeError:
        if len(encoded) == 1:
            return np.zeros((0, 3, image_size, image_size), np.float16), [0], 0.0
    mid = len(encoded) // 2
    left, bad_left, s_left = decode_robust(encoded[:mid], image_size, batch_size, use_gpu)
    right, bad_right, s_right = decode_robust(encoded[mid:], image_size, batch_size, use_gpu)
    return np.concatenate([left, right]), bad_left + [mid + i for i in bad_right], s_left + s_right


def preprocess(inp: PreprocessInput, s3: Any, *, reader: Any = None) -> PreprocessOutput:
    """See the module doc. Raises :class:`StepError` (exit 1) when too many images are corrupt.

    ``s3``: the store (writes); ``reader``: where the staged images are read from (default ``s3``;
    Alluxio's S3 proxy when configured, see ``pipectl.components.alluxio.data_read_client``).
    """
    reader = s3 if reader is None else reader
    manifest = DatasetManifest.model_validate(read_json(s3, inp.manifest_uri))
    bucket, manifest_key = parse_s3_uri(inp.manifest_uri)
    data_prefix = manifest_key.rsplit("/", 1)[0] + "/data/"
    label_index = {label: i for i, label in enumerate(manifest.labels)}

    def fetch(key: str) -> bytes:
        return reader.get_object(Bucket=bucket, Key=data_prefix + key)["Body"].read()

    with ThreadPoolExecutor(max_workers=16) as pool:
        blobs = list(pool.map(fetch, [e.key for e in manifest.entries]))

    quarantined: list[dict[str, str]] = []

    def quarantine(key: str, blob: bytes, reason: str) -> None:
        quarantined.append({"key": key, "reason": reason})
        out_bucket, out_key = parse_s3_uri(join_uri(inp.output_uri, "quarantine", key))
        s3.put_object(Bucket=out_bucket, Key=out_key, Body=blob)
        log.warning("quarantined %s: %s", key, reason)

    candidates: dict[str, list[tuple[str, bytes, int]]] = {"train": [], "validation": []}
    for entry, blob in zip(manifest.entries, blobs):
        reason = is_corrupt(blob)
        if reason:
            quarantine(entry.key, blob, reason)
            continue
        split = "validation" if in_validation(entry.sha256, inp.validation_fraction) else "train"
        candidates[split].append((entry.key, blob, label_index[entry.label]))

    use_gpu = inp.device == "gpu" or (inp.device == "auto" and gpu_available())
    if inp.device == "gpu" and not gpu_available():
        raise StepError("device=gpu but DALI sees no CUDA device", "use device=auto or cpu, or schedule on a GPU node")
    decoded_splits: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    seconds = 0.0
    for split, items in candidates.items():
        images, bad, dali_s = decode_robust([b for _, b, _ in items], inp.image_size, inp.batch_size, use_gpu)
        seconds += dali_s
        for i in bad:
            quarantine(items[i][0], items[i][1], "DALI could not decode it")
        bad_set = set(bad)
        labels = np.asarray([y for i, (_, _, y) in enumerate(items) if i not in bad_set], dtype=np.int64)
        decoded_splits[split] = (images, labels)

    total = len(manifest.entries)
    if quarantined:
        write_json(s3, join_uri(inp.output_uri, "quarantine.json"), quarantined)
    if len(quarantined) > inp.max_corrupt_fraction * total:
        raise StepError(
            f"{len(quarantined)} of {total} images are corrupt ({len(quarantined) / total:.1%}), "
            f"above max-corrupt-fraction {inp.max_corrupt_fraction:.1%}",
            f"see {join_uri(inp.output_uri, 'quarantine.json')}; fix the dataset or raise max-corrupt-fraction",
        )
    counts = {split: len(labels) for split, (_, labels) in decoded_splits.items()}
    if not counts["train"] or not counts["validation"]:
        raise StepError(
            f"a split is empty (train {counts['train']}, validation {counts['validation']} images)",
            "use a larger dataset or a validation-fraction between 0.05 and 0.5",
        )

    shards: dict[str, list[str]] = {"train": [], "validation": []}
    for split, (images, labels) in decoded_splits.items():
        for n, start in enumerate(range(0, len(labels), inp.shard_size)):
            uri = join_uri(inp.output_uri, f"{split}-{n:05d}.npz")
            put_npz(s3, uri, images[start:start + inp.shard_size], labels[start:start + inp.shard_size])
            shards[split].append(uri)

    decoded = counts["train"] + counts["validation"]
    index = ShardIndex(
        labels=manifest.labels,
        image_size=inp.image_size,
        channels=3,
        mean=MEAN,
        std=STD,
        train=shards["train"],
        validation=shards["validation"],
        train_count=counts["train"],
        validation_count=counts["validation"],
    )
    write_json(s3, join_uri(inp.output_uri, "index.json"), index.model_dump(mode="json"))
    rate = decoded / seconds if seconds > 0 else 0.0
    device = "gpu (mixed)" if use_gpu else "cpu"
    log.info("DALI on %s: %d images in %.2f s (%.0f images/s); %d quarantined", device, decoded, seconds, rate, len(quarantined))
    return PreprocessOutput(
        shards_uri=inp.output_uri.rstrip("/") + "/",
        train_count=counts["train"],
        validation_count=counts["validation"],
        corrupt=len(quarantined),
        images_per_s=round(rate, 1),
        device=device,
    )


def run(inp: PreprocessInput, settings: StoreSettings) -> PreprocessOutput:
    from pipectl.components.alluxio import data_read_client

    return preprocess(inp, s3_client(settings), reader=data_read_client(settings))
