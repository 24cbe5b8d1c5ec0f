import pytest
from pydantic import ValidationError

from pipectl.components.contracts import Lane, TrainingParameters, is_k8s_name


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


def test_k8s_names():
    assert is_k8s_name("training-v1")
    assert not is_k8s_name("Training")
    assert not is_k8s_name("a" * 64)
