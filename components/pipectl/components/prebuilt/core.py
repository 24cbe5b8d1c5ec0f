"""Shards a user already has, checked before a gang is started on them.

The format is the one preprocess writes (:mod:`pipectl.components.shards`)::

    <shards_uri>/index.json     ShardIndex: labels, image_size, channels, mean, std,
                                train and validation (shard URIs), train_count, validation_count
    <shard>.npz                 images [N, channels, image_size, image_size]: uint8 pixels
                                (what preprocess writes; normalised with mean and std when
                                read) or float16/float32 already normalised,
                                labels int64 [N] in 0 .. len(labels) - 1

The check reads the index, lists the shards' sizes (every shard it names must exist; with the
dataset's images, the shards' bytes must be within the run's lane's maximum), and loads the first shard of each split
(its arrays' names, types, shapes and labels); train and evaluate stream the rest.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from pydantic import ValidationError

from pipectl.components.contracts import PrebuiltInput, PrebuiltOutput, ShardIndex, StoreSettings
from pipectl.components.datasize import DatasetSize, check_dataset_size, shard_bytes
from pipectl.components.runtime import StepError, join_uri, object_exists, parse_s3_uri, read_json, s3_client
from pipectl.components.shards import get_shard, load_shard, shard_errors

log = logging.getLogger("pipectl.prebuilt")


def _index(s3: Any, shards_uri: str) -> ShardIndex:
    uri = join_uri(shards_uri, "index.json")
    if object_exists(s3, *parse_s3_uri(uri)) is None:
        raise StepError(f"no shard index at {uri}", "dataset-uri names the folder of pre-built shards: index.json and its .npz files")
    try:
        index = ShardIndex.model_validate(read_json(s3, uri))
    except (ValidationError, ValueError) as e:
        why = ("; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()[:5])
               if isinstance(e, ValidationError) else str(e).splitlines()[0])
        raise StepError(f"{uri} is not a shard index: {why}",
                        "fields: labels, image_size, channels, mean, std, train, validation, train_count, validation_count") from e
    if len(index.labels) < 2 or not index.train or not index.validation:
        raise StepError(f"{uri}: needs at least 2 labels and shards in both splits "
                        f"(has {len(index.labels)} labels, {len(index.train)} train, {len(index.validation)} validation shards)",
                        "a classifier needs two classes; evaluate needs a validation split")
    return index


def _check_sizes(index: ShardIndex) -> None:
    """``train_sizes``/``validation_sizes``, when given: one per shard, summing to the split's count."""
    for split in ("train", "validation"):
        uris, sizes, count = getattr(index, split), getattr(index, f"{split}_sizes"), getattr(index, f"{split}_count")
        if sizes and (len(sizes) != len(uris) or sum(sizes) != count or min(sizes) < 1):
            raise StepError(f"index.json's {split}_sizes has {len(sizes)} entries summing to {sum(sizes)} for "
                            f"{len(uris)} shards of {count} samples", f"one positive count per {split} shard, in order (or leave it out)")


def _check_shard(s3: Any, uri: str, index: ShardIndex, size: int | None) -> None:
    with load_shard(uri, get_shard(s3, uri)) as z, shard_errors(uri):
        if set(z.files) != {"images", "labels"}:
            raise StepError(f"shard {uri} holds {sorted(z.files)}, not images and labels", "np.savez(f, images=..., labels=...)")
        images, labels = z["images"], z["labels"]
    want = (index.channels, index.image_size, index.image_size)
    if images.dtype not in (np.uint8, np.float16, np.float32) or images.ndim != 4 or images.shape[1:] != want:
        raise StepError(f"shard {uri}: images are {images.dtype} {list(images.shape)}, not uint8/float16/float32 "
                        f"[N, {', '.join(map(str, want))}]",
                        "write the images as the index says: uint8 pixels (normalised with the index's mean and std "
                        "when read) or normalised floats, channels first, image_size square")
    if labels.dtype != np.int64 or labels.shape != (len(images),) or (len(labels) and not 0 <= labels.min() <= labels.max() < len(index.labels)):
        raise StepError(f"shard {uri}: labels must be int64 [{len(images)}] in 0..{len(index.labels) - 1}",
                        "one label per image, the index of its class in index.json's labels")
    if size is not None and len(labels) != size:
        raise StepError(f"shard {uri} holds {len(labels)} samples; index.json's sizes say {size}", "correct the sizes in index.json")


def check(inp: PrebuiltInput, s3: Any) -> PrebuiltOutput:
    """Check the shards under ``inp.shards_uri`` (module doc); StepError naming what is wrong."""
    index = _index(s3, inp.shards_uri)
    found = shard_bytes(s3, inp.shards_uri, index.train + index.validation)
    missing = [u for u in index.train + index.validation if u not in found]
    if missing:
        raise StepError(f"{len(missing)} shard(s) listed in the index are missing, e.g. {missing[0]}", "write every shard the index lists")
    _check_sizes(index)
    if inp.lane is not None and inp.dataset_max:
        size = DatasetSize(inp.shards_uri, index.train_count + index.validation_count, sum(found.values()))
        check_dataset_size(size, inp.lane, inp.dataset_max)
    for split in ("train", "validation"):
        sizes = getattr(index, f"{split}_sizes")
        _check_shard(s3, getattr(index, split)[0], index, sizes[0] if sizes else None)
    log.info("pre-built shards %s: %d labels, %dx%d, %d train and %d validation images", inp.shards_uri, len(index.labels),
             index.image_size, index.image_size, index.train_count, index.validation_count)
    return PrebuiltOutput(shards_uri=inp.shards_uri, train_count=index.train_count, validation_count=index.validation_count)


def run(inp: PrebuiltInput, settings: StoreSettings) -> PrebuiltOutput:
    return check(inp, s3_client(settings))
