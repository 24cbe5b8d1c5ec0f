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
"""

from __future__ import annotations

import hashlib
import io
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


def save_checkpoint(s3: Any, run_uri: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Write the checkpoint of ``step``, then move ``latest.json`` to it. Returns its URI."""
    layout = RunLayout(run_uri=run_uri)
    uri = layout.checkpoint_uri(step)
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, buf)
    body = buf.getvalue()
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    write_json(s3, layout.latest_checkpoint_uri, {"step": step, "uri": uri, "sha256": hashlib.sha256(body).hexdigest()})
    return uri


def load_checkpoint(s3: Any, uri: str, sha256: str | None = None, *, pointer: str = "the run's checkpoint pointer") -> dict:
    """The checkpoint at ``uri`` (tensors only); StepError when its digest is not ``sha256``
    (``pointer``: the object that named it, for the message)."""
    start_over = f"delete {pointer} to train the run from the start"
    bucket, key = parse_s3_uri(uri)
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    if sha256 is not None and hashlib.sha256(body).hexdigest() != sha256:
        raise StepError(f"checkpoint {uri} is not the file {pointer} names (sha256 {hashlib.sha256(body).hexdigest()[:16]}…, "
                        f"expected {sha256[:16]}…): changed or damaged after it was written", start_over)
    try:
        return torch.load(io.BytesIO(body), map_location="cpu", weights_only=True)
    except Exception as e:  # a pickle that is not plain tensors, or a truncated file
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
