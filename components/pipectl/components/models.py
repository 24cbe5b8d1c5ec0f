"""Model architectures the steps train and evaluate.

Kept outside any one step: ``train`` logs a model, ``evaluate`` rebuilds it (candidate and
champion) from its weights alone.
"""

from __future__ import annotations

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


WEIGHTS_ARTIFACT = "weights"
"""Artifact folder of a training run holding ``state_dict.pt`` (tensors only) and ``model.json``
(the architecture's constructor arguments): what evaluate loads, never a pickle."""


def log_weights(model: SmallCNN, channels: int) -> None:
    """Log ``model``'s weights and constructor arguments to the active MLflow run (WEIGHTS_ARTIFACT)."""
    import json
    import tempfile
    from pathlib import Path

    import mlflow

    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), Path(d) / "state_dict.pt")
        (Path(d) / "model.json").write_text(json.dumps({"architecture": "SmallCNN", "num_classes": model.num_classes,
                                                        "channels": channels}))
        mlflow.log_artifacts(d, artifact_path=WEIGHTS_ARTIFACT)


def load_weights(run_id: str, tracking_uri: str | None = None) -> SmallCNN:
    """The model a training run logged with :func:`log_weights`, rebuilt from its constructor
    arguments and a tensors-only ``torch.load(weights_only=True)``: a model file in the registry
    cannot run code in the pipeline (pickled MLflow models can). Raises ValueError for an
    unknown architecture, MLflow/torch errors for a missing or malformed artifact."""
    import json
    import tempfile
    from pathlib import Path

    import mlflow.artifacts

    with tempfile.TemporaryDirectory() as d:
        local = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=WEIGHTS_ARTIFACT, dst_path=d,
                                                         tracking_uri=tracking_uri))
        spec = json.loads((local / "model.json").read_text())
        if spec.get("architecture") != "SmallCNN":
            raise ValueError(f"run {run_id}: unknown architecture {spec.get('architecture')!r}")
        model = SmallCNN(num_classes=int(spec["num_classes"]), channels=int(spec["channels"]))
        model.load_state_dict(torch.load(local / "state_dict.pt", map_location="cpu", weights_only=True))
    return model.eval()


def classification_metrics(logits: torch.Tensor, labels: torch.Tensor, num_classes: int) -> dict[str, float]:
    """Accuracy and macro-averaged F1 of ``logits`` [N, C] against ``labels`` int64 [N]."""
    pred = logits.argmax(dim=1)
    accuracy = (pred == labels).float().mean().item()
    f1s = []
    for c in range(num_classes):
        tp = ((pred == c) & (labels == c)).sum().item()
        fp = ((pred == c) & (labels != c)).sum().item()
        fn = ((pred != c) & (labels == c)).sum().item()
        if tp + fp + fn == 0:
            continue
        f1s.append(2 * tp / (2 * tp + fp + fn))
    return {"accuracy": accuracy, "f1_macro": sum(f1s) / len(f1s) if f1s else 0.0}


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Logits [N, C] for ``images`` [N, C, H, W], in eval mode, in batches."""
    model.eval()
    return torch.cat([model(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])
