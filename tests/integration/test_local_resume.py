"""`pipectl run --resume`: an interrupted local run continues where it stopped.

Real processes throughout: `pipectl run training` with the embedded S3 server (moto) and MLflow,
torchrun with a 2-process gang, interrupted by a signal while the train step runs and after it
wrote checkpoints, then resumed with `pipectl run training --resume`.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tools.procs import default_signals

pytestmark = [pytest.mark.integration, pytest.mark.pipeline]

PIPECTL = str(Path(sys.executable).parent / "pipectl")
CHECKPOINT_EVERY = 5
# ~23 optimiser steps an epoch on the digits with 2 processes; 10 epochs leave seconds to interrupt in.
PARAMS = ["-p", "epochs=10", "-p", f"checkpoint-every-steps={CHECKPOINT_EVERY}", "-p", "promotion-threshold=0"]
EPOCH_DONE = re.compile(r"epoch (\d+) of \d+ done: step (\d+) of (\d+)")


def _pipectl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PIPECTL, "run", "training", "--output", "json", *args], capture_output=True, text=True, timeout=timeout)


def _record(state: Path) -> dict:
    (path,) = state.glob("runs/*/run.json")
    return json.loads(path.read_text())


def _interrupt_during_training(state: Path, signame: str) -> tuple[int, int]:
    """Start `pipectl run training`, wait (by reading the train step's log) until an epoch ended
    after >= 1 checkpoint was written, send ``signame``. Returns (the step logged then, exit code)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    err = state.parent / "interrupted-run.stderr"
    with open(err, "w") as f:
        proc = subprocess.Popen([PIPECTL, "run", "training", "--state-dir", str(state), *PARAMS],
                                stdout=subprocess.DEVNULL, stderr=f, preexec_fn=default_signals)
    try:
        deadline = time.monotonic() + 300
        step = 0
        while time.monotonic() < deadline and proc.poll() is None:
            logs = list(state.glob("runs/*/train/main.log"))
            found = EPOCH_DONE.findall(logs[0].read_text(errors="replace")) if logs else []
            if found and int(found[-1][1]) >= CHECKPOINT_EVERY:
                step = int(found[-1][1])
                break
            time.sleep(0.1)
        assert step, f"no epoch of training ended (exit {proc.poll()}): {err.read_text()[-3000:]}"
        proc.send_signal(getattr(signal, signame))
        return step, proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def _check_interrupted(tmp_path: Path, signame: str, code: int) -> tuple[dict, Path, int]:
    """Interrupt a run in training with ``signame``: exit ``code``, the record says Interrupted in
    train with the steps before it Succeeded, the embedded S3's objects (checkpoints included) were
    saved in the run's folder, and the user was told how to resume. Returns (record, run folder,
    the step the log showed when the signal was sent)."""
    state = tmp_path / "state"
    logged_step, rc = _interrupt_during_training(state, signame)
    assert rc == code
    record = _record(state)
    run_dir = state / "runs" / record["name"]
    assert record["phase"] == "Interrupted"
    assert {t: v["phase"] for t, v in record["tasks"].items()} == {
        "validate": "Succeeded", "stage": "Succeeded", "warm": "Skipped", "preprocess": "Succeeded", "train": "Interrupted"}
    saved = json.loads((run_dir / "s3-snapshot" / "index.json").read_text())
    assert any(o["key"].startswith(f"runs/{record['name']}/checkpoints/step-") for o in saved["objects"])
    assert f"run {record['name']} can be resumed" in (tmp_path / "interrupted-run.stderr").read_text()
    return record, run_dir, logged_step


def test_sigterm_in_training_leaves_a_resumable_run(tmp_path):
    """kill (SIGTERM, exit 143) unwinds like Ctrl-C: recorded Interrupted, the embedded S3 saved."""
    _check_interrupted(tmp_path, "SIGTERM", 143)


def test_an_interrupted_run_resumes_without_redoing_finished_steps(tmp_path):
    """Ctrl-C (SIGINT) in training, then `--resume`: stage/preprocess are not run again, training
    continues from the last checkpoint (step > 0), the run ends Succeeded with exactly one model
    version (C05). Before it: resume with another parameter is exit 2 and changes nothing. After
    it: nothing is left to resume (exit 2)."""
    state = tmp_path / "state"
    before, run_dir, logged_step = _check_interrupted(tmp_path, "SIGINT", 130)
    record_bytes = (run_dir / "run.json").read_bytes()

    # Another parameter than the run had: refused before any service starts; nothing changes.
    changed = _pipectl("--state-dir", str(state), "--resume", "-p", "epochs=11")
    assert changed.returncode == 2, changed.stderr
    assert "ran with other parameters: epochs=10 (asked: 11)" in changed.stderr
    assert "services:" not in changed.stderr
    assert (run_dir / "run.json").read_bytes() == record_bytes
    assert not list(run_dir.glob("*.resume*"))

    # The same parameters given again are fine: -p epochs=10 is what the run had.
    r = _pipectl("--state-dir", str(state), "--resume", "-p", "epochs=10")
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    assert summary["phase"] == "Succeeded" and summary["workflow"] == before["name"]
    after = _record(state)
    assert after["phase"] == "Succeeded" and after["uid"] == before["uid"] and after["executions"] == 2
    for task in ("validate", "stage", "preprocess"):  # not run again: same single execution, same start
        assert after["tasks"][task]["executions"] == before["tasks"][task]["executions"], task
        assert len(after["tasks"][task]["executions"]) == 1, task
    assert [s["task"] for s in summary["steps"] if s["reused"]] == ["validate", "stage", "preprocess"]
    assert [e["phase"] for e in after["tasks"]["train"]["executions"]] == ["Interrupted", "Succeeded"]

    train_log = (run_dir / "train.resume1" / "main.log").read_text(errors="replace")
    resumed = re.search(r"resuming from checkpoint s3://\S+/runs/" + before["name"] + r"/checkpoints/step-(\d+)\.pt \(step (\d+) of (\d+)\)", train_log)
    assert resumed, train_log[-3000:]
    step, total = int(resumed[2]), int(resumed[3])
    # at least the last checkpoint before the logged step; a multiple of the checkpoint interval
    assert logged_step // CHECKPOINT_EVERY * CHECKPOINT_EVERY <= step < total and step % CHECKPOINT_EVERY == 0
    output = json.loads(train_log.strip().splitlines()[-1])
    assert output["resumed_from_step"] == step and output["steps_this_attempt"] == total - step and output["steps"] == total
    assert summary["metrics"]["accuracy"] > 0.8

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}", registry_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")  # a registry URI set by an earlier test must not win
    versions = client.search_model_versions("name = 'digits-cnn'")
    assert [(str(v.version), v.run_id) for v in versions] == [("1", summary["mlflow_run_id"])]
    assert summary["model"]["version"] == "1"
    experiment = client.get_experiment_by_name("digits-cnn")
    runs = client.search_runs([experiment.experiment_id], f"tags.`pipectl.workflow` = '{before['name']}'")
    assert [r.info.run_id for r in runs] == [summary["mlflow_run_id"]]  # training re-attached to its MLflow run
    assert not (run_dir / "s3-snapshot").exists()  # nothing left to resume: the saved objects are gone

    # Resuming again: the last run Succeeded.
    again = _pipectl("--state-dir", str(state), "--resume")
    assert again.returncode == 2 and f"nothing to resume: the last run, {before['name']}, Succeeded" in again.stderr, again.stderr


def test_resume_with_nothing_to_resume_is_exit_2_and_writes_nothing(tmp_path):
    """No state folder, or a run name that is not there: exit 2 with a hint; nothing created."""
    state = tmp_path / "state"
    r = _pipectl("--state-dir", str(state), "--resume")
    assert r.returncode == 2 and "nothing to resume: no run in the state folder" in r.stderr and "pipectl run training" in r.stderr, r.stderr
    assert not state.exists()
    (state / "runs").mkdir(parents=True)
    r = _pipectl("--state-dir", str(state), "--resume", "training-nope1")
    assert r.returncode == 2 and "no run 'training-nope1'" in r.stderr, r.stderr
    assert sorted(p.name for p in state.iterdir()) == ["run.lock", "runs"]
