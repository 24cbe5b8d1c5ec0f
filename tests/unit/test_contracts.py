import pytest
from pydantic import ValidationError

from pipectl.components.contracts import Lane, StoreSettings, TrainingParameters


def test_defaults_are_valid_and_render_as_kebab_strings():
    args = TrainingParameters().as_arguments()
    assert args["image-size"] == "32"
    assert args["lane"] == "standard"
    assert args["dataset-uri"] == "example:digits"
    assert all(isinstance(v, str) for v in args.values())


def test_overrides_accept_kebab_and_snake_case():
    p = TrainingParameters.from_overrides({"image-size": "64", "batch_size": "16", "lane": "urgent"})
    assert (p.image_size, p.batch_size, p.lane) == (64, 16, Lane.urgent)


def test_unknown_parameter_names_the_key_and_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown parameter 'epoch'.*epochs"):
        TrainingParameters.from_overrides({"epoch": "3"})


@pytest.mark.parametrize(
    "key,value",
    [("lane", "superurgent"), ("workers", "0"), ("processes-per-worker", "0"), ("learning-rate", "0"),
     ("promotion-metric", "auc"), ("image-size", "4"), ("model-name", "bad name!"), ("epochs", "many")],
)
def test_bad_values_are_rejected(key, value):
    with pytest.raises(ValidationError):
        TrainingParameters.from_overrides({key: value})


@pytest.mark.parametrize("bucket", ["Bad_Bucket", "ab", "a" * 64, "-x-", "a..b"])
def test_bucket_names_follow_s3_rules(bucket):
    with pytest.raises(ValidationError):
        StoreSettings(bucket=bucket)
    assert StoreSettings(bucket="pipectl-data.v1").bucket == "pipectl-data.v1"


def test_credentials_in_urls_are_never_printed():
    """An MLflow/S3 URL with userinfo keeps the user but never the password, in every
    error of the one error type (what the CLI and the steps print) and in the services line."""
    from pipectl.components.errors import PipectlError, Unreachable, redact_credentials

    assert redact_credentials("http://alice:s3cr%40t@mlflow:5000/x and https://bob:pw@h") == "http://alice:***@mlflow:5000/x and https://bob:***@h"
    assert redact_credentials("http://mlflow:5000 s3://bucket/key user@host") == "http://mlflow:5000 s3://bucket/key user@host"
    e = Unreachable("MLflow tracking server http://alice:hunter2@mlflow:5000 is unreachable", "check http://alice:hunter2@mlflow")
    assert "hunter2" not in e.headline + e.hint + str(e) and "alice:***@" in e.headline
    assert "hunter2" not in str(PipectlError("x https://u:hunter2@h y"))


def test_cli_run_never_prints_the_mlflow_password(tmp_path):
    """End to end through the CLI: an unreachable MLflow URI with a password (exit 3)."""
    import subprocess
    import sys
    from pathlib import Path

    r = subprocess.run([str(Path(sys.executable).parent / "pipectl"), "run", "training", "--state-dir", str(tmp_path),
                        "--mlflow-uri", "http://alice:hunter2@127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "hunter2" not in r.stdout + r.stderr and "alice:***@" in r.stderr, r.stderr
