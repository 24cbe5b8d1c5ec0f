"""A restarted gang resumes only from its own run's checkpoint, as written (the store's S3 API:
moto). Each refusal is a step error naming the object and how to start over; nothing is loaded."""

from __future__ import annotations

import io
import json
import os

import pytest
import torch
from torch import nn

from pipectl.components.contracts import RunLayout
from pipectl.components.runtime import StepError, parse_s3_uri
from pipectl.components.train.checkpoints import latest_checkpoint, resume, save_checkpoint

pytestmark = pytest.mark.integration


def _model() -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    return model, torch.optim.Adam(model.parameters())


def _put(s3, uri: str, body: bytes) -> None:
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=body)


@pytest.fixture()
def run_uri(settings, s3):
    s3.create_bucket(Bucket=settings.bucket)
    return f"s3://{settings.bucket}/runs/wf-a"


def test_a_checkpoint_resumes_with_its_step_and_weights(s3, run_uri):
    model, opt = _model()
    save_checkpoint(s3, run_uri, 40, model, opt)
    latest = latest_checkpoint(s3, run_uri)
    assert latest["uri"] == RunLayout(run_uri=run_uri).checkpoint_uri(40) and len(latest["sha256"]) == 64
    fresh = nn.Linear(4, 3)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    assert resume(s3, run_uri, fresh, fresh_opt) == (40, latest["uri"])
    assert torch.equal(fresh.weight, model.weight)


def test_a_pointer_to_another_runs_checkpoint_is_refused(s3, run_uri, settings):
    """latest.json naming another run's (another team's) file, or a key outside the checkpoints."""
    other = f"s3://{settings.bucket}/runs/wf-b"
    model, opt = _model()
    save_checkpoint(s3, other, 40, model, opt)
    layout = RunLayout(run_uri=run_uri)
    for pointer in ({"step": 40, "uri": RunLayout(run_uri=other).checkpoint_uri(40)},
                    {"step": 40, "uri": f"s3://{settings.bucket}/datasets/x/data/a.pt"},
                    {"step": 40, "uri": layout.checkpoint_uri(20)},
                    {"step": "40", "uri": layout.checkpoint_uri(40)}, ["not", "an", "object"]):
        _put(s3, layout.latest_checkpoint_uri, json.dumps(pointer).encode())
        with pytest.raises(StepError, match="does not point at one of this run's checkpoints") as e:
            resume(s3, run_uri, *_model())
        assert "delete it to train this run from the start" in e.value.hint


def test_a_checkpoint_changed_after_it_was_written_is_refused(s3, run_uri):
    model, opt = _model()
    uri = save_checkpoint(s3, run_uri, 40, model, opt)
    with torch.no_grad():
        model.weight.add_(1)
    buf = io.BytesIO()
    torch.save({"step": 40, "model": model.state_dict(), "optimizer": opt.state_dict()}, buf)
    _put(s3, uri, buf.getvalue())
    with pytest.raises(StepError, match="is not the file s3://.*/checkpoints/latest.json names"):
        resume(s3, run_uri, *_model())


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/pipectl-checkpoint-payload-ran",))


def test_a_checkpoint_that_is_not_plain_tensors_is_never_unpickled(s3, run_uri):
    """Code in a checkpoint (a pickle's __reduce__) is refused by weights_only loading, digest
    matching or not: the payload never runs."""
    import hashlib

    marker = "/tmp/pipectl-checkpoint-payload-ran"
    if os.path.exists(marker):
        os.remove(marker)
    layout = RunLayout(run_uri=run_uri)
    buf = io.BytesIO()
    torch.save({"step": 40, "model": _Payload(), "optimizer": {}}, buf)
    _put(s3, layout.checkpoint_uri(40), buf.getvalue())
    _put(s3, layout.latest_checkpoint_uri, json.dumps({"step": 40, "uri": layout.checkpoint_uri(40),
                                                       "sha256": hashlib.sha256(buf.getvalue()).hexdigest()}).encode())
    with pytest.raises(StepError, match="cannot be loaded as tensors"):
        resume(s3, run_uri, *_model())
    assert not os.path.exists(marker)


def test_a_checkpoint_larger_than_a_part_streams_in_parts_and_resumes(s3, run_uri):
    """Never one buffer nor one PUT: with 5 MiB parts (S3's smallest), a ~25 MiB checkpoint is a
    multipart object of several parts whose digest the pointer holds, and it resumes bit for bit."""
    torch.manual_seed(1)
    model = nn.Linear(1024, 2048)  # 8 MiB of weights; Adam's two moments make ~25 MiB
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    opt.step()
    uri = save_checkpoint(s3, run_uri, 7, model, opt, part_bytes=5 * 1024 * 1024)
    bucket, key = parse_s3_uri(uri)
    head = s3.head_object(Bucket=bucket, Key=key)
    parts = int(head["ETag"].strip('"').rsplit("-", 1)[1])
    assert parts == -(-head["ContentLength"] // (5 * 1024 * 1024)) >= 5, head
    fresh = nn.Linear(1024, 2048)
    fresh_opt = torch.optim.Adam(fresh.parameters())
    assert resume(s3, run_uri, fresh, fresh_opt) == (7, uri)
    assert torch.equal(fresh.weight, model.weight)
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])


def test_a_checkpoint_that_fails_midway_leaves_no_object_no_parts_and_the_pointer_as_it_was(s3, run_uri):
    """The store refuses the third part (a 503 that outlived the client's retries, a full pool):
    the upload is aborted, no object and no part stays, latest.json still names the last good one."""
    model, opt = _model()
    save_checkpoint(s3, run_uri, 20, model, opt)
    before = latest_checkpoint(s3, run_uri)

    class Failing:
        def __init__(self, client) -> None:
            self.client, self.sent = client, 0

        def __getattr__(self, name):
            return getattr(self.client, name)

        def upload_part(self, **kwargs):
            self.sent += 1
            if self.sent == 3:
                raise ConnectionError("the store went away")
            return self.client.upload_part(**kwargs)

    torch.manual_seed(2)
    big = nn.Linear(1024, 4096)  # 16 MiB of weights, 48 MiB with Adam's moments
    big_opt = torch.optim.Adam(big.parameters())
    big(torch.randn(2, 1024)).sum().backward()
    big_opt.step()
    failing = Failing(s3)
    with pytest.raises(ConnectionError):
        save_checkpoint(failing, run_uri, 40, big, big_opt, part_bytes=5 * 1024 * 1024)
    assert failing.sent == 3
    bucket, key = parse_s3_uri(RunLayout(run_uri=run_uri).checkpoint_uri(40))
    assert s3.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount") == 0
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
    assert latest_checkpoint(s3, run_uri) == before
