"""The in-place shard file (components/pipectl/components/preprocess/npz.py) is what np.savez writes and np.load reads."""

from __future__ import annotations

import io

import numpy as np
import pytest

from pipectl.components.preprocess.npz import ShardFile, fits


def _fill(f: ShardFile, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (n, 3, f.image_size, f.image_size), dtype=np.uint8)
    f.images(n)[:] = images
    return images, rng.integers(0, 10, n).astype(np.int64)


def test_shard_file_loads_with_numpy_like_savez():
    f = ShardFile(capacity=7, image_size=12)
    images, labels = _fill(f, 7, seed=1)
    body = f.finish(7, labels).read()
    with np.load(io.BytesIO(body)) as z:
        assert sorted(z.files) == ["images", "labels"]
        assert z["images"].dtype == np.uint8 and z["images"].shape == (7, 3, 12, 12)
        np.testing.assert_array_equal(z["images"], images)
        np.testing.assert_array_equal(z["labels"], labels)


def test_reused_buffer_with_fewer_images_holds_only_them():
    """The last shard of a split is shorter: the file must say so (shape, sizes, CRC)."""
    f = ShardFile(capacity=6, image_size=8)
    _fill(f, 6, seed=2)
    f.finish(6, np.zeros(6, np.int64))
    images, labels = _fill(f, 4, seed=3)
    body = f.finish(4, labels)
    data = body.read()
    assert len(body) == len(data)
    with np.load(io.BytesIO(data)) as z:
        assert z["images"].shape == (4, 3, 8, 8)
        np.testing.assert_array_equal(z["images"], images)
        np.testing.assert_array_equal(z["labels"], labels)
    # a bit flipped in the image data is caught by the zip CRC on read
    bad = bytearray(data)
    bad[200] ^= 0xFF
    with np.load(io.BytesIO(bytes(bad))) as z, pytest.raises(Exception, match="CRC|Bad"):
        z["images"]


def test_equal_shards_are_equal_bytes_and_the_reader_seeks():
    a, b = ShardFile(3, 8), ShardFile(5, 8)
    images, labels = _fill(a, 3, seed=4)
    b.images(3)[:] = images
    ra, rb = a.finish(3, labels), b.finish(3, labels)
    assert ra.read() == rb.read()
    rb.seek(0)
    assert rb.read(4) == b"PK\x03\x04"  # local file header
    rb.seek(-22, io.SEEK_END)
    assert rb.read(4) == b"PK\x05\x06"  # end of central directory
    with pytest.raises(ValueError, match="capacity"):
        a.images(4)


def test_zip64_sized_shards_are_refused():
    assert fits(5000, 512)  # 5000 × 3 × 512² bytes ≈ 3.9 GB
    assert not fits(6000, 512)
    with pytest.raises(ValueError, match="ZIP64"):
        ShardFile(6000, 512)


def test_a_shard_holds_at_most_256_mib_of_images():
    from pipectl.components.preprocess.writer import SHARD_BYTES, shard_images

    assert shard_images(2048, 64) == 2048
    assert shard_images(2048, 224) == 1783 and 1783 * 3 * 224 * 224 <= SHARD_BYTES < 1784 * 3 * 224 * 224  # uint8
    assert shard_images(2048, 224, 64 << 20) == 445 and shard_images(2048, 16, 1 << 20) == 1365  # the run's shard-mib
    assert shard_images(2048, 512, 1 << 20) == 1
    assert shard_images(100, 512) == 100 and shard_images(2048, 512) == 341
