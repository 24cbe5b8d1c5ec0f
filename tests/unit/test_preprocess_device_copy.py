"""Decoded images into shard bytes (preprocess/device_copy.py).

The GPU is the boundary this machine cannot cross: the direct copies are exercised here on a real
DALI CPU pipeline's output (the same ``copy_to_external`` / ``as_tensor`` / per-image calls a
GPU TensorList has); on the GPU the GPU check compares the step's shards with ``as_cpu()``'s.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pipectl.components.preprocess import device_copy
from pipectl.components.preprocess.decode import build_pipeline, gpu_available
from pipectl.components.preprocess.device_copy import DeviceImages, take_into

S = 8


def _output(n: int = 5):
    """A real DALI batch of ``n`` decoded images (uint8 [n, 3, S, S]) and the same on the host."""
    rng = np.random.default_rng(0)
    blobs = []
    for _ in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(buf, "PNG")
        blobs.append(np.frombuffer(buf.getvalue(), np.uint8))
    pipe = build_pipeline([blobs], n, S, use_gpu=False, num_threads=1)
    (out,) = pipe.run()
    return pipe, out, np.array(out.as_tensor())


@pytest.mark.parametrize("positions", [[0, 1, 2, 3, 4], [1, 3, 4], [2]])
def test_direct_copies_put_each_image_where_the_shard_wants_it(positions):
    pipe, out, host = _output()
    dst = np.full((8, 3, S, S), 7, np.uint8)
    DeviceImages(out).copy_into(dst[2:], np.asarray(positions))
    np.testing.assert_array_equal(dst[2:2 + len(positions)], host[positions])
    assert (dst[:2] == 7).all() and (dst[2 + len(positions):] == 7).all()  # nothing written outside its place


def test_memory_not_page_locked_gets_its_images_through_the_host(monkeypatch):
    pipe, out, host = _output()
    dst = np.zeros((3, 3, S, S), np.uint8)
    direct = []
    monkeypatch.setattr(DeviceImages, "copy_into", lambda self, d, p: direct.append(p))
    take_into(DeviceImages(out), np.asarray([0, 2, 4]), dst)
    assert direct == []  # never a direct copy into pageable memory (slower than the host copy)
    np.testing.assert_array_equal(dst, host[[0, 2, 4]])


def test_page_locked_memory_of_the_right_shape_gets_direct_copies(monkeypatch):
    pipe, out, host = _output()
    dst = np.zeros((4, 3, S, S), np.uint8)
    monkeypatch.setitem(device_copy._pinned, dst.ctypes.data, dst.nbytes)  # as pin() records it on a GPU
    take_into(DeviceImages(out), np.asarray([1, 4]), dst[1:])
    np.testing.assert_array_equal(dst[1:3], host[[1, 4]])
    wrong = np.zeros((4, 3, S + 1, S + 1), np.uint8)  # another image size: never a raw copy into it
    monkeypatch.setitem(device_copy._pinned, wrong.ctypes.data, wrong.nbytes)
    with pytest.raises(ValueError):
        take_into(DeviceImages(out), np.asarray([0]), wrong)  # the host path's own shape check


def test_host_arrays_are_copied_or_gathered():
    host = (np.arange(5 * 3 * S * S) % 256).astype(np.uint8).reshape(5, 3, S, S)
    dst = np.zeros((5, 3, S, S), np.uint8)
    take_into(host, np.arange(5), dst)
    np.testing.assert_array_equal(dst, host)
    take_into(host, np.asarray([3, 4]), dst)
    np.testing.assert_array_equal(dst[:2], host[[3, 4]])


@pytest.mark.skipif(gpu_available(), reason="a CUDA device is visible: pinning works there")
def test_without_cuda_nothing_is_pinned():
    assert device_copy.pin(np.zeros((2, 3, S, S), np.uint8)) is False
    assert device_copy._pinned == {}


def test_shard_buffers_for_the_gpu_are_made_ready_before_the_first_images(monkeypatch):
    """With ``pin_buffers`` each split's first buffer is made (and page-locked) in a writer
    thread while the decoder starts; the images then land in those very buffers, each split in
    the smallest that holds it, and every buffer is released (unpinned) at close."""
    from concurrent.futures import ThreadPoolExecutor

    from pipectl.components.preprocess.writer import ShardWriter

    pinned, unpinned, made = [], [], []
    monkeypatch.setattr("pipectl.components.preprocess.writer.pin", lambda a: pinned.append(a.ctypes.data) or True)
    monkeypatch.setattr("pipectl.components.preprocess.writer.unpin", lambda a: unpinned.append(a.ctypes.data))
    written: dict[str, np.ndarray] = {}

    def put(uri, body):
        with np.load(io.BytesIO(body.read())) as z:
            written[uri.rsplit("/", 1)[1]] = z["images"]

    images = (np.arange(6 * 3 * S * S) % 256).astype(np.uint8).reshape(6, 3, S, S)
    with ThreadPoolExecutor(2) as pool:
        w = ShardWriter("s3://b/shards", 100, S, {"train": 4, "validation": 2}, put, pool, pin_buffers=True)
        real_new = w._new_file
        monkeypatch.setattr(w, "_new_file", lambda c: made.append(c) or real_new(c))
        w.prepare()
        w._ready.result()
        assert sorted(made) == [2, 4] and len(pinned) == 2
        w.add("validation", images, np.asarray([1, 3]), np.asarray([0, 1]))  # the smaller buffer, not the train one
        w.add("train", images, np.asarray([0, 2, 4, 5]), np.asarray([0, 1, 2, 3]))
        w.close()
    assert sorted(made) == [2, 4]  # no buffer made after the prepared ones
    np.testing.assert_array_equal(written["validation-00000.npz"], images[[1, 3]])
    np.testing.assert_array_equal(written["train-00000.npz"], images[[0, 2, 4, 5]])
    assert sorted(unpinned) == sorted(pinned)
