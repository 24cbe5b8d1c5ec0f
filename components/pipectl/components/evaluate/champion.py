"""The champion a candidate is compared with, and the held-out split both are scored on.

A candidate takes the ``champion`` alias only by out-scoring the champion on the champion's own
registered evaluation set: the held-out split its version was evaluated on, which register tags on
every version (:data:`~pipectl.components.contracts.EVALUATION_SET_TAG`) with a digest of its
content (:data:`~pipectl.components.contracts.EVALUATION_SET_DIGEST_TAG`). Whoever may submit a run
chooses its dataset, so a held-out split of their own could be made easy for their model and hard
for the champion; the champion's set was chosen by the run that made it champion. A candidate that
cannot be compared there is kept (registered, not promoted), never promoted on its threshold alone:

- the champion's set has other labels, another image size or channel count than the candidate's
  (another task under the same model name: train it under a model name of its own, or move the
  alias by hand after looking at both);
- the set cannot be read, the champion cannot be scored on it, or its content is not the content
  registered (changed in the store since).

A champion registered without an evaluation set (before pipectl recorded one, or by hand) is
scored on the candidate's split, as it always was.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipectl.components.contracts import EVALUATION_SET_DIGEST_TAG, EVALUATION_SET_TAG, ShardIndex
from pipectl.components.models import load_scorer
from pipectl.components.models.portable import Scorer

log = logging.getLogger("pipectl.evaluate")

CHAMPION_ALIAS = "champion"
_SHOWN_LABELS = 12


@dataclass
class Champion:
    """The version holding the ``champion`` alias, as evaluate uses it."""

    version: str
    scorer: Scorer | None
    """None: it could not be loaded (the candidate is then held to the threshold only, as before)."""
    evaluation_set: str = ""
    """Its registered held-out split (``s3://…/shards/``); empty: registered without one."""
    evaluation_set_sha256: str = ""


def champion_version(client: Any, model_name: str) -> str | None:
    """The version number holding the champion alias, or None (no model, or no alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(model_name, CHAMPION_ALIAS).version)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def champion_model(client: Any, model_name: str) -> tuple[str, str]:
    """(model URI, training run id) of the version holding the ``champion`` alias. The run is the
    version's run_id, or (MLflow 3 registers ``models:/m-...`` URIs without one) its logged
    model's source run."""
    mv = client.get_model_version_by_alias(model_name, CHAMPION_ALIAS)
    return mv.source, mv.run_id or client.get_logged_model(mv.model_id).source_run_id


def load_champion(client: Any, model_name: str, folder: Path, threads: int) -> Champion | None:
    """The champion of ``model_name`` with its scorer (loaded into ``folder``) and its registered
    evaluation set; None when there is none."""
    version = champion_version(client, model_name)
    if version is None:
        return None
    tags = client.get_model_version(model_name, version).tags or {}
    champion = Champion(version, None, tags.get(EVALUATION_SET_TAG, ""), tags.get(EVALUATION_SET_DIGEST_TAG, ""))
    try:  # the champion may be another architecture: both are ONNX graphs, scored alike
        uri, run_id = champion_model(client, model_name)
        champion.scorer = load_scorer(uri, run_id, folder, threads=threads)
    except Exception as e:  # an unloadable champion cannot block a good candidate
        log.warning("champion version %s could not be loaded (%s); threshold only", version, e)
    return champion


def split_hasher(index: ShardIndex) -> Any:
    """A sha256 over what a split means to a model: its label names, image size, channels and
    normalisation; :func:`hash_shard` adds each shard's images and labels in the index's order."""
    head = {"labels": index.labels, "image_size": index.image_size, "channels": index.channels,
            "mean": index.mean, "std": index.std}
    return hashlib.sha256(json.dumps(head, sort_keys=True).encode())


def hash_shard(hasher: Any, images: np.ndarray, labels: np.ndarray) -> None:
    """Add one shard (``images`` [N, C, H, W], ``labels`` [N]) with its dtypes and shapes."""
    for array in (images, labels):
        a = np.ascontiguousarray(array)
        hasher.update(f"{a.dtype.str}{a.shape}".encode())
        hasher.update(memoryview(a).cast("B"))


def _labels_text(labels: list[str]) -> str:
    shown = ", ".join(labels[:_SHOWN_LABELS])
    return f"[{shown}{', …' if len(labels) > _SHOWN_LABELS else ''}] ({len(labels)})"


def incomparable(candidate: ShardIndex, champion: ShardIndex) -> str:
    """Why a candidate evaluated on ``candidate``'s split cannot be scored on the champion's
    (``champion``): other labels (names or order: a label is an output index), image size or
    channels. Empty when it can."""
    if candidate.labels != champion.labels:
        return (f"the champion's evaluation set has the labels {_labels_text(champion.labels)}, the candidate's "
                f"{_labels_text(candidate.labels)}: another task under the same model name")
    if (candidate.image_size, candidate.channels) != (champion.image_size, champion.channels):
        return (f"the champion's evaluation set holds {champion.channels}x{champion.image_size}x{champion.image_size} "
                f"images, the candidate was trained on {candidate.channels}x{candidate.image_size}x{candidate.image_size}")
    return ""
