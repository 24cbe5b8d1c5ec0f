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
from tests.tools.procs import default_signals

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
                            preexec_fn=default_signals)
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


@pytest.mark.pipeline
def test_the_latest_runs_learning_curve_opens_in_the_mlflow_ui(tmp_path):
    """After `pipectl run training`, `pipectl ui` names the latest run's page; in headless Chromium
    that page's Artifacts tab shows evaluation/learning_curve.png, the picture evaluate logged (the
    image drawn at the PNG's own size)."""
    import json
    import struct

    from tests.cluster.browser import SHOTS, launch_chromium

    state = tmp_path / "state"
    r = subprocess.run([PIPECTL, "run", "training", "--state-dir", str(state), "-p", "epochs=2", "--output", "json"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    run_id = json.loads(r.stdout)["mlflow_run_id"]
    png = next(state.rglob(f"{run_id}/artifacts/evaluation/learning_curve.png")).read_bytes()
    width = struct.unpack(">I", png[16:20])[0]  # the IHDR chunk's width
    # SIGINT at its default for the child (CI runners start tests with it ignored): the stop below is Ctrl-C
    proc = subprocess.Popen([PIPECTL, "ui", "--state-dir", str(state)], stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_signals)
    try:
        text, deadline = "", time.monotonic() + 120
        while "latest run:" not in text:
            assert time.monotonic() < deadline and proc.poll() is None, text
            text += proc.stderr.readline()
        page_url = re.search(r"latest run: (\S+)", text).group(1)
        assert page_url.endswith(f"/runs/{run_id}"), text
        with launch_chromium() as browser:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(page_url)
            page.get_by_role("tab", name="Artifacts").click()
            page.get_by_text("evaluation", exact=True).click()
            page.get_by_text("learning_curve.png", exact=True).click()
            page.get_by_text("evaluation/learning_curve.png", exact=True).wait_for(timeout=30_000)
            page.wait_for_function(f"() => [...document.images].some(i => i.complete && i.naturalWidth === {width})",
                                   timeout=30_000)
            page.screenshot(path=str(SHOTS / "mlflow-learning-curve.png"))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
