"""register against a real MLflow server: one version per pipeline run, one champion (C05)."""

from __future__ import annotations

import threading
import uuid

import pytest

from pipectl.components.contracts import Decision, EvaluateOutput, PromotionMetric, RegisterInput
from pipectl.components.register.core import _ensure_registered_model, register

pytestmark = pytest.mark.integration


@pytest.fixture()
def client(settings):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(settings.mlflow_uri)
    mlflow.set_registry_uri(settings.mlflow_uri)
    return MlflowClient(tracking_uri=settings.mlflow_uri, registry_uri=settings.mlflow_uri)


def _candidate(metric: float, decision: Decision = Decision.promote, champion: str | None = None) -> EvaluateOutput:
    """A real logged model in a real MLflow run, evaluated at ``metric``."""
    import mlflow

    from pipectl.components.models import SmallCNN

    mlflow.set_experiment("register-tests")
    with mlflow.start_run() as run:
        info = mlflow.pytorch.log_model(SmallCNN(num_classes=10, width=4), name="model", serialization_format="pickle",
                                        pip_requirements=["torch"])
    return EvaluateOutput(mlflow_run_id=run.info.run_id, model_uri=info.model_uri, metrics={"accuracy": metric},
                          metric=metric, champion_version=champion, champion_metric=None, decision=decision)


def _versions(client, name):
    return sorted(int(mv.version) for mv in client.search_model_versions(f"name = '{name}'"))


def _inp(name, key):
    return RegisterInput(evaluate_output_uri="s3://unused/e.json", model_name=name, run_key=key,
                         promotion_metric=PromotionMetric.accuracy)


def test_C05d_a_retried_register_step_finds_its_own_version(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    ev = _candidate(0.97)
    first = register(_inp(name, "wf-uid-1"), ev, client)
    again = register(_inp(name, "wf-uid-1"), ev, client)
    assert (first.version, first.created, first.alias) == ("1", True, "champion")
    assert (again.version, again.created, again.alias) == ("1", False, "champion")
    assert _versions(client, name) == [1]


def test_C05c_already_exists_is_success(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    errors = []

    def create():
        try:
            _ensure_registered_model(client, name)
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=create) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert client.get_registered_model(name).name == name


def test_C05b_two_promotions_end_with_one_champion_the_better_one(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    # Both runs evaluated while there was no champion; the weaker one finishes last.
    strong, weak = _candidate(0.99), _candidate(0.96)
    a = register(_inp(name, "wf-a"), strong, client)
    b = register(_inp(name, "wf-b"), weak, client)
    assert (a.alias, b.alias) == ("champion", None)
    assert b.champion_version == a.version
    assert client.get_model_version_by_alias(name, "champion").version == a.version
    assert _versions(client, name) == [1, 2]


def test_keep_registers_without_moving_the_alias(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    first = register(_inp(name, "wf-1"), _candidate(0.97), client)
    kept = register(_inp(name, "wf-2"), _candidate(0.90, Decision.keep, champion=first.version), client)
    assert (kept.version, kept.alias, kept.champion_version) == ("2", None, "1")
