"""Decoded images into a shard's bytes: from DALI's GPU output straight into page-locked shard
memory, or from a host array.

Why (measured on an H200, 2,000 images of 512² → 224², batch 256, DALI mixed decode at ~22,000
images/s with its outputs dropped): copying each batch out with ``as_cpu()`` and then into the
shard ran at ~5,000 images/s — the copy to pageable memory and the first touch of fresh shard
pages, one batch at a time on the step's main thread, not the decoder, set the pace. Copying from
device memory straight into shard memory registered with CUDA (page-locked, so the copy is one
DMA and the pages are faulted in once, when the shard file is made) ran at 17,000 images/s image
by image and 20,000 as one batch. Into unregistered memory the same direct copy was slower than
``as_cpu()`` (3,200 images/s), so it is used only where :func:`pin` succeeded; elsewhere the host
copy stays.

Pinning uses torch's CUDA runtime binding (``cudaHostRegister``: the GPU image ships torch);
without torch or CUDA nothing is pinned and every copy goes through the host.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import numpy as np

log = logging.getLogger("pipectl.preprocess")

_pinned: dict[int, int] = {}
"""Start address → bytes of every host range registered by :func:`pin` and not yet unpinned."""


def _cudart() -> Any:
    import torch

    return torch.cuda.cudart()


def pin(array: np.ndarray) -> bool:
    """Register ``array``'s memory (C-contiguous) with CUDA as page-locked; False when it cannot
    be (no torch, no CUDA, the driver refused: copies into it then go through the host)."""
    address, nbytes = array.ctypes.data, array.nbytes
    if not array.flags.c_contiguous or not nbytes:
        return False
    try:
        code = _cudart().cudaHostRegister(address, nbytes, 0)
    except Exception as e:  # noqa: BLE001 - no torch or no CUDA: the host copy stays
        log.info("shard memory not page-locked (%s): GPU outputs are copied through the host", e)
        return False
    if int(code) != 0:
        log.info("shard memory not page-locked (cudaHostRegister: %s): GPU outputs are copied through the host", code)
        return False
    _pinned[address] = nbytes
    return True


def unpin(array: np.ndarray) -> None:
    """Undo :func:`pin` for ``array`` (nothing when it was not pinned)."""
    if _pinned.pop(array.ctypes.data, None) is not None:
        _cudart().cudaHostUnregister(array.ctypes.data)


def _is_pinned(dst: np.ndarray) -> bool:
    start, end = dst.ctypes.data, dst.ctypes.data + dst.nbytes
    return any(a <= start and end <= a + n for a, n in _pinned.items())


class DeviceImages:
    """One batch of DALI's GPU output (uint8 [n, 3, S, S] in device memory), valid until its
    pipeline runs again; :func:`take_into` copies from it."""

    def __init__(self, output: Any) -> None:
        self._output = output  # nvidia.dali.backend.TensorListGPU
        self._host: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._output)

    @property
    def dtype(self) -> np.dtype:
        """The numpy dtype of the batch's elements (``DALIDataType.UINT8`` -> ``uint8``)."""
        return np.dtype(str(self._output.dtype).rsplit(".", 1)[-1].lower())

    def host(self) -> np.ndarray:
        """The batch in host memory (one copy, kept for the batch)."""
        if self._host is None:
            self._host = np.asarray(self._output.as_cpu().as_tensor())
        return self._host

    def copy_into(self, dst: np.ndarray, positions: np.ndarray) -> None:
        """``dst[k] = images[positions[k]]`` by direct device-to-host copies into ``dst`` (pinned,
        C-contiguous, of the batch's dtype and image shape): the whole batch in one copy when
        ``positions`` is all of it in order, else image by image."""
        one = dst[0].nbytes
        if len(positions) == len(self) and positions[0] == 0 and positions[-1] == len(self) - 1:
            self._output.as_tensor().copy_to_external(ctypes.c_void_p(dst.ctypes.data))
            return
        base = dst.ctypes.data
        for k, p in enumerate(positions.tolist()):
            self._output[p].copy_to_external(ctypes.c_void_p(base + k * one))


def _fits(images: DeviceImages, dst: np.ndarray, positions: np.ndarray) -> bool:
    shape = tuple(images._output[0].shape())
    return (dst.dtype == images.dtype and dst.flags.c_contiguous and dst.shape[1:] == shape
            and len(dst) >= len(positions) and _is_pinned(dst[:len(positions)]))


def take_into(images: np.ndarray | DeviceImages, positions: np.ndarray, dst: np.ndarray) -> None:
    """``dst[:len(positions)] = images[positions]`` (``positions`` ascending): straight from the
    GPU into pinned ``dst`` when ``images`` is a :class:`DeviceImages`, else through the host."""
    if isinstance(images, DeviceImages):
        if _fits(images, dst, positions):
            images.copy_into(dst, positions)
            return
        images = images.host()
    if len(positions) == len(images) and positions[0] == 0 and positions[-1] == len(images) - 1:
        np.copyto(dst[:len(positions)], images)
    else:
        np.take(images, positions, axis=0, out=dst[:len(positions)], mode="clip")
