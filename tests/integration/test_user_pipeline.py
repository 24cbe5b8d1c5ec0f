"""A user's own pipeline, run by reference with the local backend: the example project under
examples/custom-pipeline (pipectl's steps without warm, plus the team's `report` step importing
the team's own package) trains, writes its report into the run's folder and registers one version."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.tools.procs import default_signals

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


@pytest.mark.pipeline  # long: make test runs it in tier 1b, beside tier 1
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
    # on the CNN champion's own held-out split (its run's shards, kept by the state folder between runs)
    assert re.search(r"on the champion's evaluation set s3://pipectl/runs/training-[a-z0-9]+/shards/: candidate [0-9.]+\)",
                     log_of(resnet, "evaluate")), log_of(resnet, "evaluate")[-2000:]
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
mean, std = (torch.tensor(index[k]).view(1, -1, 1, 1) for k in ("mean", "std"))  # the pixels, normalised as the index says
x = (torch.from_numpy(np.concatenate([z["images"] for z in shards])).float() - mean) / std
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


CHECKPOINTING_TRAINER = '''
"""A torchrun script with no pipectl import that checkpoints through the environment contract only:
rank 0 writes step-<n>.pt to PIPECTL_TRAIN_CHECKPOINTS_URI every PIPECTL_TRAIN_CHECKPOINT_EVERY_STEPS
steps, and at start every rank resumes from the newest one there. Rank 0 writes model.onnx at the end."""
import io, json, os, re
import boto3, numpy as np, torch, torch.distributed as dist
from torch import nn
from torch.distributed.elastic.multiprocessing.errors import record

env = os.environ
s3 = boto3.client("s3", endpoint_url=env["PIPECTL_S3_ENDPOINT"], aws_access_key_id=env["PIPECTL_S3_ACCESS_KEY"],
                  aws_secret_access_key=env["PIPECTL_S3_SECRET_KEY"], region_name="us-east-1")


def split(uri):
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


def get(uri):
    bucket, key = split(uri)
    return s3.get_object(Bucket=bucket, Key=key)["Body"].read()


def newest_checkpoint():
    bucket, prefix = split(env["PIPECTL_TRAIN_CHECKPOINTS_URI"])
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])]
    steps = sorted(int(m[1]) for k in keys if (m := re.search(r"step-(\\d+)\\.pt$", k)))
    return f"s3://{bucket}/{prefix}step-{steps[-1]:08d}.pt" if steps else None


@record
def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    index = json.loads(get(env["PIPECTL_TRAIN_SHARDS_URI"].rstrip("/") + "/index.json"))
    shards = [np.load(io.BytesIO(get(u))) for u in index["train"]]
    mean, std = (torch.tensor(index[k]).view(1, -1, 1, 1) for k in ("mean", "std"))  # the pixels, normalised as the index says
    x = (torch.from_numpy(np.concatenate([z["images"] for z in shards])).float() - mean) / std
    y = torch.from_numpy(np.concatenate([z["labels"] for z in shards]))
    seed, batch = int(env["PIPECTL_TRAIN_SEED"]), int(env["PIPECTL_TRAIN_BATCH_SIZE"])
    every, epochs = int(env["PIPECTL_TRAIN_CHECKPOINT_EVERY_STEPS"]), int(env["PIPECTL_TRAIN_EPOCHS"])
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(x.shape[1], 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(32, len(index["labels"])))
    optimizer = torch.optim.Adam(model.parameters(), lr=float(env["PIPECTL_TRAIN_LEARNING_RATE"]))
    net = nn.parallel.DistributedDataParallel(model)
    per_epoch, step = len(x) // (batch * world), 0
    total, found = per_epoch * epochs, newest_checkpoint()
    if found:
        state = torch.load(io.BytesIO(get(found)), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
    print(f"ckpttrain: rank {rank} starts at step {step} of {total} ({found or 'no checkpoint'})", flush=True)
    while step < total:
        epoch, i = divmod(step, per_epoch)
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed + epoch))
        mine = order[(i * world + rank) * batch:(i * world + rank + 1) * batch]
        optimizer.zero_grad()
        nn.functional.cross_entropy(net(x[mine]), y[mine]).backward()
        optimizer.step()
        step += 1
        if rank == 0 and step % every == 0 and step < total:
            buf = io.BytesIO()
            torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, buf)
            bucket, prefix = split(env["PIPECTL_TRAIN_CHECKPOINTS_URI"])
            s3.put_object(Bucket=bucket, Key=f"{prefix}step-{step:08d}.pt", Body=buf.getvalue())
            print(f"ckpttrain: checkpoint step {step} written", flush=True)
    if rank == 0:
        os.makedirs(env["PIPECTL_TRAIN_OUTPUTS_DIR"], exist_ok=True)
        torch.onnx.export(model.eval(), (x[:2],), env["PIPECTL_TRAIN_OUTPUTS_DIR"] + "/model.onnx", dynamo=True,
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    dist.destroy_process_group()


main()
'''
CHECKPOINT_WRITTEN = re.compile(r"ckpttrain: checkpoint step (\d+) written")
GANG_RESTARTED = re.compile(r"pipectl run: pod worker-\d of Job \S+ exited (\d+): the job's policy restarts the whole gang "
                            r"\(restart 1 of \d+\)")


def _gang_pod(run: psutil.Process, index: int) -> psutil.Process | None:
    """The process standing in for gang pod ``index`` (its launcher) under the ``pipectl run`` process."""
    for p in run.children(recursive=True):
        try:
            if "pipectl.components.train.launch" in p.cmdline() and p.environ().get("VC_TASK_INDEX") == str(index):
                return p
        except psutil.Error:  # ended meanwhile
            continue
    return None


def _evict(pod: psutil.Process, grace_s: float) -> None:
    """End a gang pod as a kubelet's eviction does: SIGTERM, then SIGKILL to what is left after ``grace_s``."""
    from pipectl.pipelines.backends.processes import kill_tree

    tree = [pod, *pod.children(recursive=True)]
    pod.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for p in alive:
        kill_tree(p.pid)


@pytest.mark.pipeline  # long: make test runs it in tier 1b, beside tier 1
def test_a_script_that_checkpoints_through_the_contract_resumes_after_a_gang_member_is_evicted(tmp_path, small_digits_dir):
    """train(module=..., exports_onnx=True), 2 pods x 1 process: once the script wrote a checkpoint,
    pod 1 is evicted (SIGTERM, SIGKILL after a grace period). The Volcano Job's policy restarts
    the whole gang; the script, started again, resumes from the newest checkpoint in
    PIPECTL_TRAIN_CHECKPOINTS_URI (the last one it wrote, step > 0), finishes, and the run registers
    exactly one model version."""
    (tmp_path / "ckpttrain.py").write_text(CHECKPOINTING_TRAINER)
    (tmp_path / "pipeline.py").write_text(
        "from pipectl.sdk import Pipeline, evaluate, preprocess, register, stage, train\n"
        "pipeline = Pipeline('script-resume', [stage(), preprocess(), train('ckpttrain', exports_onnx=True), evaluate(), register()])\n")
    state, out = tmp_path / "state", tmp_path / "run.json"
    with out.open("w") as stdout, (tmp_path / "run.stderr").open("w") as stderr:
        proc = subprocess.Popen([PIPECTL, "run", "pipeline.py:pipeline", "--output", "json", "--state-dir", str(state),
                                 "-p", f"dataset-uri={small_digits_dir}", "-p", "workers=2", "-p", "processes-per-worker=1",
                                 "-p", "epochs=8", "-p", "batch-size=8", "-p", "checkpoint-every-steps=5",
                                 "-p", "promotion-threshold=0", "-p", "model-name=script-resume"],
                                stdout=stdout, stderr=stderr, cwd=tmp_path, preexec_fn=default_signals)
    try:
        deadline, written = time.monotonic() + 300, []
        while not written:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.stderr").read_text()[-3000:]
            logs = list(state.glob("runs/*/train/main.log"))
            written = CHECKPOINT_WRITTEN.findall(logs[0].read_text(errors="replace")) if logs else []
            time.sleep(0.05)
        pod = _gang_pod(psutil.Process(proc.pid), 1)
        assert pod is not None, "gang pod 1 is not running"
        _evict(pod, grace_s=10)
        assert proc.wait(timeout=600) == 0, (tmp_path / "run.stderr").read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads(out.read_text())
    train = next(s for s in summary["steps"] if s["task"] == "train")
    assert train["phase"] == "Succeeded" and train["message"].endswith("(2 pods, 1 gang restart(s))"), train
    train_log = Path(train["log"]).read_text(errors="replace")
    assert GANG_RESTARTED.search(train_log), train_log[-4000:]
    first, restarted = train_log.split("the job's policy restarts the whole gang", 1)
    assert "restarts the whole gang" not in restarted, train_log[-4000:]  # one restart
    assert "ckpttrain: rank 0 starts at step 0 of " in first
    last_written = int(CHECKPOINT_WRITTEN.findall(first)[-1])
    resumed = re.search(r"ckpttrain: rank 0 starts at step (\d+) of (\d+) \(s3://\S+/checkpoints/step-(\d+)\.pt\)", restarted)
    assert resumed, restarted[-3000:]
    assert 0 < int(resumed[1]) == int(resumed[3]) == last_written < int(resumed[2])
    assert re.search(rf"ckpttrain: rank 1 starts at step {last_written} of ", restarted)  # every rank resumed there
    assert "published the training code's model as models:/" in restarted
    assert [(s["task"], s["phase"]) for s in summary["steps"]][-1] == ("register", "Succeeded")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}", registry_uri=f"sqlite:///{state / 'mlflow' / 'mlflow.db'}")  # a registry URI set by an earlier test must not win
    assert [str(v.version) for v in client.search_model_versions("name = 'script-resume'")] == ["1"]
    assert summary["model"]["version"] == "1"


PACKAGED_TRAIN = '''
"""The team's train function: a linear classifier through TrainContext."""
import torch
from torch import nn


def train(ctx):
    model = nn.Sequential(nn.Flatten(), nn.LazyLinear(ctx.num_classes)).to(ctx.device)
    model(torch.zeros(1, ctx.channels, ctx.image_size, ctx.image_size, device=ctx.device))
    optimizer = torch.optim.Adam(model.parameters(), lr=ctx.params.learning_rate)
    net = ctx.wrap(model)
    for images, labels in ctx.batches(model, optimizer):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(images), labels)
        loss.backward()
        optimizer.step()
        ctx.record_loss(loss)
    return model
'''


def test_a_pipeline_named_as_package_module_renders_and_runs(tmp_path, small_digits_dir):
    """`pipectl render|run teampipes.pipelines:pipeline`, the package on PYTHONPATH (not in the
    working folder): the template renders and the run succeeds, its gang importing the package's
    train function. A reference to a name the module does not define, or to an object that is not
    a Pipeline, is exit 2 naming what is wrong, before anything runs."""
    pkg = tmp_path / "site" / "teampipes"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(PACKAGED_TRAIN)
    (pkg / "pipelines.py").write_text(
        "from pipectl.sdk import Pipeline, preprocess, stage, train\n"
        "pipeline = Pipeline('pkg-training', [stage(), preprocess(), train(function='teampipes.train:train')])\n"
        "epochs = 3\n")
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path / "site"), os.environ.get("PYTHONPATH")) if p)}

    def pipectl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([PIPECTL, *args], capture_output=True, text=True, timeout=timeout, cwd=work, env=env)
    r = pipectl("render", "teampipes.pipelines:pipeline")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["metadata"]["name"] == "pkg-training-v1"
    for command in ("render", "run"):
        state = ["--state-dir", str(work / "state")] if command == "run" else []
        r = pipectl(command, "teampipes.pipelines:nosuch", *state)
        assert r.returncode == 2 and "teampipes.pipelines has no 'nosuch'" in r.stderr and "pipelines it defines: pipeline" in r.stderr, r.stderr
        r = pipectl(command, "teampipes.pipelines:epochs", *state)
        assert r.returncode == 2 and "teampipes.pipelines:epochs: epochs is a int, not a pipectl.sdk.Pipeline" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (work / "state").exists()  # refused before anything was written

    r = pipectl("run", "teampipes.pipelines:pipeline", "--output", "json", "--state-dir", str(work / "state"),
                "-p", f"dataset-uri={small_digits_dir}", "-p", "epochs=1", timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    assert summary["phase"] == "Succeeded" and summary["workflow"].startswith("pkg-training-")
    assert [s["task"] for s in summary["steps"]] == ["validate", "stage", "preprocess", "train"]
    train_log = Path(summary["steps"][-1]["log"]).read_text()
    assert "train function teampipes.train:train, its own model" in train_log, train_log[-3000:]


def test_a_train_function_whose_module_fails_to_import_in_the_gang_shows_the_users_traceback(tmp_path, small_digits_dir):
    """The team's train function imports a helper that imports a package missing where the gang
    runs (at definition time a missing dependency is allowed: it may be in the image only). In
    the gang the import fails: the train step's log shows the user's frames (file and line of
    both modules) and none of pipectl's or the import machinery's, and the run fails as the
    code's (exit 1, not retried)."""
    (tmp_path / "teamtrain.py").write_text('"""The team\'s train function."""\nfrom teamhelpers import augment\n\n\n'
                                           "def train(ctx):\n    return augment(ctx)\n")
    (tmp_path / "teamhelpers.py").write_text("import math\nimport nosuch_augmentations_xyz\n\n\ndef augment(x):\n    return x\n")
    (tmp_path / "pipeline.py").write_text(
        "from pipectl.sdk import Pipeline, preprocess, stage, train\n"
        "pipeline = Pipeline('fn-broken', [stage(), preprocess(), train(function='teamtrain:train')])\n")
    r = subprocess.run([PIPECTL, "run", "pipeline.py:pipeline", "--output", "json", "--state-dir", str(tmp_path / "state"),
                        "-p", f"dataset-uri={small_digits_dir}", "-p", "epochs=1"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-4000:]
    summary = json.loads(r.stdout)
    train = summary["steps"][-1]
    assert (train["task"], train["phase"], train["exit_code"]) == ("train", "Failed", 1)
    log = Path(train["log"]).read_text()
    traceback = log.split("importing teamtrain failed:\n", 1)[1].split("ModuleNotFoundError", 1)[0]
    frames = re.findall(r'File "([^"]+)", line (\d+)', traceback)
    assert frames == [(str(tmp_path / "teamtrain.py"), "2"), (str(tmp_path / "teamhelpers.py"), "2")], traceback
    assert "import nosuch_augmentations_xyz" in traceback
    assert "ModuleNotFoundError: No module named 'nosuch_augmentations_xyz'" in log
    assert "error: pipectl.components.train: train function teamtrain:train: importing teamtrain failed" in log, log[-3000:]
    shown = set(re.findall(r'File "([^"]+)", line \d+', log))  # every frame of every traceback in the log
    assert shown == {str(tmp_path / "teamtrain.py"), str(tmp_path / "teamhelpers.py")}, log[-4000:]
    record = json.loads(next((tmp_path / "state" / "runs").glob("*/run.json")).read_text())
    assert record["tasks"]["train"]["attempts"] == 1
