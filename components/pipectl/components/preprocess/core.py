"""Decode, resize and normalise staged images with NVIDIA DALI; write train/validation shards.

Shards: ``<output_uri>/<split>-<nnnnn>.npz`` with ``images`` float16 [N, 3, H, W] (normalised
to [-1, 1]: (x - 127.5) / 127.5) and ``labels`` int64 [N]; ``<output_uri>/index.json``
(:class:`ShardIndex`) lists them. Corrupt images are copied to ``<output_uri>/quarantine/``
and listed in ``quarantine.json`` (key, :class:`Corrupt` category, reason); more than
``max_corrupt_fraction`` of them fails the step.

What is corrupt (field case C13): an image the decoders cannot decode, not one whose bytes a
heuristic dislikes. The format is read from the bytes, not the file name (PNG bytes named .jpg are a
PNG). DALI decodes JPEG, PNG, WebP, BMP, TIFF, JPEG 2000 and PNM; GIF (and any image DALI fails on
its own) goes to PIL, the fallback decoder. Every image comes out as the picture a person sees, as
torchvision's PIL loader + ``ImageOps.exif_transpose`` would give it: EXIF orientation applied,
3 channels (greyscale repeated, alpha dropped, palette/CMYK converted), 16-bit scaled to 8 bits.
Checked on a generated corpus of odd and broken files (tests/tools/odd_images.py; on CPU only: the
GPU ``mixed`` decoder has not been run on it).

The split is a pure function of each image's sha256 (no leakage between splits of duplicates,
the same split on every run of the same dataset, so champion and candidate are compared on
the same held-out images).

DALI device: ``mixed`` decode (nvJPEG) + GPU resize/normalise when a CUDA device is visible;
otherwise a CPU pipeline built with ``device_id=None`` (DALI refuses a GPU pipeline without
CUDA: REFERENCE.md §1).

Flow (fetching overlaps decoding, start-up is reported apart from steady state)::

    S3 GETs + cheap checks   ──►  DALI pipeline (one for both    ──►  shard files assembled in
    (16 threads, in manifest      splits; external source fed        place (npz.py), PUT by a
     order, at most 4 batches     from the main thread, float16      writer thread while the
     or 512 MiB ahead)            CHW out)                           next batches decode

Before, every object was fetched before the first decode, each split built its own pipeline,
and shards were written after the last decode, through two extra copies of every image
(``np.savez`` + ``getvalue``). Memory is now bounded by the prefetch window and the shard
buffers (one open per split, at most 2 being written, finished ones reused), not by the data set.

``PreprocessOutput.images_per_s`` is the steady-state decode rate (images after the first batch
÷ seconds from the first batch out to the last); with a single batch there is no steady state
and it is the images ÷ start-up seconds. The step's log line gives start-up (pipeline build,
first batch), steady state, the time decoding waited for bytes, and the shard writes.
"""

from __future__ import annotations

import codecs
import io
import logging
import re
import struct
import time
import zlib
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np

from pipectl.components.contracts import (
    DatasetLayout,
    DatasetManifest,
    PreprocessInput,
    PreprocessOutput,
    ShardIndex,
    StoreSettings,
)
from pipectl.components.runtime import StepError, available_cpus, join_uri, parse_s3_uri, read_json, s3_client, write_json
from pipectl.components.preprocess.npz import ShardFile, fits

log = logging.getLogger("pipectl.preprocess")

MEAN = [127.5, 127.5, 127.5]
STD = [127.5, 127.5, 127.5]


def in_validation(sha256: str, fraction: float) -> bool:
    """True when the image with content hash ``sha256`` belongs to the held-out split.

    Uses the first 32 bits of the hash as a uniform number in [0, 1).
    """
    return int(sha256[:8], 16) / 2**32 < fraction


class Corrupt:
    """Quarantine categories (``quarantine.json``'s ``category``), field case C13.

    The rule: an image is corrupt when the decoder cannot decode it, not when a heuristic dislikes
    its bytes. The cheap checks before DALI (:func:`screen`) only name, early and precisely, what
    the decoders would refuse anyway (measured on the C13 corpus, tests/tools/odd_images.py).
    """

    EMPTY = "empty"  # zero bytes
    NOT_AN_IMAGE = "not-an-image"  # HTML error page, text, unknown bytes: no image format
    TRUNCATED = "truncated"  # an image format, cut short (no JPEG EOI after the last scan, PNG without IEND)
    CORRUPT_DATA = "corrupt-data"  # complete, but a checksum or the structure says the bytes changed
    UNDECODABLE = "undecodable"  # passed the checks, but DALI and the PIL fallback both failed to decode it


@dataclass(frozen=True)
class Verdict:
    """Why an image is quarantined: ``category`` (a :class:`Corrupt` value) and a sentence for people."""

    category: str
    reason: str


# formats DALI's decoders.image reads (DALI 2.4 docs, fn.decoders.image: "JPG, BMP, PNG, TIFF, PNM,
# JPEG 2000 and WebP"); GIF only through the PIL fallback. Recognised by content, never by name.
DALI_FORMATS = frozenset({"JPEG", "PNG", "BMP", "TIFF", "WEBP", "JPEG2000", "PNM"})
FALLBACK_FORMATS = frozenset({"GIF"})

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def image_format(data: bytes) -> str | None:
    """The image format of ``data`` by its magic bytes (file signatures of each format's spec),
    one of :data:`DALI_FORMATS` | :data:`FALLBACK_FORMATS`, or None. The file name plays no part."""
    if data[:2] == b"\xff\xd8":
        return "JPEG"
    if data[:8] == _PNG_SIGNATURE:
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:4] in (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+"):
        return "TIFF"
    if data[:2] == b"BM" and len(data) >= 18 and int.from_bytes(data[14:18], "little") in (12, 40, 52, 56, 64, 108, 124):
        return "BMP"  # the DIB header sizes of the BMP versions
    if data[:12] == b"\x00\x00\x00\x0cjP  \r\n\x87\n" or data[:4] == b"\xff\x4f\xff\x51":
        return "JPEG2000"
    if len(data) > 2 and data[:1] == b"P" and data[1:2] in b"123456" and data[2:3] in b" \t\r\n#":
        return "PNM"
    return None


def _not_an_image(data: bytes) -> Verdict:
    """Name what non-image bytes are (the common cases in scraped or hand-made datasets)."""
    head = data[:2048]
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    low = text.lower()
    if low.startswith((b"<!doctype html", b"<html", b"<head", b"<body")) or b"<html" in low[:512]:
        m = re.search(rb"<title[^>]*>([^<]{1,80})", head, re.I)
        title = f": {m.group(1).decode('utf-8', 'replace').strip()!r}" if m else ""
        return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: HTML{title} (a web page, usually an error page "
                                             "a download saved under the image's name)")
    if low.startswith((b"<?xml", b"<svg")):
        kind = "SVG" if b"<svg" in low else "XML"
        return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: {kind} text (only raster images are decoded)")
    try:  # incremental: a character cut at the 2 KiB boundary is not an error
        decoded = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        decoded = None
    if decoded is not None and all(c.isprintable() or c in "\t\r\n" for c in decoded):
        if not decoded.strip():
            return Verdict(Corrupt.NOT_AN_IMAGE, "not an image: blank text (only white space)")
        first = decoded.strip().splitlines()[0][:40]
        return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: text (starts {first!r})")
    return Verdict(Corrupt.NOT_AN_IMAGE, f"not an image: unknown format (first bytes {data[:8].hex(' ')})")


def _check_jpeg(data: bytes) -> Verdict | None:
    # Bytes after EOI are not corruption (C13: a CR LF from a text-mode copy, zero padding, vendor
    # trailers, a second image (MPO)): decoders stop at EOI. Entropy-coded data cannot contain
    # FFDA/FFD9 (0xFF is byte-stuffed, ITU T.81 B.1.1.5), so rfind finds real markers. Without an
    # EOI after the last scan libjpeg-turbo (DALI's CPU decoder) fails: "Premature end of JPEG data".
    last_scan = data.rfind(b"\xff\xda")
    if last_scan < 0:
        return Verdict(Corrupt.TRUNCATED, "truncated: no start-of-scan marker (the JPEG ends inside its header: no image data)")
    if data.rfind(b"\xff\xd9") < last_scan:
        return Verdict(Corrupt.TRUNCATED, "truncated: no end-of-image marker after the last scan "
                                          f"(the JPEG ends inside its image data, {len(data):,} bytes)")
    return None


def _check_png(data: bytes) -> Verdict | None:
    # Chunk walk (PNG spec 5.3): length, type, data, CRC-32 over type + data. A critical chunk's bad
    # CRC is refused by libpng (DALI's PNG decoder: "IDAT: CRC error"); an ancillary chunk's is only
    # a warning (the chunk is dropped), so it is not corruption. Bytes after IEND are ignored.
    pos, n, seen_idat = 8, len(data), False
    view = memoryview(data)  # CRCs over slices without copying them
    while True:
        if pos + 8 > n:
            return Verdict(Corrupt.TRUNCATED, f"truncated: PNG ends after {n:,} bytes, without its IEND chunk")
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if length > 0x7FFFFFFF or not kind.isalpha():
            return Verdict(Corrupt.CORRUPT_DATA, f"corrupt data: PNG chunk structure broken at byte {pos:,}")
        name = kind.decode("ascii")
        end = pos + 12 + length
        if end > n:
            return Verdict(Corrupt.TRUNCATED, f"truncated: PNG ends inside its {name} chunk "
                                              f"({max(0, n - pos - 8):,} of {length:,} bytes)")
        if kind[0] & 0x20 == 0:  # critical chunk (upper-case first letter)
            if zlib.crc32(view[pos + 4:end - 4]) & 0xFFFFFFFF != struct.unpack(">I", data[end - 4:end])[0]:
                return Verdict(Corrupt.CORRUPT_DATA, f"corrupt data: CRC mismatch in the PNG's {name} chunk "
                                                     "(its bytes changed after it was written)")
        seen_idat |= kind == b"IDAT"
        if kind == b"IEND":
            break
        pos = end
    if not seen_idat:
        return Verdict(Corrupt.CORRUPT_DATA, "corrupt data: PNG without an IDAT chunk (no image data)")
    return None


def screen(data: bytes) -> tuple[str | None, Verdict | None]:
    """Cheap checks before DALI (which fails a whole batch on one bad image); does not decode pixels.

    Returns (format by content (:func:`image_format`) or None, a :class:`Verdict` when the image is
    to be quarantined or None). Quarantined here: empty files, bytes of no image format (named:
    HTML, text, unknown), JPEGs without an end-of-image marker after the last scan, PNGs cut short
    or with a bad CRC in a critical chunk: what the decoders refuse (tests/tools/odd_images.py).
    Everything else goes to the decoder, which has the last word (:func:`decode_robust`).
    """
    if not data:
        return None, Verdict(Corrupt.EMPTY, "empty file (0 bytes)")
    fmt = image_format(data)
    if fmt is None:
        return None, _not_an_image(data)
    if fmt == "JPEG":
        return fmt, _check_jpeg(data)
    if fmt == "PNG":
        return fmt, _check_png(data)
    return fmt, None


def is_corrupt(data: bytes) -> str | None:
    """The quarantine reason of :func:`screen` for ``data``, or None when it goes to the decoder."""
    verdict = screen(data)[1]
    return verdict.reason if verdict is not None else None


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


T = TypeVar("T")
R = TypeVar("R")

FETCH_THREADS = 16
PREFETCH_BATCHES = 4
PREFETCH_BYTES = 512 << 20
WRITES_IN_FLIGHT = 2

SHARD_BYTES = 256 << 20
"""Most bytes of images in one shard: what a training process holds per shard it reads
(pipectl.components.shard_stream keeps about four), whatever the dataset's size."""


def shard_images(shard_size: int, image_size: int) -> int:
    """Images per shard: ``shard_size``, fewer when their float16 bytes would pass :data:`SHARD_BYTES`
    (at 224x224: 891 images)."""
    return max(1, min(shard_size, SHARD_BYTES // (3 * image_size * image_size * 2)))


def gpu_available() -> bool:
    """True when DALI sees at least one CUDA device."""
    try:
        from nvidia.dali.backend import GetCUDADeviceCount

        return GetCUDADeviceCount() > 0
    except Exception:
        return False


def build_pipeline(source: Any, batch_size: int, image_size: int, use_gpu: bool, num_threads: int | None = None) -> Any:
    """DALI pipeline: external source of encoded bytes -> decode -> resize -> normalise (CHW).

    ``source``: an iterable of batches, or a callable returning the next batch; a batch is a list
    of at most ``batch_size`` encoded images as uint8 arrays [n_bytes]; ``StopIteration`` ends the
    stream (``pipe.run()`` raises it after the last batch). Output per batch: float16
    [B, 3, image_size, image_size], (x - 127.5) / 127.5 (DALI computes in float32 and rounds once:
    equal to float32 output cast to float16, checked on the 512² set 2026-12-01).
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
        return fn.crop_mirror_normalize(images, dtype=types.FLOAT16, output_layout="CHW", mean=MEAN, std=STD)

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

    Returns (float16 array [N, 3, image_size, image_size], seconds spent in DALI, build included).
    Raises RuntimeError (DALI's) when an image cannot be decoded; see :func:`decode_robust`.
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
    empty = np.zeros((0, 3, image_size, image_size), np.float16)
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
) -> Iterator[tuple[list[T], np.ndarray, list[tuple[T, bytes]]]]:
    """Decode a stream of batches of (tag, encoded image) with one DALI pipeline, in order.

    Yields, per input batch, (tags of the decoded images, their images float16 [n, 3, S, S],
    the (tag, bytes) DALI could not decode). The images array is a view of DALI's output
    buffer: valid until the next item is requested (copy what you keep). Batches are pulled
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
                images = _to_numpy(result, use_gpu)
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


def prefetch_ordered(
    items: Sequence[T],
    fetch: Callable[[T], R],
    *,
    workers: int = FETCH_THREADS,
    max_items: int = 1024,
    max_bytes: int = PREFETCH_BYTES,
    size: Callable[[T], int] = lambda _: 0,
) -> Iterator[tuple[T, R]]:
    """Yield ``(item, fetch(item))`` in the order of ``items``, fetching ahead in ``workers`` threads.

    Bounded: at most ``max_items`` items and ``max_bytes`` of their ``size(item)`` (bytes) are
    fetched or being fetched ahead of the consumer (always at least one). An exception from
    ``fetch`` is raised when its item's turn comes; leaving early cancels what has not started.
    """
    window: deque[tuple[T, Future[R], int]] = deque()
    in_flight = 0
    source = iter(items)
    end = object()
    nxt: Any = next(source, end)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fetch") as pool:
        try:
            while True:
                while nxt is not end and (not window or (len(window) < max_items and in_flight + size(nxt) <= max_bytes)):
                    n = size(nxt)
                    window.append((nxt, pool.submit(fetch, nxt), n))
                    in_flight += n
                    nxt = next(source, end)
                if not window:
                    return
                item, fut, n = window.popleft()
                in_flight -= n
                yield item, fut.result()
        finally:
            for _, fut, _ in window:
                fut.cancel()


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of ``size`` consecutive items (the last may be shorter; none is empty)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


class _NumpyShard:
    """A shard too large for :class:`ShardFile` (ZIP64): a numpy buffer written by ``np.savez``."""

    def __init__(self, capacity: int, image_size: int) -> None:
        self.capacity, self.image_size = capacity, image_size
        self._images = np.empty((capacity, 3, image_size, image_size), np.float16)

    def images(self, n: int) -> np.ndarray:
        return self._images[:n]

    def finish(self, n: int, labels: np.ndarray) -> io.BytesIO:
        buf = io.BytesIO()
        np.savez(buf, images=self._images[:n], labels=labels)
        buf.seek(0)
        return buf


@dataclass
class ShardWriter:
    """Routes decoded images to their split's shard files; PUTs complete shards in ``pool``.

    ``expected``: images per split that may still arrive (capacity of new shard buffers:
    min(shard_size, expected)); ``put(uri, body)``: uploads one file (``body``: seekable binary
    file). A shard is complete at ``shard_size`` images, or at :meth:`close`. Shard ``n`` of a
    split holds the split's images ``n*shard_size ..`` in stream order, as when each split was decoded in one go.
    """

    output_uri: str
    shard_size: int
    image_size: int
    expected: dict[str, int]
    put: Callable[[str, Any], None]
    pool: ThreadPoolExecutor
    uris: dict[str, list[str]] = field(default_factory=lambda: {"train": [], "validation": []})
    sizes: dict[str, list[int]] = field(default_factory=lambda: {"train": [], "validation": []})
    counts: Counter[str] = field(default_factory=Counter)
    put_s: float = 0.0
    _open: dict[str, tuple[Any, int, list[np.ndarray]]] = field(default_factory=dict)
    _writes: deque[tuple[Future[float], Any]] = field(default_factory=deque)
    _free: list[Any] = field(default_factory=list)

    def add(self, split: str, images: np.ndarray, positions: np.ndarray, labels: np.ndarray) -> None:
        """Copy ``images[positions]`` (float16 [B, 3, S, S]; positions int [k]) with ``labels``
        int64 [k] into ``split``'s open shard(s)."""
        k = 0
        while k < len(positions):
            if split not in self._open:
                self._open[split] = (self._file(min(self.shard_size, max(self.expected[split], 1))), 0, [])
            f, fill, labs = self._open[split]
            if fill == f.capacity:  # capacity = min(shard_size, an upper bound of what may arrive)
                raise StepError(f"more {split} images arrived than expected ({fill})", "report this as a bug")
            take = positions[k:k + f.capacity - fill]
            dst = f.images(f.capacity)[fill:fill + len(take)]
            if len(take) == len(images) and take[0] == 0 and take[-1] == len(images) - 1:
                np.copyto(dst, images)
            else:
                np.take(images, take, axis=0, out=dst, mode="clip")
            labs.append(labels[k:k + len(take)])
            k += len(take)
            fill += len(take)
            self.expected[split] -= len(take)
            self._open[split] = (f, fill, labs)
            if fill == self.shard_size:
                self._flush(split)

    def lost(self, split: str) -> None:
        """One image of ``split`` will not arrive (quarantined)."""
        self.expected[split] -= 1

    def close(self) -> None:
        """Write the open shards and wait for every write (raises the first write error)."""
        for split in list(self._open):
            self._flush(split)
        while self._writes:
            self._reclaim(self._writes.popleft())

    def _file(self, capacity: int) -> Any:
        while self._writes and self._writes[0][0].done():
            self._reclaim(self._writes.popleft())
        for i, f in enumerate(self._free):
            if f.capacity >= capacity:
                return self._free.pop(i)
        if not fits(capacity, self.image_size):
            return _NumpyShard(capacity, self.image_size)
        return ShardFile(capacity, self.image_size)

    def _reclaim(self, write: tuple[Future[float], Any]) -> None:
        fut, f = write
        self.put_s += fut.result()
        self._free.append(f)

    def _flush(self, split: str) -> None:
        f, fill, labs = self._open.pop(split)
        if not fill:
            self._free.append(f)
            return
        uri = join_uri(self.output_uri, f"{split}-{len(self.uris[split]):05d}.npz")
        labels = np.concatenate(labs).astype(np.int64)
        self.uris[split].append(uri)
        self.sizes[split].append(fill)
        self.counts[split] += fill
        while len(self._writes) >= WRITES_IN_FLIGHT:  # bound memory: wait for the oldest write
            self._reclaim(self._writes.popleft())

        def write() -> float:
            t0 = time.perf_counter()
            self.put(uri, f.finish(fill, labels))
            return time.perf_counter() - t0

        self._writes.append((self.pool.submit(write), f))


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
) -> ShardWriter:
    """The step's core, from encoded images to written shards (what the benchmark measures).

    ``items``: (manifest index, encoded bytes) in manifest order (corrupt ones already left
    out); ``splits[i]``/``labels[i]`` (int64 [N]): manifest entry ``i``'s split and class;
    ``put(uri, body)``: writes one shard (called in a writer thread); ``on_undecodable(i, bytes)``:
    an image neither DALI nor the fallback could decode, ``reasons[i]`` (when a dict is given) saying
    why, filled before the call. Returns the closed :class:`ShardWriter` (uris, counts).
    Raises what ``items``, DALI or ``put`` raise; written shards are not removed here.
    """
    remaining = Counter(splits[i] for i in range(len(splits)))
    with ThreadPoolExecutor(max_workers=WRITES_IN_FLIGHT, thread_name_prefix="shard-put") as pool:
        writer = ShardWriter(output_uri, shard_size, image_size, dict(remaining), put, pool)
        for split in ("train", "validation"):
            writer.expected.setdefault(split, 0)
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
        t0 = time.perf_counter()
        writer.close()
        timings.tail_s = time.perf_counter() - t0
        timings.put_s = writer.put_s
    return writer


def quarantine_summary(quarantined: Sequence[tuple[int, Verdict]]) -> str:
    """Counts per category, most first, then by name: ``"3 truncated, 2 not-an-image"`` ("none" when empty)."""
    counts = Counter(v.category for _, v in quarantined)
    return ", ".join(f"{n} {c}" for c, n in sorted(counts.items(), key=lambda cn: (-cn[1], cn[0]))) or "none"


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
    index = ShardIndex(labels=labels, image_size=inp.image_size, channels=3, mean=MEAN, std=STD,
                       train=writer.uris["train"], validation=writer.uris["validation"],
                       train_count=counts["train"], validation_count=counts["validation"],
                       train_sizes=writer.sizes["train"], validation_sizes=writer.sizes["validation"])
    write_json(s3, join_uri(inp.output_uri, "index.json"), index.model_dump(mode="json"))
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


def preprocess_timed(inp: PreprocessInput, s3: Any, *, reader: Any = None) -> tuple[PreprocessOutput, StepTimings]:
    """:func:`preprocess`, also returning where the time went (:class:`StepTimings`)."""
    t_start = time.perf_counter()
    timings = StepTimings()
    reader = s3 if reader is None else reader
    manifest = DatasetManifest.model_validate(read_json(s3, inp.manifest_uri))
    bucket, data_prefix = parse_s3_uri(DatasetLayout.of_manifest(inp.manifest_uri).data_uri)
    label_index = {label: i for i, label in enumerate(manifest.labels)}
    # In content-hash order, not the manifest's (grouped by label): every shard mixes the classes,
    # so a window of a shard or two shuffled together (pipectl.components.shard_stream) is a fair sample.
    entries = sorted(manifest.entries, key=lambda e: e.sha256)
    splits = ["validation" if in_validation(e.sha256, inp.validation_fraction) else "train" for e in entries]
    labels = np.asarray([label_index[e.label] for e in entries], dtype=np.int64)

    use_gpu = inp.device == "gpu" or (inp.device == "auto" and gpu_available())
    if inp.device == "gpu" and not gpu_available():
        raise StepError("device=gpu but DALI sees no CUDA device", "use device=auto or cpu, or schedule on a GPU node")

    quarantined: list[tuple[int, Verdict]] = []  # (manifest index, why)
    reasons: dict[int, Verdict] = {}  # filled by the decode stream for the images it could not decode
    side_writes: list[Future[Any]] = []

    def put(uri: str, body: Any) -> None:
        out_bucket, out_key = parse_s3_uri(uri)
        s3.put_object(Bucket=out_bucket, Key=out_key, Body=body)

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="quarantine") as side:

        transcoded: set[int] = set()  # images given to DALI as PIL's decoding, not as stored

        def read(i: int) -> bytes:
            return reader.get_object(Bucket=bucket, Key=data_prefix + entries[i].key)["Body"].read()

        def keep(i: int, blob: bytes) -> None:
            put(join_uri(inp.output_uri, "quarantine", entries[i].key), read(i) if i in transcoded else blob)

        def quarantine(i: int, blob: bytes, verdict: Verdict) -> None:
            quarantined.append((i, verdict))
            side_writes.append(side.submit(keep, i, blob))
            log.warning("quarantined %s (%s): %s", entries[i].key, verdict.category, verdict.reason)

        def fetch(i: int) -> tuple[bytes, bytes, Verdict | None]:
            """(the object's bytes, the bytes to decode, why it is quarantined or None); in a fetch thread."""
            blob = read(i)
            fmt, verdict = screen(blob)
            if verdict is None and fmt in FALLBACK_FORMATS:  # DALI cannot read it: PIL decodes it here
                try:
                    return blob, decode_with_pil(blob), None
                except Exception as e:  # PIL raises many types for bad files
                    return blob, blob, _fallback_verdict(blob, fmt, e)
            return blob, blob, verdict

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
                batch_size=inp.batch_size, shard_size=shard_images(inp.shard_size, inp.image_size), use_gpu=use_gpu, put=put,
                on_undecodable=lambda i, blob: quarantine(i, blob, reasons.pop(i, Verdict(Corrupt.UNDECODABLE, "decoder error"))),
                timings=timings, reasons=reasons,
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


def preprocess(inp: PreprocessInput, s3: Any, *, reader: Any = None) -> PreprocessOutput:
    """See the module doc. Raises :class:`StepError` (exit 1) when too many images are corrupt
    or a split is empty (the shards written so far are removed; no index.json is written).

    ``s3``: the store (writes); ``reader``: where the staged images are read from (default ``s3``;
    Alluxio's S3 proxy when configured, see ``pipectl.components.alluxio.data_read_client``).
    """
    return preprocess_timed(inp, s3, reader=reader)[0]


def run(inp: PreprocessInput, settings: StoreSettings) -> PreprocessOutput:
    from pipectl.components.alluxio import data_read_client

    return preprocess(inp, s3_client(settings), reader=data_read_client(settings))
