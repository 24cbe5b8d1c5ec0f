"""Shard writing: decoded images routed to their split's shard files, complete shards PUT by
writer threads while the next batches decode, and ``index.json`` (:class:`ShardIndex`), which
makes the shards reachable.

Shards: ``<output_uri>/<split>-<nnnnn>.npz`` with ``images`` uint8 [N, 3, H, W] (the resized
pixels; readers normalise them with the index's mean and std) and ``labels`` int64 [N]. Each shard file is assembled in place
(npz.py): an image is copied once, into the file's bytes. Memory is bounded by the shard buffers
(one open per split, at most 2 being written, finished ones reused), not by the data set.
"""

from __future__ import annotations

import io
import time
from collections import Counter, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from pipectl.components.contracts import DEFAULT_SHARD_MIB, ShardIndex
from pipectl.components.runtime import StepError, join_uri, write_json
from pipectl.components.preprocess.decode import MEAN, STD
from pipectl.components.preprocess.device_copy import DeviceImages, pin, take_into, unpin
from pipectl.components.preprocess.npz import IMAGE_DTYPE, ShardFile, fits, image_bytes
from pipectl.components.preprocess.upload import StreamedShard

WRITES_IN_FLIGHT = 2

SHARD_BYTES = DEFAULT_SHARD_MIB << 20
"""Most bytes of images in one shard unless the run's ``shard-mib`` says otherwise: what a training
process holds per shard it reads (pipectl.components.shard_stream keeps about four), whatever the
dataset's size."""


def shard_images(shard_size: int, image_size: int, shard_bytes: int = SHARD_BYTES) -> int:
    """Images per shard: ``shard_size``, fewer when their bytes would pass ``shard_bytes`` (at
    224x224 and 256 MiB: 1,783 images); at least one (``shard-mib`` is checked to hold one)."""
    return max(1, min(shard_size, shard_bytes // image_bytes(image_size)))


class _NumpyShard:
    """A shard too large for :class:`ShardFile` (ZIP64): a numpy buffer written by ``np.savez``."""

    def __init__(self, capacity: int, image_size: int) -> None:
        self.capacity, self.image_size = capacity, image_size
        self._images = np.empty((capacity, 3, image_size, image_size), IMAGE_DTYPE)

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
    pin_buffers: bool = False
    """Page-lock each shard buffer for direct copies from the GPU (the ``mixed`` decoder's outputs)."""
    stream: Callable[[str, Any, int], StreamedShard | None] | None = None
    """``stream(uri, file, capacity)``: a shard sent while it fills (upload.py), or None: PUT whole
    when complete. Not used with ``pin_buffers``."""
    uris: dict[str, list[str]] = field(default_factory=lambda: {"train": [], "validation": []})
    sizes: dict[str, list[int]] = field(default_factory=lambda: {"train": [], "validation": []})
    counts: Counter[str] = field(default_factory=Counter)
    put_s: float = 0.0
    _open: dict[str, tuple[Any, int, list[np.ndarray], StreamedShard | None]] = field(default_factory=dict)
    _writes: deque[tuple[Future[float], Any]] = field(default_factory=deque)
    _free: list[Any] = field(default_factory=list)
    _ready: Future[None] | None = None

    def add(self, split: str, images: np.ndarray | DeviceImages, positions: np.ndarray, labels: np.ndarray) -> None:
        """Copy ``images[positions]`` (uint8 [B, 3, S, S], on the host or the GPU; positions
        int [k], ascending) with ``labels`` int64 [k] into ``split``'s open shard(s)."""
        k = 0
        while k < len(positions):
            if split not in self._open:
                self._open[split] = self._start(split)
            f, fill, labs, streamed = self._open[split]
            if fill == f.capacity:  # capacity = min(shard_size, an upper bound of what may arrive)
                raise StepError(f"more {split} images arrived than expected ({fill})", "report this as a bug")
            take = positions[k:k + f.capacity - fill]
            take_into(images, take, f.images(f.capacity)[fill:fill + len(take)])
            labs.append(labels[k:k + len(take)])
            k += len(take)
            fill += len(take)
            self.expected[split] -= len(take)
            self._open[split] = (f, fill, labs, streamed)
            if streamed is not None:
                streamed.filled(fill)
            if fill == self.shard_size:
                self._flush(split)

    def _start(self, split: str) -> tuple[Any, int, list[np.ndarray], StreamedShard | None]:
        """A new shard of ``split``: its buffer, and its stream when it is sent while it fills."""
        capacity = min(self.shard_size, max(self.expected[split], 1))  # what arrives unless an image is lost
        f = self._file(capacity)
        streamed = None
        if self.stream is not None and not self.pin_buffers and isinstance(f, ShardFile):
            streamed = self.stream(self._uri(split), f, capacity)
        return f, 0, [], streamed

    def _uri(self, split: str) -> str:
        """The next shard of ``split``."""
        return join_uri(self.output_uri, f"{split}-{len(self.uris[split]):05d}.npz")

    def abort(self) -> None:
        """The step failed: drop the streams of the shards still open (nothing of them stays)."""
        for split in list(self._open):
            streamed = self._open.pop(split)[3]
            if streamed is not None:
                streamed.abort()

    def lost(self, split: str) -> None:
        """One image of ``split`` will not arrive (quarantined)."""
        self.expected[split] -= 1

    def close(self) -> None:
        """Write the open shards and wait for every write (raises the first write error)."""
        for split in list(self._open):
            self._flush(split)
        while self._writes:
            self._reclaim(self._writes.popleft())
        if self._ready is not None:  # nothing was added: the prepared buffers are still to be released
            self._ready.result()
            self._ready = None
        for f in self._free:
            unpin(f.images(f.capacity))

    def prepare(self) -> None:
        """With ``pin_buffers``: make each split's first shard buffer ready (allocated, its pages
        faulted in and page-locked) in a writer thread, while the decoder starts (DALI's build and
        first batch take seconds); the first :meth:`add` waits for it. Without, nothing: buffers
        are made when needed."""
        if self.pin_buffers:
            capacities = [min(self.shard_size, n) for n in self.expected.values() if n > 0]
            self._ready = self.pool.submit(lambda: self._free.extend(self._new_file(c) for c in capacities))

    def _new_file(self, capacity: int) -> Any:
        f = ShardFile(capacity, self.image_size) if fits(capacity, self.image_size) else _NumpyShard(capacity, self.image_size)
        if self.pin_buffers:
            pin(f.images(f.capacity))  # GPU outputs are copied straight in (device_copy); else through the host
        return f

    def _file(self, capacity: int) -> Any:
        if self._ready is not None:
            self._ready.result()
            self._ready = None
        while self._writes and self._writes[0][0].done():
            self._reclaim(self._writes.popleft())
        fitting = [f for f in self._free if f.capacity >= capacity]
        if fitting:  # the smallest that holds it: a large buffer stays for the split that needs it
            f = min(fitting, key=lambda f: f.capacity)
            self._free.remove(f)
            return f
        return self._new_file(capacity)

    def _reclaim(self, write: tuple[Future[float], Any]) -> None:
        fut, f = write
        self.put_s += fut.result()
        self._free.append(f)

    def _flush(self, split: str) -> None:
        f, fill, labs, streamed = self._open.pop(split)
        if not fill:
            if streamed is not None:
                streamed.abort()
            self._free.append(f)
            return
        uri = self._uri(split)
        labels = np.concatenate(labs).astype(np.int64)
        self.uris[split].append(uri)
        self.sizes[split].append(fill)
        self.counts[split] += fill
        while len(self._writes) >= WRITES_IN_FLIGHT:  # bound memory: wait for the oldest write
            self._reclaim(self._writes.popleft())

        def write() -> float:
            t0 = time.perf_counter()
            if streamed is None or not streamed.finish(fill, labels):  # not streamed, or it ended short
                self.put(uri, f.finish(fill, labels))
            return time.perf_counter() - t0

        self._writes.append((self.pool.submit(write), f))


def write_index(s3: Any, output_uri: str, labels: list[str], image_size: int, writer: ShardWriter,
                counts: dict[str, int]) -> None:
    """Write ``<output_uri>/index.json`` listing ``writer``'s shards (written last: it makes them reachable)."""
    index = ShardIndex(labels=labels, image_size=image_size, channels=3, mean=MEAN, std=STD,
                       train=writer.uris["train"], validation=writer.uris["validation"],
                       train_count=counts["train"], validation_count=counts["validation"],
                       train_sizes=writer.sizes["train"], validation_sizes=writer.sizes["validation"])
    write_json(s3, join_uri(output_uri, "index.json"), index.model_dump(mode="json"))
