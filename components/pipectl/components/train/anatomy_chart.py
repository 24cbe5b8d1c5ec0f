"""The step anatomy as one picture in the run's MLflow artifacts: ``training/step_anatomy.png``.

Left, a per-rank step-time heatmap: a row per rank, a column per epoch, each cell the rank's own
time per step (data + compute + optimizer: its median step of the epoch) in ms — a straggler is a
row darker than the others, a slow node a row that darkens from some epoch on. Right, the gang's
time shares per epoch as stacked bars (data, compute, sync, optimizer, checkpoint): where the step
time goes, and whether it moves. Rank 0 logs it once, after the last epoch of the attempt. Best
effort: a picture that cannot be made is a warning, never a failed step.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from pipectl.components.train.telemetry import PARTS, RankEpoch, gang_shares

log = logging.getLogger("pipectl.train")

STEP_ANATOMY_PNG = "training/step_anatomy.png"
COLOURS = {"data": "tab:orange", "compute": "tab:blue", "sync": "tab:red", "optimizer": "tab:green", "checkpoint": "tab:gray"}


def own_ms(epochs: list[list[RankEpoch]]) -> np.ndarray:
    """[ranks, epochs]: each rank's own milliseconds per step in each epoch (``epochs[e]``: the gang's
    numbers of epoch ``e``, one per rank); NaN where a rank is missing."""
    ranks = max((r.rank for gang in epochs for r in gang), default=-1) + 1
    out = np.full((ranks, len(epochs)), np.nan)
    for e, gang in enumerate(epochs):
        for r in gang:
            out[r.rank, e] = 1000 * (r.own_median or r.own_per_step)
    return out


def figure(epochs: list[list[RankEpoch]], numbers: list[int]) -> Any:
    """The picture of the module doc; ``numbers``: the epochs' numbers (1 first), for the axes."""
    from matplotlib.figure import Figure  # no pyplot: no display, no global state

    heat = own_ms(epochs)
    fig = Figure(figsize=(12, max(3.5, 1.5 + 0.3 * heat.shape[0])))
    left, right = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    image = left.imshow(heat, aspect="auto", cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=left, label="own ms per step (median step)")
    left.set(title="step time per rank", xlabel="epoch", ylabel="rank")
    _ticks(left, numbers, heat.shape[0])
    bottom = np.zeros(len(epochs))
    shares = [gang_shares(gang) for gang in epochs]
    for part in PARTS:
        values = np.array([s[f"share_{part}"] for s in shares])
        right.bar(numbers, values, bottom=bottom, label=part, color=COLOURS[part])
        bottom += values
    right.set(title="where the step time goes (the gang)", xlabel="epoch", ylabel="share of step time", ylim=(0, 1))
    right.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def _ticks(ax: Any, numbers: list[int], ranks: int) -> None:
    every = max(1, len(numbers) // 15)
    ax.set_xticks(range(0, len(numbers), every), [str(n) for n in numbers[::every]])
    every = max(1, ranks // 16)
    ax.set_yticks(range(0, ranks, every))


def log_chart(mlflow: Any, epochs: list[list[RankEpoch]], numbers: list[int]) -> str | None:
    """Log the picture to the active MLflow run (``mlflow``: the module); its artifact path, or None."""
    if not epochs:
        return None
    try:
        mlflow.log_figure(figure(epochs, numbers), STEP_ANATOMY_PNG)
    except Exception as e:  # a picture is for people: never the reason a training fails
        log.warning("step anatomy chart not logged (%s: %s)", type(e).__name__, e)
        return None
    return STEP_ANATOMY_PNG
