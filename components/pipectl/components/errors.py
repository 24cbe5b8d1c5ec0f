"""The one error type: a headline (what went wrong, where) and a hint (how to fix it).

Caught at one boundary per process: the CLI's group (``cli_exit`` becomes the exit code) and a
step's ``step_main`` (its :class:`~pipectl.components.runtime.StepError` subclass exits 1 or 75).
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s:]*):(?P<secret>[^/@\s]*)@")


def redact_credentials(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL in it replaced by
    ``***`` (RFC 3986 userinfo: an MLflow URI with a password is never printed)."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


class PipectlError(Exception):
    """``cli_exit``: 1 operation failed, 2 usage/validation, 3 unreachable/unauthorised (the CLI's exit codes)."""

    cli_exit: int = 1

    def __init__(self, headline: str, hint: str = "", *, cli_exit: int | None = None) -> None:
        headline, hint = redact_credentials(headline), redact_credentials(hint)  # printed: never a password
        super().__init__(headline)
        self.headline = headline
        self.hint = hint
        if cli_exit is not None:
            self.cli_exit = cli_exit

    @property
    def exit_code(self) -> int:
        return self.cli_exit


class ValidationFailed(PipectlError):
    """Bad input caught before anything was written (exit 2)."""

    cli_exit = 2


class Unreachable(PipectlError):
    """A service (S3 endpoint, MLflow, API server) cannot be reached or refuses us (exit 3)."""

    cli_exit = 3
