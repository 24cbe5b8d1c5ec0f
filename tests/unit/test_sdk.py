"""The public pipeline API (pipectl.sdk) and pipelines by reference (cli/pipeline_ref.py): a user
pipeline compiles to one WorkflowTemplate with pipectl's steps and the user's, the built-in
``training`` is one such pipeline, and every bad definition or reference is exit 2 naming the fix."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipectl.sdk import (
    RUN_URI, SHARDS_URI, ContainerStep, Pipeline, PipelineError, evaluate, output, parameter, preprocess, register,
    stage, train, warm,
)

ROOT = Path(__file__).resolve().parents[2]
PIPECTL = str(Path(sys.executable).parent / "pipectl")
EXAMPLE = ROOT / "examples" / "custom-pipeline" / "pipeline.py"


def _tasks(wt: dict) -> dict[str, dict]:
    entry = next(t for t in wt["spec"]["templates"] if t["name"] == wt["spec"]["entrypoint"])
    return {t["name"]: t for t in entry["dag"]["tasks"]}


def _template(wt: dict, name: str) -> dict:
    return next(t for t in wt["spec"]["templates"] if t["name"] == name)


def test_the_built_in_training_pipeline_is_written_with_the_public_api():
    from pipectl.pipelines.builtin import PIPELINES, build_training, training

    assert PIPELINES == {"training": training} and isinstance(training, Pipeline)
    wt = build_training().to_dict()
    assert wt["metadata"]["name"] == "training-v1" and wt["spec"]["entrypoint"] == "training"
    tasks = _tasks(wt)
    assert list(tasks) == ["validate", "stage", "warm", "preprocess", "train", "evaluate", "register"]
    # each step runs after the one before it (after warm, which may be skipped, also after stage); validate first
    assert [t.get("dependencies") for t in tasks.values()] == [None, ["validate"], ["stage"], ["stage", "warm"],
                                                               ["preprocess"], ["train"], ["evaluate"]]
    assert tasks["train"]["template"] == "train-retry"


def test_a_user_pipeline_drops_a_step_and_adds_its_own_between_two():
    step = ContainerStep("export-onnx", image="registry.example.com/me/export:1", command=["python", "-m", "mypkg.export"],
                         args=["--run-uri", RUN_URI, "--shards", SHARDS_URI, "--model", parameter("model-name")],
                         env={"MODE": "fp16"}, outputs=["onnx-uri"], cpu=2, memory_gib=4)
    notify = ContainerStep("notify", image="registry.example.com/me/notify:1", command=["notify"],
                           args=[output("export-onnx", "onnx-uri")], store_access=False)
    wt = Pipeline("my-training", [stage(), preprocess(), train(), step, notify, evaluate(), register()]).build().to_dict()
    assert wt["metadata"]["name"] == "my-training-v1" and wt["spec"]["entrypoint"] == "my-training"
    tasks = _tasks(wt)
    assert list(tasks) == ["validate", "stage", "preprocess", "train", "export-onnx", "notify", "evaluate", "register"]
    assert tasks["export-onnx"]["dependencies"] == ["train"] and tasks["evaluate"]["dependencies"] == ["notify"]
    assert tasks["preprocess"]["dependencies"] == ["stage"]  # no warm step: it follows stage directly
    args = {p["name"]: p["value"] for p in tasks["export-onnx"]["arguments"]["parameters"]}
    assert args == {"run-uri": "s3://pipectl/runs/{{workflow.name}}",
                    "shards-uri": "{{tasks.preprocess.outputs.parameters.shards-uri}}",
                    "model-name": "{{workflow.parameters.model-name}}"}
    assert {p["name"]: p["value"] for p in tasks["notify"]["arguments"]["parameters"]} == {
        "export-onnx-onnx-uri": "{{tasks.export-onnx.outputs.parameters.onnx-uri}}"}
    c = _template(wt, "export-onnx")
    assert c["container"]["command"] == ["python", "-m", "mypkg.export"]
    assert c["container"]["args"] == ["--run-uri", "{{inputs.parameters.run-uri}}", "--shards",
                                      "{{inputs.parameters.shards-uri}}", "--model", "{{inputs.parameters.model-name}}"]
    assert c["container"]["env"] == [{"name": "MODE", "value": "fp16"}, {"name": "PIPECTL_OUTPUTS_DIR", "value": "/tmp/outputs"}]
    assert c["container"]["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert c["outputs"]["parameters"] == [{"name": "onnx-uri", "valueFrom": {"path": "/tmp/outputs/onnx-uri"}}]
    # what every step pod gets: restricted security context, lane priority, retry policy, timeout
    assert c["container"]["securityContext"]["runAsNonRoot"] is True and c["retryStrategy"] and c["timeout"]
    assert c["priorityClassName"] == _template(wt, "stage")["priorityClassName"]
    assert "envFrom" in c["container"] and "envFrom" not in _template(wt, "notify")["container"]


def test_the_example_project_pipeline_renders_and_lints():
    r = subprocess.run([PIPECTL, "render", f"{EXAMPLE}:pipeline"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    wt = yaml.safe_load(r.stdout)
    assert list(_tasks(wt)) == ["validate", "stage", "preprocess", "train", "report", "evaluate", "register"]
    from pipectl.pipelines.lint import lint_objects

    assert lint_objects([("example", wt)]) == []


@pytest.mark.parametrize("steps,message", [
    ([train()], "step 'train' needs the shards that preprocess makes, and no step before it does"),
    ([stage(), train(), preprocess()], "step 'train' needs the shards that preprocess makes"),
    ([evaluate()], "step 'evaluate' needs the"),
    ([stage(), stage()], "two steps named 'stage'"),
    ([ContainerStep("x", image="", command=["true"])], "step 'x': image is empty"),
    ([ContainerStep("x", image="i", command="python -m x")], "command must be a non-empty list of strings"),
    ([ContainerStep("Bad_Name", image="i", command=["x"])], "step name 'Bad_Name'"),
    ([ContainerStep("train-retry", image="i", command=["x"])], "step name 'train-retry'"),
    ([ContainerStep("x", image="i", command=["x"], args=[SHARDS_URI])], "step 'x' needs the shards that preprocess makes"),
    ([ContainerStep("x", image="i", command=["x"], args=[output("y", "z")])], "reads output 'z' of step 'y'"),
    (["stage"], "step 1 of pipeline 'p' is a str, not a step"),
])
def test_a_pipeline_that_cannot_work_is_refused_naming_the_step(steps, message):
    with pytest.raises(PipelineError, match=None) as e:
        Pipeline("p", steps).build()
    assert message in str(e.value)


def test_unknown_parameter_is_refused_when_the_pipeline_is_defined():
    with pytest.raises(PipelineError, match="parameter\\('model'\\): no such workflow parameter"):
        parameter("model")


def _pipectl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PIPECTL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("body,ref,message", [
    (None, "nosuch.py:p", "pipeline file nosuch.py does not exist"),
    ("x = 1\n", "{f}:p", "has no 'p'"),
    ("x = 1\n", "{f}:x", "x is a int, not a pipectl.sdk.Pipeline"),
    ("import nosuchmodule_xyz\n", "{f}:p", "importing"),
    ("from pipectl.sdk import Pipeline, train\np = Pipeline('p', [train()])\n", "{f}:p", "needs the shards that preprocess makes"),
    (None, "trainingg", "unknown pipeline 'trainingg'"),
    (None, "no_such_pkg_xyz.mod:p", "module no_such_pkg_xyz.mod not found"),
])
def test_a_bad_pipeline_reference_is_exit_2_and_names_the_problem(tmp_path, body, ref, message):
    f = tmp_path / "userpipe.py"
    if body is not None:
        f.write_text(body)
    ref = ref.format(f=f)
    for argv in (["render", ref], ["submit", ref, "--dry-run"], ["templates", "apply", ref, "--dry-run"]):
        r = _pipectl(*argv, cwd=tmp_path)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert message in r.stderr, (argv, r.stderr)
        assert r.stdout == ""


def test_a_user_module_that_fails_to_import_shows_the_users_traceback(tmp_path):
    (tmp_path / "helpers.py").write_text("def broken():\n    return 1 / 0\n")
    f = tmp_path / "userpipe.py"
    f.write_text("import helpers\nVALUE = helpers.broken()\n")
    r = _pipectl("render", f"{f}:p")
    assert r.returncode == 2
    assert "helpers.py" in r.stderr and "return 1 / 0" in r.stderr and "ZeroDivisionError" in r.stderr
    assert "pipeline_ref.py" not in r.stderr and "click" not in r.stderr  # the user's frames, not pipectl's


def test_submit_and_templates_apply_name_the_users_template(tmp_path):
    r = _pipectl("submit", f"{EXAMPLE}:pipeline", "--dry-run", "-p", "epochs=2")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["spec"]["workflowTemplateRef"] == {"name": "team-training-v1"}
    r = _pipectl("templates", "apply", f"{EXAMPLE}:pipeline", "training", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(r.stdout)] == ["team-training-v1", "training-v1"]


@pytest.mark.parametrize("launcher", ["volcano", "pytorchjob"])
def test_the_users_training_code_runs_in_the_gang_with_the_environment_contract(launcher):
    from pipectl.pipelines.launchers import LAUNCHERS
    from pipectl.pipelines.substitution import substitute
    from pipectl.sdk import CompileConfig

    p = Pipeline("mine", [stage(), preprocess(), train("mypkg.train", args=["--arch", "resnet18"],
                                                        image="registry.example.com/me/train:1")])
    wt = p.build(CompileConfig(launcher=launcher)).to_dict()
    manifest = _template(wt, "train")["resource"]["manifest"]
    from pipectl.components.contracts import TrainingParameters

    values = {f"inputs.parameters.{k}": v for k, v in TrainingParameters().as_arguments().items()}
    values |= {"inputs.parameters.shards-uri": "s3://b/runs/w/shards/", "inputs.parameters.run-uri": "s3://b/runs/w",
               "workflow.name": "w", "retries": "0"}
    job = yaml.safe_load(substitute(manifest, values, where="test"))
    for group in LAUNCHERS[launcher].replica_groups(job):
        c = group.pod_spec["containers"][0]
        assert c["image"] == "registry.example.com/me/train:1"
        assert c["command"][:3] == ["python", "-m", "pipectl.components.train.launch"]  # exit codes kept
        assert c["command"][-4:] == ["-m", "mypkg.train", "--arch", "resnet18"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {"PIPECTL_TRAIN_SHARDS_URI", "PIPECTL_TRAIN_RUN_URI", "PIPECTL_TRAIN_EPOCHS", "PIPECTL_TRAIN_SEED",
                "PIPECTL_TRAIN_WORKFLOW_NAME", "PIPECTL_TRAIN_OUTPUTS_DIR"} <= set(env)
    # pipectl's own training is unchanged: no contract env, its own module
    own = _template(Pipeline("own", [stage(), preprocess(), train()]).build(CompileConfig(launcher=launcher)).to_dict(), "train")
    assert re.search(r"- pipectl\.components\.train\n", own["resource"]["manifest"])
    assert "PIPECTL_TRAIN_" not in own["resource"]["manifest"]


@pytest.mark.parametrize("make,message", [
    (lambda: train("mypkg.train", script="x.py"), "give module= or script=, not both"),
    (lambda: train("my-pkg.train"), "not a Python module name"),
    (lambda: train(args=["--x"]), "needs module= or script="),
    (lambda: train("m", image="a b"), "not an image reference"),
    (lambda: Pipeline("p", [stage(), preprocess(), train("m"), evaluate()]).build(),
     "scores the model pipectl's own training code writes"),
])
def test_bad_user_training_is_refused(make, message):
    with pytest.raises(PipelineError) as e:
        make()
    assert message in str(e.value)


def test_a_pipeline_error_reads_as_a_sentence_with_its_fix():
    with pytest.raises(PipelineError) as e:
        Pipeline("p", [train()]).build()
    assert str(e.value) == ("step 'train' needs the shards that preprocess makes, and no step before it does "
                            "(put preprocess() before 'train' in pipeline 'p')")
    assert e.value.hint == "put preprocess() before 'train' in pipeline 'p'"
