"""The team's train function: torchvision's ResNet-18 (random initialisation), SGD with Nesterov
momentum, a cosine learning-rate schedule, random horizontal flips. pipectl runs it in every
process of the gang and registers the model it returns (as ONNX). Its hyper-parameters beside
pipectl's are the pipeline's own (shapes/parameters.py)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from pipectl.sdk import TrainContext
from shapes.parameters import ShapesParameters


def learning_rate(step: int, total_steps: int, peak: float) -> float:
    """Cosine decay from ``peak`` to zero: a function of the global step, so a resumed run continues it."""
    return peak * 0.5 * (1.0 + math.cos(math.pi * step / max(1, total_steps)))


def train(ctx: TrainContext) -> nn.Module:
    hp = ShapesParameters.from_env()
    if ctx.rank == 0:
        print(f"shapes: weight decay {hp.weight_decay}, label smoothing {hp.label_smoothing}, "
              f"random flips {hp.random_flips}", flush=True)
    model = torchvision.models.resnet18(weights=None, num_classes=ctx.num_classes).to(ctx.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=ctx.params.learning_rate, momentum=0.9, nesterov=True,
                                weight_decay=hp.weight_decay)
    net = ctx.wrap(model)
    for images, labels in ctx.batches(model, optimizer):
        if hp.random_flips:
            flip = torch.rand(len(images), 1, 1, 1, device=images.device) < 0.5
            images = torch.where(flip, images.flip(3), images)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(ctx.step, ctx.total_steps, ctx.params.learning_rate)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(images), labels, label_smoothing=hp.label_smoothing)
        loss.backward()
        optimizer.step()
        ctx.record_loss(loss)
    return model
