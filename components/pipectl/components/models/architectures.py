"""The architectures pipectl's own training builds, by name (the ``architecture`` parameter).

Each entry takes ``(num_classes, channels)`` and returns an untrained ``nn.Module`` mapping a float
tensor [N, channels, H, W] to logits [N, num_classes]. torchvision's are built without downloaded
weights (a cluster node reaches no model hub). A new architecture is one entry in
:data:`ARCHITECTURES` and one member of :class:`~pipectl.components.contracts.Architecture`.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Three conv blocks and a linear head for small images.

    Input: float tensor [N, channels, H, W] (any H, W >= 8; global average pooling).
    Output: logits float tensor [N, num_classes].
    ~100k parameters for 3 channels and 10 classes: enough for digits (>= 0.97 held-out
    accuracy at 32x32) and small enough to train on 2 CPU cores in seconds.
    """

    def __init__(self, num_classes: int, channels: int = 3, width: int = 32) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.features = nn.Sequential(
            nn.Conv2d(channels, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.BatchNorm2d(2 * width),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(2 * width, 4 * width, 3, padding=1),
            nn.BatchNorm2d(4 * width),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(self.features(x), 1))


def _torchvision(name: str, num_classes: int, channels: int) -> nn.Module:
    """torchvision's ``name`` (random initialisation), its stem taking ``channels`` input planes."""
    import torchvision.models  # imported here: only these architectures need it

    model = getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
    if channels != 3:
        stem = model.conv1
        model.conv1 = nn.Conv2d(channels, stem.out_channels, stem.kernel_size, stem.stride, stem.padding, bias=False)
    return model


ARCHITECTURES: dict[str, Callable[[int, int], nn.Module]] = {
    "small-cnn": lambda num_classes, channels: SmallCNN(num_classes, channels),
    "resnet18": partial(_torchvision, "resnet18"),
    "resnet50": partial(_torchvision, "resnet50"),
}


def build_model(architecture: str, num_classes: int, channels: int) -> nn.Module:
    """An untrained ``architecture`` for ``num_classes`` classes and ``channels`` input planes.

    >>> build_model("resnet18", num_classes=5, channels=3)(torch.zeros(2, 3, 64, 64)).shape
    torch.Size([2, 5])
    """
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {architecture!r}: one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[architecture](num_classes, channels)
