"""A user's own pipeline, run by reference with the local backend: the example project under
examples/custom-pipeline (pipectl's steps without warm, plus the team's `report` step importing
the team's own package) trains, writes its report into the run's folder and registers one version."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
    assert check["env"]["PIPECTL_TRAIN_CHECKPOINTS_URI"] == f"s3://pipectl/runs/{summary['workflow']}/checkpoints/"


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


def test_the_image_classifier_example_trains_its_own_resnet_function_and_evaluates_it_against_a_cnn_champion(tmp_path):
    """examples/image-classifier: the team's generator writes 64x64 images of four shapes. pipectl's
    built-in pipeline trains a small CNN on them first (the champion); then the team's pipeline runs
    its own train function (a torchvision ResNet-18, through TrainContext): the ResNet is scored
    against the CNN champion (both ONNX) by the team's metric and registered as version 2."""
    example = ROOT / "examples" / "image-classifier"
    data = tmp_path / "shapes-data"
    gen = subprocess.run([sys.executable, "-m", "shapes.generate", str(data), "--per-class", "40"],
                         capture_output=True, text=True, timeout=120, cwd=example)
    assert gen.returncode == 0, gen.stderr
    runs = []
    for ref, extra in (("training", ["-p", "image-size=64", "-p", "model-name=shapes-classifier", "-p", "epochs=2"]),
                       (f"{example / 'pipeline.py'}:pipeline",
                        ["-p", "epochs=3", "-p", "weight-decay=0.001", "-p", "random-flips=false"])):
        r = subprocess.run([PIPECTL, "run", ref, "--output", "json", "--state-dir", str(tmp_path / "state"),
                            "-p", f"dataset-uri={data}", "-p", "promotion-threshold=0", *extra],
                           capture_output=True, text=True, timeout=900, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-4000:]
        runs.append(json.loads(r.stdout))
    cnn, resnet = runs
    assert cnn["model"]["name"] == resnet["model"]["name"] == "shapes-classifier"
    assert (cnn["model"]["version"], resnet["model"]["version"]) == ("1", "2")
    assert resnet["preprocess"]["train-count"] + resnet["preprocess"]["validation-count"] == 160

    def log_of(summary, task):
        return Path(next(s["log"] for s in summary["steps"] if s["task"] == task)).read_text()
    assert "train function shapes.train:train, its own model" in log_of(resnet, "train")
    # the pipeline's own parameters reached every process of the gang: given (-p), and defaults
    assert "shapes: weight decay 0.001, label smoothing 0.1, random flips False" in log_of(resnet, "train")
    assert "train function pipectl, architecture small-cnn" in log_of(cnn, "train")
    scored = re.search(r"candidate balanced_accuracy=([0-9.]+), champion \(v1\) ([0-9.]+)", log_of(resnet, "evaluate"))
    assert scored, log_of(resnet, "evaluate")[-2000:]  # the CNN champion was scored beside the ResNet, by the team's metric
    assert float(scored.group(1)) == pytest.approx(resnet["metrics"]["balanced_accuracy"], abs=1e-4)
    assert set(resnet["metrics"]) == {"accuracy", "f1_macro", "balanced_accuracy"} and set(cnn["metrics"]) == {"accuracy", "f1_macro"}


COUNT_SHARDS = '''
"""A step of the team's own between shards and train: reads the shards' index, outputs a count."""
import json, os, sys
from pathlib import Path
import boto3
s3 = boto3.client("s3", endpoint_url=os.environ["PIPECTL_S3_ENDPOINT"], aws_access_key_id=os.environ["PIPECTL_S3_ACCESS_KEY"],
                  aws_secret_access_key=os.environ["PIPECTL_S3_SECRET_KEY"], region_name="us-east-1")
bucket, _, prefix = sys.argv[1].removeprefix("s3://").partition("/")
index = json.loads(s3.get_object(Bucket=bucket, Key=prefix.rstrip("/") + "/index.json")["Body"].read())
out = Path(os.environ["PIPECTL_OUTPUTS_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / "train-shards").write_text(str(len(index["train"])))
print(f"count-shards: {len(index['train'])} train shard(s) at {sys.argv[1]}", flush=True)
'''


def test_a_pipeline_on_shards_the_team_already_has_skips_stage_and_preprocess(tmp_path, settings, s3, small_digits_dir):
    """shards(): dataset-uri names pre-built shards in the store; they are checked, read by a step of
    the team's own (a ContainerStep), then trained on, evaluated and registered. An index listing a
    shard that is not there fails the shards step before any gang starts."""
    from pipectl.components.contracts import PreprocessInput, StageInput
    from pipectl.components.preprocess.core import preprocess
    from pipectl.components.stage.core import stage

    staged = stage(StageInput(source_uri=str(small_digits_dir), bucket=settings.bucket), s3)
    prebuilt = preprocess(PreprocessInput(manifest_uri=staged.manifest_uri, output_uri=f"s3://{settings.bucket}/team-shards/",
                                          image_size=16, validation_fraction=0.2, max_corrupt_fraction=0.01), s3).shards_uri
    index = json.loads(s3.get_object(Bucket=settings.bucket, Key="team-shards/index.json")["Body"].read())
    broken = {**index, "train": index["train"] + [f"s3://{settings.bucket}/team-shards/missing.npz"]}
    s3.put_object(Bucket=settings.bucket, Key="broken-shards/index.json", Body=json.dumps(broken).encode())
    f = tmp_path / "fromshards.py"
    f.write_text("from pipectl.sdk import SHARDS_URI, ContainerStep, Pipeline, evaluate, register, shards, train\n"
                 "count = ContainerStep('count-shards', image='registry.example.com/me/count:1', command=['python', 'count.py'],\n"
                 "                      args=[SHARDS_URI], outputs=['train-shards'])\n"
                 "pipeline = Pipeline('from-shards', [shards(), count, train(), evaluate(), register()])\n")
    (tmp_path / "count.py").write_text(COUNT_SHARDS)
    r = subprocess.run([PIPECTL, "render", f"{f}:pipeline"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from pipectl.pipelines.lint import lint_objects

    assert lint_objects([("from-shards", yaml.safe_load(r.stdout))]) == []
    store = ["--s3-endpoint", settings.s3_endpoint, "--s3-access-key", settings.s3_access_key,
             "--s3-secret-key", settings.s3_secret_key, "--bucket", settings.bucket]

    def run(dataset: str, state: str) -> subprocess.CompletedProcess:
        return subprocess.run([PIPECTL, "run", f"{f}:pipeline", "--output", "json", "--state-dir", str(tmp_path / state), *store,
                               "-p", f"dataset-uri={dataset}", "-p", "epochs=2", "-p", "promotion-threshold=0",
                               "-p", "model-name=from-shards"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    r = run(prebuilt, "good")
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    assert [s["task"] for s in summary["steps"]] == ["validate", "shards", "count-shards", "train", "evaluate", "register"]
    assert summary["model"]["version"] == "1"
    count = next(s for s in summary["steps"] if s["task"] == "count-shards")
    assert f"count-shards: {len(index['train'])} train shard(s) at {prebuilt}" in Path(count["log"]).read_text()
    record = json.loads(next((tmp_path / "good" / "runs").glob("*/run.json")).read_text())
    assert record["tasks"]["count-shards"]["outputs"]["train-shards"] == str(len(index["train"]))
    r = run(f"s3://{settings.bucket}/broken-shards/", "broken")
    assert r.returncode == 1, r.stderr[-4000:]
    failed = json.loads(r.stdout)
    assert [(s["task"], s["phase"]) for s in failed["steps"]][-1] == ("shards", "Failed")
    assert "1 shard(s) listed in the index are missing" in Path(failed["steps"][-1]["log"]).read_text()


ONNX_TRAINER = '''
"""A torchrun script with no pipectl import that trains a linear classifier on the shards and, on
rank 0, writes it as ONNX where the environment contract says."""
import io, json, os
import boto3, numpy as np, torch, torch.distributed as dist
from torch import nn

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
s3 = boto3.client("s3", endpoint_url=os.environ["PIPECTL_S3_ENDPOINT"], aws_access_key_id=os.environ["PIPECTL_S3_ACCESS_KEY"],
                  aws_secret_access_key=os.environ["PIPECTL_S3_SECRET_KEY"], region_name="us-east-1")
def get(uri):
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
index = json.loads(get(os.environ["PIPECTL_TRAIN_SHARDS_URI"].rstrip("/") + "/index.json"))
shards = [np.load(io.BytesIO(get(u))) for u in index["train"]]
x = torch.from_numpy(np.concatenate([z["images"] for z in shards]).astype("float32"))
y = torch.from_numpy(np.concatenate([z["labels"] for z in shards]))
torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(x[0].numel(), len(index["labels"])))
net, opt = nn.parallel.DistributedDataParallel(model), torch.optim.Adam(model.parameters(), lr=0.01)
stride = 16 * world
for epoch in range(int(os.environ["PIPECTL_TRAIN_EPOCHS"])):
    for i in range(rank * 16, len(x) // stride * stride, stride):
        opt.zero_grad()
        nn.functional.cross_entropy(net(x[i:i + 16]), y[i:i + 16]).backward()
        opt.step()
if rank == 0:
    out = os.environ["PIPECTL_TRAIN_OUTPUTS_DIR"]
    os.makedirs(out, exist_ok=True)
    torch.onnx.export(model.eval(), (x[:2],), f"{out}/model.onnx", dynamo=True,
                      dynamic_shapes=({0: torch.export.Dim("batch")},))
dist.destroy_process_group()
'''


def test_a_torchrun_script_that_writes_onnx_is_evaluated_and_registered_as_pipectls_own(tmp_path, small_digits_dir):
    """train(module=..., exports_onnx=True): the script (2 pods) writes model.onnx on rank 0; pipectl
    publishes it, evaluate scores it on the held-out shards and register makes version 1."""
    (tmp_path / "onnxtrain.py").write_text(ONNX_TRAINER)
    (tmp_path / "pipeline.py").write_text(
        "from pipectl.sdk import Pipeline, evaluate, preprocess, register, stage, train\n"
        "pipeline = Pipeline('script-onnx', [stage(), preprocess(), train('onnxtrain', exports_onnx=True), evaluate(), register()])\n")
    r = subprocess.run([PIPECTL, "run", "pipeline.py:pipeline", "--output", "json", "--state-dir", str(tmp_path / "state"),
                        "-p", f"dataset-uri={small_digits_dir}", "-p", "workers=2", "-p", "processes-per-worker=1",
                        "-p", "epochs=3", "-p", "promotion-threshold=0", "-p", "model-name=script-onnx"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    train_log = Path(next(s["log"] for s in summary["steps"] if s["task"] == "train")).read_text()
    assert [s["task"] for s in summary["steps"]] == ["validate", "stage", "preprocess", "train", "evaluate", "register"]
    assert "published the training code's model as models:/" in train_log, train_log[-3000:]
    assert summary["model"]["version"] == "1" and summary["metrics"]["accuracy"] > 0.5, summary
