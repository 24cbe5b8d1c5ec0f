"""CLI side of the one error type (:mod:`pipectl.components.errors`)."""

from __future__ import annotations

from typing import NoReturn

from pipectl.components.errors import PipectlError

__all__ = ["PipectlError", "fail"]


def fail(headline: str, hint: str = "", *, code: int = 1) -> NoReturn:
    """Raise a :class:`PipectlError` that exits with ``code``."""
    raise PipectlError(headline, hint, cli_exit=code)
