"""A pipeline's own parameters (``Pipeline(..., parameters=MyParameters)``): one spec per field,
arguments of the WorkflowTemplate beside pipectl's, checked by ``-p`` and by the ``validate`` step
inside the cluster with the same rules, given to the gang's pods and to a ContainerStep; a class
that cannot be a set of parameters is refused naming the field."""

from __future__ import annotations

import contextlib
import enum
import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest
import yaml
from pydantic import BaseModel, Field

from pipectl.components.pipeline_parameters import parameter_model, specs_from_class, specs_from_json, specs_json
from pipectl.components.runtime import step_main
from pipectl.components.validate.core import run
from pipectl.pipelines.substitution import substitute
from pipectl.sdk import ContainerStep, Parameters, Pipeline, PipelineError, evaluate, parameter, preprocess, register, stage, train

PIPECTL = str(Path(sys.executable).parent / "pipectl")


class Optim(str, enum.Enum):
    sgd = "sgd"
    adamw = "adamw"


class TeamParameters(Parameters):
    weight_decay: float = Field(0.0005, ge=0, le=0.1, description="L2 penalty of the optimiser.")
    warmup_epochs: int = Field(2, ge=0, le=50, description="Epochs of linear learning-rate warm-up.")
    augment: bool = Field(True, description="Random flips while training.")
    optimizer: Optim = Field(Optim.sgd, description="The optimiser.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="Training precision.")
    notify_channel: str = Field("ml-alerts", pattern=r"[a-z0-9-]{1,40}", description="Chat channel told of the result.")


NOTIFY = ContainerStep("notify", image="registry.example.com/team/notify:1", command=["notify"],
                       args=["--channel", parameter("notify-channel"), "--model", parameter("model-name")])
PIPELINE = Pipeline("team", [stage(), preprocess(), train(), evaluate(), register(), NOTIFY], parameters=TeamParameters)
WT = PIPELINE.build().to_dict()
TEMPLATES = {t["name"]: t for t in WT["spec"]["templates"]}


def test_each_field_becomes_a_typed_described_argument_after_pipectls():
    args = WT["spec"]["arguments"]["parameters"]
    names = [a["name"] for a in args]
    assert names[-6:] == ["weight-decay", "warmup-epochs", "augment", "optimizer", "precision", "notify-channel"]
    assert names.index("dataset-uri") == 0  # pipectl's own come first, unchanged
    by_name = {a["name"]: a for a in args}
    assert by_name["weight-decay"] == {"name": "weight-decay", "value": "0.0005", "description": "L2 penalty of the optimiser."}
    assert by_name["optimizer"]["enum"] == ["sgd", "adamw"] and by_name["precision"]["enum"] == ["fp32", "bf16"]
    assert by_name["augment"]["enum"] == ["false", "true"] and by_name["augment"]["value"] == "true"


def test_specs_round_trip_through_json_into_the_same_rules():
    specs = PIPELINE.parameter_specs()
    assert specs_from_json(specs_json(specs)) == specs
    kinds = {s.name: s.kind for s in specs}
    assert kinds == {"weight-decay": "decimal", "warmup-epochs": "integer", "augment": "boolean", "optimizer": "choice",
                     "precision": "choice", "notify-channel": "text"}
    assert next(s for s in specs if s.name == "warmup-epochs").le == 50  # an integer bound stays an integer


def _gang_job(manifest: str, arguments: dict[str, str]) -> dict:
    """The gang job of ``manifest`` substituted with the run's ``arguments`` (as workflow and train inputs)."""
    values = {f"{scope}.parameters.{k}": v for k, v in arguments.items() for scope in ("inputs", "workflow")}
    values |= {"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r",
               "workflow.name": "w", "retries": "0", "inputs.parameters.gang-affinity": "{}"}
    return yaml.safe_load(substitute(manifest, values, where="test"))


def test_the_gang_and_a_container_step_get_the_values():
    arguments = {**PIPELINE.run_parameters().as_arguments(), "weight-decay": "0.03", "notify-channel": "team-b"}
    manifest = _gang_job(TEMPLATES["train"]["resource"]["manifest"], arguments)
    env = {e["name"]: e.get("value") for task in manifest["spec"]["tasks"] for e in task["template"]["spec"]["containers"][0]["env"]}
    assert env["PIPECTL_PARAM_WEIGHT_DECAY"] == "0.03"
    assert env["PIPECTL_PARAM_NOTIFY_CHANNEL"] == "team-b"
    notify = next(t for t in TEMPLATES["team"]["dag"]["tasks"] if t["name"] == "notify")
    assert {p["name"]: p["value"] for p in notify["arguments"]["parameters"]}["notify-channel"] == \
        "{{workflow.parameters.notify-channel}}"


def test_from_env_reads_this_runs_values_and_keeps_defaults():
    hp = TeamParameters.from_env({"PIPECTL_PARAM_WEIGHT_DECAY": "0.01", "PIPECTL_PARAM_OPTIMIZER": "adamw"})
    assert (hp.weight_decay, hp.optimizer, hp.warmup_epochs, hp.augment) == (0.01, Optim.adamw, 2, True)
    with pytest.raises(ValueError, match="weight_decay"):
        TeamParameters.from_env({"PIPECTL_PARAM_WEIGHT_DECAY": "2"})


def _validate(params: dict[str, str]) -> tuple[int, str]:
    """The validate step's entrypoint with the argv its template renders (as its __main__ reads it)."""
    defaults = PIPELINE.run_parameters().as_arguments()
    values = {f"inputs.parameters.{k}": v for k, v in {**defaults, **params}.items()}
    argv = [substitute(a, values, where="test") for a in TEMPLATES["validate"]["container"]["args"]]
    specs = argv[argv.index("--pipeline-parameters") + 1]
    rest = argv[:argv.index("--pipeline-parameters")] + argv[argv.index("--pipeline-parameters") + 2:]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = step_main(parameter_model(specs_from_json(specs)), run, argv=rest, prog="pipectl.components.validate")
    return int(code), err.getvalue()


BAD = [("weight-decay", "1e-3"), ("weight-decay", "0.5"), ("warmup-epochs", "07"), ("augment", "yes"),
       ("optimizer", "lamb"), ("notify-channel", "ML Alerts"), ("notify-channel", "x" * 41)]


def test_validate_in_the_cluster_accepts_good_values():
    assert _validate({"weight-decay": "0.01", "optimizer": "adamw", "notify-channel": "team-a"}) == (0, "")


@pytest.mark.parametrize("name,value", BAD, ids=[f"{n}={v[:10]}" for n, v in BAD])
def test_validate_in_the_cluster_refuses_a_bad_value_naming_the_parameter(name, value):
    code, err = _validate({name: value})
    assert code == 1 and f"parameter {name}:" in err, err


def test_a_text_value_with_quotes_stays_inside_its_string_in_the_gangs_manifest_and_is_refused():
    """A quote that would end a quoted string of text substituted into the gang's manifest stays
    inside the value (the manifest takes it as a JSON string), and validate refuses it anyway."""
    class Free(Parameters):
        note: str = Field("hello", description="Free text.")
    pipeline = Pipeline("free", [stage(), preprocess(), train()], parameters=Free)
    manifest = next(t for t in pipeline.build().to_dict()["spec"]["templates"] if t["name"] == "train")["resource"]["manifest"]
    payload = "x', privileged: '1\"\nhostPID: true"
    job = _gang_job(manifest, {**pipeline.run_parameters().as_arguments(), "note": payload})
    pod = job["spec"]["tasks"][0]["template"]["spec"]
    assert {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}["PIPECTL_PARAM_NOTE"] == payload
    assert "hostPID" not in pod and "privileged" not in pod["containers"][0]
    with pytest.raises(ValueError, match="quotes or backslashes"):  # one line: the quote is what it refuses
        parameter_model(Pipeline("free", [stage()], parameters=Free).parameter_specs()).from_overrides({"note": payload.split("\n")[0]})


class NoDefault(Parameters):
    alpha: float = Field(ge=0, description="x")


class NoDescription(Parameters):
    alpha: float = 0.1


class Clash(Parameters):
    epochs: int = Field(3, description="x")


class Unsupported(Parameters):
    sizes: list[int] = Field([1], description="x")


class BadDefault(Parameters):
    alpha: float = Field(2.0, le=1, description="x")


class BoundsOnText(Parameters):
    name: str = Field("a", ge=1, description="x")


class NotParameters:
    pass


@pytest.mark.parametrize("cls,message", [
    (NoDefault, "NoDefault.alpha: give it a default"),
    (NoDescription, "NoDescription.alpha: describe it"),
    (Clash, "Clash.epochs: pipectl already has a parameter epochs"),
    (Unsupported, "Unsupported.sizes: type list[int] is not a parameter type"),
    (BadDefault, "BadDefault: a default its own rules refuse"),
    (BoundsOnText, "BoundsOnText.name: bounds (ge, gt, le, lt) are for int and float fields"),
    (NotParameters, "parameters=NotParameters is a class, not a pydantic model"),
    (3, "is a int, not a class"),
])
def test_a_class_that_cannot_be_parameters_is_refused_naming_the_field(cls, message):
    with pytest.raises(PipelineError) as e:
        Pipeline("p", [stage()], parameters=cls).build()
    assert f"pipeline 'p': parameters: " in str(e.value) and message in str(e.value), str(e.value)


def test_a_plain_pydantic_model_is_accepted_too():
    class Plain(BaseModel):
        alpha: float = Field(0.1, description="x")
    assert [s.name for s in specs_from_class(Plain)] == ["alpha"]


def _pipectl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PIPECTL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_cli_takes_lists_and_checks_the_pipelines_own_parameters(tmp_path):
    (tmp_path / "team.py").write_text(
        "from pydantic import Field\n"
        "from pipectl.sdk import Parameters, Pipeline, preprocess, stage, train\n"
        "class P(Parameters):\n"
        "    weight_decay: float = Field(0.0005, ge=0, le=0.1, description='L2 penalty of the optimiser.')\n"
        "pipeline = Pipeline('team', [stage(), preprocess(), train()], parameters=P)\n")
    r = _pipectl("submit", "team.py:pipeline", "--dry-run", "-p", "weight-decay=0.01", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    sent = {a["name"]: a["value"] for a in yaml.safe_load(r.stdout)["spec"]["arguments"]["parameters"]}
    assert sent["weight-decay"] == "0.01"
    r = _pipectl("submit", "team.py:pipeline", "--dry-run", "-p", "weight-decay=0.5", cwd=tmp_path)
    assert r.returncode == 2 and "weight-decay: Input should be less than or equal to 0.1" in r.stderr, r.stderr
    r = _pipectl("submit", "team.py:pipeline", "--help", cwd=tmp_path)
    assert r.returncode == 0 and "weight-decay" in r.stdout and "L2 penalty of the optimiser." in r.stdout, r.stdout
    r = _pipectl("submit", "training", "--dry-run", "-p", "weight-decay=0.01", cwd=tmp_path)
    assert r.returncode == 2 and "unknown parameter 'weight-decay'" in r.stderr, r.stderr
