"""A real MLflow tracking server in basic-auth mode (``mlflow server --app-name basic-auth``) for the
tests of per-team MLflow users: an admin user set in the server's auth ini, ``default_permission =
READ`` (what docs/install.md ships), its user database a sqlite file under the test's folder."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ADMIN = "pipectl-admin"
ADMIN_PASSWORD = "admin-password-for-tests-only"


@dataclass(frozen=True)
class AuthMlflow:
    url: str
    admin: str
    admin_password: str


def auth_ini(folder: Path, default_permission: str = "READ") -> Path:
    """The auth app's config (MLFLOW_AUTH_CONFIG_PATH) with the test's admin and a user database in ``folder``."""
    path = folder / "basic_auth.ini"
    path.write_text("[mlflow]\n"
                    f"default_permission = {default_permission}\n"
                    f"database_uri = sqlite:///{(folder / 'basic_auth.db').resolve()}\n"
                    f"admin_username = {ADMIN}\n"
                    f"admin_password = {ADMIN_PASSWORD}\n"
                    "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    return path


@contextmanager
def auth_mlflow(folder: Path) -> Iterator[AuthMlflow]:
    """Start the server (pipectl's own :func:`~pipectl.pipelines.backends.services.start_mlflow`)
    and stop it (its process tree) on exit."""
    from pipectl.pipelines.backends.services import start_mlflow

    folder.mkdir(parents=True, exist_ok=True)
    svc = start_mlflow(folder, auth_config=auth_ini(folder))
    try:
        yield AuthMlflow(svc.url, ADMIN, ADMIN_PASSWORD)
    finally:
        svc.stop()


@contextmanager
def as_user(username: str | None, password: str | None) -> Iterator[None]:
    """MLflow's client sends ``username``/``password`` (None: no credentials) inside the block:
    it reads MLFLOW_TRACKING_USERNAME/PASSWORD at each request, as a step's pod has them."""
    keys = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
    before = {k: os.environ.get(k) for k in keys}
    for k, v in zip(keys, (username, password)):
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
