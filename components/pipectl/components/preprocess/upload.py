"""A shard sent to the store while the decoder fills it.

Without it a shard is PUT once it is complete, so the last shard of each split is written after
the last image is decoded: on 2,000 images of 224² (one 240 MB train shard and one 60 MB
validation shard) the step waited 0.6-0.85 s for those PUTs after decoding had ended. Streamed,
the images member's header goes first (sized for the shard's capacity; its CRC and sizes follow
the pixels in a data descriptor, npz.py), each filled stretch of pixels goes as soon as a part's
worth is filled, and only the last part and the zip directory are left when the last image
arrives.

The shard's size is fixed when the stream opens: a shard that ends short of its capacity (an
image of it quarantined) drops its upload and is written whole, as without streaming. Memory: the
store client holds at most ``STREAM_IN_FLIGHT`` parts of each streamed shard (64 MiB) beside the
shard's own buffer.
"""

from __future__ import annotations

import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np

from pipectl.components.preprocess.npz import ShardFile, image_bytes

STREAM_PART_BYTES = 16 << 20
"""Bytes a part of a streamed shard (a multipart upload's part; S3's smallest is 5 MiB)."""
STREAM_IN_FLIGHT = 4
"""Parts of one streamed shard being sent at once."""


class StreamedShard:
    """Sends ``f``'s bytes to ``upload`` (:class:`pipectl.components.objstore.Upload`) as
    :meth:`filled` reports images filled, from ``pool``'s threads (in order, one at a time), and
    finishes it with :meth:`finish` (``capacity`` images: the upload is completed; fewer: it is
    dropped and False returned, the caller writes the shard whole). :meth:`abort` drops it."""

    def __init__(self, f: ShardFile, capacity: int, upload: Any, pool: ThreadPoolExecutor, part_bytes: int) -> None:
        self.f, self.capacity, self.upload, self.pool, self.part_bytes = f, capacity, upload, pool, part_bytes
        self._per_image = image_bytes(f.image_size)
        self._lock = threading.Lock()
        self._queued = f.data_offset  # bytes handed to the pool to send
        self._error: BaseException | None = None
        self._closed = False
        local, npy = f.stream_head(capacity)
        self._crc = zlib.crc32(npy)  # the images member's CRC-32: its NPY header, then the pixels
        self._sent = f.data_offset
        self.upload.write(local + npy)

    def filled(self, images: int) -> None:
        """``images`` images of the shard are in place: send the whole parts they complete."""
        end = self.f.data_offset + images * self._per_image
        if end - self._queued >= self.part_bytes:
            self._queued = end
            self.pool.submit(self._send_to, end)

    def finish(self, images: int, labels: np.ndarray) -> bool:
        """The shard holds ``images`` images: complete the upload (True), or, when that is not its
        capacity, drop it (False: write the shard whole instead). Raises a failed send's error."""
        # no waiting on the queued sends (they may sit behind this task in the same pool): what
        # they have not sent yet is sent here, and they find nothing left to do
        with self._lock:
            if self._error is not None:
                raise self._error
            if images != self.capacity:
                self._drop()
                return False
            self._send(self.f.data_offset + images * self._per_image)
            self.upload.write(self.f.stream_tail(images, labels, self._crc))
            self._closed = True
            self.upload.close()
        return True

    def abort(self) -> None:
        """Drop the upload (the step failed): nothing of it stays on the store."""
        with self._lock:
            self._drop()

    def _drop(self) -> None:
        if not self._closed:
            self._closed = True
            self.upload.abort()

    def _send_to(self, end: int) -> None:
        with self._lock:
            if self._closed or self._error is not None:
                return
            try:
                self._send(end)
            except BaseException as e:
                self._error = e
                raise

    def _send(self, end: int) -> None:
        """Send the pixels from what was sent up to byte ``end`` of the file (lock held)."""
        if end <= self._sent:
            return
        view = self.f.buffer()[self._sent:end]
        self._crc = zlib.crc32(view, self._crc)  # releases the GIL for large buffers
        self.upload.write(view)
        self._sent = end


def streamer(open_upload: Callable[[str, int, int], Any] | None,
             pool: ThreadPoolExecutor) -> Callable[[str, ShardFile, int], StreamedShard | None]:
    """``start(uri, f, capacity)``: a :class:`StreamedShard` of ``f`` at ``uri`` (through
    ``open_upload(uri, part_bytes, parts_in_flight)``) when ``open_upload`` is given and the
    shard holds at least two parts' worth of pixels, else None (the shard is PUT whole when
    complete)."""

    def start(uri: str, f: ShardFile, capacity: int) -> StreamedShard | None:
        part = STREAM_PART_BYTES
        if open_upload is None or capacity * image_bytes(f.image_size) < 2 * part:
            return None
        return StreamedShard(f, capacity, open_upload(uri, part, STREAM_IN_FLIGHT), pool, part)

    return start
