"""The step anatomy of a training while it runs, from its MLflow run.

At each epoch's end rank 0 tags the run (one background request, beside the epoch's metrics) with
the epoch's step-time line and the verdicts so far (:func:`epoch_tags`); ``pipectl status`` reads
them back (:func:`read`) until the evaluate step carries the last epoch's anatomy as its outputs.
The run is found by its tag ``pipectl.workflow`` (the workflow's name), as the train step finds it
again after a restart. No torch here: the command line imports this module.
"""

from __future__ import annotations

import os
from typing import Any

WORKFLOW_TAG = "pipectl.workflow"
"""The workflow whose training the MLflow run holds."""
STEP_TIME_TAG = "pipectl.step_time"
"""``epoch E of N: <the epoch's step-time line>`` (:func:`pipectl.components.train.telemetry.describe`)."""
VERDICTS_TAG = "pipectl.verdicts"
"""The verdicts so far, one a line (empty: none)."""
TAG_LIMIT = 5000
"""The most characters of a tag value every MLflow server keeps."""
SHOWN_CHARS = 300
"""The most characters ``pipectl status`` prints of one line read from the tags (anyone who can
write to the MLflow run can set them)."""
SHOWN_VERDICTS = 10
"""The most verdicts ``pipectl status`` prints, then how many more there are."""
READ_TIMEOUT_S = 10
"""``pipectl status`` waits this long for each answer of the MLflow server, asked once: an MLflow
that cannot be reached leaves the anatomy out, never the status."""


def epoch_tags(epoch: int, epochs: int, step_time: str, verdicts: list[str]) -> dict[str, str]:
    """The tags rank 0 sets at the end of epoch ``epoch`` (1 first) of ``epochs``."""
    return {STEP_TIME_TAG: f"epoch {epoch} of {epochs}: {step_time}"[:TAG_LIMIT],
            VERDICTS_TAG: "\n".join(verdicts)[:TAG_LIMIT]}


def _plain(text: str) -> str:
    """``text`` as one line of plain text: every control or format character (escape sequences, a
    carriage return, bidirectional overrides) shown as ``?``, at most :data:`SHOWN_CHARS` characters."""
    import unicodedata

    text = "".join("?" if unicodedata.category(c).startswith("C") else c for c in text)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 1] + "…"


def lines(tags: dict[str, str]) -> list[str]:
    """What ``pipectl status`` prints of a run's tags: the latest epoch's step time, then each verdict
    (at most :data:`SHOWN_VERDICTS`); plain text, each line bounded (:func:`_plain`)."""
    step_time = tags.get(STEP_TIME_TAG, "")
    if not step_time:
        return []
    epoch, _, text = step_time.partition(": ")
    verdicts = [v for v in tags.get(VERDICTS_TAG, "").splitlines() if v.strip()]
    more = [f"verdict: and {len(verdicts) - SHOWN_VERDICTS} more"] if len(verdicts) > SHOWN_VERDICTS else []
    return [_plain(f"training step time ({epoch}, the latest): {text}"),
            *(_plain(f"verdict: {v}") for v in verdicts[:SHOWN_VERDICTS]), *more]


def _auth() -> Any:
    """The credentials MLflow's own client sends (``MLFLOW_TRACKING_TOKEN``, else
    ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``), for requests."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}, None
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    return {}, (user, os.environ.get("MLFLOW_TRACKING_PASSWORD", "")) if user else None


def read(mlflow_uri: str, workflow: str, timeout_s: int = READ_TIMEOUT_S) -> tuple[list[str], str]:
    """(lines, problem): the latest anatomy of ``workflow``'s training (:func:`lines`; empty when
    no epoch has ended yet), or no lines and why they could not be read. MLflow's REST API through
    ``requests`` (the command line's own dependency: an install without the steps' libraries reads it too)."""
    import requests

    api, (headers, auth) = mlflow_uri.rstrip("/") + "/api/2.0/mlflow", _auth()

    def post(path: str, body: dict) -> dict:
        r = requests.post(f"{api}/{path}", json=body, headers=headers, auth=auth, timeout=timeout_s)
        r.raise_for_status()
        return r.json()

    try:
        experiments = [e["experiment_id"] for e in post("experiments/search", {"max_results": 1000}).get("experiments", [])]
        runs = post("runs/search", {"experiment_ids": experiments, "max_results": 1,
                                    "filter": f"tags.`{WORKFLOW_TAG}` = '{workflow}'"}).get("runs", []) if experiments else []
    except (requests.RequestException, ValueError) as e:  # unreachable, refused, not MLflow: said, never fatal
        return [], f"the training's step anatomy could not be read from MLflow at {mlflow_uri} ({type(e).__name__}: {_plain(str(e))[:200]})"
    tags = {t["key"]: t.get("value", "") for t in runs[0].get("data", {}).get("tags", [])} if runs else {}
    return lines(tags), ""
