"""Real services for integration tests: moto's S3 server and an MLflow tracking server."""

from __future__ import annotations

import uuid

import pytest

from pipectl.components.contracts import StoreSettings
from pipectl.pipelines.backends.services import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices
from tests.conftest import require_storage_mark


@pytest.fixture(scope="session")
def services(tmp_path_factory):
    state = tmp_path_factory.mktemp("services")
    with EmbeddedServices(state, s3=True, mlflow=True) as svc:
        yield svc


def _settings(endpoint: str, access_key: str, secret_key: str, mlflow_url: str) -> StoreSettings:
    return StoreSettings(
        s3_endpoint=endpoint,
        s3_access_key=access_key,
        s3_secret_key=secret_key,
        bucket=f"t-{uuid.uuid4().hex[:12]}",
        mlflow_uri=mlflow_url,
    )


@pytest.fixture()
def settings(services) -> StoreSettings:
    """Store settings for the session's moto S3 server and MLflow, with a fresh bucket per test."""
    return _settings(services.s3_url, S3_ACCESS_KEY, S3_SECRET_KEY, services.mlflow_url)


@pytest.fixture()
def ceph_settings(request, services, ceph_cluster) -> StoreSettings:
    """Store settings for the session's real Ceph RADOS Gateway (and the session's MLflow)."""
    require_storage_mark(request)
    return _settings(ceph_cluster.s3_endpoint, ceph_cluster.access_key, ceph_cluster.secret_key, services.mlflow_url)


@pytest.fixture(params=["moto", pytest.param("ceph-rgw", marks=pytest.mark.storage)])
def store_settings(request) -> StoreSettings:
    """Parametrised over both S3 servers: moto (the embedded default) and Ceph RGW (production)."""
    return request.getfixturevalue("settings" if request.param == "moto" else "ceph_settings")


@pytest.fixture()
def s3(settings):
    from pipectl.components.runtime import s3_client

    return s3_client(settings)


@pytest.fixture()
def step_env(settings):
    import os

    return {**os.environ, **settings.step_env()}
