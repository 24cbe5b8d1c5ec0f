"""Evaluate the candidate on the held-out split, against the model holding the champion alias.

Decision rule: ``promote`` when the candidate's promotion metric is >= the threshold and
strictly greater than the champion's on the same held-out images (or there is no champion);
``keep`` otherwise. Ties keep the champion (no churn for equal models).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from pipectl.components.contracts import (
    Decision,
    EvaluateInput,
    EvaluateOutput,
    RunLayout,
    StoreSettings,
    TrainOutput,
)
from pipectl.components.models import classification_metrics, load_weights, predict
from pipectl.components.runtime import read_json, s3_client, write_json
from pipectl.components.shards import load_split

log = logging.getLogger("pipectl.evaluate")

CHAMPION_ALIAS = "champion"


def decide(metric: float, threshold: float, champion_metric: float | None) -> Decision:
    """The promotion rule of the module doc, as a pure function."""
    if metric < threshold:
        return Decision.keep
    if champion_metric is not None and metric <= champion_metric:
        return Decision.keep
    return Decision.promote


def champion_version(client: Any, model_name: str) -> str | None:
    """The version number holding the champion alias, or None (no model, or no alias)."""
    from mlflow.exceptions import MlflowException

    try:
        return str(client.get_model_version_by_alias(model_name, CHAMPION_ALIAS).version)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def champion_run_id(client: Any, model_name: str) -> str:
    """The training run behind the version holding the ``champion`` alias: the version's run_id,
    or (MLflow 3 registers ``models:/m-...`` URIs without one) its logged model's source run."""
    mv = client.get_model_version_by_alias(model_name, CHAMPION_ALIAS)
    return mv.run_id or client.get_logged_model(mv.model_id).source_run_id


def evaluate(inp: EvaluateInput, s3: Any, client: Any) -> EvaluateOutput:
    """Score candidate and champion on the validation split; log to the candidate's MLflow run."""

    layout = RunLayout(run_uri=inp.run_uri)
    train = TrainOutput.model_validate(read_json(s3, layout.train_output_uri))
    images, labels, index = load_split(s3, inp.shards_uri, "validation")
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    candidate = load_weights(train.mlflow_run_id)
    metrics = classification_metrics(predict(candidate, x), y, len(index.labels))
    metric = metrics[inp.promotion_metric.value]

    champ_version = champion_version(client, inp.model_name)
    champ_metric: float | None = None
    if champ_version is not None:
        try:
            champion = load_weights(champion_run_id(client, inp.model_name))
            champ_metric = classification_metrics(predict(champion, x), y, len(index.labels))[inp.promotion_metric.value]
        except Exception as e:  # an incompatible or unloadable champion cannot block a good candidate
            log.warning("champion version %s could not be scored on this split (%s); threshold only", champ_version, e)
    decision = decide(metric, inp.promotion_threshold, champ_metric)

    for name, value in metrics.items():
        client.log_metric(train.mlflow_run_id, f"eval_{name}", value)
    if champ_metric is not None:
        client.log_metric(train.mlflow_run_id, f"champion_{inp.promotion_metric.value}", champ_metric)
    client.set_tag(train.mlflow_run_id, "pipectl.decision", decision.value)
    log.info(
        "candidate %s=%.4f, champion (v%s) %s, threshold %.3f -> %s",
        inp.promotion_metric.value, metric, champ_version, champ_metric, inp.promotion_threshold, decision.value,
    )
    out = EvaluateOutput(
        mlflow_run_id=train.mlflow_run_id,
        model_uri=train.model_uri,
        metrics={k: round(v, 6) for k, v in metrics.items()},
        metric=round(metric, 6),
        champion_version=champ_version,
        champion_metric=None if champ_metric is None else round(champ_metric, 6),
        decision=decision,
    )
    write_json(s3, layout.evaluate_output_uri, out.model_dump(mode="json"))
    return out


def run(inp: EvaluateInput, settings: StoreSettings) -> EvaluateOutput:
    import mlflow
    from mlflow import MlflowClient

    if settings.mlflow_uri:
        mlflow.set_tracking_uri(settings.mlflow_uri)
        mlflow.set_registry_uri(settings.mlflow_uri)
    return evaluate(inp, s3_client(settings), MlflowClient(tracking_uri=settings.mlflow_uri))
