"""A folder that answers the two S3 calls the shard writer and the shard stream make."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


class FolderStore:
    """``put_object``/``get_object`` over a folder (``s3://bucket/key`` -> ``root/bucket/key``): the
    two calls the shard writer and :class:`~pipectl.components.shard_stream.ShardStream` make."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def put_object(self, Bucket: str, Key: str, Body: bytes, **_: Any) -> None:  # noqa: N803 - boto3's names
        path = self.root / Bucket / Key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(Body)

    def get_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        return {"Body": io.BytesIO((self.root / Bucket / Key).read_bytes())}
