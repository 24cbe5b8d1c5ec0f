"""The team's train function: torchvision's ResNet-18 (random initialisation), SGD with Nesterov
momentum, a cosine learning-rate schedule, random horizontal flips. pipectl runs it in every
process of the gang and registers the model it returns (as ONNX)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from pipectl.sdk import TrainContext


def learning_rate(step: int, total_steps: int, peak: float) -> float:
    """Cosine decay from ``peak`` to zero: a function of the global step, so a resumed run continues it."""
    return peak * 0.5 * (1.0 + math.cos(math.pi * step / max(1, total_steps)))


def train(ctx: TrainContext) -> nn.Module:
    model = torchvision.models.resnet18(weights=None, num_classes=ctx.num_classes).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.params.learning_rate, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    net = ctx.wrap(model)
    for images, labels in ctx.batches(model, optimizer):
        flip = torch.rand(len(images), 1, 1, 1, device=images.device) < 0.5
        images = torch.where(flip, images.flip(3), images)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(ctx.step, ctx.total_steps, ctx.params.learning_rate)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(images), labels, label_smoothing=0.1)
        loss.backward()
        optimizer.step()
        ctx.record_loss(loss)
    return model
