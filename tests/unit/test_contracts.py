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
