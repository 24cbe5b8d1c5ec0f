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
    # store access: the store's keys and the team's MLflow user (the store ConfigMap names MLflow to it)
    assert {e["secretRef"]["name"] for e in c["container"]["envFrom"] if "secretRef" in e} == {
        "pipectl-s3-credentials", "pipectl-mlflow-credentials"}


def test_a_pipeline_on_shards_it_already_has_drops_preprocess_and_adds_its_own_step():
    from pipectl.pipelines.lint import lint_objects
    from pipectl.sdk import shards

    inspect = ContainerStep("inspect-shards", image="registry.example.com/me/inspect:1", command=["python", "inspect.py"],
                            args=[SHARDS_URI, RUN_URI], outputs=["report-uri"])
    wt = Pipeline("from-shards", [shards(), inspect, train(), evaluate(), register()]).build().to_dict()
    assert lint_objects([("from-shards", wt)]) == []
    tasks = _tasks(wt)
    assert list(tasks) == ["validate", "shards", "inspect-shards", "train", "evaluate", "register"]
    assert {"stage", "preprocess"}.isdisjoint(t["name"] for t in wt["spec"]["templates"])
    assert tasks["inspect-shards"]["dependencies"] == ["shards"] and tasks["train"]["dependencies"] == ["inspect-shards"]
    # both the user's step and the gang read the shards the shards step checked (dataset-uri)
    args = {p["name"]: p["value"] for p in tasks["inspect-shards"]["arguments"]["parameters"]}
    assert args == {"shards-uri": "{{tasks.shards.outputs.parameters.shards-uri}}", "run-uri": "s3://pipectl/runs/{{workflow.name}}"}
    train_args = {p["name"]: p["value"] for p in tasks["train"]["arguments"]["parameters"]}
    assert train_args["shards-uri"] == "{{tasks.shards.outputs.parameters.shards-uri}}"


@pytest.mark.parametrize("example,tasks", [
    (EXAMPLE, ["validate", "stage", "preprocess", "train", "report", "evaluate", "register"]),
    (ROOT / "examples" / "image-classifier" / "pipeline.py", ["validate", "stage", "preprocess", "train", "evaluate", "register"]),
])
def test_the_example_projects_pipelines_render_and_lint(example, tasks):
    r = subprocess.run([PIPECTL, "render", f"{example}:pipeline"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    wt = yaml.safe_load(r.stdout)
    assert list(_tasks(wt)) == tasks
    from pipectl.pipelines.lint import lint_objects

    assert lint_objects([("example", wt)]) == []


@pytest.mark.parametrize("steps,message", [
    ([train()], "step 'train' needs the shards that preprocess (or shards) makes, and no step before it does"),
    ([stage(), train(), preprocess()], "step 'train' needs the shards that preprocess (or shards) makes"),
    ([evaluate()], "step 'evaluate' needs the"),
    ([stage(), stage()], "two steps named 'stage'"),
    ([ContainerStep("x", image="", command=["true"])], "step 'x': image is empty"),
    ([ContainerStep("x", image="i", command="python -m x")], "command must be a non-empty list of strings"),
    ([ContainerStep("Bad_Name", image="i", command=["x"])], "step name 'Bad_Name'"),
    ([ContainerStep("train-retry", image="i", command=["x"])], "step name 'train-retry'"),
    ([ContainerStep("x", image="i", command=["x"], args=[SHARDS_URI])], "step 'x' needs the shards that preprocess (or shards) makes"),
    ([ContainerStep("x", image="i", command=["x"], args=[output("y", "z")])], "reads output 'z' of step 'y'"),
    (["stage"], "step 1 of pipeline 'p' is a str, not a step"),
])
def test_a_pipeline_that_cannot_work_is_refused_naming_the_step(steps, message):
    with pytest.raises(PipelineError, match=None) as e:
        Pipeline("p", steps).build()
    assert message in str(e.value)


def test_a_parameter_the_pipeline_does_not_declare_is_refused_when_it_is_built():
    step = ContainerStep("notify", image="i", command=["x"], args=[parameter("model")])
    with pytest.raises(PipelineError, match="reads parameter\\('model'\\), which the pipeline does not declare"):
        Pipeline("p", [step]).build()
    with pytest.raises(PipelineError, match="kebab-case name"):
        parameter("Model Name")


def _pipectl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([PIPECTL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("body,ref,message", [
    (None, "nosuch.py:p", "pipeline file nosuch.py does not exist"),
    ("x = 1\n", "{f}:p", "has no 'p'"),
    ("x = 1\n", "{f}:x", "x is a int, not a pipectl.sdk.Pipeline"),
    ("import nosuchmodule_xyz\n", "{f}:p", "importing"),
    ("from pipectl.sdk import Pipeline, train\np = Pipeline('p', [train()])\n", "{f}:p", "needs the shards that preprocess (or shards) makes"),
    (None, "trainingg", "unknown pipeline 'trainingg'"),
    (None, "no_such_pkg_xyz.mod:p", "module no_such_pkg_xyz.mod not found"),
])
def test_a_bad_pipeline_reference_is_exit_2_and_names_the_problem(tmp_path, body, ref, message):
    f = tmp_path / "userpipe.py"
    if body is not None:
        f.write_text(body)
    ref = ref.format(f=f)
    for argv in (["render", ref], ["submit", ref, "--dry-run"], ["templates", "apply", ref, "--dry-run"],
                 ["cron", "apply", ref, "--dry-run"]):
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


def test_cron_apply_schedules_the_users_pipeline_beside_the_built_in_one():
    from pipectl.pipelines.lint import lint_objects

    r = _pipectl("cron", "apply", f"{EXAMPLE}:pipeline", "--dry-run")
    assert r.returncode == 0, r.stderr
    mine = yaml.safe_load(r.stdout)
    assert mine["metadata"]["name"] == "retrain-team-training"  # its own schedule: the built-in one's stays
    assert mine["spec"]["workflowSpec"]["workflowTemplateRef"] == {"name": "team-training-v1"}
    assert lint_objects([("cron", mine)]) == []
    builtin = yaml.safe_load(_pipectl("cron", "apply", "training", "--dry-run").stdout)
    assert builtin == yaml.safe_load(_pipectl("cron", "apply", "--dry-run").stdout)  # training is the default
    assert builtin["metadata"]["name"] == "retrain"
    assert builtin["spec"]["workflowSpec"]["workflowTemplateRef"] == {"name": "training-v1"}
    # the same schedule, history and overlap rules for every pipeline
    assert {k: v for k, v in mine["spec"].items() if k != "workflowSpec"} == \
        {k: v for k, v in builtin["spec"].items() if k != "workflowSpec"}


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
               "workflow.name": "w", "retries": "0", "inputs.parameters.gang-affinity": "{}"}
    job = yaml.safe_load(substitute(manifest, values, where="test"))
    for group in LAUNCHERS[launcher].replica_groups(job):
        c = group.pod_spec["containers"][0]
        assert c["image"] == "registry.example.com/me/train:1"
        assert c["command"][:3] == ["python", "-m", "pipectl.components.train.launch"]  # exit codes kept
        assert c["command"][-4:] == ["-m", "mypkg.train", "--arch", "resnet18"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert {"PIPECTL_TRAIN_SHARDS_URI", "PIPECTL_TRAIN_RUN_URI", "PIPECTL_TRAIN_EPOCHS", "PIPECTL_TRAIN_SEED",
                "PIPECTL_TRAIN_WORKFLOW_NAME", "PIPECTL_TRAIN_OUTPUTS_DIR"} <= set(env)
        # where checkpoints go: the run layout's folder, the one pipectl's own training uses
        from pipectl.components.contracts import RunLayout

        assert env["PIPECTL_TRAIN_CHECKPOINTS_URI"] == RunLayout(run_uri="s3://b/runs/w").checkpoints_uri == "s3://b/runs/w/checkpoints/"
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
    assert str(e.value) == ("step 'train' needs the shards that preprocess (or shards) makes, and no step before it does "
                            "(put preprocess() (or shards()) before 'train' in pipeline 'p')")
    assert e.value.hint == "put preprocess() (or shards()) before 'train' in pipeline 'p'"


def test_a_pipeline_sets_its_own_parameter_defaults_and_the_command_line_still_wins():
    p = Pipeline("shapes", [stage(), preprocess(), train()],
                 defaults={"architecture": "resnet18", "image_size": 64, "warm-cache": True, "learning-rate": 0.001})
    args = {a["name"]: a["value"] for a in p.build().to_dict()["spec"]["arguments"]["parameters"]}
    assert (args["architecture"], args["image-size"], args["warm-cache"], args["learning-rate"]) == ("resnet18", "64", "true", "0.001")
    assert args["epochs"] == "15"  # what the pipeline does not set keeps pipectl's default
    example = ROOT / "examples" / "image-classifier" / "pipeline.py"
    r = _pipectl("submit", f"{example}:pipeline", "--dry-run", "-p", "epochs=2", "-p", "dataset-uri=s3://team/shapes/")
    assert r.returncode == 0, r.stderr
    sent = {a["name"]: a["value"] for a in yaml.safe_load(r.stdout)["spec"]["arguments"]["parameters"]}
    assert (sent["learning-rate"], sent["image-size"], sent["epochs"]) == ("0.02", "64", "2")


def test_a_pipeline_of_your_own_registers_under_its_own_name_unless_it_names_its_model():
    def model_name(p: Pipeline) -> str:
        return {a["name"]: a["value"] for a in p.build().to_dict()["spec"]["arguments"]["parameters"]}["model-name"]

    assert model_name(Pipeline("team-training", [stage(), preprocess(), train(), evaluate(), register()])) == "team-training"
    assert model_name(Pipeline("team-training", [stage()], defaults={"model-name": "team-cnn"})) == "team-cnn"
    from pipectl.pipelines.builtin import training

    assert model_name(training) == "digits-cnn"  # the built-in pipeline's model
    r = _pipectl("submit", f"{EXAMPLE}:pipeline", "--dry-run", "-p", "dataset-uri=s3://team/data/")
    assert r.returncode == 0, r.stderr
    sent = {a["name"]: a["value"] for a in yaml.safe_load(r.stdout)["spec"]["arguments"]["parameters"]}
    assert sent["model-name"] == "team-training"
    r = _pipectl("submit", f"{EXAMPLE}:pipeline", "--dry-run", "-p", "dataset-uri=s3://team/data/", "-p", "model-name=x-cnn")
    sent = {a["name"]: a["value"] for a in yaml.safe_load(r.stdout)["spec"]["arguments"]["parameters"]}
    assert sent["model-name"] == "x-cnn"  # the command line still wins


@pytest.mark.parametrize("defaults,message", [
    ({"nosuch": 1}, "pipeline 'p': defaults: unknown parameter 'nosuch'"),
    ({"epochs": 0}, "pipeline 'p': defaults: epochs: Input should be greater than or equal to 1 (got '0')"),
    ({"architecture": "vgg"}, "pipeline 'p': defaults: architecture: Input should be 'small-cnn', 'resnet18' or 'resnet50'"),
    ("epochs=3", "defaults must be a mapping"),
])
def test_bad_pipeline_defaults_are_refused_naming_the_parameter(defaults, message):
    with pytest.raises(PipelineError) as e:
        Pipeline("p", [stage()], defaults=defaults).build()
    assert message in str(e.value)


def _refused_with(tmp_path: Path, monkeypatch, body: str | None, ref: str, define) -> str:
    """The PipelineError message of ``define()`` with the module of ``ref`` written as ``body``."""
    monkeypatch.syspath_prepend(str(tmp_path))
    if body is not None:
        (tmp_path / f"{ref.partition(':')[0]}.py").write_text(body)
    with pytest.raises(PipelineError) as e:
        define()
    return str(e.value)


@pytest.mark.parametrize("body,ref,message,at_step", [
    ("def train(ctx):\n    return ctx\n", "userfn_ok:nosuch", "userfn_ok has no 'nosuch'", "userfn_ok has no 'nosuch'"),
    ("def train(ctx, extra):\n    return ctx\n", "userfn_two:train", "a train function takes one argument, the TrainContext",
     "train function userfn_two:train: must take 1 argument (it is function train)"),
    ("train = 3\n", "userfn_int:train", "a train function takes one argument", "must take 1 argument (it is int train)"),
    ("x = 1 / 0\n", "userfn_boom:train", "importing userfn_boom failed: ZeroDivisionError",
     "importing userfn_boom failed: ZeroDivisionError"),
    (None, "not a reference", "not a train function reference (module.path:name)", None),
])
def test_a_train_function_that_cannot_work_is_refused_when_the_pipeline_is_defined_and_when_the_step_starts(
        tmp_path, monkeypatch, body, ref, message, at_step):
    from pipectl.components.runtime import StepError
    from pipectl.components.train.core import resolve_function

    assert message in _refused_with(tmp_path, monkeypatch, body, ref, lambda: train(function=ref))
    if at_step is not None:  # the image's copy of the module is checked again when the step starts
        sys.modules.pop(ref.partition(":")[0], None)
        with pytest.raises(StepError) as step_error:
            resolve_function(ref)
        assert at_step in str(step_error.value)


def test_a_train_function_is_given_to_the_gang_and_its_module_may_live_only_in_the_image():
    p = Pipeline("fn", [stage(), preprocess(), train(function="only_in_the_image.train:train"), evaluate(), register()])
    wt = p.build().to_dict()
    command = _template(wt, "train")["resource"]["manifest"]
    assert "--function\n" in command or "- --function" in command
    assert "only_in_the_image.train:train" in command
    with pytest.raises(PipelineError, match="function= .a train function. or module=/script="):
        train(function="a.b:c", module="a.b")


@pytest.mark.parametrize("body,ref,message", [
    ("def m(logits):\n    return 1.0\n", "usermetric_one:m", "a metric takes two arguments, logits and labels"),
    ("x = 1\n", "usermetric_none:m", "usermetric_none has no 'm'"),
    (None, "no-colon", "not a metric function reference (module.path:name)"),
])
def test_a_metric_that_cannot_work_is_refused_when_the_pipeline_is_defined(tmp_path, monkeypatch, body, ref, message):
    assert message in _refused_with(tmp_path, monkeypatch, body, ref, lambda: evaluate(metric=ref))


@pytest.mark.parametrize("returns,ok", [("0.75", True), ("1.5", False), ("float('nan')", False), ("'high'", False), ("True", False)])
def test_the_users_metric_decides_and_a_value_outside_0_1_is_a_failure_of_the_code(tmp_path, monkeypatch, returns, ok):
    import numpy as np

    from pipectl.components.contracts import EvaluateInput
    from pipectl.components.evaluate.core import _metrics
    from pipectl.components.runtime import StepError

    monkeypatch.syspath_prepend(str(tmp_path))
    module = f"usermetric_{abs(hash(returns))}"
    (tmp_path / f"{module}.py").write_text(f"def score(logits, labels):\n    return {returns}\n")
    inp = EvaluateInput(shards_uri="s3://b/s/", run_uri="s3://b/r", model_name="m", promotion_metric="f1_macro",
                        promotion_threshold=0.5, metric_function=f"{module}:score")
    every, decider = _metrics(inp, 2)
    assert decider == "score"
    logits, labels = np.array([[2.0, 1.0], [0.0, 3.0]], np.float32), np.array([0, 1])
    if ok:
        assert every(logits, labels) == {"accuracy": 1.0, "f1_macro": 1.0, "score": 0.75}
    else:
        with pytest.raises(StepError, match="not a number in \\[0, 1\\]"):
            every(logits, labels)


def test_a_train_function_must_return_the_trained_module():
    import types

    from torch import nn

    from pipectl.components.runtime import StepError
    from pipectl.components.train.core import _trained

    ctx = types.SimpleNamespace(watch=None)
    assert isinstance(_trained(ctx, lambda c: nn.Linear(2, 2), "mine:train"), nn.Linear)
    with pytest.raises(StepError, match="train function mine:train returned NoneType, not the trained torch.nn.Module"):
        _trained(ctx, lambda c: None, "mine:train")


def test_exports_onnx_is_for_your_own_torchrun_code_and_lets_evaluate_follow_it():
    p = Pipeline("p", [stage(), preprocess(), train("mypkg.train", exports_onnx=True), evaluate(), register()])
    job = _template(p.build().to_dict(), "train")["resource"]["manifest"]
    assert "PIPECTL_TRAIN_PUBLISH_ONNX" in job and "mypkg.train" in job
    with pytest.raises(PipelineError, match="only with module= or script="):
        train(exports_onnx=True)
    with pytest.raises(PipelineError, match="exports_onnx=True"):
        Pipeline("p", [stage(), preprocess(), train("mypkg.train"), evaluate()]).build()


def test_a_script_that_declared_its_onnx_but_wrote_none_fails_as_code(tmp_path, monkeypatch, capsys):
    """After torchrun's success, node rank 0's launcher finds no model.onnx: exit 1 and why; a file
    that is not ONNX is refused alike (nothing is logged or written: the check comes first)."""
    from pipectl.components.train import launch
    from pipectl.components.train.launch import _published, _torchrun_args

    monkeypatch.setenv("PIPECTL_TRAIN_OUTPUTS_DIR", str(tmp_path))
    for name in ("SHARDS_URI", "RUN_URI", "WORKFLOW_NAME", "MODEL_NAME"):
        monkeypatch.setenv(f"PIPECTL_TRAIN_{name}", "s3://b/x" if name.endswith("URI") else "x")
    for name, value in (("EPOCHS", "1"), ("BATCH_SIZE", "8"), ("LEARNING_RATE", "0.1"), ("CHECKPOINT_EVERY_STEPS", "5"), ("SEED", "0")):
        monkeypatch.setenv(f"PIPECTL_TRAIN_{name}", value)
    known = _torchrun_args(["--nnodes=2", "--nproc-per-node=1", "--node-rank=0", "-m", "mine"])
    assert _published(known) == 1
    assert "the training code ended with success but wrote no" in capsys.readouterr().err
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    assert _published(known) == 1
    assert "is not a model ONNX Runtime loads" in capsys.readouterr().err
    assert launch.publish.model_path() == tmp_path / "model.onnx"

