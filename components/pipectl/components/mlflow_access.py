"""MLflow's refusals of a step's user, as one clear step failure that is not retried.

An MLflow server that runs with its basic-auth app (docs/install.md, "MLflow with auth") answers
401 to a request without valid credentials and 403 to a user without the permission the request
needs: with ``default_permission = READ``, a team's user may read every experiment and registered
model but write only those it created (or was granted). Retrying either cannot help, and neither
is the infrastructure's fault, so the step exits 1 (:class:`~pipectl.components.contracts.ExitCode`) with a
message naming the user, what it was refused and what to do, instead of MLflow's "API request to
endpoint ... failed with error code 403 != 200" and a traceback.

The user is the one MLflow's client sends: ``MLFLOW_TRACKING_USERNAME``, which a pod gets from its
namespace's Secret :data:`~pipectl.components.names.MLFLOW_SECRET`.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Iterator

from pipectl.components.names import MLFLOW_SECRET, MLFLOW_USERNAME_ENV
from pipectl.components.runtime import StepError

UNAUTHENTICATED = "UNAUTHENTICATED"
PERMISSION_DENIED = "PERMISSION_DENIED"
"""MLflow's error codes for HTTP 401 and 403 (``mlflow.exceptions.MlflowException.error_code``)."""


def refusal_status(exc: BaseException) -> int | None:
    """401 or 403 when ``exc`` is MLflow's refusal of the request's user, else None."""
    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover - the steps install mlflow
        return None
    if not isinstance(exc, MlflowException):
        return None
    return {UNAUTHENTICATED: 401, PERMISSION_DENIED: 403}.get(exc.error_code)


def refused_error(status: int, user: str | None, what: str) -> StepError:
    """The step's error for MLflow's ``status`` (401/403) to ``user`` (None: no credentials) trying
    to ``what`` (``write registered model team-a-digits``): not retried (exit 1)."""
    if status == 401:
        who = f"user {user}" if user else "a request without credentials"
        return StepError(f"MLflow refused {who} to {what}: not authenticated (401: missing or wrong credentials)",
                         f"the namespace's Secret {MLFLOW_SECRET} must hold your team's MLflow user "
                         f"(MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD): ask your platform admin to run "
                         f"`pipectl teams mlflow-user <team>` (with --rotate if the password changed)")
    return StepError(f"MLflow refused user {user or '(none)'} to {what}: permission denied (403: another team's "
                     f"user created it, or the name is outside your team's model prefix; yours may read it, not write it)",
                     "a team writes only its own models and experiments: name the model with your team's model prefix "
                     "(<prefix>-<name>, the namespace label pipectl.io/model-prefix), or ask the MLflow admin to grant "
                     "your team's user EDIT on it")


@contextmanager
def mlflow_access(what: str) -> Iterator[None]:
    """Run the block's MLflow calls; MLflow's 401/403 becomes :func:`refused_error` naming
    ``what`` (``write registered model team-a-digits``) and the user of ``MLFLOW_TRACKING_USERNAME``.
    Any other failure passes unchanged."""
    try:
        yield
    except Exception as exc:
        status = refusal_status(exc)
        if status is None:
            raise
        raise refused_error(status, os.environ.get(MLFLOW_USERNAME_ENV) or None, what) from exc
