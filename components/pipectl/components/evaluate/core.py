"""Evaluate the candidate on the held-out split, against the model holding the champion alias.

The metric that decides is ``promotion_metric`` (accuracy or F1 macro), or the pipeline's own metric
function (``evaluate(metric="mypkg.metrics:name")``) when it has one.

Decision rule: ``promote`` when the candidate's deciding metric on its own held-out split is >= the
threshold and, when there is a champion, the candidate scores strictly higher than the champion on
the same images: the champion's registered evaluation set (:mod:`pipectl.components.evaluate.champion`,
which also says when a candidate that cannot be compared there is kept); ``keep`` otherwise. Ties
keep the champion (no churn for equal models).
"""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
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
from pipectl.components.evaluate.champion import (
    CHAMPION_ALIAS,
    Champion,
    champion_model,
    champion_version,
    hash_shard,
    incomparable,
    load_champion,
    split_hasher,
)
from pipectl.components.evaluate.pictures import log_pictures
from pipectl.components.mlflow_access import mlflow_access
from pipectl.components.models import classification_metrics, load_scorer, model_sha256
from pipectl.components.models.portable import Scorer, predict
from pipectl.components.runtime import StepError, available_cpus, read_json, resolve_callable, s3_client, write_json
from pipectl.components.shard_stream import ShardStream

log = logging.getLogger("pipectl.evaluate")

__all__ = ["CHAMPION_ALIAS", "champion_model", "champion_version", "decide", "evaluate", "run"]


def decide(metric: float, threshold: float, champion_metric: float | None, challenger_metric: float | None = None) -> Decision:
    """The promotion rule of the module doc, as a pure function: ``metric`` (the candidate's, on its
    own split) against ``threshold``; ``challenger_metric`` (the candidate's on the split the
    champion was scored on; default ``metric``) against ``champion_metric`` (None: no champion scored)."""
    if metric < threshold:
        return Decision.keep
    challenger = metric if challenger_metric is None else challenger_metric
    if champion_metric is not None and challenger <= champion_metric:
        return Decision.keep
    return Decision.promote


def explain(decision: Decision, name: str, metric: float, threshold: float, champion_metric: float | None,
            challenger_metric: float | None = None, champion_version: str | None = None) -> str:
    """Why :func:`decide` decided ``decision``, in one line for the run summary and the step's output."""
    if metric < threshold:
        return f"{name} {metric:.4f} is below the promotion threshold {threshold:.3f}"
    challenger = metric if challenger_metric is None else challenger_metric
    if champion_metric is None:
        return f"{name} {metric:.4f} reaches the threshold {threshold:.3f}; no champion to beat"
    champion = f"the champion (version {champion_version})"
    if decision is Decision.promote:
        return f"{name} {challenger:.4f} beats {champion}'s {champion_metric:.4f}"
    if challenger == champion_metric:
        return f"{name} {challenger:.4f} ties {champion}: a tie keeps the champion"
    return f"{name} {challenger:.4f} is below {champion}'s {champion_metric:.4f}"


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


def _score_split(data: ShardStream, scorers: dict[str, Scorer], hasher: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Logits of every scorer and the labels, over the split shard by shard (one shard in memory,
    the next being fetched), each shard added to ``hasher`` (:func:`~pipectl.components.evaluate.champion.hash_shard`).
    A scorer that fails on a shard (an incompatible champion) is dropped, except the candidate's."""
    logits: dict[str, list[np.ndarray]] = {name: [] for name in scorers}
    labels: list[np.ndarray] = []
    for images, y in data.shards():
        hash_shard(hasher, images, y)
        labels.append(y)
        for name in list(scorers):
            try:
                logits[name].append(predict(scorers[name], images, data.model_input))
            except Exception as e:
                if name == "candidate":
                    raise
                log.warning("the %s could not be scored on this split (%s)", name, e)
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


@dataclass
class Comparison:
    """Candidate against champion on one split (``compared_on``); ``reason``: why they could not be."""

    champion_metric: float | None = None
    challenger_metric: float | None = None
    compared_on: str = ""
    reason: str = ""


def _on_champion_set(s3: Any, champ: Champion, candidate: Scorer, own: ShardStream, score_all: Metric,
                     decider: str) -> Comparison:
    """Candidate and champion scored on the champion's registered evaluation set (module doc of
    :mod:`~pipectl.components.evaluate.champion`): a Comparison with a reason when they cannot be."""
    where = f"the champion's (v{champ.version}) evaluation set {champ.evaluation_set}"
    try:
        theirs = ShardStream(s3, champ.evaluation_set, "validation")
    except Exception as e:
        return Comparison(reason=f"{where} cannot be read ({type(e).__name__}: {str(e)[:200]})")
    if why := incomparable(own.index, theirs.index):
        return Comparison(reason=why)
    hasher = split_hasher(theirs.index)
    scorers = {"candidate": candidate, "champion": champ.scorer} if champ.scorer else {"candidate": candidate}
    logits, labels = _score_split(theirs, scorers, hasher)
    if hasher.hexdigest() != champ.evaluation_set_sha256:
        return Comparison(reason=f"{where} is not the content registered with it (sha256 {hasher.hexdigest()[:12]}…, "
                                 f"registered {champ.evaluation_set_sha256[:12]}…): it changed in the store since")
    champion_metric = _champion_metric(score_all, logits.get("champion"), labels, decider, champ.version)
    if champion_metric is None:
        return Comparison(reason=f"the champion could not be scored on its own evaluation set {champ.evaluation_set}")
    return Comparison(champion_metric, score_all(logits["candidate"], labels)[decider], champ.evaluation_set)


def _compare(s3: Any, champ: Champion | None, candidate: Scorer, own: ShardStream, own_uri: str,
             own_logits: dict[str, np.ndarray], own_labels: np.ndarray, score_all: Metric, decider: str) -> Comparison:
    """Candidate against champion: on the champion's registered set when it has one, else (a
    champion registered without one) on the candidate's own split (``own_uri``), already scored in ``own_logits``."""
    if champ is None or champ.scorer is None:
        return Comparison()
    if champ.evaluation_set:
        return _on_champion_set(s3, champ, candidate, own, score_all, decider)
    log.info("champion version %s was registered without an evaluation set: compared on the candidate's split", champ.version)
    metric = _champion_metric(score_all, own_logits.get("champion"), own_labels, decider, champ.version)
    return Comparison(metric, None, own_uri if metric is not None else "")


def _log(client: Any, run_id: str, metrics: dict[str, float], decider: str, comparison: Comparison, decision: Decision) -> None:
    """The evaluation on the candidate's MLflow run."""
    for name, value in metrics.items():
        client.log_metric(run_id, f"eval_{name}", value)
    if comparison.champion_metric is not None:
        client.log_metric(run_id, f"champion_{decider}", comparison.champion_metric)
    if comparison.challenger_metric is not None:
        client.log_metric(run_id, f"on_champion_set_{decider}", comparison.challenger_metric)
    client.set_tag(run_id, "pipectl.decision", decision.value)
    if comparison.reason:
        client.set_tag(run_id, "pipectl.decision_reason", comparison.reason[:5000])


def evaluate(inp: EvaluateInput, s3: Any, client: Any) -> EvaluateOutput:
    """Score candidate and champion (module doc); log to the candidate's MLflow run."""
    layout = RunLayout(run_uri=inp.run_uri)
    train = TrainOutput.model_validate(read_json(s3, layout.train_output_uri))
    data = ShardStream(s3, inp.shards_uri, "validation")
    score_all, decider = _metrics(inp, len(data.index.labels))
    threads = available_cpus()
    own_hasher = split_hasher(data.index)
    with tempfile.TemporaryDirectory() as folder:
        candidate = load_scorer(train.model_uri, train.mlflow_run_id, Path(folder) / "candidate", threads=threads)
        digest = model_sha256(Path(folder) / "candidate" / "model")  # what was scored: register takes only this
        champ = load_champion(client, inp.model_name, Path(folder) / "champion", threads)
        legacy = champ is not None and champ.scorer is not None and not champ.evaluation_set
        logits, labels = _score_split(data, {"candidate": candidate, **({"champion": champ.scorer} if legacy else {})},
                                      own_hasher)
        comparison = _compare(s3, champ, candidate, data, inp.shards_uri, logits, labels, score_all, decider)
    metrics = score_all(logits["candidate"], labels)
    metric = metrics[decider]
    decision = (Decision.keep if comparison.reason
                else decide(metric, inp.promotion_threshold, comparison.champion_metric, comparison.challenger_metric))
    _log(client, train.mlflow_run_id, metrics, decider, comparison, decision)
    pictures = log_pictures(client, train.mlflow_run_id, logits["candidate"], labels, data.index.labels)
    champ_version = champ.version if champ else None
    on_theirs = ("" if comparison.challenger_metric is None
                 else f" (on the champion's evaluation set {comparison.compared_on}: candidate {comparison.challenger_metric:.4f})")
    log.info("candidate %s=%.4f, champion (v%s) %s%s, threshold %.3f -> %s%s", decider, metric, champ_version,
             comparison.champion_metric, on_theirs, inp.promotion_threshold, decision.value,
             f": {comparison.reason}" if comparison.reason else "")
    reason = comparison.reason or explain(decision, decider, metric, inp.promotion_threshold, comparison.champion_metric,
                                          comparison.challenger_metric, champ_version)
    out = _output(inp, train, metrics, decider, comparison, decision, champ_version, digest, pictures, own_hasher.hexdigest(), reason)
    write_json(s3, layout.evaluate_output_uri, out.model_dump(mode="json"))
    return out


def _output(inp: EvaluateInput, train: TrainOutput, metrics: dict[str, float], decider: str, comparison: Comparison,
            decision: Decision, champ_version: str | None, digest: str, pictures: list[str], set_sha256: str,
            reason: str) -> EvaluateOutput:
    return EvaluateOutput(
        mlflow_run_id=train.mlflow_run_id,
        model_uri=train.model_uri,
        metrics={k: round(v, 6) for k, v in metrics.items()},
        metric=round(metrics[decider], 6),
        champion_version=champ_version,
        champion_metric=None if comparison.champion_metric is None else round(comparison.champion_metric, 6),
        challenger_metric=None if comparison.challenger_metric is None else round(comparison.challenger_metric, 6),
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
        evaluation_set=inp.shards_uri,
        evaluation_set_sha256=set_sha256,
        compared_on=comparison.compared_on,
        decision_reason=reason,
    )


def run(inp: EvaluateInput, settings: StoreSettings) -> EvaluateOutput:
    import mlflow
    from mlflow import MlflowClient

    if settings.mlflow_uri:
        mlflow.set_tracking_uri(settings.mlflow_uri)
        mlflow.set_registry_uri(settings.mlflow_uri)
    with mlflow_access(f"read model {inp.model_name}'s champion and log the evaluation to the candidate's run"):
        return evaluate(inp, s3_client(settings), MlflowClient(tracking_uri=settings.mlflow_uri))
