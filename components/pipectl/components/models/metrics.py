"""Classification metrics over logits: what train reports and evaluate compares."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def classification_metrics(logits: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, num_classes: int) -> dict[str, float]:
    """Accuracy and macro-averaged F1 (over the classes present in labels or predictions) of
    ``logits`` [N, C] against ``labels`` int [N]: scikit-learn's definitions."""
    from sklearn.metrics import accuracy_score, f1_score

    pred = np.asarray(logits.detach().cpu() if isinstance(logits, torch.Tensor) else logits).argmax(axis=1)
    true = np.asarray(labels.detach().cpu() if isinstance(labels, torch.Tensor) else labels)
    present = sorted(set(true.tolist()) | set(pred.tolist()))
    return {"accuracy": float(accuracy_score(true, pred)),
            "f1_macro": float(f1_score(true, pred, labels=present, average="macro", zero_division=0)) if present else 0.0}


@torch.no_grad()
def predict(model: nn.Module, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """Logits [N, C] for ``images`` [N, C, H, W], in eval mode, in batches."""
    model.eval()
    return torch.cat([model(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])
