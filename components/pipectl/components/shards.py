"""Shard files shared by preprocess (writer), train and evaluate (readers)."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from pipectl.components.contracts import ShardIndex
from pipectl.components.runtime import join_uri, parse_s3_uri, read_json


def put_npz(s3: Any, uri: str, images: np.ndarray, labels: np.ndarray) -> None:
    """PUT one ``.npz`` shard: ``images`` [N, 3, H, W] and ``labels`` int64 [N]."""
    buf = io.BytesIO()
    np.savez(buf, images=images, labels=labels)
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def load_split(s3: Any, shards_uri: str, split: str) -> tuple[np.ndarray, np.ndarray, ShardIndex]:
    """Read every shard of ``split`` (``train`` or ``validation``).

    Returns (images float32 [N, 3, H, W], labels int64 [N], the shard index).
    """
    index = ShardIndex.model_validate(read_json(s3, join_uri(shards_uri, "index.json")))
    images, labels = [], []
    for uri in getattr(index, split):
        bucket, key = parse_s3_uri(uri)
        with np.load(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read())) as z:
            images.append(z["images"].astype(np.float32))
            labels.append(z["labels"])
    return np.concatenate(images), np.concatenate(labels), index


