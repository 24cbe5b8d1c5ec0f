"""A shard ``.npz`` assembled in place: decoded images are copied once, into the file's bytes.

``np.savez`` (:func:`pipectl.components.shards.put_npz`) copies the images array into a new
``BytesIO`` and ``getvalue()`` copies it again; on the 2-core test machine writing to fresh
memory costs ~3.5 ms per MiB in page faults (measured 2026-12-01: 77 MiB copied into a fresh
array 220-280 ms, into memory already touched 8 ms, into memory advised MADV_HUGEPAGE 49 ms).
:class:`ShardFile` instead lays the whole ``.npz`` out in one buffer (anonymous ``mmap``, advised
MADV_HUGEPAGE where the kernel offers it), hands out the images region as a numpy view for the
decoder to fill, writes headers, CRC-32 and the zip directory when the shard is complete, and is
reused for the next shard.

The file is what ``np.savez(f, images=..., labels=...)`` means and ``np.load`` reads: a zip
(PKWARE APPNOTE 6.3, "stored", no compression, no ZIP64) with members ``images.npy`` (uint8
[N, 3, S, S]) and ``labels.npy`` (int64 [N]), each an NPY v1.0 file (numpy
``numpy/lib/format.py``: magic, uint16 header length, a dict literal padded with spaces to a
multiple of 64 bytes, C-order data). Timestamps are fixed (1980-01-01) so equal shards are equal
bytes. Files of 4 GiB or more would need ZIP64: :func:`fits` says when to use ``put_npz`` instead.
"""

from __future__ import annotations

import io
import mmap
import struct
import zlib
from typing import Any

import numpy as np

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header, 30 bytes
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header, 46 bytes
_END = struct.Struct("<IHHHHIIH")  # end of central directory, 22 bytes
_DESCRIPTOR = struct.Struct("<IIII")  # data descriptor (signature, CRC-32, sizes), 16 bytes
_AFTER_DATA = 0x08  # general purpose flag bit 3: the member's CRC and sizes follow its data
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01
_NPY_HEADER = 128  # bytes: magic + version + length + dict, padded (a multiple of 64)
_NAMES = (b"images.npy", b"labels.npy")
IMAGE_DTYPE = np.dtype(np.uint8)
"""What a shard's images are stored as: the resized pixels (the index's mean and std normalise them)."""
_ZIP_LIMIT = 0xFFFFFFFF


def image_bytes(image_size: int) -> int:
    """Bytes of one image's pixels in a shard: 3 channels of ``image_size``² ``IMAGE_DTYPE`` values."""
    return 3 * image_size * image_size * IMAGE_DTYPE.itemsize


def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """NPY v1.0 header of exactly ``_NPY_HEADER`` bytes for a C-order array."""
    d = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}".encode("latin1")
    body_len = _NPY_HEADER - 10
    if len(d) + 1 > body_len:
        raise ValueError(f"NPY header for shape {shape} longer than {body_len} bytes")
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", body_len) + d + b" " * (body_len - len(d) - 1) + b"\n"


def _file_bytes(capacity: int, image_size: int) -> int:
    member = len(_NAMES[0]) + _LOCAL.size + _NPY_HEADER
    return (2 * member + capacity * (image_bytes(image_size) + 8)
            + 2 * (_CENTRAL.size + len(_NAMES[0])) + _END.size)


def fits(capacity: int, image_size: int) -> bool:
    """True when a shard of ``capacity`` images of ``image_size``² stays under the zip limit (4 GiB)."""
    return _file_bytes(capacity, image_size) < _ZIP_LIMIT


def _alloc(nbytes: int) -> mmap.mmap:
    """Anonymous private memory of ``nbytes``, advised MADV_HUGEPAGE when available (Linux THP
    "madvise" mode; ignored elsewhere)."""
    m = mmap.mmap(-1, max(nbytes, 1))
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            m.madvise(advice)
        except OSError:
            pass
    return m


class ShardFile:
    """One reusable ``.npz`` buffer for up to ``capacity`` images of ``image_size``².

    Use: ``view = f.images(n)`` (uint8 [n, 3, S, S], fill it), ``body = f.finish(n, labels)``
    (``labels``: int64 [n]), upload ``body`` (a seekable binary file object over the buffer,
    valid until the next ``images()``), then reuse ``f``. Raises ValueError when ``n`` exceeds
    the capacity or the file would need ZIP64 (see :func:`fits`).
    """

    def __init__(self, capacity: int, image_size: int) -> None:
        if not fits(capacity, image_size):
            raise ValueError(f"a shard of {capacity} images of {image_size}² needs ZIP64; use put_npz")
        self.capacity, self.image_size = capacity, image_size
        self._buf = _alloc(_file_bytes(capacity, image_size))
        self._data0 = _LOCAL.size + len(_NAMES[0]) + _NPY_HEADER

    def images(self, n: int) -> np.ndarray:
        """uint8 view [n, 3, S, S] of the images member's data (uninitialised)."""
        if n > self.capacity:
            raise ValueError(f"{n} images > capacity {self.capacity}")
        s = self.image_size
        return np.frombuffer(self._buf, IMAGE_DTYPE, count=n * 3 * s * s, offset=self._data0).reshape(n, 3, s, s)

    def finish(self, n: int, labels: np.ndarray) -> "BufferReader":
        """Write headers, labels, CRCs and the zip directory for ``n`` images; return the file."""
        if n > self.capacity or labels.shape != (n,):
            raise ValueError(f"labels shape {labels.shape} for {n} images (capacity {self.capacity})")
        s = self.image_size
        mv = memoryview(self._buf)
        members = [(_NAMES[0], IMAGE_DTYPE.str, (n, 3, s, s), n * image_bytes(s)), (_NAMES[1], "<i8", (n,), n * 8)]
        offset, central = 0, []
        for name, descr, shape, data_len in members:
            start = offset + _LOCAL.size + len(name)
            mv[start:start + _NPY_HEADER] = _npy_header(descr, shape)
            if name == _NAMES[1]:
                mv[start + _NPY_HEADER:start + _NPY_HEADER + data_len] = np.ascontiguousarray(labels, "<i8").tobytes()
            size = _NPY_HEADER + data_len
            crc = zlib.crc32(mv[start:start + size])  # releases the GIL for large buffers
            mv[offset:offset + _LOCAL.size] = _LOCAL.pack(0x04034B50, 20, 0, 0, 0, _DOS_DATE, crc, size, size, len(name), 0)
            mv[offset + _LOCAL.size:start] = name
            central.append(_CENTRAL.pack(0x02014B50, 20, 20, 0, 0, 0, _DOS_DATE, crc, size, size, len(name), 0, 0, 0, 0, 0o644 << 16, offset) + name)
            offset = start + size
        directory = b"".join(central)
        end = _END.pack(0x06054B50, 0, 0, len(central), len(central), len(directory), offset, 0)
        mv[offset:offset + len(directory) + len(end)] = directory + end
        return BufferReader(mv[:offset + len(directory) + len(end)])


    # ---- the streamed file: sent while the decoder fills the images (see preprocess/upload.py)

    @property
    def data_offset(self) -> int:
        """Where the images' pixels start in the file (the same in the streamed file)."""
        return self._data0

    def buffer(self) -> memoryview:
        """The whole buffer (the pixels of image ``i`` at ``data_offset + i * image bytes``)."""
        return memoryview(self._buf)

    def stream_head(self, n: int) -> tuple[bytes, bytes]:
        """(local file header + name, NPY header) of the images member of a streamed file of
        ``n`` images: its CRC and sizes follow the pixels in a data descriptor (flag bit 3), so
        the head can be sent before any pixel. The NPY header is the first byte the member's
        CRC-32 covers."""
        s = self.image_size
        local = _LOCAL.pack(0x04034B50, 20, _AFTER_DATA, 0, 0, _DOS_DATE, 0, 0, 0, len(_NAMES[0]), 0) + _NAMES[0]
        return local, _npy_header(IMAGE_DTYPE.str, (n, 3, s, s))

    def stream_tail(self, n: int, labels: np.ndarray, images_crc: int) -> bytes:
        """What follows the ``n`` images' pixels in a streamed file: the images member's data
        descriptor (``images_crc``: CRC-32 of its NPY header and pixels), the labels member and
        the zip directory. ``np.load`` reads the file as it reads :meth:`finish`'s."""
        if labels.shape != (n,):
            raise ValueError(f"labels shape {labels.shape} for {n} images")
        s = self.image_size
        images_size = _NPY_HEADER + n * image_bytes(s)
        labels_offset = self._data0 - _NPY_HEADER + images_size + _DESCRIPTOR.size
        body = _npy_header("<i8", (n,)) + np.ascontiguousarray(labels, "<i8").tobytes()
        crc = zlib.crc32(body)
        name = _NAMES[1]
        labels_member = _LOCAL.pack(0x04034B50, 20, 0, 0, 0, _DOS_DATE, crc, len(body), len(body), len(name), 0) + name + body
        directory = (
            _CENTRAL.pack(0x02014B50, 20, 20, _AFTER_DATA, 0, 0, _DOS_DATE, images_crc, images_size, images_size,
                          len(_NAMES[0]), 0, 0, 0, 0, 0o644 << 16, 0) + _NAMES[0]
            + _CENTRAL.pack(0x02014B50, 20, 20, 0, 0, 0, _DOS_DATE, crc, len(body), len(body), len(name), 0, 0, 0, 0,
                            0o644 << 16, labels_offset) + name
        )
        end = _END.pack(0x06054B50, 0, 0, 2, 2, len(directory), labels_offset + len(labels_member), 0)
        return (_DESCRIPTOR.pack(0x08074B50, images_crc, images_size, images_size) + labels_member + directory + end)


class BufferReader(io.RawIOBase):
    """A read-only, seekable binary file over a memoryview (what boto3 accepts as ``Body``
    without copying the whole buffer into ``bytes``)."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view, self._pos = view, 0

    def __len__(self) -> int:
        return len(self._view)

    def getbuffer(self) -> memoryview:
        """The whole file, without a copy (as ``io.BytesIO.getbuffer``)."""
        return self._view

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        chunk = bytes(self._view[self._pos:end])
        self._pos = max(self._pos, end)
        return chunk

    def readinto(self, b: Any) -> int:
        chunk = self.read(len(b))
        b[:len(chunk)] = chunk
        return len(chunk)
