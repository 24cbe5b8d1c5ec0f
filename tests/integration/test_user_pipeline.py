"""A user's own pipeline, run by reference with the local backend: the example project under
examples/custom-pipeline (pipectl's steps without warm, plus the team's `report` step importing
the team's own package) trains, writes its report into the run's folder and registers one version."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PIPECTL = str(Path(sys.executable).parent / "pipectl")


def test_the_example_project_pipeline_runs_locally_with_its_own_step(tmp_path):
    ref = f"{ROOT / 'examples' / 'custom-pipeline' / 'pipeline.py'}:pipeline"
    r = subprocess.run([PIPECTL, "run", ref, "--output", "json", "--state-dir", str(tmp_path / "state"),
                        "-p", "epochs=2", "-p", "promotion-threshold=0", "-p", "model-name=team-cnn"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    assert summary["phase"] == "Succeeded"
    assert [s["task"] for s in summary["steps"]] == ["validate", "stage", "preprocess", "train", "report", "evaluate",
                                                      "register"]
    assert summary["workflow"].startswith("team-training-")
    report = next(s for s in summary["steps"] if s["task"] == "report")
    log = Path(report["log"]).read_text()
    assert f"report: s3://pipectl/runs/{summary['workflow']}/report.md" in log, log
    assert summary["model"]["name"] == "team-cnn" and summary["model"]["version"] == "1"
    record = json.loads(next((tmp_path / "state" / "runs").glob("*/run.json")).read_text())
    assert record["tasks"]["report"]["outputs"]["report-uri"] == f"s3://pipectl/runs/{summary['workflow']}/report.md"
