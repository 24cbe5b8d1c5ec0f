"""`pipectl run` refuses bad input with a clear error and exit code 2 (3 when unreachable),
before anything is started or written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PIPECTL = str(Path(sys.executable).parent / "pipectl")


def _run(args, tmp_path, timeout=120):
    state = tmp_path / "state"
    r = subprocess.run([PIPECTL, "run", "training", "--state-dir", str(state), *args], capture_output=True, text=True, timeout=timeout)
    return r, state


def _jpeg(path):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8)).save(path, "JPEG")


@pytest.mark.parametrize(
    "make_args,message",
    [
        (lambda d: ["-p", f"dataset-uri={d / 'missing'}"], "does not exist"),
        (lambda d: (d / "empty" / "cats").mkdir(parents=True) or ["-p", f"dataset-uri={d / 'empty'}"], "is empty"),
        (lambda d: _jpeg(d / "flat" / "a.jpg") or ["-p", f"dataset-uri={d / 'flat'}"], "no label"),
        (lambda d: ["-p", "epoch=3"], "unknown parameter 'epoch'"),
        (lambda d: ["-p", "lane=superurgent"], "lane"),
        (lambda d: ["-p", "workers=0"], "workers"),
        (lambda d: ["-p", "workers"], "not key=value"),
        (lambda d: ["-p", "warm-cache=true"], "no Alluxio is configured"),
    ],
    ids=["missing-path", "empty", "no-labels", "unknown-param", "bad-enum", "workers-0", "not-key-value", "warm-without-alluxio"],
)
def test_bad_input_exits_2_and_writes_nothing(make_args, message, tmp_path):
    r, state = _run(make_args(tmp_path), tmp_path)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert "hint:" in r.stderr
    assert not state.exists(), "nothing may be written for bad input"
    assert r.stdout == ""


def test_bad_enum_lists_the_allowed_values(tmp_path):
    r, _ = _run(["-p", "lane=superurgent"], tmp_path)
    assert "'urgent', 'standard' or 'batch'" in r.stderr and "superurgent" in r.stderr


def test_unreachable_s3_endpoint_exits_3_naming_it(tmp_path):
    r, state = _run(["--s3-endpoint", "http://127.0.0.1:9", "--s3-access-key", "a", "--s3-secret-key", "b"], tmp_path)
    assert r.returncode == 3, r.stderr
    assert "http://127.0.0.1:9" in r.stderr and "unreachable" in r.stderr
    assert not state.exists()


def test_unreachable_mlflow_exits_3_naming_it(tmp_path):
    r, state = _run(["--mlflow-uri", "http://127.0.0.1:9"], tmp_path)
    assert r.returncode == 3, r.stderr
    assert "http://127.0.0.1:9" in r.stderr
    assert not state.exists()


def test_render_prints_the_workflow_template():
    r = subprocess.run([PIPECTL, "render", "training"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    assert "kind: WorkflowTemplate" in r.stdout and "name: training-v1" in r.stdout
    assert r.stderr == ""


@pytest.mark.parametrize(
    "args,message,code",
    [
        (["--s3-endpoint", "not-a-url"], "is not an http(s):// URL", 2),
        (["--mlflow-uri", "127.0.0.1:5000"], "is not an http(s):// URL", 2),
        (["-p", "seed=99999999999999999999999"], "seed", 2),
        (["-p", "gpus-per-worker=2", "-p", "processes-per-worker=2"], "no NVIDIA GPU", 2),
    ],
    ids=["s3-not-a-url", "mlflow-no-scheme", "seed-too-large", "gpus-without-gpu"],
)
def test_more_bad_input_found_by_breaking_it(args, message, code, tmp_path):
    r, state = _run(args, tmp_path)
    assert r.returncode == code, r.stderr
    assert message in r.stderr
    assert not state.exists()


def test_unusable_state_dir_is_a_clear_error(tmp_path):
    r = subprocess.run([PIPECTL, "run", "training", "--state-dir", "/proc/pipectl-state"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "is not usable" in r.stderr and "Traceback" not in r.stderr


def test_a_server_that_is_not_mlflow_exits_3(tmp_path):
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        r, state = _run(["--mlflow-uri", f"http://127.0.0.1:{server.server_address[1]}"], tmp_path)
    finally:
        server.shutdown()
    assert r.returncode == 3, r.stderr
    assert "not as an MLflow tracking server" in r.stderr
    assert not state.exists()


@pytest.mark.parametrize("target", ["", "/proc/nope"])
def test_data_example_refuses_bad_targets(target):
    r = subprocess.run([PIPECTL, "data", "example", target], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_data_push_stages_a_folder_once_and_prints_the_uri_submit_takes(settings, s3, small_digits_dir, tmp_path):
    """`pipectl data push DIR` (the store from PIPECTL_* settings): the images in the store under
    their content address, the printed URI accepted by `submit` (dry run), a second push writes
    nothing; a missing folder is exit 2 and a store that cannot be reached exit 3, both writing nothing."""
    env = {**os.environ, **settings.step_env()}
    first = subprocess.run([PIPECTL, "data", "push", str(small_digits_dir)], capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr
    uri = first.stdout.strip()
    assert uri.startswith(f"s3://{settings.bucket}/datasets/") and uri.endswith("/data/"), uri
    assert "300 images" in first.stderr and "300 written" in first.stderr, first.stderr
    keys = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.bucket) for o in page.get("Contents", [])]
    assert sum(k.endswith(".jpg") for k in keys) == 300
    again = subprocess.run([PIPECTL, "data", "push", str(small_digits_dir)], capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0 and again.stdout.strip() == uri and "0 written" in again.stderr, again.stderr
    sub = subprocess.run([PIPECTL, "submit", "training", "--dry-run", "-p", f"dataset-uri={uri}"], capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0 and f"value: {uri}" in sub.stdout, sub.stderr

    missing = subprocess.run([PIPECTL, "data", "push", str(tmp_path / "nope")], capture_output=True, text=True, timeout=120, env=env)
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    closed = {**env, "PIPECTL_S3_ENDPOINT": "http://127.0.0.1:9", "PIPECTL_BUCKET": "never-made"}
    down = subprocess.run([PIPECTL, "data", "push", str(small_digits_dir)], capture_output=True, text=True, timeout=300, env=closed)
    assert down.returncode == 3 and "cannot write to the store at http://127.0.0.1:9" in down.stderr, down.stderr
