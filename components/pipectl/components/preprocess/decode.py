"""Decoding: encoded images to resized uint8 CHW arrays with NVIDIA DALI, and the fallback
decoder (PIL) for what DALI cannot read. Normalising is the readers' part
(``ShardStream.model_input``, ``shards.as_float``).

DALI decodes JPEG, PNG, WebP, BMP, TIFF, JPEG 2000 and PNM; GIF (and any image DALI fails on
its own) goes to PIL, the fallback decoder. Every image comes out as the picture a person sees, as
torchvision's PIL loader + ``ImageOps.exif_transpose`` would give it: EXIF orientation applied,
3 channels (greyscale repeated, alpha dropped, palette/CMYK converted), 16-bit scaled to 8 bits.
Checked on a generated corpus of odd and broken files (tests/tools/odd_images.py; on CPU only: the
GPU ``mixed`` decoder has not been run on it).

DALI device: ``mixed`` decode (nvJPEG) + GPU resize when a CUDA device is visible;
otherwise a CPU pipeline built with ``device_id=None`` (DALI refuses a GPU pipeline without
CUDA: "You are trying to create a GPU DALI pipeline while CUDA is not available").
"""

from __future__ import annotations

import io
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, TypeVar

import numpy as np

from pipectl.components.runtime import StepError, available_cpus
from pipectl.components.preprocess.device_copy import DeviceImages
from pipectl.components.preprocess.npz import IMAGE_DTYPE
from pipectl.components.preprocess.screen import FALLBACK_FORMATS, Corrupt, Verdict, image_format, screen

log = logging.getLogger("pipectl.preprocess")

MEAN = [127.5, 127.5, 127.5]
STD = [127.5, 127.5, 127.5]
"""What the shard index says readers normalise with: (x - 127.5) / 127.5, to [-1, 1]."""


def decode_with_pil(data: bytes) -> bytes:
    """The fallback decoder: ``data`` decoded by PIL as torchvision's loader does, re-encoded as an
    8-bit RGB PNG (lossless) for DALI to resize like every other image.

    EXIF orientation applied (``ImageOps.exif_transpose``, as DALI's ``adjust_orientation``); 16-bit
    samples scaled to 8 bits (v * 255 / 65535, not clipped); alpha dropped and palettes expanded
    (``convert("RGB")``, torchvision's ``pil_loader``); GIF: the first frame. Truncated files are
    refused (PIL's default ``LOAD_TRUNCATED_IMAGES = False``). Raises what PIL raises (OSError,
    SyntaxError, ValueError, ``DecompressionBombError`` above PIL's pixel limit).
    """
    from PIL import Image, ImageOps

    with Image.open(io.BytesIO(data)) as img:
        img = ImageOps.exif_transpose(img)
        if img.mode.startswith("I;16") or img.mode == "I":
            a = np.asarray(img, dtype=np.float64)
            img = Image.fromarray(np.clip(np.rint(a * 255 / 65535), 0, 255).astype(np.uint8))
        rgb = img.convert("RGB")
    buf = io.BytesIO()
    rgb.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def _fallback_verdict(data: bytes, fmt: str | None, error: BaseException) -> Verdict:
    who = "PIL" if fmt in FALLBACK_FORMATS else "DALI could not decode it and PIL neither"
    return Verdict(Corrupt.UNDECODABLE, f"decoder error: {fmt or 'image'}: {who}: {type(error).__name__}: {error}")


def for_decoding(data: bytes) -> tuple[bytes, Verdict | None]:
    """(the bytes to give DALI for the image ``data``, why it is quarantined or None).

    :func:`screen`'s verdict; an image of a format DALI cannot read (GIF) is decoded here by the
    fallback decoder (:func:`decode_with_pil`), or quarantined when PIL cannot decode it either.
    """
    fmt, verdict = screen(data)
    if verdict is None and fmt in FALLBACK_FORMATS:  # DALI cannot read it: PIL decodes it here
        try:
            return decode_with_pil(data), None
        except Exception as e:  # PIL raises many types for bad files
            return data, _fallback_verdict(data, fmt, e)
    return data, verdict


T = TypeVar("T")


def gpu_available() -> bool:
    """True when DALI sees at least one CUDA device."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:
        return False


def build_pipeline(source: Any, batch_size: int, image_size: int, use_gpu: bool, num_threads: int | None = None) -> Any:
    """DALI pipeline: external source of encoded bytes -> decode -> resize -> CHW, uint8.

    ``source``: an iterable of batches, or a callable returning the next batch; a batch is a list
    of at most ``batch_size`` encoded images as uint8 arrays [n_bytes]; ``StopIteration`` ends the
    stream (``pipe.run()`` raises it after the last batch). Output per batch: uint8
    [B, 3, image_size, image_size], the resized pixels (half the bytes of float16: the shards,
    their PUTs and every epoch's reads; a reader's float16 of them equals what DALI's own
    normalisation gives, see ``shards.as_float``).
    ``num_threads``: DALI's CPU worker threads; default :func:`available_cpus` (the CPUs this
    pod may use: CPU decode scales with them, tests/bench/bench_preprocess.py).
    """
    if num_threads is None:
        num_threads = available_cpus()
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    # a callable ends the stream by raising StopIteration; ``cycle`` is for iterables only
    src_kw: dict[str, Any] = {"source": source} if callable(source) else {"source": iter(source), "cycle": False}

    @pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=0 if use_gpu else None)
    def pipe():  # type: ignore[no-untyped-def]
        encoded = fn.external_source(**src_kw, dtype=types.UINT8, ndim=1, batch=True)
        # RGB: greyscale repeated, alpha dropped, CMYK and palettes converted, 16-bit scaled to 8;
        # adjust_orientation: EXIF orientation applied (DALI's default, stated; field case C13)
        images = fn.decoders.image(encoded, device="mixed" if use_gpu else "cpu", output_type=types.RGB,
                                   adjust_orientation=True)
        images = fn.resize(images, resize_x=image_size, resize_y=image_size, antialias=True)
        return fn.transpose(images, perm=[2, 0, 1])  # HWC -> CHW

    p = pipe()
    p.build()
    return p


def _to_numpy(result: Any, use_gpu: bool) -> np.ndarray:
    """A DALI batch output as a numpy view [B, 3, S, S] (valid until the pipeline runs again)."""
    if use_gpu:
        result = result.as_cpu()
    return np.asarray(result.as_tensor())


def decode_all(encoded: list[bytes], image_size: int, batch_size: int, use_gpu: bool) -> tuple[np.ndarray, float]:
    """Run the DALI pipeline over ``encoded`` images (order kept), in memory.

    Returns (uint8 array [N, 3, image_size, image_size], seconds spent in DALI, build included).
    Raises RuntimeError (DALI's) when an image cannot be decoded; see :func:`decode_robust`.
    """
    if not encoded:
        return np.zeros((0, 3, image_size, image_size), IMAGE_DTYPE), 0.0
    batches = [
        [np.frombuffer(b, dtype=np.uint8) for b in encoded[start:start + batch_size]]
        for start in range(0, len(encoded), batch_size)
    ]
    out = np.empty((len(encoded), 3, image_size, image_size), IMAGE_DTYPE)
    t0 = time.perf_counter()
    pipe = build_pipeline(batches, batch_size, image_size, use_gpu)
    filled = 0
    while True:
        try:
            (result,) = pipe.run()
        except StopIteration:
            break
        arr = _to_numpy(result, use_gpu)
        out[filled:filled + len(arr)] = arr
        filled += len(arr)
    if filled != len(encoded):
        raise StepError(f"DALI returned {filled} images for {len(encoded)} inputs", "report this as a bug")
    return out, time.perf_counter() - t0


def decode_robust(
    encoded: list[bytes], image_size: int, batch_size: int, use_gpu: bool, *,
    reasons: dict[int, Verdict] | None = None, fallback: bool = True,
) -> tuple[np.ndarray, list[int], float]:
    """:func:`decode_all`, but an image DALI cannot decode is isolated instead of failing the lot.

    DALI fails a whole pipeline on one bad sample; on failure the list is split in halves and
    each half decoded with a fresh pipeline, down to single images. An image DALI fails alone is
    given to the fallback decoder (:func:`decode_with_pil`, when ``fallback``): decoded by PIL, it
    is used (DALI resizes PIL's pixels); otherwise it is undecodable and ``reasons[index]`` (when a
    dict is given) says why. Cost: a clean list decodes once; each bad image adds ~log2(N) pipeline
    builds. Returns (images of the decodable ones in order [M, 3, S, S], indices of the undecodable
    ones, seconds in DALI).
    """
    try:
        images, seconds = decode_all(encoded, image_size, batch_size, use_gpu)
        return images, [], seconds
    except RuntimeError:
        if len(encoded) == 1:
            return _decode_fallback(encoded[0], image_size, use_gpu, reasons, fallback)
    mid = len(encoded) // 2
    right_reasons: dict[int, Verdict] | None = None if reasons is None else {}
    left, bad_left, s_left = decode_robust(encoded[:mid], image_size, batch_size, use_gpu, reasons=reasons, fallback=fallback)
    right, bad_right, s_right = decode_robust(encoded[mid:], image_size, batch_size, use_gpu, reasons=right_reasons, fallback=fallback)
    if reasons is not None and right_reasons:
        reasons.update({mid + i: v for i, v in right_reasons.items()})
    return np.concatenate([left, right]), bad_left + [mid + i for i in bad_right], s_left + s_right


def _decode_fallback(data: bytes, image_size: int, use_gpu: bool, reasons: dict[int, Verdict] | None,
                     fallback: bool) -> tuple[np.ndarray, list[int], float]:
    """One image DALI failed: PIL decodes it (then DALI resizes the lossless re-encoding), or it is bad."""
    empty = np.zeros((0, 3, image_size, image_size), IMAGE_DTYPE)
    fmt = image_format(data)
    error: BaseException = RuntimeError("DALI failed (its message names no cause)")
    if fallback:
        try:
            png = decode_with_pil(data)
        except Exception as e:  # PIL raises many types for bad files
            error = e
        else:
            try:
                images, seconds = decode_all([png], image_size, 1, use_gpu)
            except RuntimeError as e:  # DALI refusing a plain RGB PNG would be a bug: keep its message
                error = e
            else:
                log.warning("DALI could not decode a %s image; PIL's decoding of it is used", fmt or "unrecognised")
                return images, [], seconds
    if reasons is not None:
        reasons[0] = _fallback_verdict(data, fmt, error)
    return empty, [0], 0.0


@dataclass
class DecodeTimings:
    """Where a decode stream's wall time went (seconds, ``time.perf_counter``).

    ``build_s``: pipeline builds; ``first_batch_s``: end of the first build to the first batch
    out (includes waiting for its bytes); ``steady_s``: first batch out to the last;
    ``steady_images``: images out after the first batch; ``feed_wait_s``: time DALI's feeding
    waited for the next batch's bytes (fetch not keeping up); ``rebuilds``: pipelines rebuilt
    after a batch DALI could not decode.
    """

    build_s: float = 0.0
    first_batch_s: float = 0.0
    steady_s: float = 0.0
    steady_images: int = 0
    images: int = 0
    feed_wait_s: float = 0.0
    rebuilds: int = 0

    @property
    def startup_s(self) -> float:
        return self.build_s + self.first_batch_s

    @property
    def steady_images_per_s(self) -> float:
        """Steady-state images/s; 0.0 when there was no second batch."""
        return self.steady_images / self.steady_s if self.steady_images and self.steady_s > 0 else 0.0


class _FedSource:
    """DALI's external source over a stream of batches: the batches fed but not yet returned
    (``pending``), the stream's own error (``error``: DALI would wrap or swallow it), and the
    time the pipeline waited for a batch (``timings.feed_wait_s``)."""

    def __init__(self, it: Iterator[list[tuple[Any, bytes]]], timings: DecodeTimings) -> None:
        self.it = it
        self.timings = timings
        self.pending: deque[list[tuple[Any, bytes]]] = deque()
        self.error: list[BaseException] = []

    def __call__(self) -> list[np.ndarray]:
        t0 = time.perf_counter()
        try:
            batch = next(self.it)
        except StopIteration:
            raise
        except BaseException as e:
            self.error.append(e)
            raise
        finally:
            self.timings.feed_wait_s += time.perf_counter() - t0
        self.pending.append(batch)
        return [np.frombuffer(b, dtype=np.uint8) for _, b in batch]


def decode_stream(
    batches: Iterable[list[tuple[T, bytes]]],
    image_size: int,
    batch_size: int,
    use_gpu: bool,
    *,
    num_threads: int | None = None,
    timings: DecodeTimings | None = None,
    reasons: dict[T, Verdict] | None = None,
) -> Iterator[tuple[list[T], "np.ndarray | DeviceImages", list[tuple[T, bytes]]]]:
    """Decode a stream of batches of (tag, encoded image) with one DALI pipeline, in order.

    Yields, per input batch, (tags of the decoded images, their images uint8 [n, 3, S, S],
    the (tag, bytes) DALI could not decode). The images are a view of DALI's output buffer —
    a numpy array on the CPU, a :class:`~pipectl.components.preprocess.device_copy.DeviceImages`
    in GPU memory with ``use_gpu`` — valid until the next item is requested: copy what you keep
    (:func:`~pipectl.components.preprocess.device_copy.take_into`). Batches are pulled
    from ``batches`` by DALI's external source as the pipeline asks (prefetch depth 2), so a
    slow producer shows up as ``timings.feed_wait_s``. When DALI fails a batch, the batches fed
    but not yet returned are decoded again by :func:`decode_robust` (isolating the bad images)
    and a fresh pipeline continues with the rest (images PIL decodes are used: the fallback of
    :func:`decode_robust`); ``reasons[tag]`` (when a dict is given) says why each rejected image
    could not be decoded. Errors raised by ``batches`` propagate as is.
    """
    t = timings if timings is not None else DecodeTimings()
    src = _FedSource(iter(batches), t)
    first_out: float | None = None
    while True:
        # peek: build a pipeline only when there is something to decode
        try:
            head = next(src.it)
        except StopIteration:
            return
        src.it = _chain_one(head, src.it)
        t0 = time.perf_counter()
        pipe = build_pipeline(src, batch_size, image_size, use_gpu, num_threads)
        t_built = time.perf_counter()
        t.build_s += t_built - t0
        try:
            while True:
                try:
                    (result,) = pipe.run()
                except StopIteration:
                    return
                batch = src.pending.popleft()
                images = DeviceImages(result) if use_gpu else _to_numpy(result, use_gpu)
                now = time.perf_counter()
                if first_out is None:
                    first_out = now
                    t.first_batch_s = now - t_built
                else:
                    t.steady_s = now - first_out
                    t.steady_images += len(images)
                t.images += len(images)
                yield [tag for tag, _ in batch], images, []
        except RuntimeError:
            if src.error:
                raise src.error[0] from None
            failed = list(src.pending)
            src.pending.clear()
        del pipe
        t.rebuilds += 1
        log.warning("DALI failed a batch: decoding %d batch(es) again, image by image where needed", len(failed))
        yield from _decode_again(failed, image_size, batch_size, use_gpu, t, reasons)


def _decode_again(
    failed: list[list[tuple[T, bytes]]], image_size: int, batch_size: int, use_gpu: bool, t: DecodeTimings,
    reasons: dict[T, Verdict] | None,
) -> Iterator[tuple[list[T], np.ndarray, list[tuple[T, bytes]]]]:
    """The batches of a pipeline DALI failed, decoded again by :func:`decode_robust`, yielded as
    :func:`decode_stream` yields them."""
    for batch in failed:
        why: dict[int, Verdict] = {}
        images, bad, _ = decode_robust([b for _, b in batch], image_size, batch_size, use_gpu, reasons=why)
        if reasons is not None:
            reasons.update({batch[i][0]: v for i, v in why.items()})
        bad_set = set(bad)
        t.images += len(images)
        yield [tag for i, (tag, _) in enumerate(batch) if i not in bad_set], images, [batch[i] for i in bad]


def _chain_one(head: T, rest: Iterator[T]) -> Iterator[T]:
    yield head
    yield from rest
