"""pipectl lint: every policy rule and the schema check have a failing example (and pass on argo/)."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipectl.pipelines.lint import lint_objects
from pipectl.pipelines.training import CompileConfig, build_training

ARGO = Path(__file__).resolve().parents[2] / "argo"


@pytest.fixture(scope="module", params=["volcano", "pytorchjob"])
def good(request):
    return build_training(CompileConfig(launcher=request.param)).to_dict()


def _messages(obj):
    return [str(f) for f in lint_objects([("test", obj)])]


def _tmpl(wt, name):
    return next(t for t in wt["spec"]["templates"] if t["name"] == name)


def test_rendered_templates_are_clean(good):
    assert _messages(good) == []


def test_everything_under_argo_is_clean():
    r = subprocess.run([str(Path(sys.executable).parent / "pipectl"), "lint", str(ARGO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    objects = sum(1 for f in ARGO.rglob("*.yaml") if f.name != "kustomization.yaml"
                  for d in yaml.safe_load_all(f.read_text()) if d)
    assert f"{objects} object(s) valid" in r.stderr


def _broken(good, mutate):
    wt = copy.deepcopy(good)
    mutate(wt)
    return _messages(wt)


def test_default_outside_enum(good):
    def m(wt):
        next(p for p in wt["spec"]["arguments"]["parameters"] if p["name"] == "lane")["value"] = "superurgent"
    assert any("default 'superurgent' of lane is not in its enum" in x for x in _broken(good, m))


def test_replicas_quoted_become_strings_C03(good):
    def m(wt):
        res = _tmpl(wt, "train")["resource"]
        res["manifest"] = res["manifest"].replace("replicas: {{inputs.parameters.workers}}", "replicas: '{{inputs.parameters.workers}}'")
        res["manifest"] = res["manifest"].replace("replicas: {{=asInt(inputs.parameters.workers) - 1}}", "replicas: '{{=asInt(inputs.parameters.workers) - 1}}'")
    assert any("replicas must be integers" in x for x in _broken(good, m))


def test_min_available_below_the_gang(good):
    wt = copy.deepcopy(good)
    next(p for p in wt["spec"]["arguments"]["parameters"] if p["name"] == "workers")["value"] = "4"
    res = _tmpl(wt, "train")["resource"]
    res["manifest"] = res["manifest"].replace("minAvailable: {{inputs.parameters.workers}}", "minAvailable: 3")
    assert any("minAvailable 3 must equal the gang size 4" in x for x in _messages(wt))


def test_fractional_gpus(good):
    def m(wt):
        res = _tmpl(wt, "train")["resource"]
        res["manifest"] = res["manifest"].replace("nvidia.com/gpu: {{inputs.parameters.gpus-per-worker}}", "nvidia.com/gpu: 0.5")
    assert any("whole number" in x for x in _broken(good, m))


def test_lane_that_does_not_exist(good):
    def m(wt):
        res = _tmpl(wt, "train")["resource"]
        res["manifest"] = res["manifest"].replace("pipectl-{{inputs.parameters.lane}}", "gold-{{inputs.parameters.lane}}")
    out = _broken(good, m)
    assert any("is not a lane's" in x for x in out)


def test_secret_literal_in_env(good):
    def m(wt):
        _tmpl(wt, "stage")["container"]["env"] = [{"name": "AWS_SECRET_ACCESS_KEY", "value": "hunter2"}]
    assert any("AWS_SECRET_ACCESS_KEY carries a secret literal" in x for x in _broken(good, m))


def test_template_without_command(good):
    def m(wt):
        del _tmpl(wt, "evaluate")["container"]["command"]
    assert any("'evaluate' sets no command" in x for x in _broken(good, m))


@pytest.mark.parametrize("image", ["pipectl/step-light", "pipectl/step-light:latest"])
def test_unpinned_image(good, image):
    def m(wt):
        _tmpl(wt, "register")["container"]["image"] = image
    assert any("is not pinned" in x for x in _broken(good, m))


def _index(wt: dict, name: str) -> int:
    return [t["name"] for t in wt["spec"]["templates"]].index(name)


def test_schema_names_a_misspelled_field_and_a_wrong_type(good):
    def m(wt):
        _tmpl(wt, "stage")["retryStrateg"] = {"limit": 1}
        wt["spec"]["parallelism"] = "many"
    out = _broken(good, m)
    i = _index(good, "stage")
    assert any(f"spec.templates[{i}].retryStrateg" in x and "unknown field" in x for x in out), out
    assert any("spec.parallelism" in x and "'many' is not of type 'integer'" in x for x in out), out


def test_lint_cli_exits_2_naming_the_field(tmp_path, good):
    wt = copy.deepcopy(good)
    _tmpl(wt, "stage")["container"]["imagePullPolicee"] = "Always"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(wt))
    r = subprocess.run([str(Path(sys.executable).parent / "pipectl"), "lint", str(tmp_path / "broken.yaml")], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"spec.templates[{_index(good, 'stage')}].container.imagePullPolicee" in r.stderr
