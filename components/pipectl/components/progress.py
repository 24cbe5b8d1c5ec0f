"""Training progress for a person watching a local run: rank 0 of the gang appends one JSON line
per epoch (epoch, step, loss, images/s, the step time's data and sync shares, the verdicts so far)
to the file named by :data:`PROGRESS_FILE_ENV`; ``pipectl run`` shows the last line on the train
step's row. Unset (a cluster's pods): nothing is written (``pipectl status`` reads the same from
the run's MLflow tags: :mod:`pipectl.components.train.live`). A failure to write never fails the
training."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from pipectl.components.names import PROGRESS_FILE_ENV


def report(epoch: int, epochs: int, step: int, total_steps: int, loss: float, anatomy: dict[str, float],
           verdicts: list[str]) -> None:
    """Append one line (rank 0, after each epoch); ``anatomy``: the epoch's step anatomy
    (``images_per_s``, ``share_data``, ``share_sync``; empty: not measured)."""
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return
    line = {"epoch": epoch, "epochs": epochs, "step": step, "total_steps": total_steps,
            "loss": None if math.isnan(loss) else round(loss, 4),
            **{key: round(anatomy[name], 3) if name in anatomy else None
               for key, name in (("images_per_s", "images_per_s"), ("data_share", "share_data"), ("sync_share", "share_sync"))},
            "verdicts": sorted({v.split(":", 1)[0] for v in verdicts})}
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
    except OSError:
        pass


def last(path: Path) -> dict[str, Any] | None:
    """The last complete line of ``path`` (None: none yet)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for text in reversed(lines):
        try:
            return dict(json.loads(text))
        except ValueError:
            continue
    return None


def describe(p: dict[str, Any]) -> str:
    """``epoch 3/15 · step 60/300 · loss 0.412 · 950 images/s · data 3% · sync 15% · straggler``
    (the last: the kinds of verdict so far, when any)."""
    parts = [f"epoch {p['epoch']}/{p['epochs']}", f"step {p['step']}/{p['total_steps']}"]
    if p.get("loss") is not None:
        parts.append(f"loss {p['loss']:.3f}")
    if p.get("images_per_s"):
        parts.append(f"{p['images_per_s']:.0f} images/s")
    for part in ("data", "sync"):
        if p.get(f"{part}_share") is not None:
            parts.append(f"{part} {p[f'{part}_share']:.0%}")
    if p.get("verdicts"):
        parts.append(", ".join(p["verdicts"]))
    return " · ".join(parts)
