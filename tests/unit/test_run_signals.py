"""How `pipectl run` reacts to stop signals (cli/run_cmd.py ``stop_on_signals``), in a small child
process: a signal at its default disposition when the run starts unwinds the run with exit 128+N;
SIGINT/SIGHUP ignored when it starts (nohup, ``cmd &`` in a script) stay ignored; SIGTERM always stops it."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import os, signal, sys, time
    for name in sys.argv[1].split(",") if sys.argv[1] else []:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    from pipectl.cli.run_cmd import stop_on_signals
    try:
        with stop_on_signals():
            for name in sys.argv[2].split(","):
                os.kill(os.getpid(), getattr(signal, name))
                time.sleep(0.05)
            print("survived", flush=True)
    except SystemExit as e:
        print("exit", e.code, flush=True)
        raise
    # the handlers are put back afterwards
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
""")


def _child(ignored: str, send: str) -> tuple[int, str]:
    r = subprocess.run([sys.executable, "-c", CHILD, ignored, send], capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM)])
    return r.returncode, r.stdout.strip()


@pytest.mark.parametrize("name,code", [("SIGINT", 130), ("SIGHUP", 129), ("SIGTERM", 143)])
def test_a_signal_at_its_default_unwinds_the_run(name, code):
    assert _child("", name) == (code, f"exit {code}")


def test_signals_ignored_at_start_stay_ignored_but_sigterm_stops():
    # nohup ignores SIGHUP; a script's `cmd &` ignores SIGINT
    assert _child("SIGINT,SIGHUP", "SIGINT,SIGHUP") == (0, "survived")
    assert _child("SIGINT,SIGHUP", "SIGHUP,SIGTERM") == (143, "exit 143")
