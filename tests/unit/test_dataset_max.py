"""A lane's dataset maximum: the rule, its defaults, the site setting, and what the steps receive."""

from __future__ import annotations

import pytest
import yaml

from pipectl.components.contracts import DatasetMax, Lane, PrebuiltInput, StageInput
from pipectl.components.contracts import DatasetLayout
from pipectl.components.datasize import GIB, DatasetSize, DatasetTooLarge, check_dataset_size, size_text
from pipectl.components.errors import ValidationFailed
from pipectl.pipelines.policy import LANES
from pipectl.pipelines.site import site_config
from pipectl.pipelines.training import CompileConfig

MAXIMA = {Lane.urgent: DatasetMax(max_samples=1_000, max_gib=1), Lane.standard: DatasetMax(max_samples=10_000, max_gib=10),
          Lane.batch: DatasetMax(max_samples=None, max_gib=None)}


def test_a_dataset_within_the_lanes_maximum_passes_and_one_sample_or_byte_more_is_refused():
    check_dataset_size(DatasetSize("s3://b/d/", 1_000, GIB), Lane.urgent, MAXIMA)  # at the maximum: taken
    with pytest.raises(DatasetTooLarge) as images:
        check_dataset_size(DatasetSize("s3://b/d/", 1_001, GIB), Lane.urgent, MAXIMA)
    assert "1,001 images > 1,000" in images.value.headline and "GiB >" not in images.value.headline
    with pytest.raises(DatasetTooLarge) as size:
        check_dataset_size(DatasetSize("s3://b/d/", 10, GIB + 1), Lane.urgent, MAXIMA)
    assert "1 GiB > 1 GiB" in size.value.headline and "images >" not in size.value.headline


def test_the_refusal_names_the_dataset_its_size_the_lanes_maximum_and_the_lanes_that_take_it():
    with pytest.raises(DatasetTooLarge) as e:
        check_dataset_size(DatasetSize("s3://b/datasets/x/data/", 5_000, 3 * GIB), Lane.urgent, MAXIMA)
    err = e.value
    assert err.cli_exit == 2 and not err.transient  # exit 2 at the command line, 1 (never retried) in a step
    assert err.headline == ("dataset s3://b/datasets/x/data/ (5,000 images, 3 GiB) is over the urgent lane's maximum: "
                            "5,000 images > 1,000; 3 GiB > 1 GiB")
    assert "standard (up to 10,000 images, 10 GiB)" in err.hint and "batch (up to no maximum)" in err.hint
    assert "lane_dataset_max.urgent" in err.hint


def test_when_no_lane_takes_it_the_hint_says_so_and_names_the_setting():
    maxima = {lane: DatasetMax(max_samples=10) for lane in Lane}
    with pytest.raises(DatasetTooLarge) as e:
        check_dataset_size(DatasetSize("s3://b/d/", 11, 0), Lane.batch, maxima)
    assert e.value.hint.startswith("no lane takes it: raise the site setting lane_dataset_max.batch")


def test_a_lane_without_a_maximum_takes_any_size():
    check_dataset_size(DatasetSize("s3://b/d/", 10**12, 10**18), Lane.batch, MAXIMA)
    check_dataset_size(DatasetSize("s3://b/d/", 10**12, 10**18), Lane.batch, {})


def test_the_lanes_defaults_grow_from_urgent_to_batch_and_bound_every_lane():
    urgent, standard, batch = (LANES[lane].dataset_max for lane in (Lane.urgent, Lane.standard, Lane.batch))
    for m in (urgent, standard, batch):
        assert m.max_samples is not None and m.max_gib is not None
    assert urgent.max_samples < standard.max_samples < batch.max_samples
    assert urgent.max_gib < standard.max_gib < batch.max_gib
    assert standard.max_samples >= 1_281_167  # ImageNet-1k's training images fit the standard lane


def test_the_site_file_overrides_a_lanes_maximum_key_by_key(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"lane_dataset_max": {"urgent": {"max_samples": 50}, "batch": {"max_gib": None}}}))
    maxima = site_config(site).dataset_maxima()
    assert maxima[Lane.urgent] == DatasetMax(max_samples=50, max_gib=LANES[Lane.urgent].dataset_max.max_gib)
    assert maxima[Lane.batch] == DatasetMax(max_samples=LANES[Lane.batch].dataset_max.max_samples, max_gib=None)
    assert maxima[Lane.standard] == LANES[Lane.standard].dataset_max
    assert CompileConfig().dataset_maxima() == {lane: spec.dataset_max for lane, spec in LANES.items()}


@pytest.mark.parametrize("value,expected", [
    ({"urgent": {"max_samples": 0}}, "lane_dataset_max.urgent.max_samples"),
    ({"urgent": {"max_gib": -1}}, "lane_dataset_max.urgent.max_gib"),
    ({"urgent": {"max_images": 5}}, "lane_dataset_max.urgent.max_images"),
    ({"fast": {"max_samples": 5}}, "lane_dataset_max.fast"),
    ({"urgent": {"max_samples": True}}, "lane_dataset_max.urgent.max_samples"),  # not a maximum of 1 image
    ({"urgent": {"max_gib": True}}, "lane_dataset_max.urgent.max_gib"),
    ({"urgent": {"max_gib": float("inf")}}, "lane_dataset_max.urgent.max_gib"),  # null is no bound; Infinity is no JSON
    ({"urgent": {"max_gib": float("nan")}}, "lane_dataset_max.urgent.max_gib"),
])
def test_a_bad_maximum_in_the_site_file_is_refused_naming_the_key(tmp_path, value, expected):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"lane_dataset_max": value}))
    with pytest.raises(ValidationFailed) as e:
        site_config(site)
    assert e.value.cli_exit == 2 and expected in e.value.headline and str(site) in e.value.headline


def test_the_stage_and_shards_steps_receive_the_lane_and_every_lanes_maximum_as_they_parse_it():
    cfg = CompileConfig(lane_dataset_max={Lane.urgent: DatasetMax(max_samples=7)})
    text = cfg.dataset_max_json()
    assert "}}" not in text and "{{" not in text  # Argo would read a tag in it
    template = next(t for t in cfg_templates(cfg) if t["name"] == "stage")
    args = template["container"]["args"]
    assert args[args.index("--lane") + 1] == "{{workflow.parameters.lane}}"
    assert args[args.index("--dataset-max") + 1] == text
    for model in (StageInput(source_uri="s3://b/x/", bucket="bkt", lane="urgent", dataset_max=text),
                  PrebuiltInput(shards_uri="s3://b/x/", lane="urgent", dataset_max=text)):
        assert model.dataset_max == cfg.dataset_maxima() and model.lane is Lane.urgent


def cfg_templates(cfg: CompileConfig) -> list[dict]:
    from pipectl.pipelines.builtin import training

    return training.build(cfg).to_dict()["spec"]["templates"]


@pytest.mark.parametrize("uri,dataset", [
    ("s3://b/datasets/0123456789abcdef0123/data/", "s3://b/datasets/0123456789abcdef0123"),
    ("s3://b/datasets/0123456789abcdef0123/", "s3://b/datasets/0123456789abcdef0123"),
    ("s3://b/team/datasets/0123456789abcdef0123/data", "s3://b/team/datasets/0123456789abcdef0123"),
    ("s3://b/images/", None),
    ("s3://b/datasets/0123456789abcdef0123/data/cats/", None),
])
def test_a_staged_datasets_uri_is_recognised_by_its_layout(uri, dataset):
    layout = DatasetLayout.of_uri(uri)
    assert (layout.dataset_uri if layout else None) == (dataset + "/" if dataset else None)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (20 * GIB, "20 GiB"), (3 * 1024 * GIB, "3 TiB"),
                                    (int(1023.4 * 2**20), "1,023 MiB"), (150 * 2**20, "150 MiB"), (1500 * 1024 * GIB, "1,500 TiB")])
def test_sizes_are_written_in_binary_units(n, text):
    assert size_text(n) == text
