"""The one error type: a headline (what went wrong, where) and a hint (how to fix it).

Caught at one boundary per process: the CLI's group (``cli_exit`` becomes the exit code) and a
step's ``step_main`` (its :class:`~pipectl.components.runtime.StepError` subclass exits 1 or 75).
"""

from __future__ import annotations


class PipectlError(Exception):
    """``cli_exit``: 1 operation failed, 2 usage/validation, 3 unreachable/unauthorised (DESIGN.md)."""

    cli_exit: int = 1

    def __init__(self, headline: str, hint: str = "", *, cli_exit: int | None = None) -> None:
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
