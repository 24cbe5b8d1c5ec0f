"""Shard files shared by preprocess (writer), train and evaluate (readers)."""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np

from pipectl.components.contracts import ShardIndex
from pipectl.components.runtime import StepError, join_uri, parse_s3_uri, read_json


def put_npz(s3: Any, uri: str, images: np.ndarray, labels: np.ndarray) -> None:
    """PUT one ``.npz`` shard: ``images`` [N, 3, H, W] and ``labels`` int64 [N]."""
    buf = io.BytesIO()
    np.savez(buf, images=images, labels=labels)
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def read_index(reader: Any, shards_uri: str) -> ShardIndex:
    """``<shards_uri>/index.json``."""
    return ShardIndex.model_validate(read_json(reader, join_uri(shards_uri, "index.json")))


def read_shard(reader: Any, uri: str) -> tuple[np.ndarray, np.ndarray]:
    """One ``.npz`` shard: (images [N, C, H, W] as stored, labels int64 [N]).

    A shard whose bytes are damaged (a flipped bit fails the zip member's CRC-32; cut short; not
    an ``.npz``; pickled objects, never loaded) is a :class:`StepError` naming it: the data's
    failure, not retried. A read the connection cut short is botocore's error (transient)."""
    bucket, key = parse_s3_uri(uri)
    body = reader.get_object(Bucket=bucket, Key=key)["Body"].read()
    try:
        with np.load(io.BytesIO(body)) as z:
            return z["images"], z["labels"]
    except (zipfile.BadZipFile, ValueError, KeyError, EOFError, OSError) as e:
        raise StepError(f"shard {uri} cannot be read: {type(e).__name__}: {str(e)[:200]}",
                        "the shard is damaged: restore it, or preprocess the dataset again into new shards") from e


def load_split(s3: Any, shards_uri: str, split: str) -> tuple[np.ndarray, np.ndarray, ShardIndex]:
    """Read every shard of ``split`` (``train`` or ``validation``) into memory at once: for tests and
    small sets (the steps stream: :mod:`pipectl.components.shard_stream`).

    Returns (images float32 [N, 3, H, W], labels int64 [N], the shard index).
    """
    index = read_index(s3, shards_uri)
    parts = [read_shard(s3, uri) for uri in getattr(index, split)]
    return np.concatenate([x.astype(np.float32) for x, _ in parts]), np.concatenate([y for _, y in parts]), index


