"""A dataset over its lane's maximum (site setting ``lane_dataset_max``), on the embedded S3 server
(moto): refused by ``pipectl run`` and ``pipectl submit`` before anything is created when its size is
known then, else by the stage or shards step before anything is copied."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipectl.components.contracts import DatasetMax, Lane, PrebuiltInput, ShardIndex, StageInput
from pipectl.components.datasize import DatasetTooLarge
from pipectl.components.runtime import join_uri, write_json
from pipectl.components.shards import put_npz
from pipectl.pipelines.training import CompileConfig

PIPECTL = str(Path(sys.executable).parent / "pipectl")
URGENT_IMAGES = 100
"""The urgent lane's maximum in these tests: the 300 images of ``small_digits_dir`` are over it."""


@pytest.fixture()
def site(tmp_path) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"lane_dataset_max": {"urgent": {"max_samples": URGENT_IMAGES}}}))
    return path


def _maxima_json() -> str:
    return CompileConfig(lane_dataset_max={Lane.urgent: DatasetMax(max_samples=URGENT_IMAGES)}).dataset_max_json()


def _keys(s3, bucket: str) -> list[str]:
    return [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket) for o in page.get("Contents", [])]


def _unreachable_kubeconfig(tmp_path: Path) -> Path:
    """A cluster at a closed port: a submit that gets past validation exits 3 naming it."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
    }))
    return path


def test_run_refuses_a_local_folder_over_the_lanes_maximum_and_starts_nothing(tmp_path, site, small_digits_dir):
    state = tmp_path / "state"
    r = subprocess.run([PIPECTL, "--site", str(site), "run", "training", "--state-dir", str(state), "-p", "lane=urgent",
                        "-p", f"dataset-uri={small_digits_dir}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"dataset {small_digits_dir} (300 images" in r.stderr and "300 images > 100" in r.stderr, r.stderr
    assert "standard (up to 5,000,000 images, 500 GiB)" in r.stderr and "lane_dataset_max.urgent" in r.stderr
    assert not state.exists(), "a refused run starts no service and writes nothing"
    assert "Traceback" not in r.stderr


def test_the_stage_step_refuses_a_dataset_over_the_lanes_maximum_before_copying_anything(settings, s3, small_digits_dir, tmp_path):
    """The size known only once stage lists the source: the step fails as the data's failure (exit 1,
    never retried) with the numbers, and the bucket holds nothing of it."""
    from pipectl.components.stage.core import stage

    s3.create_bucket(Bucket=settings.bucket)
    inp = StageInput(source_uri=str(small_digits_dir), bucket=settings.bucket, lane="urgent", dataset_max=_maxima_json())
    with pytest.raises(DatasetTooLarge, match=r"300 images > 100"):
        stage(inp, s3)
    assert _keys(s3, settings.bucket) == []
    step = subprocess.run([sys.executable, "-m", "pipectl.components.stage", "--source-uri", str(small_digits_dir),
                           "--bucket", settings.bucket, "--lane", "urgent", "--dataset-max", _maxima_json(),
                           "--outputs-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **settings.step_env()})
    assert step.returncode == 1, step.stderr
    assert "over the urgent lane's maximum: 300 images > 100" in step.stderr and "hint: submit it to another lane" in step.stderr
    assert _keys(s3, settings.bucket) == []
    standard = stage(inp.model_copy(update={"lane": Lane.standard}), s3)  # the same set in a lane that takes it
    assert standard.objects == 300 and standard.copied == 300


def test_submit_refuses_a_staged_dataset_over_the_lanes_maximum_before_reaching_the_cluster(settings, small_digits_dir, tmp_path, site):
    """`pipectl data push`, then submit: the manifest in the store gives the size; over the lane's
    maximum is exit 2 before any connection to the cluster (whose address here is a closed port:
    a submit that got past the check would exit 3 naming it, as it does in a lane that takes the set)."""
    env = {**os.environ, **settings.step_env(), "PIPECTL_SITE": str(site), "KUBECONFIG": str(_unreachable_kubeconfig(tmp_path))}
    push = subprocess.run([PIPECTL, "data", "push", str(small_digits_dir)], capture_output=True, text=True, timeout=300, env=env)
    assert push.returncode == 0, push.stderr
    uri = push.stdout.strip()

    def submit(lane: str) -> subprocess.CompletedProcess:
        return subprocess.run([PIPECTL, "submit", "training", "-p", f"dataset-uri={uri}", "--lane", lane],
                              capture_output=True, text=True, timeout=120, env=env)

    urgent = submit("urgent")
    assert urgent.returncode == 2, urgent.stderr
    assert f"dataset {uri} (300 images" in urgent.stderr and "300 images > 100" in urgent.stderr, urgent.stderr
    assert "127.0.0.1:9" not in urgent.stderr
    standard = submit("standard")
    assert standard.returncode == 3 and "127.0.0.1:9" in standard.stderr, standard.stderr


def _team_shards(s3, bucket: str, images: int = 150) -> str:
    """Shards a team already has: 150 images (120 train, 30 validation) of 8x8 in two train shards and one validation shard."""
    s3.create_bucket(Bucket=bucket)
    uri = f"s3://{bucket}/team-shards/"
    rng = np.random.default_rng(0)
    sizes = {"train": [60, 60], "validation": [images - 120]}
    listed: dict[str, list[str]] = {"train": [], "validation": []}
    for split, counts in sizes.items():
        for n, count in enumerate(counts):
            listed[split].append(join_uri(uri, f"{split}-{n:05d}.npz"))
            put_npz(s3, listed[split][-1], rng.standard_normal((count, 3, 8, 8)).astype(np.float16),
                    (np.arange(count) % 2).astype(np.int64))
    index = ShardIndex(labels=["a", "b"], image_size=8, channels=3, mean=[0.5] * 3, std=[0.5] * 3,
                       train=listed["train"], validation=listed["validation"], train_count=120, validation_count=images - 120,
                       train_sizes=sizes["train"], validation_sizes=sizes["validation"])
    write_json(s3, join_uri(uri, "index.json"), index.model_dump(mode="json"))
    return uri


def test_shards_a_team_has_are_refused_by_size_by_submit_and_by_the_shards_step(settings, s3, tmp_path, site):
    from pipectl.components.prebuilt.core import check

    uri = _team_shards(s3, settings.bucket)
    with pytest.raises(DatasetTooLarge, match=r"\(150 images, .* KiB\) is over the urgent lane's maximum: 150 images > 100"):
        check(PrebuiltInput(shards_uri=uri, lane="urgent", dataset_max=_maxima_json()), s3)
    tiny = CompileConfig(lane_dataset_max={Lane.standard: DatasetMax(max_gib=10 / 2**30)}).dataset_max_json()  # 10 bytes
    with pytest.raises(DatasetTooLarge, match=r"KiB > 10 B"):
        check(PrebuiltInput(shards_uri=uri, lane="standard", dataset_max=tiny), s3)
    assert check(PrebuiltInput(shards_uri=uri, lane="standard", dataset_max=_maxima_json()), s3).train_count == 120

    pipeline = tmp_path / "fromshards.py"
    pipeline.write_text("from pipectl.sdk import Pipeline, evaluate, register, shards, train\n"
                        "pipeline = Pipeline('from-shards', [shards(), train(), evaluate(), register()])\n")
    env = {**os.environ, **settings.step_env(), "PIPECTL_SITE": str(site), "KUBECONFIG": str(_unreachable_kubeconfig(tmp_path))}
    r = subprocess.run([PIPECTL, "submit", f"{pipeline}:pipeline", "-p", f"dataset-uri={uri}", "--lane", "urgent"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "150 images > 100" in r.stderr and "127.0.0.1:9" not in r.stderr, r.stderr


def test_an_index_whose_counts_are_negative_is_no_shard_index(settings, s3):
    """A negative count in index.json would let any number of images pass a lane's max_samples."""
    from pipectl.components.prebuilt.core import check
    from pipectl.components.runtime import StepError, read_json

    uri = _team_shards(s3, settings.bucket)
    index = read_json(s3, join_uri(uri, "index.json"))
    index.update(train_count=-1_000_000, train_sizes=[], validation_sizes=[])
    write_json(s3, join_uri(uri, "index.json"), index)
    with pytest.raises(StepError, match=r"index.json is not a shard index: .*train_count") as e:
        check(PrebuiltInput(shards_uri=uri, lane="urgent", dataset_max=_maxima_json()), s3)
    assert not isinstance(e.value, DatasetTooLarge)


SHARDS_PIPELINE = ("from pipectl.sdk import Pipeline, evaluate, register, shards, train\n"
                   "pipeline = Pipeline('from-shards', [shards(), train(), evaluate(), register()])\n")


def _store_options(settings) -> list[str]:
    return ["--s3-endpoint", settings.s3_endpoint, "--s3-access-key", settings.s3_access_key,
            "--s3-secret-key", settings.s3_secret_key, "--bucket", settings.bucket]


def test_run_refuses_shards_over_the_lanes_maximum_on_a_configured_store_and_starts_nothing(settings, s3, tmp_path, site):
    uri = _team_shards(s3, settings.bucket)
    (tmp_path / "fromshards.py").write_text(SHARDS_PIPELINE)
    state = tmp_path / "state"
    r = subprocess.run([PIPECTL, "--site", str(site), "run", "fromshards.py:pipeline", "--state-dir", str(state),
                        *_store_options(settings), "-p", f"dataset-uri={uri}", "-p", "lane=urgent"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert f"dataset {uri} (150 images" in r.stderr and "150 images > 100" in r.stderr, r.stderr
    assert not state.exists()


def test_a_damaged_shard_met_in_training_ends_the_run_as_the_datas_failure_not_retried(settings, s3, tmp_path, small_digits_dir):
    """Shards a team has, the last train shard damaged in the store (a flipped bit): the shards
    step checks the first shard of each split and passes; the training meets the damaged one, names
    it and exits 1, which ends the gang (no restart) and the run Failed (exit 1)."""
    from pipectl.components.contracts import PreprocessInput
    from pipectl.components.preprocess.core import preprocess
    from pipectl.components.runtime import read_json
    from pipectl.components.stage.core import stage

    staged = stage(StageInput(source_uri=str(small_digits_dir), bucket=settings.bucket), s3)
    uri = preprocess(PreprocessInput(manifest_uri=staged.manifest_uri, output_uri=f"s3://{settings.bucket}/team-shards/",
                                     image_size=16, validation_fraction=0.2, max_corrupt_fraction=0.01, shard_size=50), s3).shards_uri
    damaged = read_json(s3, join_uri(uri, "index.json"))["train"][-1]
    key = damaged.removeprefix(f"s3://{settings.bucket}/")
    body = bytearray(s3.get_object(Bucket=settings.bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0x01
    s3.put_object(Bucket=settings.bucket, Key=key, Body=bytes(body))
    (tmp_path / "fromshards.py").write_text(SHARDS_PIPELINE)
    r = subprocess.run([PIPECTL, "run", "fromshards.py:pipeline", "--output", "json", "--state-dir", str(tmp_path / "state"),
                        *_store_options(settings), "-p", f"dataset-uri={uri}", "-p", "epochs=1", "-p", "processes-per-worker=1"],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-4000:]
    import json

    steps = json.loads(r.stdout)["steps"]
    assert [(s["task"], s["phase"]) for s in steps] == [("validate", "Succeeded"), ("shards", "Succeeded"), ("train", "Failed")]
    log = Path(steps[-1]["log"]).read_text()
    assert f"shard {damaged} cannot be read: BadZipFile: Bad CRC-32" in log, log[-4000:]
    assert "restarts the whole gang" not in log and steps[-1]["exit_code"] == 1
