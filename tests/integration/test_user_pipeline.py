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


def test_the_example_project_pipeline_runs_locally_with_its_own_step(tmp_path, small_digits_dir):
    ref = f"{ROOT / 'examples' / 'custom-pipeline' / 'pipeline.py'}:pipeline"
    r = subprocess.run([PIPECTL, "run", ref, "--output", "json", "--state-dir", str(tmp_path / "state"),
                        "-p", f"dataset-uri={small_digits_dir}", "-p", "epochs=2", "-p", "promotion-threshold=0",
                        "-p", "model-name=team-cnn"],
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


TRAINER = '''
"""A torchrun-compatible training script with no pipectl import: the environment contract only."""
import json, os
import boto3, torch, torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)                      # every rank took part: 1 + 2 + ... + world
env = {k: v for k, v in os.environ.items() if k.startswith("PIPECTL_TRAIN_")}
if rank == 0:
    s3 = boto3.client("s3", endpoint_url=os.environ["PIPECTL_S3_ENDPOINT"],
                      aws_access_key_id=os.environ["PIPECTL_S3_ACCESS_KEY"],
                      aws_secret_access_key=os.environ["PIPECTL_S3_SECRET_KEY"], region_name="us-east-1")
    bucket, _, prefix = env["PIPECTL_TRAIN_RUN_URI"].removeprefix("s3://").partition("/")
    s3.put_object(Bucket=bucket, Key=f"{prefix}/model/usertrain.json",
                  Body=json.dumps({"world": world, "sum": t.item(), "env": env}).encode())
    shards = env["PIPECTL_TRAIN_SHARDS_URI"].removeprefix("s3://").partition("/")[2]
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=shards)["KeyCount"]
    print(f"usertrain: world={world} sum={t.item()} epochs={env['PIPECTL_TRAIN_EPOCHS']} shard-objects={listed}", flush=True)
dist.destroy_process_group()
'''

CHECK = '''
import json, os, sys
import boto3
s3 = boto3.client("s3", endpoint_url=os.environ["PIPECTL_S3_ENDPOINT"], aws_access_key_id=os.environ["PIPECTL_S3_ACCESS_KEY"],
                  aws_secret_access_key=os.environ["PIPECTL_S3_SECRET_KEY"], region_name="us-east-1")
bucket, _, prefix = sys.argv[1].removeprefix("s3://").partition("/")
doc = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/model/usertrain.json")["Body"].read())
print("check:", json.dumps(doc, sort_keys=True))
'''

PIPELINE = '''
from pipectl.sdk import RUN_URI, ContainerStep, Pipeline, preprocess, stage, train
pipeline = Pipeline("script-training", [
    stage(), preprocess(), train("usertrain"),
    ContainerStep("check", image="registry.example.com/me/check:1", command=["python", "check.py"], args=[RUN_URI]),
])
'''


def test_a_torchrun_script_with_no_pipectl_import_trains_in_the_gang(tmp_path, small_digits_dir):
    """train(module=...): the user's script runs under torchrun as the gang (2 pods x 1 process here), with
    the train step's inputs and the store in its environment; a later step of the user's reads what it wrote."""
    (tmp_path / "usertrain.py").write_text(TRAINER)
    (tmp_path / "check.py").write_text(CHECK)
    (tmp_path / "pipeline.py").write_text(PIPELINE)
    r = subprocess.run([PIPECTL, "run", "pipeline.py:pipeline", "--output", "json", "--state-dir", str(tmp_path / "state"),
                        "-p", f"dataset-uri={small_digits_dir}", "-p", "workers=2", "-p", "processes-per-worker=1",
                        "-p", "epochs=4"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    assert [s["task"] for s in summary["steps"]] == ["validate", "stage", "preprocess", "train", "check"]
    steps = {s["task"]: s for s in summary["steps"]}
    train_log = Path(steps["train"]["log"]).read_text()
    assert "usertrain: world=2 sum=3.0 epochs=4 shard-objects=" in train_log, train_log[-3000:]
    assert int(train_log.split("shard-objects=")[1].split()[0]) >= 2  # the index and at least one shard
    check = json.loads(Path(steps["check"]["log"]).read_text().split("check: ", 1)[1].splitlines()[0])
    assert check["world"] == 2 and check["env"]["PIPECTL_TRAIN_WORKFLOW_NAME"] == summary["workflow"]
    assert check["env"]["PIPECTL_TRAIN_RUN_URI"] == f"s3://pipectl/runs/{summary['workflow']}"


def test_a_failing_user_script_fails_the_run_as_code(tmp_path, small_digits_dir):
    """Exit 1 from the user's code (a bug) ends the run Failed at the train step, not retried."""
    (tmp_path / "usertrain.py").write_text("raise SystemExit('bad hyper-parameter')\n")
    (tmp_path / "pipeline.py").write_text(
        "from pipectl.sdk import Pipeline, preprocess, stage, train\n"
        "pipeline = Pipeline('script-training', [stage(), preprocess(), train('usertrain')])\n")
    r = subprocess.run([PIPECTL, "run", "pipeline.py:pipeline", "--output", "json", "--state-dir", str(tmp_path / "state"),
                        "-p", f"dataset-uri={small_digits_dir}"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    train = next(s for s in summary["steps"] if s["task"] == "train")
    assert train["phase"] == "Failed" and train["exit_code"] == 1
    assert "bad hyper-parameter" in Path(train["log"]).read_text()
