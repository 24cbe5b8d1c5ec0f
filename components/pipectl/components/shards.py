"""Shard files shared by preprocess (writer), train and evaluate (readers)."""

from __future__ import annotations

import contextlib
import io
import logging
import time
import zipfile
from typing import Any, Iterator

import numpy as np

from pipectl.components.contracts import ShardIndex
from pipectl.components.runtime import StepError, join_uri, parse_s3_uri, read_json

log = logging.getLogger("pipectl.data")


def put_npz(s3: Any, uri: str, images: np.ndarray, labels: np.ndarray) -> None:
    """PUT one ``.npz`` shard: ``images`` [N, 3, H, W] and ``labels`` int64 [N]."""
    buf = io.BytesIO()
    np.savez(buf, images=images, labels=labels)
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())


def read_index(reader: Any, shards_uri: str) -> ShardIndex:
    """``<shards_uri>/index.json``."""
    return ShardIndex.model_validate(read_json(reader, join_uri(shards_uri, "index.json")))


READ_ATTEMPTS = 4
"""GETs of one shard before a read the connection keeps cutting short counts as failed."""


def _cut_short() -> tuple[type[BaseException], ...]:
    """botocore's errors for a body the connection ended early or stopped sending: the request
    itself succeeded, so botocore's own retries never see them (they happen while the body streams)."""
    from botocore.exceptions import ConnectionClosedError, IncompleteReadError, ReadTimeoutError, ResponseStreamingError

    return ConnectionClosedError, IncompleteReadError, ReadTimeoutError, ResponseStreamingError


def get_shard(reader: Any, uri: str) -> bytes:
    """The bytes of the shard at ``uri``. A read the connection cuts short is sent again, up to
    :data:`READ_ATTEMPTS` GETs, then a transient :class:`StepError` naming the shard (the step exits
    75 and the workflow retries it); the store's own errors (404, 403) propagate."""
    bucket, key = parse_s3_uri(uri)
    cut_short = _cut_short()
    for attempt in range(1, READ_ATTEMPTS + 1):
        try:
            return reader.get_object(Bucket=bucket, Key=key)["Body"].read()
        except cut_short as e:
            if attempt == READ_ATTEMPTS:
                raise StepError(f"shard {uri}: the read was cut short {READ_ATTEMPTS} times ({type(e).__name__}: {str(e)[:200]})",
                                "the store or the network is failing; the step is retried", transient=True) from e
            log.warning("shard %s: read cut short (%s), reading it again (%d of %d)", uri, type(e).__name__, attempt + 1, READ_ATTEMPTS)
            time.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


def load_shard(uri: str, body: bytes) -> Any:
    """``np.load`` of a shard's bytes (a context manager: the ``.npz`` archive). Damaged bytes (a
    flipped bit fails the zip member's CRC-32 when the member is read; cut short; not an ``.npz``;
    pickled objects, never loaded) are a :class:`StepError` naming it when opened; read the members
    inside :func:`shard_errors`."""
    with shard_errors(uri):
        return np.load(io.BytesIO(body))


@contextlib.contextmanager
def shard_errors(uri: str) -> Iterator[None]:
    """Damaged shard bytes met inside the block: a :class:`StepError` naming the shard, the data's
    failure (exit 1, not retried: reading it again finds the same bytes)."""
    try:
        yield
    except (zipfile.BadZipFile, ValueError, KeyError, EOFError, OSError) as e:
        raise StepError(f"shard {uri} cannot be read: {type(e).__name__}: {str(e)[:200]}",
                        "the shard is damaged: restore it, or preprocess the dataset again into new shards") from e


def read_shard(reader: Any, uri: str) -> tuple[np.ndarray, np.ndarray]:
    """One ``.npz`` shard: (images [N, C, H, W] as stored, labels int64 [N]).

    A read cut short is sent again (:func:`get_shard`); damaged bytes are a :class:`StepError`
    naming the shard, not retried (:func:`shard_errors`)."""
    body = get_shard(reader, uri)
    with shard_errors(uri), load_shard(uri, body) as z:
        return z["images"], z["labels"]


def as_float(images: np.ndarray, index: ShardIndex) -> np.ndarray:
    """Stored shard images as float32, normalised: uint8 pixels (what preprocess writes) as
    ``(x - mean[c]) / std[c]`` with the index's mean and std; float images as they are (they were
    normalised when written)."""
    x = images.astype(np.float32)
    if images.dtype != np.uint8:
        return x
    x -= np.asarray(index.mean, np.float32).reshape(1, -1, 1, 1)
    x /= np.asarray(index.std, np.float32).reshape(1, -1, 1, 1)
    return x


def load_split(s3: Any, shards_uri: str, split: str) -> tuple[np.ndarray, np.ndarray, ShardIndex]:
    """Read every shard of ``split`` (``train`` or ``validation``) into memory at once: for tests and
    small sets (the steps stream: :mod:`pipectl.components.shard_stream`).

    Returns (images float32 [N, 3, H, W], normalised (:func:`as_float`), labels int64 [N], the shard index).
    """
    index = read_index(s3, shards_uri)
    parts = [read_shard(s3, uri) for uri in getattr(index, split)]
    return np.concatenate([as_float(x, index) for x, _ in parts]), np.concatenate([y for _, y in parts]), index


