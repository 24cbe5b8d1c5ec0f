"""Register the candidate in the MLflow Model Registry; move the champion alias if promoted.

One version per pipeline run (field case C05): the version carries the tag ``pipectl.run_key``
(the workflow uid); a retried step finds it by the candidate's MLflow run id and that tag and
creates nothing. "Already exists" when creating the registered model is success.

Promotion under concurrency (C05 b, C08: two retrains finishing together, A 0.99 and B 0.96,
both having seen no champion). On the cluster the register step holds an Argo mutex per model
name, so promotions of one model run one at a time; and the step does not trust that alone:

1. compare-and-set: if the champion moved after this run's evaluate step, this run takes it only
   with a strictly better metric;
2. each promoting version is tagged with the champion its evaluation was measured against
   (``pipectl.promote_over``): the versions with the same tag are one *round* of promotions;
3. verify after writing: the champion must be the best version of the round (metric, then the
   lower version); any participant that finds otherwise writes the best one. Every participant
   computes the same answer, so concurrent writers converge on A, and B reports no alias. A
   champion from outside the round (a later round, an operator's rollback) is left alone, and a
   round only spans versions created within :data:`ROUND_WINDOW_S` of each other: an old version
   that once promoted over the same champion (before an operator rolled the alias back to it) is
   not a member of today's round.
"""

from __future__ import annotations

import logging
from typing import Any

from pipectl.components.contracts import (
    EVALUATION_SET_DIGEST_TAG,
    EVALUATION_SET_TAG,
    Decision,
    EvaluateOutput,
    RegisterInput,
    RegisterOutput,
    StoreSettings,
)
from pipectl.components.mlflow_access import mlflow_access
from pipectl.components.runtime import StepError

log = logging.getLogger("pipectl.register")

CHAMPION_ALIAS = "champion"
RUN_KEY_TAG = "pipectl.run_key"
METRIC_TAG = "pipectl.metric.{}"
MODEL_DIGEST_TAG = "pipectl.model_sha256"
"""On every version: the digest of the model evaluate scored and register verified."""
ROUND_TAG = "pipectl.promote_over"
"""On a promoting version: the champion version its evaluation compared against (``none``: no champion)."""
ROUND_WINDOW_S = 3600.0
"""Seconds between the creation of two versions of one round at most: concurrent register steps of
one model (they overlap in time) are well within it; a rollback target's old rivals are not."""


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name, description="Registered by pipectl")
    except MlflowException as e:
        if e.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def _current_champion(client: Any, name: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, CHAMPION_ALIAS)
    except MlflowException as e:
        if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            return None
        raise


def find_version(client: Any, name: str, run_id: str, run_key: str) -> Any | None:
    """The version this pipeline run registered earlier, or None."""
    for mv in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
        if mv.tags.get(RUN_KEY_TAG) == run_key:
            return mv
    return None


def _take_champion(client: Any, name: str, version: str, evaluation: EvaluateOutput, metric_tag: str) -> bool:
    """Compare-and-set: take the alias unless the champion moved since evaluation to a version at
    least as good."""
    current = _current_champion(client, name)
    if current is None or str(current.version) in (evaluation.champion_version, version):
        return True
    theirs = current.tags.get(metric_tag)
    take = theirs is None or evaluation.metric > float(theirs)
    log.info("champion moved to v%s (%s=%s) since evaluation; taking it: %s", current.version, metric_tag, theirs, take)
    return take


def _settle_round(client: Any, name: str, mine: Any, round_key: str, metric_tag: str, window_s: float | None = None) -> str | None:
    """After writing: make the champion the best version of the promotion round ``round_key``
    (highest metric, then lowest version; members created within ``window_s`` seconds of ``mine``,
    this run's version) when the champion is one of the round; return the champion version
    (None when there is none)."""
    window_s = ROUND_WINDOW_S if window_s is None else window_s
    current = _current_champion(client, name)
    if current is None:
        return None
    members = [mv for mv in client.search_model_versions(f"name = '{name}'")
               if mv.tags.get(ROUND_TAG) == round_key and mv.tags.get(metric_tag) is not None
               and abs(int(mv.creation_timestamp) - int(mine.creation_timestamp)) <= window_s * 1000]
    if str(current.version) not in {str(mv.version) for mv in members}:
        return str(current.version)  # a later round or an operator's choice: not ours to change
    best = max(members, key=lambda mv: (float(mv.tags[metric_tag]), -int(mv.version)))
    if str(best.version) != str(current.version):
        log.info("champion v%s is not the best of its round (v%s is): moving the alias back", current.version, best.version)
        client.set_registered_model_alias(name, CHAMPION_ALIAS, str(best.version))
    return str(best.version)


def _evaluation_set_tags(evaluation: EvaluateOutput) -> dict[str, str]:
    """The held-out split the version was evaluated on, and its content's digest: a later candidate
    is compared with this version on it (:mod:`pipectl.components.evaluate.champion`)."""
    if not (evaluation.evaluation_set and evaluation.evaluation_set_sha256):
        return {}
    return {EVALUATION_SET_TAG: evaluation.evaluation_set, EVALUATION_SET_DIGEST_TAG: evaluation.evaluation_set_sha256}


def register(inp: RegisterInput, evaluation: EvaluateOutput, client: Any) -> RegisterOutput:
    """Create (or find) this run's model version and apply the promote/keep decision."""
    import mlflow

    name = inp.model_name
    metric_tag = METRIC_TAG.format(evaluation.metric_name or inp.promotion_metric.value)
    _ensure_registered_model(client, name)
    promote = evaluation.decision is Decision.promote
    round_key = evaluation.champion_version or "none"
    tags = {RUN_KEY_TAG: inp.run_key, metric_tag: str(evaluation.metric), **({ROUND_TAG: round_key} if promote else {}),
            **({MODEL_DIGEST_TAG: evaluation.model_sha256} if evaluation.model_sha256 else {}),
            **_evaluation_set_tags(evaluation)}
    mv = find_version(client, name, evaluation.mlflow_run_id, inp.run_key)
    created = mv is None
    if mv is None:
        # the round tag is there before this run writes the alias: a concurrent participant sees it
        mv = mlflow.register_model(evaluation.model_uri, name, tags=tags)
        # register_model links run_id only for runs:/ URIs in some versions; search relies on it.
        log.info("registered %s version %s", name, mv.version)
    else:
        log.info("found version %s registered earlier by this run (%s); nothing created", mv.version, inp.run_key)
    version = str(mv.version)

    alias = None
    if promote:
        if not created:
            client.set_model_version_tag(name, version, ROUND_TAG, round_key)
        if _take_champion(client, name, version, evaluation, metric_tag):
            client.set_registered_model_alias(name, CHAMPION_ALIAS, version)
        best = _settle_round(client, name, mv, round_key, metric_tag)
        alias = CHAMPION_ALIAS if best == version else None
    champion = _current_champion(client, name)
    return RegisterOutput(
        model_name=name,
        version=version,
        alias=alias,
        created=created,
        champion_version=None if champion is None else str(champion.version),
    )


def run(inp: RegisterInput, settings: StoreSettings) -> RegisterOutput:
    import mlflow
    from mlflow import MlflowClient

    if settings.mlflow_uri:
        mlflow.set_tracking_uri(settings.mlflow_uri)
        mlflow.set_registry_uri(settings.mlflow_uri)
    # an MLflow with auth refuses another team's model: one clear failure, not retried
    with mlflow_access(f"write registered model {inp.model_name} (a version, the {CHAMPION_ALIAS} alias)"):
        verify_model(inp.model_uri, inp.model_sha256, settings.mlflow_uri)
        return register(inp, inp.evaluation(), MlflowClient(tracking_uri=settings.mlflow_uri, registry_uri=settings.mlflow_uri))


def verify_model(model_uri: str, sha256: str, tracking_uri: str | None = None) -> None:
    """Raise StepError (not retried) unless the logged model at ``model_uri`` is, byte for byte, the
    one evaluate scored (``sha256``: its :func:`~pipectl.components.models.model_sha256`)."""
    import tempfile
    from pathlib import Path

    from pipectl.components.models import download_model, model_sha256

    with tempfile.TemporaryDirectory(prefix="pipectl-register-") as folder:
        download_model(model_uri, Path(folder), tracking_uri=tracking_uri)
        got = model_sha256(Path(folder) / "model")  # the folder evaluate hashed, as evaluate laid it out
    if got != sha256:
        raise StepError(f"the model at {model_uri} is not the one evaluate scored (sha256 {got[:12]}…, evaluate scored {sha256[:12]}…)",
                        "its files changed after evaluation; nothing was registered: run the pipeline again")
