"""The streamed training split (pipectl.components.shard_stream) on the embedded S3 server (moto).

Every sample's image holds its own id (a float16 integer) and its label is ``id % 7``, so a
batch can be checked sample by sample: right label with its image, every id once per epoch."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from pipectl.components.contracts import ShardIndex
from pipectl.components.runtime import join_uri, write_json
from pipectl.components.shard_stream import ShardStream
from pipectl.components.shards import put_npz

SIZES = [100, 100, 100, 37, 64]  # uneven, as a split's last shard and shards built elsewhere are
CLASSES = 7


class CountingReader:
    """The real S3 client, counting the GETs of each shard."""

    def __init__(self, s3) -> None:
        self.s3, self.gets = s3, Counter()

    def get_object(self, **kw):
        self.gets[kw["Key"]] += 1
        return self.s3.get_object(**kw)


@pytest.fixture()
def shards(s3, settings):
    s3.create_bucket(Bucket=settings.bucket)
    uri = f"s3://{settings.bucket}/shards/"
    uris, first = [], 0
    for n, size in enumerate(SIZES):
        ids = np.arange(first, first + size)
        images = np.broadcast_to(ids[:, None, None, None], (size, 3, 2, 2)).astype(np.float16)
        uris.append(join_uri(uri, f"train-{n:05d}.npz"))
        put_npz(s3, uris[-1], images, (ids % CLASSES).astype(np.int64))
        first += size
    index = ShardIndex(labels=[str(c) for c in range(CLASSES)], image_size=2, channels=3, mean=[0.0] * 3, std=[1.0] * 3,
                       train=uris, validation=uris[:1], train_count=sum(SIZES), validation_count=SIZES[0],
                       train_sizes=SIZES, validation_sizes=SIZES[:1])
    write_json(s3, join_uri(uri, "index.json"), index.model_dump(mode="json"))
    return uri


def _ids(batches) -> list[int]:
    out = []
    for images, labels in batches:
        ids = images[:, 0, 0, 0].astype(np.int64)
        assert (images == images[:, :1, :1, :1]).all(), "a sample's pixels come from one image"
        assert (labels == ids % CLASSES).all(), "every label belongs to its image"
        out += ids.tolist()
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_each_epoch_every_process_takes_the_same_steps_and_together_every_sample(s3, shards, world):
    total, batch = sum(SIZES), 16
    streams = [ShardStream(s3, shards, "train", rank=r, world_size=world, seed=5) for r in range(world)]
    for epoch in (0, 1):
        per_rank = [_ids(s.batches(epoch, batch)) for s in streams]
        steps = {s.steps_per_epoch(batch) for s in streams}
        assert len(steps) == 1 and all(len(ids) == streams[0].per_process for ids in per_rank)
        seen = Counter(i for ids in per_rank for i in ids)
        assert set(seen) == set(range(total))
        # padding repeats exactly W*ceil(N/W) - N samples, as DistributedSampler pads
        assert sum(seen.values()) - total == world * -(-total // world) - total


def test_a_resumed_epoch_continues_with_exactly_the_samples_it_would_have_seen(s3, shards):
    stream = ShardStream(s3, shards, "train", rank=1, world_size=2, seed=3)
    whole = [b for b in stream.batches(2, 10)]
    for step in (0, 3, 10, 11, len(whole) - 1):
        rest = list(stream.batches(2, 10, start_step=step))
        assert len(rest) == len(whole) - step
        assert all((a[0] == b[0]).all() and (a[1] == b[1]).all() for a, b in zip(rest, whole[step:]))


def test_order_is_drawn_from_seed_and_epoch_and_mixes_shards(s3, shards):
    def order(seed, epoch):
        return _ids(ShardStream(s3, shards, "train", seed=seed).batches(epoch, 32))

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)
    first_batch = order(1, 0)[:32]
    assert first_batch != sorted(first_batch), "samples of a window are permuted"


def test_a_process_fetches_each_of_its_shards_once_per_epoch_and_not_the_others(s3, shards):
    for world in (1, 4):
        for rank in range(world):
            reader = CountingReader(s3)
            stream = ShardStream(reader, shards, "train", rank=rank, world_size=world, seed=0)
            reader.gets.clear()
            _ids(stream.batches(0, 8))
            shard_gets = {k: n for k, n in reader.gets.items() if k.endswith(".npz")}
            assert all(n == 1 for n in shard_gets.values()), shard_gets
            # its share is ~1/W of the split: whole shards plus at most two partial ones (and the wrap)
            assert len(shard_gets) <= -(-len(SIZES) // world) + 2


def test_an_index_without_shard_sizes_is_counted_from_the_shards(s3, settings, shards):
    from pipectl.components.runtime import read_json

    index = ShardIndex.model_validate(read_json(s3, join_uri(shards, "index.json")))
    bare = index.model_copy(update={"train_sizes": [], "validation_sizes": []})
    write_json(s3, join_uri(shards, "index.json"), bare.model_dump(mode="json"))
    stream = ShardStream(s3, shards, "train", rank=0, world_size=2)
    assert stream.sizes == SIZES and stream.per_process == -(-sum(SIZES) // 2)


def test_shards_in_turn_for_evaluation_and_a_process_own_ones(s3, shards):
    every = [labels for _, labels in ShardStream(s3, shards, "train").shards()]
    assert [len(y) for y in every] == SIZES
    own = [[len(y) for _, y in ShardStream(s3, shards, "train", rank=r, world_size=2).shards(own=True)] for r in (0, 1)]
    assert own == [[100, 100, 64], [100, 37]]


def test_sizes_an_index_gets_wrong_are_refused_naming_the_shard(s3, settings, shards):
    """Shards built elsewhere with an index whose sizes lie: the shards step refuses the index
    before any gang starts, and a stream that meets the shard names it instead of indexing past it."""
    from pipectl.components.contracts import PrebuiltInput
    from pipectl.components.prebuilt.core import check
    from pipectl.components.runtime import StepError, read_json

    index = ShardIndex.model_validate(read_json(s3, join_uri(shards, "index.json")))
    lying = index.model_copy(update={"train_sizes": [100, 100, 100, 64, 37]})  # two shards swapped
    write_json(s3, join_uri(shards, "index.json"), lying.model_dump(mode="json"))
    stream = ShardStream(s3, shards, "train", seed=0)
    with pytest.raises(StepError, match=r"train-0000[34]\.npz holds \d+ images .* the index says"):
        _ids(stream.batches(0, 16))
    short = index.model_copy(update={"train_sizes": [100, 100]})
    write_json(s3, join_uri(shards, "index.json"), short.model_dump(mode="json"))
    with pytest.raises(StepError, match="train_sizes has 2 entries summing to 200 for 5 shards of 401 samples"):
        check(PrebuiltInput(shards_uri=shards), s3)


@pytest.mark.parametrize("damage", ["flipped-bit", "cut-short", "not-a-shard"])
def test_a_damaged_shard_stops_the_stream_naming_it(s3, settings, shards, damage):
    """A shard whose bytes changed in the store: a step error (the data's, not retried) naming the
    shard, met by the stream that reads it, never a batch of wrong numbers."""
    from pipectl.components.runtime import StepError

    key = "shards/train-00002.npz"
    body = bytearray(s3.get_object(Bucket=settings.bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01
    damaged = {"flipped-bit": bytes(body), "cut-short": bytes(body[: len(body) // 2]), "not-a-shard": b"<html>503</html>"}
    s3.put_object(Bucket=settings.bucket, Key=key, Body=damaged[damage])
    stream = ShardStream(s3, shards, "train", seed=0)
    with pytest.raises(StepError, match=r"shard s3://.*/train-00002\.npz cannot be read") as e:
        _ids(stream.batches(0, 16))
    assert not e.value.transient and "preprocess the dataset again" in e.value.hint


def test_a_read_cut_short_is_read_again_and_one_always_cut_is_a_transient_failure_naming_the_shard(s3, settings, shards):
    """Through a proxy that cuts GET bodies halfway (headers and status as the store sent them):
    every sample still arrives right, the cut reads read again; a shard whose every read is cut
    is a transient step error (exit 75: the workflow retries the step) after READ_ATTEMPTS GETs."""
    from pipectl.components.runtime import StepError, s3_client
    from pipectl.components.shards import READ_ATTEMPTS, read_shard
    from tests.tools.faulty_proxy import FaultyProxy

    with FaultyProxy(settings.s3_endpoint, rate=0.0, cut_rate=0.4, seed=3) as proxy:
        flaky = s3_client(settings.model_copy(update={"s3_endpoint": proxy.url}))
        ids = _ids(ShardStream(flaky, shards, "train", seed=0).batches(0, 16))
        assert proxy.faults["cut"] > 0
    assert sorted(ids) == list(range(sum(SIZES)))
    with FaultyProxy(settings.s3_endpoint, rate=0.0, cut_rate=1.0) as proxy:
        reader = CountingReader(s3_client(settings.model_copy(update={"s3_endpoint": proxy.url})))
        with pytest.raises(StepError, match=rf"shard s3://.*/train-00001\.npz: the read was cut short {READ_ATTEMPTS} times") as e:
            read_shard(reader, join_uri(shards, "train-00001.npz"))
    assert e.value.transient and reader.gets["shards/train-00001.npz"] == READ_ATTEMPTS


def test_the_shards_step_names_a_damaged_shard_as_the_datas_failure(s3, settings, shards):
    from pipectl.components.contracts import PrebuiltInput
    from pipectl.components.prebuilt.core import check
    from pipectl.components.runtime import StepError

    body = bytearray(s3.get_object(Bucket=settings.bucket, Key="shards/train-00000.npz")["Body"].read())
    body[len(body) // 2] ^= 0x01
    s3.put_object(Bucket=settings.bucket, Key="shards/train-00000.npz", Body=bytes(body))
    with pytest.raises(StepError, match=r"shard s3://.*/train-00000\.npz cannot be read: BadZipFile: Bad CRC-32") as e:
        check(PrebuiltInput(shards_uri=shards), s3)
    assert not e.value.transient
