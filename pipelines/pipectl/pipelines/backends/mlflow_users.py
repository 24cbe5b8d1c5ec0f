"""A team's user on an MLflow server that runs MLflow's basic-auth app (``pipectl teams mlflow-user``).

MLflow's own auth app (``mlflow server --app-name basic-auth``) keeps users and per-resource
permissions; with ``default_permission = READ`` a user writes only the experiments and registered
models it created (or was granted) and reads the others. pipectl gives each team one user, named
as the team, through the app's REST API as its supported client does
(``mlflow.server.get_app_client("basic-auth", ...)``: ``/api/2.0/mlflow/users/get``, ``create``,
``update-password``), with the MLflow admin's credentials from ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD`` (what MLflow's client reads). The password is generated here and
never printed: it goes into the team's Secret only (:mod:`pipectl.cli.teams_cmds`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from pipectl.components.errors import PipectlError, Unreachable, ValidationFailed
from pipectl.components.names import MLFLOW_PASSWORD_ENV, MLFLOW_USERNAME_ENV

PASSWORD_BYTES = 32
"""Random bytes of a generated password (``secrets.token_urlsafe``: 43 characters)."""


@dataclass(frozen=True)
class TeamUser:
    """The outcome for one team's user: ``password`` is the new one (None: the user existed and
    kept its password), ``created`` False when the user existed."""

    username: str
    password: str | None
    created: bool


def _health(uri: str) -> None:
    """Raise :class:`Unreachable` unless MLflow at ``uri`` answers ``/health`` (no credentials
    needed; asked first, so an unreachable server fails in seconds, not after the client's retries)."""
    import requests

    try:
        requests.get(uri.rstrip("/") + "/health", timeout=10).raise_for_status()
    except requests.RequestException as e:
        raise Unreachable(f"MLflow at {uri} did not answer /health: {e}",
                          "check --mlflow-uri (or the site file's mlflow_uri) and that the server runs") from e


def _refusal(e: Any, uri: str, admin: str, username: str) -> PipectlError:
    """The CLI's error for MLflow's answer ``e`` (an MlflowException) to the admin's request."""
    code = getattr(e, "error_code", "")
    if code == "UNAUTHENTICATED":
        return Unreachable(f"MLflow at {uri} refused the credentials of {admin} (401)",
                           f"set {MLFLOW_USERNAME_ENV} and {MLFLOW_PASSWORD_ENV} to the MLflow admin's user and password")
    if code == "PERMISSION_DENIED":
        return Unreachable(f"MLflow user {admin} is not an MLflow admin (403 on user {username})",
                           f"set {MLFLOW_USERNAME_ENV}/{MLFLOW_PASSWORD_ENV} to the admin of the server's auth config "
                           "(admin_username), or ask that admin to make this user one")
    if code == "ENDPOINT_NOT_FOUND" or "404" in str(e):
        return ValidationFailed(f"MLflow at {uri} has no user API: it does not run MLflow's basic-auth app",
                                "start it with `mlflow server --app-name basic-auth` (docs/install.md, MLflow with auth)")
    return PipectlError(f"MLflow at {uri} failed on user {username}: {e}")


def ensure_team_user(uri: str, username: str, admin: str, *, rotate: bool = False) -> TeamUser:
    """Create MLflow user ``username`` (not an admin) with a generated password on the server at
    ``uri``, as ``admin`` (whose credentials MLflow's client reads from the environment). A user
    that exists keeps its password unless ``rotate`` (then it gets a new one). Raises
    :class:`Unreachable` (server down, admin refused: 401/403) or :class:`ValidationFailed` (no
    basic-auth app there); nothing is changed on MLflow when it raises before the write."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client

    _health(uri)
    client = get_app_client("basic-auth", tracking_uri=uri.rstrip("/"))
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    try:
        try:
            client.get_user(username)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            client.create_user(username, password)
            return TeamUser(username, password, created=True)
        if not rotate:
            return TeamUser(username, None, created=False)
        client.update_user_password(username, password)
        return TeamUser(username, password, created=False)
    except MlflowException as e:
        raise _refusal(e, uri, admin, username) from e
