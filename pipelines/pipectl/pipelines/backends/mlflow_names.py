"""Model and experiment names a team owns, enforced by the MLflow server itself.

MLflow's basic-auth app gives a registered model or experiment to the user that creates it first,
and has no rule on names (its grants name one resource or all of them). So a team's user could
create a model or experiment under another team's prefix directly in MLflow, before that team
did, and keep it. This module closes that: MLflow's auth app calls a configurable
``authorization_function`` on every request; :func:`authenticate` authenticates exactly as MLflow's
own basic-auth function does, then refuses (403, ``PERMISSION_DENIED``) a team user's request that
would create or rename an experiment or registered model to a name outside the team's prefix
(``<model_prefix>-…``). Admins and users no team names are not affected.

In the auth app's config (``MLFLOW_AUTH_CONFIG_PATH``; docs/mlflow-basic-auth.ini), with pipectl
installed beside MLflow on the server (``pip install pipectl-ml``)::

    [mlflow]
    authorization_function = pipectl.pipelines.backends.mlflow_names:authenticate
    [pipectl]
    # each team's MLflow user (pipectl teams mlflow-user) = its model prefix
    team_prefixes = vision=vision, speech=speech

``pipectl teams mlflow-config`` prints the ``[pipectl]`` section from the site file's ``teams:``.
"""

from __future__ import annotations

import configparser
import functools
import os
import re
from typing import Any

SECTION, KEY = "pipectl", "team_prefixes"
NAMED_WRITES = {"experiments/create": "name", "experiments/update": "new_name",
                "registered-models/create": "name", "registered-models/rename": "new_name"}
"""MLflow REST calls that give an experiment or registered model a name (path after ``/mlflow/``)
-> the field of the JSON body that holds it; served under ``/api/2.0/mlflow/`` and ``/ajax-api/2.0/mlflow/``."""
_PAIR = re.compile(r"^([^=\s]+)=([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)$")


def parse_team_prefixes(text: str) -> dict[str, str]:
    """``"vision=vision, speech=sp"`` -> ``{"vision": "vision", "speech": "sp"}`` (user -> model
    prefix); ValueError naming the entry that is not ``user=prefix``."""
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.replace("\n", ",").split(","))):
        m = _PAIR.match(entry)
        if m is None:
            raise ValueError(f"[{SECTION}] {KEY}: {entry!r} is not <MLflow user>=<model prefix>")
        out[m[1]] = m[2]
    return out


def render_section(prefixes: dict[str, str]) -> str:
    """The ``[pipectl]`` section of the auth config for ``prefixes`` (user -> model prefix)."""
    pairs = ", ".join(f"{u}={p}" for u, p in sorted(prefixes.items()))
    return f"[{SECTION}]\n# each team's MLflow user = its model prefix\n{KEY} = {pairs}\n"


def refusal(username: str, method: str, path: str, body: Any, prefixes: dict[str, str]) -> str | None:
    """Why the request must be refused (the message), else None: a POST or PATCH of
    :data:`NAMED_WRITES` by a user of ``prefixes`` naming something outside ``<prefix>-``."""
    prefix = prefixes.get(username)
    if prefix is None or method not in ("POST", "PATCH") or "/mlflow/" not in path:
        return None
    field = NAMED_WRITES.get(path.rsplit("/mlflow/", 1)[1].strip("/"))
    if field is None:
        return None
    name = body.get(field) if isinstance(body, dict) else None
    if isinstance(name, str) and name.startswith(prefix + "-"):
        return None
    what = "experiment" if "experiments/" in path else "registered model"
    return (f"user {username} may name a {what} only {prefix}-<name> (its team's model prefix), not {name!r}: "
            "the names of other prefixes belong to other teams")


@functools.lru_cache(maxsize=1)
def configured_prefixes() -> dict[str, str]:
    """The ``[pipectl] team_prefixes`` of the auth app's config file (MLflow reads the same file
    from ``MLFLOW_AUTH_CONFIG_PATH``); empty when it has none."""
    path = os.environ.get("MLFLOW_AUTH_CONFIG_PATH")
    config = configparser.ConfigParser()
    if path:
        config.read(path)
    return parse_team_prefixes(config.get(SECTION, KEY, fallback=""))


def authenticate() -> Any:
    """MLflow's ``authenticate_request_basic_auth``, then :func:`refusal` of the authenticated user's
    request: its Authorization, or the 401/403 Response to send."""
    import json

    from flask import Response, request
    from mlflow.server.auth import authenticate_request_basic_auth
    from werkzeug.datastructures import Authorization

    result = authenticate_request_basic_auth()
    if not isinstance(result, Authorization):
        return result
    why = refusal(result.username, request.method, request.path, request.get_json(silent=True), configured_prefixes())
    if why is None:
        return result
    return Response(json.dumps({"error_code": "PERMISSION_DENIED", "message": why}), status=403,
                    mimetype="application/json")
