"""The preprocess step: decode and resize staged images with NVIDIA DALI; write train/validation
shards of their pixels.

Shards: ``<output_uri>/<split>-<nnnnn>.npz`` with ``images`` uint8 [N, 3, H, W] (the resized
pixels; train and evaluate normalise them to [-1, 1], (x - 127.5) / 127.5, with the index's mean
and std) and ``labels`` int64 [N]; ``<output_uri>/index.json``
(:class:`ShardIndex`) lists them. Corrupt images are copied to ``<output_uri>/quarantine/``
and listed in ``quarantine.json`` (key, :class:`Corrupt` category, reason); more than
``max_corrupt_fraction`` of them fails the step.

This module runs the step; the rest of the package holds its parts: split.py (the split rule
and the order of the entries), screen.py (what is corrupt: the checks before decoding and the
quarantine verdicts), decode.py (DALI on GPU or CPU, and the PIL fallback decoder), stream.py
(fetching ahead and batching), writer.py (shard files and index.json), npz.py (a shard file
assembled in place).

Flow (fetching overlaps decoding, start-up is reported apart from steady state)::

    S3 GETs + cheap checks   ──►  DALI pipeline (one for both    ──►  shard files assembled in
    (16 threads, in manifest      splits; external source fed        place (npz.py), PUT by a
     order, at most 4 batches     from the main thread, uint8        writer thread while the
     or 512 MiB ahead)            CHW out)                           next batches decode

Every object is fetched once, both splits share one pipeline, and a shard is written while the
next batches decode, each image copied once into the shard's bytes; a large shard is sent part by
part while it fills (upload.py), so the last shards do not wait for the last image to start. Memory is bounded by the
prefetch window and the shard buffers (one open per split, at most 2 being written, finished
ones reused), not by the data set.

``PreprocessOutput.images_per_s`` is the steady-state decode rate (images after the first batch
÷ seconds from the first batch out to the last); with a single batch there is no steady state
and it is the images ÷ start-up seconds. The step's log line gives start-up (pipeline build,
first batch), steady state, the time decoding waited for bytes, and the shard writes.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from pipectl.components.contracts import (
    DatasetLayout,
    DatasetManifest,
    PreprocessInput,
    PreprocessOutput,
    StoreSettings,
)
from pipectl.components.runtime import StepError, join_uri, parse_s3_uri, read_json, s3_client, write_json
from pipectl.components.preprocess.decode import DecodeTimings, decode_stream, for_decoding, gpu_available
from pipectl.components.preprocess.screen import Corrupt, Verdict, quarantine_summary
from pipectl.components.preprocess.split import list_entries
from pipectl.components.preprocess.stream import PREFETCH_BATCHES, batched, prefetch_ordered
from pipectl.components.preprocess.upload import streamer
from pipectl.components.preprocess.writer import WRITES_IN_FLIGHT, ShardWriter, shard_images, write_index

log = logging.getLogger("pipectl.preprocess")


@dataclass
class StepTimings:
    """The step's figures (seconds): ``decode`` (:class:`DecodeTimings`), ``wall_s`` (manifest
    read to index written), ``put_s`` (shard PUTs, summed over the writer threads: overlapped
    with decoding), ``tail_s`` (waiting for the last writes after the last batch)."""

    decode: DecodeTimings = field(default_factory=DecodeTimings)
    wall_s: float = 0.0
    put_s: float = 0.0
    tail_s: float = 0.0


def decode_to_shards(
    items: Iterable[tuple[int, bytes]],
    splits: Sequence[str],
    labels: np.ndarray,
    *,
    output_uri: str,
    image_size: int,
    batch_size: int,
    shard_size: int,
    use_gpu: bool,
    put: Callable[[str, Any], None],
    on_undecodable: Callable[[int, bytes], None],
    timings: StepTimings,
    num_threads: int | None = None,
    reasons: dict[int, Verdict] | None = None,
    open_upload: Callable[[str, int, int], Any] | None = None,
) -> ShardWriter:
    """The step's core, from encoded images to written shards (what the benchmark measures).

    ``items``: (manifest index, encoded bytes) in manifest order (corrupt ones already left
    out); ``splits[i]``/``labels[i]`` (int64 [N]): manifest entry ``i``'s split and class;
    ``put(uri, body)``: writes one shard (called in a writer thread); ``open_upload(uri, part_bytes, in_flight)``:
    an :class:`~pipectl.components.objstore.Upload` to send a large shard while it fills (upload.py),
    or None: every shard is PUT when complete; ``on_undecodable(i, bytes)``:
    an image neither DALI nor the fallback could decode, ``reasons[i]`` (when a dict is given) saying
    why, filled before the call. Returns the closed :class:`ShardWriter` (uris, counts).
    Raises what ``items``, DALI or ``put`` raise; written shards are not removed here.
    """
    remaining = Counter(splits[i] for i in range(len(splits)))
    with ThreadPoolExecutor(max_workers=WRITES_IN_FLIGHT, thread_name_prefix="shard-put") as pool:
        writer = ShardWriter(output_uri, shard_size, image_size, dict(remaining), put, pool, pin_buffers=use_gpu,
                             stream=streamer(open_upload, pool))
        for split in ("train", "validation"):
            writer.expected.setdefault(split, 0)
        writer.prepare()
        split_of = np.asarray([s == "validation" for s in splits], dtype=bool)

        def counted(stream: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, bytes]]:
            seen = 0
            for i, blob in stream:
                # images left out before decoding (corrupt) will not arrive: shrink the buffers
                for j in range(seen, i):
                    writer.lost(splits[j])
                seen = i + 1
                yield i, blob
            for j in range(seen, len(splits)):
                writer.lost(splits[j])

        stream = decode_stream(batched(counted(items), batch_size), image_size, batch_size, use_gpu,
                               num_threads=num_threads, timings=timings.decode, reasons=reasons)
        try:
            for tags, images, bad in stream:
                for i, blob in bad:
                    writer.lost(splits[i])
                    on_undecodable(i, blob)
                idx = np.asarray(tags, dtype=np.int64)
                is_val = split_of[idx] if len(idx) else np.zeros(0, bool)
                for split, mask in (("train", ~is_val), ("validation", is_val)):
                    positions = np.flatnonzero(mask)
                    if len(positions):
                        writer.add(split, images, positions, labels[idx[positions]])
        except BaseException:
            writer.abort()  # the shards being sent while they filled: no parts left on the store
            raise
        t0 = time.perf_counter()
        writer.close()
        timings.tail_s = time.perf_counter() - t0
        timings.put_s = writer.put_s
    return writer


def _accept(inp: PreprocessInput, s3: Any, entries: list, quarantined: list[tuple[int, Verdict]], writer: "ShardWriter") -> dict[str, int]:
    """Write quarantine.json (``[{"key", "category", "reason"}]``, by key); raise :class:`StepError` when too many images are corrupt or a split is
    empty. Returns the images per split."""
    total = len(entries)
    if quarantined:
        write_json(s3, join_uri(inp.output_uri, "quarantine.json"),
                   [{"key": entries[i].key, "category": v.category, "reason": v.reason}
                    for i, v in sorted(quarantined, key=lambda q: entries[q[0]].key)])
    if len(quarantined) > inp.max_corrupt_fraction * total:
        raise StepError(
            f"{len(quarantined)} of {total} images are corrupt ({len(quarantined) / total:.1%}: "
            f"{quarantine_summary(quarantined)}), above max-corrupt-fraction {inp.max_corrupt_fraction:.1%}",
            f"see {join_uri(inp.output_uri, 'quarantine.json')}; fix the dataset or raise max-corrupt-fraction",
        )
    counts = {split: writer.counts[split] for split in ("train", "validation")}
    if not counts["train"] or not counts["validation"]:
        raise StepError(
            f"a split is empty (train {counts['train']}, validation {counts['validation']} images)",
            "use a larger dataset or a validation-fraction between 0.05 and 0.5",
        )
    return counts


def _remove_shards(s3: Any, writer: "ShardWriter | None") -> None:
    """After a failure: no index.json is written, so the shards are unreachable; remove them (best effort)."""
    for uri in ([] if writer is None else writer.uris["train"] + writer.uris["validation"]):
        try:
            out_bucket, out_key = parse_s3_uri(uri)
            s3.delete_object(Bucket=out_bucket, Key=out_key)
        except Exception as e:  # the step's own error matters more
            log.warning("could not remove %s after the failure: %s", uri, e)


def _publish(inp: PreprocessInput, s3: Any, labels: list[str], writer: "ShardWriter", counts: dict[str, int],
             timings: "StepTimings", quarantined: int, use_gpu: bool, t_start: float) -> PreprocessOutput:
    """index.json (written last: it makes the shards reachable), the timing log line, the output."""
    write_index(s3, inp.output_uri, labels, inp.image_size, writer, counts)
    timings.wall_s = time.perf_counter() - t_start
    d = timings.decode
    decoded = counts["train"] + counts["validation"]
    rate = d.steady_images_per_s or (decoded / d.startup_s if d.startup_s > 0 else 0.0)
    device = "gpu (mixed)" if use_gpu else "cpu"
    log.info(
        "DALI on %s: %d images, %d quarantined; start-up %.2f s (pipeline build %.2f s, first batch %.2f s); "
        "steady state %.0f images/s (%d images in %.2f s); decoding waited %.2f s for bytes; shard PUTs %.2f s "
        "(overlapped; %.2f s after the last batch); wall %.2f s (%.0f images/s end to end)",
        device, decoded, quarantined, d.startup_s, d.build_s, d.first_batch_s, d.steady_images_per_s,
        d.steady_images, d.steady_s, d.feed_wait_s, timings.put_s, timings.tail_s, timings.wall_s,
        decoded / timings.wall_s if timings.wall_s > 0 else 0.0,
    )
    return PreprocessOutput(shards_uri=inp.output_uri.rstrip("/") + "/", train_count=counts["train"],
                            validation_count=counts["validation"], corrupt=quarantined, images_per_s=round(rate, 1), device=device)


def _use_gpu(device: str) -> bool:
    """Whether the step decodes on the GPU for ``device`` (``gpu``, ``cpu``, or ``auto``: when DALI sees a CUDA device)."""
    use_gpu = device == "gpu" or (device == "auto" and gpu_available())
    if device == "gpu" and not gpu_available():
        raise StepError("device=gpu but DALI sees no CUDA device", "use device=auto or cpu, or schedule on a GPU node")
    return use_gpu


def preprocess_timed(inp: PreprocessInput, s3: Any, *, reader: Any = None) -> tuple[PreprocessOutput, StepTimings]:
    """:func:`preprocess`, also returning where the time went (:class:`StepTimings`)."""
    t_start = time.perf_counter()
    timings = StepTimings()
    manifest = DatasetManifest.model_validate(read_json(s3, inp.manifest_uri))
    bucket, data_prefix = parse_s3_uri(DatasetLayout.of_manifest(inp.manifest_uri).data_uri)
    get = _object_getter(s3, bucket) if reader is None else (
        lambda key: reader.get_object(Bucket=bucket, Key=key)["Body"].read())
    entries, splits, labels = list_entries(manifest, inp.validation_fraction)
    use_gpu = _use_gpu(inp.device)

    quarantined: list[tuple[int, Verdict]] = []  # (manifest index, why)
    reasons: dict[int, Verdict] = {}  # filled by the decode stream for the images it could not decode
    side_writes: list[Future[Any]] = []

    put, open_upload = _object_putter(s3, parse_s3_uri(inp.output_uri)[0])

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="quarantine") as side:

        transcoded: set[int] = set()  # images given to DALI as PIL's decoding, not as stored

        def read(i: int) -> bytes:
            return get(data_prefix + entries[i].key)

        def keep(i: int, blob: bytes) -> None:
            put(join_uri(inp.output_uri, "quarantine", entries[i].key), read(i) if i in transcoded else blob)

        def quarantine(i: int, blob: bytes, verdict: Verdict) -> None:
            quarantined.append((i, verdict))
            side_writes.append(side.submit(keep, i, blob))
            log.warning("quarantined %s (%s): %s", entries[i].key, verdict.category, verdict.reason)

        def fetch(i: int) -> tuple[bytes, bytes, Verdict | None]:
            """(the object's bytes, the bytes to decode, why it is quarantined or None); in a fetch thread.
            The bytes are checked against the manifest's sha256 first: a staged dataset is reused by its
            content address, and an object changed in the store since is not the image the run trains on."""
            blob = read(i)
            digest = hashlib.sha256(blob).hexdigest()
            if digest != entries[i].sha256:
                return blob, blob, Verdict(Corrupt.CHANGED, f"sha256 {digest[:16]}… is not the manifest's {entries[i].sha256[:16]}…: "
                                           "changed in the store after it was staged")
            return (blob, *for_decoding(blob))

        def fetched() -> Iterator[tuple[int, bytes]]:
            for i, (blob, to_decode, verdict) in prefetch_ordered(range(len(entries)), fetch, max_items=PREFETCH_BATCHES * inp.batch_size,
                                                                  size=lambda i: entries[i].size):
                if verdict is not None:
                    quarantine(i, blob, verdict)
                else:
                    if to_decode is not blob:
                        transcoded.add(i)
                    yield i, to_decode

        writer: ShardWriter | None = None
        try:
            writer = decode_to_shards(
                fetched(), splits, labels, output_uri=inp.output_uri, image_size=inp.image_size,
                batch_size=inp.batch_size, shard_size=shard_images(inp.shard_size, inp.image_size, inp.shard_mib << 20), use_gpu=use_gpu, put=put,
                on_undecodable=lambda i, blob: quarantine(i, blob, reasons.pop(i, Verdict(Corrupt.UNDECODABLE, "decoder error"))),
                timings=timings, reasons=reasons, open_upload=open_upload,
            )
            for fut in side_writes:
                fut.result()
            counts = _accept(inp, s3, entries, quarantined, writer)
        except BaseException:
            _remove_shards(s3, writer)
            raise

    if quarantined:
        log.info("quarantined %d of %d images (%s): %s", len(quarantined), len(entries), quarantine_summary(quarantined),
                 join_uri(inp.output_uri, "quarantine.json"))
    out = _publish(inp, s3, manifest.labels, writer, counts, timings, len(quarantined), use_gpu, t_start)
    return out, timings


def _object_getter(s3: Any, bucket: str) -> Callable[[str], bytes]:
    """GETs of the staged images from the store itself: through obstore (a fraction of botocore's
    CPU per request, with the GIL released: the decode threads keep the cores), or boto3 when the
    client is not botocore's (a test's stand-in).

    Measured 2026-12-02 on this project's 2-core machine (Ceph 16.2 RGW of tests/ceph, the bundled
    digits, 1,797 images at 32x32 on the CPU, 4 alternated rounds each, load average 2.3-3.5 from
    another benchmark): the step's CPU per image 0.28 ms with obstore against 1.09 ms with boto3's
    ``get_object``; wall 349 against 334 images/s (the loaded machine's RGW bounds it)."""
    if not hasattr(s3, "_request_signer"):
        return lambda key: s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    from pipectl.components.objstore import ObjectReader

    return ObjectReader(s3, bucket).get


def _object_putter(s3: Any, bucket: str) -> tuple[Callable[[str, Any], None], Callable[[str, int, int], Any] | None]:
    """``(put, open_upload)``: PUTs of the step's outputs in ``bucket`` (shards, quarantined
    images), and streamed uploads of large shards (:meth:`ObjectWriter.stream`). Through obstore,
    from the shard's own buffer (no copy into Python bytes, the request signed with an unsigned
    payload in Rust with the GIL released), or boto3 when the client is not botocore's (a test's
    stand-in; no streamed uploads then).

    Measured 2026-12-05 on this project's 2-core machine (Ceph 16.2 RGW of tests/ceph, idle, a
    150 MiB body, 2 rounds): boto3 ``put_object`` 0.11-0.12 s of client CPU, obstore ``put`` of the
    buffer 0.03 s; the store's own CPU (0.5 s) is the same for both."""
    if not hasattr(s3, "_request_signer"):
        def boto_put(uri: str, body: Any) -> None:
            out_bucket, out_key = parse_s3_uri(uri)
            s3.put_object(Bucket=out_bucket, Key=out_key, Body=body)
        return boto_put, None
    from pipectl.components.objstore import ObjectWriter

    writer = ObjectWriter(s3, bucket)

    def key(uri: str) -> str:
        out_bucket, out_key = parse_s3_uri(uri)
        if out_bucket != bucket:
            raise ValueError(f"{uri} is outside the output bucket {bucket}")
        return out_key

    def put(uri: str, body: Any) -> None:
        writer.put(key(uri), body if isinstance(body, (bytes, memoryview)) else body.getbuffer(), {})

    return put, lambda uri, part_bytes, in_flight: writer.stream(key(uri), part_bytes, in_flight)


def preprocess(inp: PreprocessInput, s3: Any, *, reader: Any = None) -> PreprocessOutput:
    """See the module doc. Raises :class:`StepError` (exit 1) when too many images are corrupt
    or a split is empty (the shards written so far are removed; no index.json is written).

    ``s3``: the store (writes; and reads, through obstore, unless ``reader`` is given);
    ``reader``: a boto3 client the staged images are read from instead (Alluxio's S3 proxy when
    configured, see ``pipectl.components.alluxio.data_read_client``).
    """
    return preprocess_timed(inp, s3, reader=reader)[0]


def run(inp: PreprocessInput, settings: StoreSettings) -> PreprocessOutput:
    from pipectl.components.alluxio import alluxio_s3_client

    return preprocess(inp, s3_client(settings), reader=alluxio_s3_client(settings) if settings.alluxio_proxy_url else None)
