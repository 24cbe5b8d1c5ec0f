"""A run's training checkpoints: written by rank 0, read back by a restarted gang.

``<run_uri>/checkpoints/step-<nnnnnnnn>.pt`` holds the model, the optimiser and the global step;
then ``<run_uri>/checkpoints/latest.json`` is moved to it (one PUT each: a reader never sees a
half-written checkpoint) with the file's sha256.

A resume trusts nothing it reads: ``latest.json`` must name this run's checkpoint of the step it
states (not any other object of the store: a pointer cannot send a resume to another run's or
another team's file), the file must have the digest the pointer states (pointers written without one are checked by
the two other rules only), and it is loaded with
``weights_only=True`` (tensors and plain containers only; never code). A pointer or file that
fails a check stops the step with what is wrong and how to start over, instead of training on.

Any size: a checkpoint is never one buffer in memory nor one PUT (S3 takes at most 5 GiB in one;
a 1B-parameter model with Adam's state is ~12 GB). ``torch.save`` writes its zip file
sequentially into :class:`PartWriter`, which hashes the bytes as they come and sends each
:data:`PART_BYTES` as a part of a multipart upload while the next one fills (aborted if anything
fails: no object, no parts left behind); a small checkpoint is one PUT. A resume downloads the file
in parallel ranges into the pod's /tmp (boto3's managed transfer; /tmp must hold one checkpoint:
``step_tmp_gib``), checks its digest and loads it from there, so the file's bytes are never held
in memory beside its tensors.

Why one ``torch.save`` file from rank 0, loaded with ``weights_only=True``, and not
``torch.distributed.checkpoint`` (DCP) or Lightning Fabric: pipectl trains with
DistributedDataParallel, which keeps the whole model and the whole optimiser state on every rank,
identical after each step. Rank 0's ``state_dict()`` is therefore the complete state, one file is
all a resume needs, and every rank of a restarted gang loads that same file. DCP earns its weight
when the state is sharded across ranks (FSDP, tensor parallelism: each rank saves its own part,
and a load can re-shard it); under DDP there is nothing to shard. Fabric's save under DDP is
likewise a rank-0 ``torch.save``: it would add a framework to the step without changing the file,
and the streamed upload, digest and pointer checks here would still be needed for the store.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch
from torch import nn

from pipectl.components.contracts import RunLayout
from pipectl.components.runtime import StepError, object_exists, parse_s3_uri, read_json, write_json


def latest_checkpoint(s3: Any, run_uri: str) -> dict | None:
    """``{"step": int, "uri": str, "sha256": str}`` of the newest checkpoint of the run, or None;
    StepError when ``latest.json`` does not point at this run's checkpoint of its step."""
    layout = RunLayout(run_uri=run_uri)
    bucket, key = parse_s3_uri(layout.latest_checkpoint_uri)
    if object_exists(s3, bucket, key) is None:
        return None
    latest = read_json(s3, layout.latest_checkpoint_uri)
    step = latest.get("step") if isinstance(latest, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or latest.get("uri") != layout.checkpoint_uri(step):
        raise StepError(f"{layout.latest_checkpoint_uri} does not point at one of this run's checkpoints: {str(latest)[:300]}",
                        "delete it to train this run from the start")
    return latest


PART_BYTES = 64 * 1024 * 1024
"""Size of each part of a checkpoint's upload (S3: 5 MiB to 5 GiB, at most 10,000 parts: 625 GiB)."""


class PartWriter(io.RawIOBase):
    """A write-only stream to ``s3://bucket/key``: the bytes hashed as written, every ``part_bytes``
    sent as one part of a multipart upload (one part in flight while the next fills); at most one
    PUT when everything fits in one part. :meth:`finish` completes it; :meth:`abort` drops it."""

    def __init__(self, s3: Any, bucket: str, key: str, part_bytes: int = PART_BYTES) -> None:
        super().__init__()
        self.s3, self.bucket, self.key, self.part_bytes = s3, bucket, key, part_bytes
        self.sha256 = hashlib.sha256()
        self.size = 0
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[Future[dict]] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-part")
        self.error: BaseException | None = None
        """The store's failure, kept: torch.save reports it as an error of its own zip writer."""

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha256.update(view)
        self.size += len(view)
        self._buf += view
        while len(self._buf) >= self.part_bytes:
            try:
                self._send(bytes(self._buf[:self.part_bytes]))
            except BaseException as e:
                self.error = e
                raise
            del self._buf[:self.part_bytes]
        return len(view)

    def _send(self, body: bytes) -> None:
        if self._upload_id is None:
            self._upload_id = self.s3.create_multipart_upload(Bucket=self.bucket, Key=self.key)["UploadId"]
        if self._parts:
            self._parts[-1].result()  # one part in flight: memory is two parts at most
        number = len(self._parts) + 1
        self._parts.append(self._pool.submit(
            lambda: {"PartNumber": number, "ETag": self.s3.upload_part(
                Bucket=self.bucket, Key=self.key, UploadId=self._upload_id, PartNumber=number, Body=body)["ETag"]}))

    def finish(self) -> str:
        """Complete the upload; the file's sha256."""
        try:
            if self._upload_id is None:
                self.s3.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self._buf))
            else:
                if self._buf or not self._parts:
                    self._send(bytes(self._buf))
                parts = [f.result() for f in self._parts]
                self.s3.complete_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self._upload_id,
                                                  MultipartUpload={"Parts": parts})
        finally:
            self._pool.shutdown(wait=True)
        return self.sha256.hexdigest()

    def abort(self) -> None:
        """Drop what was sent (no object appears, no part is left billed)."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        if self._upload_id is not None:
            self.s3.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self._upload_id)


def save_checkpoint(s3: Any, run_uri: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    *, part_bytes: int = PART_BYTES) -> str:
    """Write the checkpoint of ``step`` (streamed in parts), then move ``latest.json`` to it.
    Returns its URI. On any failure the upload is aborted and ``latest.json`` is unchanged."""
    layout = RunLayout(run_uri=run_uri)
    uri = layout.checkpoint_uri(step)
    bucket, key = parse_s3_uri(uri)
    writer = PartWriter(s3, bucket, key, part_bytes)
    try:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, writer)
        digest = writer.finish()
    except BaseException as e:
        writer.abort()
        if writer.error is not None and writer.error is not e:
            raise writer.error from e  # the store's failure (transient), not torch's report of it
        raise
    write_json(s3, layout.latest_checkpoint_uri, {"step": step, "uri": uri, "sha256": digest})
    return uri


def load_checkpoint(s3: Any, uri: str, sha256: str | None = None, *, pointer: str = "the run's checkpoint pointer") -> dict:
    """The checkpoint at ``uri`` (tensors only); StepError when its digest is not ``sha256``
    (``pointer``: the object that named it, for the message)."""
    start_over = f"delete {pointer} to train the run from the start"
    bucket, key = parse_s3_uri(uri)
    with tempfile.NamedTemporaryFile(prefix="checkpoint-", suffix=".pt") as f:
        s3.download_fileobj(bucket, key, f)  # parallel ranges for a large file (boto3's managed transfer)
        f.flush()
        f.seek(0)
        hasher = hashlib.sha256()
        while chunk := f.read(8 * 1024 * 1024):
            hasher.update(chunk)
        digest = hasher.hexdigest()
        if sha256 is not None and digest != sha256:
            raise StepError(f"checkpoint {uri} is not the file {pointer} names (sha256 {digest[:16]}…, "
                            f"expected {sha256[:16]}…): changed or damaged after it was written", start_over)
        try:
            return torch.load(f.name, map_location="cpu", weights_only=True)
        except Exception as e:  # a pickle that is not plain tensors, a truncated file, an old (non-zip) format
            raise StepError(f"checkpoint {uri} cannot be loaded as tensors: {type(e).__name__}: {str(e)[:300]}", start_over) from e


def resume(s3: Any, run_uri: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, str | None]:
    """Load the newest checkpoint of the run into ``model``/``optimizer``: (its step, its URI), or (0, None)."""
    latest = latest_checkpoint(s3, run_uri)
    if latest is None:
        return 0, None
    pointer = RunLayout(run_uri=run_uri).latest_checkpoint_uri
    state = load_checkpoint(s3, latest["uri"], latest.get("sha256"), pointer=pointer)
    if state.get("step") != latest["step"]:
        raise StepError(f"checkpoint {latest['uri']} holds step {state.get('step')}, {pointer} says {latest['step']}",
                        f"delete {pointer} to train the run from the start")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), latest["uri"]
