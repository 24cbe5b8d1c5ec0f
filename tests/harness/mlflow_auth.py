"""A real MLflow tracking server in basic-auth mode (``mlflow server --app-name basic-auth``) for the
tests of per-team MLflow users: the auth config docs/install.md ships (docs/mlflow-basic-auth.ini:
``default_permission = READ``, pipectl's rule on names) with the test's admin user, its teams'
prefixes and its user database a sqlite file under the test's folder."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

ADMIN = "pipectl-admin"
ADMIN_PASSWORD = "admin-password-for-tests-only"
TEAMS = ("team-a", "team-b")
"""The teams' MLflow users, each owning the model prefix of its name (the config's [pipectl] section)."""


@dataclass(frozen=True)
class AuthMlflow:
    url: str
    admin: str
    admin_password: str


SHIPPED_INI = Path(__file__).resolve().parents[2] / "docs" / "mlflow-basic-auth.ini"
"""The auth config docs/install.md ships: the tests run with its settings."""


def auth_ini(folder: Path) -> Path:
    """The shipped auth config (MLFLOW_AUTH_CONFIG_PATH) with the test's admin and a user database
    in ``folder``; its ``default_permission`` and the rest as shipped."""
    import configparser

    config = configparser.ConfigParser()
    config.read(SHIPPED_INI)
    config["mlflow"].update({"database_uri": f"sqlite:///{(folder / 'basic_auth.db').resolve()}",
                             "admin_username": ADMIN, "admin_password": ADMIN_PASSWORD})
    config["pipectl"]["team_prefixes"] = ", ".join(f"{t}={t}" for t in TEAMS)
    path = folder / "basic_auth.ini"
    with path.open("w") as f:
        config.write(f)
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
