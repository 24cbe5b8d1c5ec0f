"""Pictures of an evaluation a person would rather look at than numbers, logged to the
candidate's MLflow run under ``evaluation/``: the confusion matrix on the held-out split (JSON and
PNG: rows the true class, columns the predicted one) and the learning curve (the mean loss per
epoch on the training split and on the held-out one, from the run's ``train_loss`` and
``val_loss`` histories). Best effort: a picture that cannot be made
is a warning, never a failed step."""

from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np

log = logging.getLogger("pipectl.evaluate")

FOLDER = "evaluation"
CONFUSION_JSON = f"{FOLDER}/confusion_matrix.json"
CONFUSION_PNG = f"{FOLDER}/confusion_matrix.png"
LEARNING_CURVE_PNG = f"{FOLDER}/learning_curve.png"


def confusion(logits: np.ndarray, labels: np.ndarray, classes: Sequence[str]) -> dict[str, Any]:
    """``{"classes": [...], "matrix": [[count, ...], ...]}``: scikit-learn's confusion matrix over
    every class of the dataset (rows: true class, columns: predicted)."""
    from sklearn.metrics import confusion_matrix

    matrix = confusion_matrix(labels, logits.argmax(axis=1), labels=list(range(len(classes))))
    return {"classes": list(classes), "matrix": matrix.tolist()}


def _confusion_figure(cm: dict[str, Any]) -> Any:
    from matplotlib.figure import Figure  # no pyplot: no display, no global state

    n = len(cm["classes"])
    matrix = np.asarray(cm["matrix"])
    side = min(12.0, 2.0 + 0.45 * n)
    fig = Figure(figsize=(side, side))
    ax = fig.add_subplot()
    ax.imshow(matrix, cmap="Blues")
    ax.set(xticks=range(n), yticks=range(n), xlabel="predicted", ylabel="true", title="confusion matrix (held-out split)")
    if n <= 30:
        ax.set_xticklabels(cm["classes"], rotation=90)
        ax.set_yticklabels(cm["classes"])
        top = matrix.max() or 1
        for i in range(n):
            for j in range(n):
                ax.text(j, i, str(matrix[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if matrix[i, j] > top / 2 else "black")
    fig.tight_layout()
    return fig


def _learning_curve_figure(curves: dict[str, list[tuple[int, float]]]) -> Any:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for label, points in curves.items():
        ax.plot([e + 1 for e, _ in points], [v for _, v in points], marker="o", label=label)
    ax.set(xlabel="epoch", ylabel="mean loss", title="learning curve")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def log_pictures(client: Any, run_id: str, logits: np.ndarray, labels: np.ndarray, classes: Sequence[str]) -> list[str]:
    """Log the pictures to run ``run_id``; the artifact paths logged."""
    logged: list[str] = []
    try:
        cm = confusion(logits, labels, classes)
        client.log_dict(run_id, cm, CONFUSION_JSON)
        logged.append(CONFUSION_JSON)
        client.log_figure(run_id, _confusion_figure(cm), CONFUSION_PNG)
        logged.append(CONFUSION_PNG)
        curves = {label: sorted((m.step, m.value) for m in client.get_metric_history(run_id, metric))
                  for metric, label in (("train_loss", "training"), ("val_loss", "held-out"))}
        curves = {label: points for label, points in curves.items() if points}
        if curves:
            client.log_figure(run_id, _learning_curve_figure(curves), LEARNING_CURVE_PNG)
            logged.append(LEARNING_CURVE_PNG)
    except Exception as e:  # pictures are for people: never the reason a run fails
        log.warning("evaluation pictures not logged (%s: %s)", type(e).__name__, e)
    if logged:
        log.info("logged to MLflow run %s: %s", run_id, ", ".join(logged))
    return logged
