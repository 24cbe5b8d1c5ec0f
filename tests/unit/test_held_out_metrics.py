"""The held-out split scored at each epoch's end (``TrainContext._validate``): a classifier's
loss and accuracy from every shard; a model that is not a classifier, or takes other inputs,
gives no metrics instead of failing the run. One process, real torch; the shard stream is a
stand-in yielding (images, labels) shards, as ``ShardStream.shards`` does."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from pipectl.components.shard_stream import ShardStream
from pipectl.components.train.context import TrainContext


class _Shards:
    index = SimpleNamespace(mean=[0.0, 0.0, 0.0], std=[1.0, 1.0, 1.0])
    model_input = ShardStream.model_input  # the real one: uint8 normalised with the index's mean and std

    def __init__(self, shards):
        self._shards = shards
        self._scale = {}  # what ShardStream keeps for model_input

    def shards(self, *, own: bool = False):
        assert own  # each process scores its own shards
        yield from self._shards


def _context(shards) -> TrainContext:
    ctx = TrainContext.__new__(TrainContext)  # only what _validate reads
    ctx.validation, ctx.device, ctx.distributed, ctx.label_names = _Shards(shards), torch.device("cpu"), False, ["a", "b", "c"]
    return ctx


class _Fixed(nn.Module):
    """Scores class ``x[:, 0, 0, 0]`` (rounded) with logit 5, the others 0."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(x[:, 0, 0, 0].round().long(), 3).float() * 5


def test_a_classifiers_loss_and_accuracy_over_every_shard():
    rng = np.random.default_rng(0)
    shards = []
    for n, dtype in ((700, np.uint8), (300, np.float16)):  # a shard larger than the scoring batch, and a second one
        labels = rng.integers(0, 3, n)
        guess = np.where(rng.random(n) < 0.8, labels, (labels + 1) % 3)
        images = np.broadcast_to(guess[:, None, None, None], (n, 3, 2, 2)).astype(dtype)
        shards.append((images, labels.astype(np.int64)))
    model = _Fixed().train()
    got = _context(shards)._validate(model)
    truth = np.concatenate([y for _, y in shards])
    guessed = np.concatenate([x[:, 0, 0, 0] for x, _ in shards]).astype(int)
    assert got["val_accuracy"] == pytest.approx((guessed == truth).mean())
    logits = torch.nn.functional.one_hot(torch.from_numpy(guessed), 3).float() * 5
    assert got["val_loss"] == pytest.approx(nn.functional.cross_entropy(logits, torch.from_numpy(truth)).item(), rel=1e-6)
    assert model.training  # put back as it was


@pytest.mark.parametrize("model", [nn.Flatten(), nn.Conv2d(3, 3, 1)], ids=["wrong-width", "not-2d"])
def test_a_model_that_is_not_a_classifier_gives_no_metrics(model):
    shards = [(np.zeros((4, 3, 2, 2), np.float16), np.zeros(4, np.int64))]
    assert _context(shards)._validate(model) == {}


def test_a_model_that_takes_other_inputs_gives_no_metrics_and_a_warning(caplog):
    class Text(nn.Module):
        def forward(self, tokens: dict) -> torch.Tensor:
            if not isinstance(tokens, dict):
                raise TypeError("forward() expects a dict of token ids")
            return tokens["ids"]

    shards = [(np.zeros((4, 3, 2, 2), np.float16), np.zeros(4, np.int64))]
    assert _context(shards)._validate(Text()) == {}
    assert "no held-out metrics" in caplog.text and "expects a dict of token ids" in caplog.text


def test_no_held_out_split_no_metrics():
    ctx = _context([])
    ctx.validation = None
    assert ctx._validate(_Fixed()) == {}
