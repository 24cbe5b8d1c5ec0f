"""pipectl's own train function: the ``architecture`` parameter's model, Adam, cross-entropy, a
warm-up then cosine learning-rate schedule. Written with :class:`TrainContext` as a user's is: the
example to start yours from."""

from __future__ import annotations

import math

import torch
from torch import nn

from pipectl.components.models import build_model
from pipectl.components.train.context import TrainContext

WARMUP_FRACTION = 0.05
"""Share of the run's steps over which the learning rate rises linearly to its peak."""


def learning_rate_at(step: int, total_steps: int, peak: float) -> float:
    """Linear warm-up over the first :data:`WARMUP_FRACTION` of the steps, then cosine decay to
    zero at ``total_steps``. A pure function of the global step: a resumed run continues on the
    same schedule with nothing more in the checkpoint. Without a decay, Adam's steady step size
    keeps the weights moving until the last step and held-out accuracy falls as epochs grow."""
    warmup = max(1, int(total_steps * WARMUP_FRACTION))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return peak * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train(ctx: TrainContext) -> nn.Module:
    model = build_model(ctx.params.architecture.value, ctx.num_classes, ctx.channels).to(ctx.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=ctx.params.learning_rate)
    net = ctx.wrap(model)
    loss_fn = nn.CrossEntropyLoss()
    for images, labels in ctx.batches(model, optimizer):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(ctx.step, ctx.total_steps, ctx.params.learning_rate)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(net(images), labels)
        loss.backward()
        optimizer.step()
        ctx.record_loss(loss)
    return model
