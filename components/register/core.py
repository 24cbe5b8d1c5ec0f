"""Register the candidate in the MLflow Model Registry; move the champion alias if promoted.

One version per pipeline run (field case C05): the version carries the tag ``pipectl.run_key``
(the workflow uid); a retried step finds it by the candidate's MLflow run id and that tag and
creates nothing. "Already exists" when creating the registered model is success. Moving the
alias is compare-and-set: if another run moved it after this run's evaluate step, this run
takes it only with a strictly better metric (C05 b: two retrains finishing together).
"""

from __future__ import annotations

import logging
from typing import Any

from pipectl.components.contracts import Decision, EvaluateOutput, RegisterInput, RegisterOutput, RunLayout, StoreSettings
from pipectl.components.runtime import read_json, s3_client

log = logging.getLogger("pipectl.register")

CHAMPION_ALIAS = "champion"
RUN_KEY_TAG = "pipectl.run_key"
METRIC_TAG = "pipectl.metric.{}"


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


def register(inp: RegisterInput, evaluation: EvaluateOutput, client: Any) -> RegisterOutput:
    """Create (or find) this run's model version and apply the promote/keep decision."""
    import mlflow

    name = inp.model_name
    metric_tag = METRIC_TAG.format(inp.promotion_metric.value)
    _ensure_registered_model(client, name)
    mv = find_version(client, name, evaluation.mlflow_run_id, inp.run_key)
    created = mv is None
    if mv is None:
        mv = mlflow.register_model(
            evaluation.model_uri,
            name,
            tags={RUN_KEY_TAG: inp.run_key, metric_tag: str(evaluation.metric)},
        )
        # register_model links run_id only for runs:/ URIs in some versions; search relies on it.
        log.info("registered %s version %s", name, mv.version)
    else:
        log.info("found version %s registered earlier by this run (%s); nothing created", mv.version, inp.run_key)
    version = str(mv.version)

    alias = None
    if evaluation.decision is Decision.promote:
        current = _current_champion(client, name)
        if current is None or str(current.version) in (evaluation.champion_version, version):
            take = True
        else:  # someone promoted after our evaluation: only a strictly better model takes over
            theirs = current.tags.get(metric_tag)
            take = theirs is None or evaluation.metric > float(theirs)
            log.info("champion moved to v%s (%s=%s) since evaluation; taking it: %s", current.version, metric_tag, theirs, take)
        if take:
            client.set_registered_model_alias(name, CHAMPION_ALIAS, version)
            alias = CHAMPION_ALIAS
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
    evaluation = EvaluateOutput.model_validate(read_json(s3_client(settings), RunLayout(run_uri=inp.run_uri).evaluate_output_uri))
    return register(inp, evaluation, MlflowClient(tracking_uri=settings.mlflow_uri, registry_uri=settings.mlflow_uri))
