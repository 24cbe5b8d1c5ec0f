"""Helpers for tests that start the product's commands as child processes."""

from __future__ import annotations

import signal

# The signals a test may send to a command it started, to check how the command stops.
STOP_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)


def default_signals() -> None:
    """``preexec_fn`` for ``subprocess.Popen``: the child starts with SIGINT, SIGHUP and SIGTERM at
    their default disposition, whatever the test runner inherited. CI runners and ``nohup`` start
    the runner with SIGINT/SIGHUP ignored, and an ignored disposition is inherited across exec: the
    child would then (rightly) keep ignoring them, and a test of Ctrl-C would test nothing."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
