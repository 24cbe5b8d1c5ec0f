"""Real services for integration tests: moto's S3 server and an MLflow tracking server."""

from __future__ import annotations

import uuid

import pytest

from pipectl.components.contracts import StoreSettings
from pipectl.pipelines.embedded import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices


@pytest.fixture(scope="session")
def services(tmp_path_factory):
    state = tmp_path_factory.mktemp("services")
    with EmbeddedServices(state, s3=True, mlflow=True) as svc:
        yield svc


@pytest.fixture()
def settings(services) -> StoreSettings:
    """Store settings pointing at the session's services, with a fresh bucket per test."""
    return StoreSettings(
        s3_endpoint=services.s3_url,
        s3_access_key=S3_ACCESS_KEY,
        s3_secret_key=S3_SECRET_KEY,
        bucket=f"t-{uuid.uuid4().hex[:12]}",
        mlflow_uri=services.mlflow_url,
    )


@pytest.fixture()
def s3(settings):
    from pipectl.components.runtime import s3_client

    return s3_client(settings)


@pytest.fixture()
def step_env(settings):
    import os

    return {**os.environ, **settings.step_env()}
