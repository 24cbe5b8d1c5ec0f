"""Evaluate the candidate on the held-out split, against the model holding the champion alias.

The metric that decides is ``promotion_metric`` (accuracy or F1 macro), or the pipeline's own metric
function (``evaluate(metric="mypkg.metrics:name")``) when it has one.

Decision rule: ``promote`` when the candidate's deciding metric is >= the threshold and
strictly greater than the champion's on the same held-out images (or there is no champion);
``keep`` otherwise. Ties keep the champion (no churn for equal models).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pipectl.components.contracts import (
    Decision,
    EvaluateInput,
    EvaluateOutput,
    RunLayout,
    StoreSettings,
    TrainOutput,
)
from pipectl.components.evaluate.pictures import log_pictures
from pipectl.components.models import classification_metrics, load_scorer, model_sha256
from pipectl.components.models.portable import Scorer, predict
from pipectl.components.runtime import StepError, available_cpus, read_json, resolve_callable, s3_client, write_json
from pipectl.components.shard_stream import ShardStream

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


def champion_model(client: Any, model_name: str) -> tuple[str, str]:
    """(model URI, training run id) of the version holding the ``champion`` alias. The run is the
    version's run_id, or (MLflow 3 registers ``models:/m-...`` URIs without one) its logged
    model's source run."""
    mv = client.get_model_version_by_alias(model_name, CHAMPION_ALIAS)
    return mv.source, mv.run_id or client.get_logged_model(mv.model_id).source_run_id


Metric = Callable[[np.ndarray, np.ndarray], dict[str, float]]


def _metrics(inp: EvaluateInput, num_classes: int) -> tuple[Metric, str]:
    """(every metric of a model's logits, the name of the one that decides): pipectl's accuracy and
    F1 macro, plus the user's metric when the pipeline gives one (it then decides)."""
    if not inp.metric_function:
        return (lambda logits, labels: classification_metrics(logits, labels, num_classes)), inp.promotion_metric.value
    name = inp.metric_function.partition(":")[2]
    fn = resolve_callable(inp.metric_function, "metric", 2, f"def {name}(logits: np.ndarray, labels: np.ndarray) -> float")

    def every(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
        value = fn(logits, labels)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)) or not 0 <= float(value) <= 1:
            raise StepError(f"metric {inp.metric_function} returned {value!r}, not a number in [0, 1]",
                            "return a float where higher is better, as promotion-threshold is")
        return {**classification_metrics(logits, labels, num_classes), name: float(value)}
    return every, name


def _score_split(data: ShardStream, scorers: dict[str, Scorer]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Logits of every scorer and the labels, over the split shard by shard (one shard in memory,
    the next being fetched). A scorer that fails on a shard (an incompatible champion) is dropped,
    except the candidate's."""
    logits: dict[str, list[np.ndarray]] = {name: [] for name in scorers}
    labels: list[np.ndarray] = []
    for images, y in data.shards():
        labels.append(y)
        for name in list(scorers):
            try:
                logits[name].append(predict(scorers[name], images))
            except Exception as e:
                if name == "candidate":
                    raise
                log.warning("the %s could not be scored on this split (%s); threshold only", name, e)
                del scorers[name], logits[name]
    return {name: np.concatenate(parts) for name, parts in logits.items()}, np.concatenate(labels)


def _champion_metric(score_all: Metric, logits: np.ndarray | None, labels: np.ndarray, decider: str,
                     version: str | None) -> float | None:
    """The champion's deciding metric on the same images, or None (no champion, or it could not be scored)."""
    if logits is None:
        return None
    try:
        return score_all(logits, labels)[decider]
    except StepError:
        raise  # the user's metric failed: a failure of the code
    except Exception as e:  # e.g. logits of another label set
        log.warning("champion version %s could not be scored on this split (%s); threshold only", version, e)
        return None


def evaluate(inp: EvaluateInput, s3: Any, client: Any) -> EvaluateOutput:
    """Score candidate and champion on the validation split; log to the candidate's MLflow run."""

    layout = RunLayout(run_uri=inp.run_uri)
    train = TrainOutput.model_validate(read_json(s3, layout.train_output_uri))
    data = ShardStream(s3, inp.shards_uri, "validation")
    score_all, decider = _metrics(inp, len(data.index.labels))
    threads = available_cpus()
    champ_version = champion_version(client, inp.model_name)
    with tempfile.TemporaryDirectory() as folder:
        scorers = {"candidate": load_scorer(train.model_uri, train.mlflow_run_id, Path(folder) / "candidate", threads=threads)}
        digest = model_sha256(Path(folder) / "candidate" / "model")  # what was scored: register takes only this
        if champ_version is not None:
            try:  # the champion may be another architecture: both are ONNX graphs, scored alike
                uri, run_id = champion_model(client, inp.model_name)
                scorers["champion"] = load_scorer(uri, run_id, Path(folder) / "champion", threads=threads)
            except Exception as e:  # an unloadable champion cannot block a good candidate
                log.warning("champion version %s could not be loaded (%s); threshold only", champ_version, e)
        logits, labels = _score_split(data, scorers)
    metrics = score_all(logits["candidate"], labels)
    metric = metrics[decider]
    champ_metric = _champion_metric(score_all, logits.get("champion"), labels, decider, champ_version)
    decision = decide(metric, inp.promotion_threshold, champ_metric)

    for name, value in metrics.items():
        client.log_metric(train.mlflow_run_id, f"eval_{name}", value)
    if champ_metric is not None:
        client.log_metric(train.mlflow_run_id, f"champion_{decider}", champ_metric)
    client.set_tag(train.mlflow_run_id, "pipectl.decision", decision.value)
    pictures = log_pictures(client, train.mlflow_run_id, logits["candidate"], labels, data.index.labels)
    log.info(
        "candidate %s=%.4f, champion (v%s) %s, threshold %.3f -> %s",
        decider, metric, champ_version, champ_metric, inp.promotion_threshold, decision.value,
    )
    out = EvaluateOutput(
        mlflow_run_id=train.mlflow_run_id,
        model_uri=train.model_uri,
        metrics={k: round(v, 6) for k, v in metrics.items()},
        metric=round(metric, 6),
        champion_version=champ_version,
        champion_metric=None if champ_metric is None else round(champ_metric, 6),
        decision=decision,
        metric_name=decider,
        training_step_time=train.step_time,
        training_verdicts=train.verdicts,
        training_images_per_s=round(train.anatomy.get("images_per_s", 0.0), 2),
        training_data_share=train.anatomy.get("share_data", 0.0),
        training_sync_share=train.anatomy.get("share_sync", 0.0),
        training_slowest_rank_ratio=train.anatomy.get("slowest_rank_ratio", 0.0),
        model_sha256=digest,
        pictures=pictures,
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
