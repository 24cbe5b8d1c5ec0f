"""preprocess with real DALI (CPU here) over images staged in a real S3 server."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pipectl.components.contracts import PreprocessInput, StageInput
from pipectl.components.preprocess.core import preprocess
from pipectl.components.preprocess.decode import decode_all
from pipectl.components.runtime import StepError, read_json
from pipectl.components.shards import load_split
from pipectl.components.stage.core import stage

pytestmark = pytest.mark.integration


@pytest.fixture()
def settings(store_settings):
    """Every test here runs against moto's S3 server and against a real Ceph RGW."""
    return store_settings


@pytest.fixture()
def dataset_with_corrupt_jpeg(small_digits_dir, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(small_digits_dir, d)
    good = next((d / "3").iterdir()).read_bytes()
    (d / "3" / "broken.jpg").write_bytes(good[: len(good) // 2])  # truncated JPEG
    return d


def _inp(manifest_uri, bucket, **kw):
    base = dict(manifest_uri=manifest_uri, output_uri=f"s3://{bucket}/runs/t/shards/", image_size=24,
                validation_fraction=0.2, max_corrupt_fraction=0.01)
    return PreprocessInput(**{**base, **kw})


def test_corrupt_jpeg_is_quarantined_and_counted(settings, s3, dataset_with_corrupt_jpeg):
    staged = stage(StageInput(source_uri=str(dataset_with_corrupt_jpeg), bucket=settings.bucket), s3)
    out = preprocess(_inp(staged.manifest_uri, settings.bucket), s3)
    assert out.corrupt == 1
    assert out.train_count + out.validation_count == 300
    assert out.device == "cpu"
    assert out.images_per_s > 0
    quarantine = read_json(s3, f"s3://{settings.bucket}/runs/t/shards/quarantine.json")
    assert [q["key"] for q in quarantine] == ["3/broken.jpg"]
    assert s3.head_object(Bucket=settings.bucket, Key="runs/t/shards/quarantine/3/broken.jpg")["ContentLength"] > 0

    x, y, index = load_split(s3, out.shards_uri, "train")
    assert x.shape == (out.train_count, 3, 24, 24)
    assert y.dtype == np.int64 and set(y.tolist()) == set(range(10))
    assert -1.0 <= x.min() and x.max() <= 1.0
    assert index.labels == [str(i) for i in range(10)]


def test_an_image_changed_in_the_store_after_staging_is_quarantined_not_trained_on(settings, s3, small_digits_dir):
    """preprocess re-hashes every object it reads against the manifest: an image replaced in the
    store after staging (here: by another valid digit) is quarantined as changed, the rest used."""
    staged = stage(StageInput(source_uri=str(small_digits_dir), bucket=settings.bucket), s3)
    data_key = staged.dataset_uri.split("/", 3)[3] + "data/"
    other = next((small_digits_dir / "7").iterdir()).read_bytes()
    victim = sorted(p.name for p in (small_digits_dir / "3").iterdir())[0]
    s3.put_object(Bucket=settings.bucket, Key=f"{data_key}3/{victim}", Body=other)
    out = preprocess(_inp(staged.manifest_uri, settings.bucket), s3)
    assert out.corrupt == 1 and out.train_count + out.validation_count == 299
    quarantine = read_json(s3, f"s3://{settings.bucket}/runs/t/shards/quarantine.json")
    assert [(q["key"], q["category"]) for q in quarantine] == [(f"3/{victim}", "changed")], quarantine
    assert "changed in the store after it was staged" in quarantine[0]["reason"]


def test_too_many_corrupt_images_fail_deterministically(settings, s3, dataset_with_corrupt_jpeg):
    staged = stage(StageInput(source_uri=str(dataset_with_corrupt_jpeg), bucket=settings.bucket), s3)
    with pytest.raises(StepError, match="corrupt") as e:
        preprocess(_inp(staged.manifest_uri, settings.bucket, max_corrupt_fraction=0.0), s3)
    assert not e.value.transient


def test_dali_matches_a_reference_resize(small_digits_dir):
    """DALI's output against PIL on the same JPEGs (decode -> resize -> uint8 CHW)."""
    from PIL import Image

    paths = sorted(small_digits_dir.rglob("*.jpg"))[:40]
    out, seconds = decode_all([p.read_bytes() for p in paths], image_size=32, batch_size=16, use_gpu=False)
    assert out.shape == (40, 3, 32, 32) and out.dtype == np.uint8 and seconds > 0
    ref = np.stack([np.asarray(Image.open(p).convert("RGB"), np.float32) for p in paths]).transpose(0, 3, 1, 2)
    # same size in and out: the resize is an identity, differences come from the JPEG decoders only
    assert np.abs(out.astype(np.float32) - ref).mean() < 2.5


def test_stored_pixels_normalised_by_the_reader_equal_dalis_own_normalisation():
    """The shards hold uint8 pixels and readers normalise them; rounded to float16 that equals what
    DALI's crop_mirror_normalize gives in float16 on the same resized pixels (nothing is lost by
    storing pixels instead of DALI's normalised output)."""
    import nvidia.dali.fn as fn
    import nvidia.dali.types as types
    from nvidia.dali import pipeline_def

    from pipectl.components.contracts import ShardIndex
    from pipectl.components.preprocess.decode import MEAN, STD
    from pipectl.components.shards import as_float

    pixels = np.arange(256, dtype=np.uint8)[None, :, None].repeat(3, axis=2)  # HWC: every value in each channel

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        x = fn.external_source(source=lambda: [pixels], batch=True, layout="HWC")
        return fn.crop_mirror_normalize(x, dtype=types.FLOAT16, output_layout="CHW", mean=MEAN, std=STD)

    p = pipe()
    p.build()
    (dali,) = p.run()
    index = ShardIndex(labels=["a", "b"], image_size=256, channels=3, mean=MEAN, std=STD, train=[], validation=[],
                       train_count=0, validation_count=0)
    ours = as_float(pixels.transpose(2, 0, 1)[None], index)
    np.testing.assert_array_equal(ours.astype(np.float16), np.asarray(dali.as_tensor()))
    assert ours.min() == -1.0 and ours.max() == 1.0


def test_an_image_only_dali_rejects_is_isolated_and_quarantined(small_digits_dir):
    """A PNG with valid chunks but bad deflate data passes the cheap checks; DALI fails the batch."""
    import struct
    import zlib

    from pipectl.components.preprocess.decode import decode_robust

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    bad_png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0))
               + chunk(b"IDAT", b"\x78\x9c" + b"\xff" * 40) + chunk(b"IEND", b""))
    good = [p.read_bytes() for p in sorted(small_digits_dir.rglob("*.jpg"))[:20]]
    images, bad, _ = decode_robust(good[:7] + [bad_png] + good[7:], image_size=16, batch_size=8, use_gpu=False)
    assert bad == [7]
    assert images.shape == (20, 3, 16, 16)


def test_C13_digits_with_crlf_after_the_end_of_image_marker_are_all_used(settings, s3, digits_dir, tmp_path):
    """C13: 60 of the 1,797 digits JPEGs carry CR LF after EOI (a text-mode copy); PIL and DALI
    decode them. Right: all 1,797 used, 0 quarantined (it was 60 = 3.3% > 1%: preprocess failed)."""
    d = tmp_path / "ds"
    shutil.copytree(digits_dir, d)
    files = sorted(d.rglob("*.jpg"))
    assert len(files) == 1797
    for f in files[::30][:60]:
        f.write_bytes(f.read_bytes() + b"\r\n")
    staged = stage(StageInput(source_uri=str(d), bucket=settings.bucket), s3)
    out = preprocess(_inp(staged.manifest_uri, settings.bucket), s3)
    assert out.corrupt == 0
    assert out.train_count + out.validation_count == 1797


def _bad_png():
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", b"\x78\x9c" + b"\xff" * 40) + chunk(b"IEND", b""))


def test_a_stream_goes_on_after_a_batch_dali_rejects(small_digits_dir):
    """One pipeline for the whole stream; a batch DALI fails is decoded again image by
    image, the bad image reported with its tag, and a fresh pipeline continues with the rest."""
    from pipectl.components.preprocess.decode import DecodeTimings, decode_stream
    from pipectl.components.preprocess.stream import batched

    good = [p.read_bytes() for p in sorted(small_digits_dir.rglob("*.jpg"))[:60]]
    items = list(enumerate(good[:27])) + [(1000, _bad_png())] + list(enumerate(good[27:], start=27))
    timings = DecodeTimings()
    tags, parts, bad = [], [], []
    for t, images, rejected in decode_stream(batched(items, 8), 16, 8, use_gpu=False, timings=timings):
        tags += t
        parts.append(images.copy())
        bad += [tag for tag, _ in rejected]
    assert bad == [1000]
    assert tags == list(range(60))
    expected, _ = decode_all(good, image_size=16, batch_size=8, use_gpu=False)
    np.testing.assert_array_equal(np.concatenate(parts), expected)
    assert timings.rebuilds == 1 and timings.images == 60
    assert timings.startup_s > 0 and timings.steady_images > 0


def test_shards_hold_each_split_in_content_hash_order_across_shard_boundaries(settings, s3, dataset_with_corrupt_jpeg):
    """Each split's decodable images in content-hash order (so every shard mixes the classes),
    cut every shard-size images, the index counting each shard; checked against decoding the
    split in one go."""
    from pipectl.components.contracts import DatasetManifest
    from pipectl.components.preprocess.split import in_validation

    staged = stage(StageInput(source_uri=str(dataset_with_corrupt_jpeg), bucket=settings.bucket), s3)
    out = preprocess(_inp(staged.manifest_uri, settings.bucket, shard_size=50, batch_size=32), s3)
    manifest = DatasetManifest.model_validate(read_json(s3, staged.manifest_uri))
    data = f"{staged.manifest_uri.rsplit('/', 1)[0]}/data/".removeprefix(f"s3://{settings.bucket}/")
    for split, count in (("train", out.train_count), ("validation", out.validation_count)):
        entries = sorted((e for e in manifest.entries if e.key != "3/broken.jpg" and in_validation(e.sha256, 0.2) == (split == "validation")),
                         key=lambda e: e.sha256)
        blobs = [s3.get_object(Bucket=settings.bucket, Key=data + e.key)["Body"].read() for e in entries]
        expected, _ = decode_all(blobs, image_size=24, batch_size=64, use_gpu=False)
        x, y, index = load_split(s3, out.shards_uri, split)
        assert len(getattr(index, split)) == -(-count // 50) and count == len(entries)
        assert getattr(index, f"{split}_sizes") == [50] * (count // 50) + ([count % 50] if count % 50 else [])
        assert len({y for y in [manifest.labels.index(e.label) for e in entries[:50]]}) == 10, "the first shard mixes the classes"
        np.testing.assert_array_equal(x, (expected.astype(np.float32) - 127.5) / 127.5)
        assert y.tolist() == [manifest.labels.index(e.label) for e in entries]


def test_the_runs_shard_mib_bounds_each_shards_bytes(settings, s3, dataset_with_corrupt_jpeg):
    """shard-mib=1 at image-size 64 (12 KiB of uint8 pixels per image): at most 85 images a shard,
    every image still in one."""
    staged = stage(StageInput(source_uri=str(dataset_with_corrupt_jpeg), bucket=settings.bucket), s3)
    out = preprocess(_inp(staged.manifest_uri, settings.bucket, image_size=64, shard_mib=1), s3)
    index = read_json(s3, f"{out.shards_uri}index.json")
    for split, count in (("train", out.train_count), ("validation", out.validation_count)):
        sizes = index[f"{split}_sizes"]
        assert max(sizes) == min(85, count) and sum(sizes) == count and len(sizes) == -(-count // 85)
        for uri in index[split]:
            bucket, key = uri.removeprefix("s3://").split("/", 1)
            assert s3.head_object(Bucket=bucket, Key=key)["ContentLength"] <= (1 << 20) + 4096  # images + labels + zip headers


def test_a_failed_step_leaves_no_shards(settings, s3, dataset_with_corrupt_jpeg):
    """Shards are written while decoding; when the step then fails, they are removed."""
    staged = stage(StageInput(source_uri=str(dataset_with_corrupt_jpeg), bucket=settings.bucket), s3)
    with pytest.raises(StepError, match="corrupt"):
        preprocess(_inp(staged.manifest_uri, settings.bucket, max_corrupt_fraction=0.0, shard_size=40), s3)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=settings.bucket, Prefix="runs/t/shards/").get("Contents", [])]
    assert keys and not [k for k in keys if k.endswith(".npz")]
    assert "runs/t/shards/quarantine.json" in keys


def test_a_fetch_error_reaches_the_step_as_itself(small_digits_dir):
    """An error raised while feeding DALI (an S3 GET that failed after its retries) must come out
    of the stream as the same exception, not as a DALI error or a short stream: the step's exit
    code (1 or 75) is chosen from it."""
    from pipectl.components.preprocess.decode import decode_stream
    from pipectl.components.preprocess.stream import batched

    good = [p.read_bytes() for p in sorted(small_digits_dir.rglob("*.jpg"))[:40]]

    class StoreDown(ConnectionError):
        pass

    def items():
        for i, b in enumerate(good):
            if i == 20:
                raise StoreDown("connection refused after 5 attempts")
            yield i, b

    seen = []
    with pytest.raises(StoreDown, match="connection refused"):
        for tags, _, _ in decode_stream(batched(items(), 8), 16, 8, use_gpu=False):
            seen += tags
    assert seen == list(range(len(seen))) and len(seen) <= 16


def test_preprocess_reads_through_obstore_and_a_lost_store_is_transient(settings, s3, small_digits_dir):
    """The staged images are read with obstore from the store itself: an object is its bytes, a
    missing one is FileNotFoundError, and a store that stops answering is StoreUnavailable (a
    ConnectionError: the step's exit 75, retried as the infrastructure's)."""
    from pipectl.components.objstore import ObjectReader, StoreUnavailable
    from pipectl.components.runtime import s3_client

    s3.create_bucket(Bucket=settings.bucket)
    s3.put_object(Bucket=settings.bucket, Key="a/b.jpg", Body=b"\xff\xd8jpeg")
    reader = ObjectReader(s3, settings.bucket)
    assert reader.get("a/b.jpg") == b"\xff\xd8jpeg"
    with pytest.raises(FileNotFoundError):
        reader.get("a/missing.jpg")
    from pipectl.pipelines.backends.processes import free_port

    gone = s3_client(settings.model_copy(update={"s3_endpoint": f"http://127.0.0.1:{free_port()}"}))
    with pytest.raises(StoreUnavailable, match="read of s3://"):
        ObjectReader(gone, settings.bucket).get("a/b.jpg")


def _shard_heads(s3, split, index):
    heads = []
    for uri in index[split]:
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        heads.append((s3.head_object(Bucket=bucket, Key=key), s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
    return heads


@pytest.mark.parametrize("late_corrupt", [False, True], ids=["every-image", "an-image-lost-after-the-stream-opened"])
def test_large_shards_are_sent_while_they_fill_and_read_as_the_whole_ones(settings, s3, small_digits_dir, tmp_path,
                                                                       monkeypatch, late_corrupt):
    """A shard of two parts or more goes up as a multipart upload while it fills (parts of 5 MiB
    here; the train shard of 160² images holds ~4); a smaller one (validation) is PUT whole. The
    shards read back equal, image for image, to those of a run that streams nothing. A shard that
    ends short of the size its stream was opened with (an image of it lost once the stream had
    started: a corrupt file last in the train order) is written whole instead, and no upload is
    left behind on the store."""
    import hashlib
    import io
    import zipfile

    from pipectl.components.preprocess import upload
    from pipectl.components.preprocess.split import in_validation

    d = tmp_path / "ds"
    shutil.copytree(small_digits_dir, d)
    if late_corrupt:
        good = next((d / "3").iterdir()).read_bytes()
        body = good[: len(good) // 2]
        while not (hashlib.sha256(body).hexdigest().startswith("f") and not in_validation(hashlib.sha256(body).hexdigest(), 0.2)):
            body += b"\0"  # still a truncated JPEG; its content hash puts it last in the train split
        (d / "3" / "broken.jpg").write_bytes(body)
    staged = stage(StageInput(source_uri=str(d), bucket=settings.bucket), s3)

    def run(part_bytes, name):
        monkeypatch.setattr(upload, "STREAM_PART_BYTES", part_bytes)
        return preprocess(_inp(staged.manifest_uri, settings.bucket, image_size=160, batch_size=32,
                               output_uri=f"s3://{settings.bucket}/runs/{name}/shards/"), s3)

    streamed, whole = run(5 << 20, "streamed"), run(1 << 40, "whole")
    assert (streamed.corrupt, streamed.train_count) == (int(late_corrupt), whole.train_count)
    for split in ("train", "validation"):
        x, y, _ = load_split(s3, streamed.shards_uri, split)
        x_whole, y_whole, _ = load_split(s3, whole.shards_uri, split)
        np.testing.assert_array_equal(x, x_whole)
        assert y.tolist() == y_whole.tolist()
    index = read_json(s3, f"{streamed.shards_uri}index.json")
    (train_head, train_body), = _shard_heads(s3, "train", index)
    (val_head, _), = _shard_heads(s3, "validation", index)
    assert zipfile.ZipFile(io.BytesIO(train_body)).testzip() is None, "every member's CRC-32 holds"
    assert train_head["ContentLength"] > 10 << 20
    assert ("-" in train_head["ETag"]) is (not late_corrupt), "multipart (streamed) unless it ended short"
    assert "-" not in val_head["ETag"], "under two parts: one PUT"
    assert not s3.list_multipart_uploads(Bucket=settings.bucket).get("Uploads")


def test_a_step_failing_while_a_shard_streams_leaves_no_upload_behind(settings, s3, small_digits_dir, monkeypatch):
    """The images stop coming halfway (the store went away): the open shard's multipart upload is
    aborted; nothing of it stays on the store."""
    from pipectl.components.objstore import ObjectWriter
    from pipectl.components.preprocess import upload
    from pipectl.components.preprocess.core import StepTimings, decode_to_shards

    monkeypatch.setattr(upload, "STREAM_PART_BYTES", 5 << 20)
    blobs = [p.read_bytes() for p in sorted(small_digits_dir.rglob("*.jpg"))]
    s3.create_bucket(Bucket=settings.bucket)
    writer = ObjectWriter(s3, settings.bucket)

    def items():
        for i, b in enumerate(blobs):
            if i == 200:
                raise ConnectionError("the store went away")
            yield i, b

    with pytest.raises(ConnectionError):
        decode_to_shards(items(), ["train"] * len(blobs), np.zeros(len(blobs), np.int64),
                         output_uri=f"s3://{settings.bucket}/runs/f/shards/", image_size=160, batch_size=32,
                         shard_size=2048, use_gpu=False, put=lambda uri, body: None,
                         on_undecodable=lambda i, b: None, timings=StepTimings(),
                         open_upload=lambda uri, part, in_flight: writer.stream(uri.split("/", 3)[3], part, in_flight))
    assert not s3.list_multipart_uploads(Bucket=settings.bucket).get("Uploads")
    assert not s3.list_objects_v2(Bucket=settings.bucket, Prefix="runs/f/").get("Contents")
