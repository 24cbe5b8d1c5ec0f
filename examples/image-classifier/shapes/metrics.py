"""The team's metric: balanced accuracy (the mean of the per-class recalls), so a model that
neglects a rare class cannot become champion on the common ones."""

from __future__ import annotations

import numpy as np
from sklearn.metrics import balanced_accuracy_score


def balanced_accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    """Balanced accuracy of ``logits`` [N, classes] against ``labels`` [N], in [0, 1]."""
    return float(balanced_accuracy_score(labels, logits.argmax(axis=1)))
