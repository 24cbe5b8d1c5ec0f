"""`pipectl ui`: the MLflow UI of the local runs in a state folder, until Ctrl-C."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipectl.pipelines.backends.services import start_mlflow

pytestmark = pytest.mark.integration

PIPECTL = str(Path(sys.executable).parent / "pipectl")


def _left(tmp_path) -> list[str]:
    """Processes whose command line names the test's folder (the MLflow server the command started)."""
    return subprocess.run(["pgrep", "-af", str(tmp_path)], capture_output=True, text=True).stdout.splitlines()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ui_serves_the_state_folders_mlflow_store_until_stopped(tmp_path, sig):
    """Until Ctrl-C (SIGINT at its default disposition, set for the child: CI runners start tests
    with it ignored) or SIGTERM; then the server it started is gone too."""
    start_mlflow(tmp_path).stop()  # what a `pipectl run` leaves: the store, no server
    proc = subprocess.Popen([PIPECTL, "ui", "--state-dir", str(tmp_path)], stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "MLflow UI of" not in line:
            assert time.monotonic() < deadline and proc.poll() is None, line
            line = proc.stderr.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+", line).group(0)
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(url + "/", timeout=10) as r:
            assert r.status == 200 and b"MLflow" in r.read()
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)
        assert _left(tmp_path) == []
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)


def test_ui_without_local_runs_says_so(tmp_path):
    r = subprocess.run([PIPECTL, "ui", "--state-dir", str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no local runs in" in r.stderr and "pipectl run training" in r.stderr
