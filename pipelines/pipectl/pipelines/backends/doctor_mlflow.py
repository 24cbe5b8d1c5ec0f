"""``pipectl doctor``'s MLflow credentials row: the namespace's ``pipectl-mlflow-credentials``
Secret against what its MLflow server asks for.

The Secret is optional (without it the steps talk to MLflow without auth), so what it must hold
depends on the server: asked anonymously, an MLflow running with basic auth answers 401 — then the
Secret must exist and the server must accept it; a server without auth answers 200 — then no
Secret is needed. A server that does not answer from this machine (a cluster-internal name) leaves
only the Secret's own shape to check.

Example::

    row = credentials_row("http://mlflow.pipectl:5000", {"MLFLOW_TRACKING_USERNAME": "...", ...}, "ns")
"""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from typing import NamedTuple

from pipectl.components.names import MLFLOW_PASSWORD_ENV, MLFLOW_SECRET, MLFLOW_USERNAME_ENV

CHECK = "MLflow credentials"


class Finding(NamedTuple):
    """The row's status (ok, warn, fail), what was found, and the fix when it is not ok."""

    status: str
    detail: str
    fix: str = ""

PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"
"""A read every MLflow user may make: 200 with a right user (or no auth at all), 401 without."""


def answer(uri: str, user: str | None = None, password: str | None = None, timeout: float = 5.0) -> int | None:
    """The HTTP status MLflow at ``uri`` gives a read, with basic auth when ``user`` is given; None
    when it does not answer."""
    request = urllib.request.Request(uri.rstrip("/") + PROBE)
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


def decoded(data: dict[str, str], key: str) -> str | None:
    """Value ``key`` of a Secret's ``data`` (base64, as the API gives it), decoded; None when absent."""
    value = data.get(key)
    return base64.b64decode(value).decode(errors="replace") if value else None


def credentials_row(uri: str | None, secret: dict[str, str] | None, namespace: str, timeout: float = 5.0) -> Finding:
    """The row for ``secret`` (the Secret's ``data``, base64 as the API gives it; None: no such
    Secret) against MLflow at ``uri`` (None: not configured; the store row says so)."""
    fix = (f"pipectl teams mlflow-user TEAM (with the MLflow admin's MLFLOW_TRACKING_USERNAME/PASSWORD): writes "
           f"{MLFLOW_SECRET} into the team's namespace {namespace}")
    anonymous = answer(uri, timeout=timeout) if uri else None
    if secret is None:
        if anonymous == 401:
            return Finding("fail", f"MLflow at {uri} asks for credentials (401) and Secret {MLFLOW_SECRET} is missing: "
                                      "training and register would be refused", fix)
        said = {None: "does not answer from this machine", 200: "answers without credentials"}.get(anonymous, f"answers {anonymous}")
        return Finding("ok", f"no Secret {MLFLOW_SECRET}: the steps talk to MLflow without auth (MLflow {said})")
    user, password = decoded(secret, MLFLOW_USERNAME_ENV), decoded(secret, MLFLOW_PASSWORD_ENV)
    missing = [k for k, v in ((MLFLOW_USERNAME_ENV, user), (MLFLOW_PASSWORD_ENV, password)) if not v]
    if missing:
        return Finding("fail", f"Secret {MLFLOW_SECRET} lacks {', '.join(missing)}", fix)
    status = answer(uri, user, password, timeout) if uri else None
    if status in (401, 403):
        return Finding("fail", f"MLflow at {uri} refuses user {user} of Secret {MLFLOW_SECRET} ({status})",
                   f"{fix} --rotate (a new password for the user, written into the Secret)")
    if status is None:
        return Finding("ok", f"Secret {MLFLOW_SECRET} (user {user}); not tried: MLflow does not answer from this machine "
                                "(pipectl doctor --from-pod asks from the namespace)")
    return Finding("ok", f"Secret {MLFLOW_SECRET}: MLflow accepts user {user}")
