"""C15: no parameter value submitted outside the CLI (Argo UI, Argo Server API, kubectl create) can
change a manifest's shape — the first step, ``validate``, parses every workflow parameter with the
CLI's contract inside the cluster and fails the workflow, naming the parameter, before any step
that uses them runs.

Each payload is shown to be a real attack first (substituted as Argo does, as text, into the train
step's manifest it changes the gang job's structure), then to be stopped by the validate step's
own entrypoint, called with the very argv the compiled template gives its container.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import yaml

from pipectl.components.contracts import TrainingParameters, kebab
from pipectl.components.runtime import step_main
from pipectl.components.validate.core import run
from pipectl.pipelines.substitution import substitute
from pipectl.pipelines.builtin import build_training
from tests.tools.argo import ArgoExpr
from tests.tools.shape import key_paths

WT = build_training().to_dict()
TEMPLATES = {t["name"]: t for t in WT["spec"]["templates"]}
DEFAULTS = TrainingParameters().as_arguments()

# Payloads per kind of parameter that reaches the gang manifest: free string, integer (substituted
# unquoted), float, enum. STRUCTURAL ones add fields to the raw substitution; the others are merely
# invalid (the second model-name is the `$`-matches-before-a-newline case of the old regex).
STRUCTURAL = [
    # quoted in the manifest ('{{...}}' inside the container's command): break out of the quotes
    ("model-name", "x'\n          securityContext:\n            privileged: true\n          args:\n          - '"),
    ("checkpoint-every-steps", "5'\n          securityContext: {privileged: true}\n          args:\n          - '"),
    ("learning-rate", "0.01'\n          volumeMounts: [{name: host, mountPath: /host}]\n          args:\n          - '"),
    # unquoted (integers, the lane inside names): a newline and a key at the right indentation
    ("workers", "1\n  extra: 1"),
    ("lane", "standard\n  hostPID: true"),
]
INVALID = [("model-name", "digits-cnn\n"), ("seed", "1 #"), ("epochs", "1e3"), ("lane", "Urgent"),
           ("cpu-per-worker", " 2"), ("dataset-uri", "s3://b/p\tx"), ("memory-gib-per-worker", "8Gi")]



def _train_job(params: dict[str, str]) -> dict | list | str | None:
    values = {f"inputs.parameters.{k}": v for k, v in {**DEFAULTS, **params}.items()}
    values.update({"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r",
                   "workflow.name": "training-abcde", "retries": "0", "inputs.parameters.gang-affinity": "{}"})
    try:
        return yaml.safe_load(substitute(TEMPLATES["train"]["resource"]["manifest"], values, where="test"))
    except yaml.YAMLError as e:
        return f"YAML error: {e}"


def _validate(params: dict[str, str]) -> tuple[int, str]:
    """Run the validate step's entrypoint with the argv its template renders for ``params``."""
    values = {f"inputs.parameters.{k}": v for k, v in {**DEFAULTS, **params}.items()}
    argv = [substitute(a, values, where="test") for a in TEMPLATES["validate"]["container"]["args"]]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = step_main(TrainingParameters, run, argv=argv, prog="pipectl.components.validate")
    return int(code), err.getvalue()


def test_validate_runs_first_and_checks_every_parameter():
    dag = TEMPLATES["training"]["dag"]["tasks"]
    assert dag[0]["name"] == "validate" and "dependencies" not in dag[0]
    assert all("validate" in t.get("dependencies", []) for t in dag if t["name"] == "stage")
    flags = TEMPLATES["validate"]["container"]["args"][::2]
    assert flags[:-1] == [f"--{kebab(n)}" for n in TrainingParameters.model_fields]
    assert TEMPLATES["validate"]["container"]["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_defaults_pass():
    assert _validate({}) == (0, "")


@pytest.mark.parametrize("name,value", STRUCTURAL, ids=[n for n, _ in STRUCTURAL])
def test_C15_hostile_value_keeps_the_manifests_shape_and_validate_stops_it(name, value):
    from pipectl.pipelines.launchers.base import refusal

    hostile = _train_job({name: value})
    assert key_paths(hostile) == key_paths(_train_job({})) and refusal(hostile).startswith(f"parameter {name}: ")
    code, err = _validate({name: value})
    assert code == 1, err
    assert f"parameter {name}:" in err and repr(value)[:40] in err, err  # named, value shown on one line


@pytest.mark.parametrize("name,value", INVALID, ids=[f"{n}={v!r}" for n, v in INVALID])
def test_C15_invalid_value_is_refused_naming_the_parameter(name, value):
    code, err = _validate({name: value})
    assert code == 1 and f"parameter {name}:" in err, err


@pytest.fixture(scope="module")
def argo():
    evaluator = ArgoExpr()
    yield evaluator
    evaluator.close()


@pytest.mark.parametrize("name,value", STRUCTURAL, ids=[n for n, _ in STRUCTURAL])
def test_C15_with_argos_own_substitution_the_payload_keeps_the_jobs_shape_and_validate_refuses_it(argo, name, value):
    """The same payloads through the workflow controller's own substitution code (argo-workflows
    v4 util/template.Replace over the template's JSON, as operator.go does), not a re-implementation:
    the gang job Argo would send keeps its shape (each value a typed conversion) and is refused
    (tests/unit/test_gang_manifest_values.py), and the validate container, given the argv Argo
    substitutes into it, exits 1 naming the parameter."""
    def params(values):
        p = {f"inputs.parameters.{k}": v for k, v in {**DEFAULTS, **values}.items()}
        p.update({"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r",
                  "workflow.name": "training-abcde", "retries": "0", "inputs.parameters.gang-affinity": "{}"})
        return p

    def job(values):
        manifest = argo.substitute(TEMPLATES["train"], params(values))["resource"]["manifest"]
        try:
            return yaml.safe_load(manifest)
        except yaml.YAMLError as e:
            return f"YAML error: {e}"

    hostile = job({name: value})
    assert key_paths(hostile) == key_paths(job({})), hostile
    argv = argo.substitute(TEMPLATES["validate"], params({name: value}))["container"]["args"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = step_main(TrainingParameters, run, argv=argv, prog="pipectl.components.validate")
    assert code == 1 and f"parameter {name}:" in err.getvalue(), err.getvalue()


# C22: spellings the contract used to accept that a later reader takes otherwise. Each is first
# shown to be read differently downstream (the gang manifest's YAML, or Argo's `when`), then refused.
MISREAD = [
    ("workers", "010", "YAML 1.1 reads a leading zero as octal: 8 pods for a gang of 10"),
    ("workers", "0o12", "YAML 1.1 octal"),
    ("gpus-per-worker", "0x1", "YAML hexadecimal"),
    ("workers", "1_0", "YAML 1.1 drops the underscore; torchrun refuses it"),
    ("workers", "+4", "a sign"),
    ("memory-gib-per-worker", "8.0", "a float where the manifest needs an integer"),
    ("seed", "-0", "a sign"),
    ("learning-rate", "5e-324", "an exponent (subnormal: 0 in float32)"),
    ("learning-rate", "1E-3", "an exponent"),
    ("cpu-per-worker", ".5", "no integer part"),
    ("warm-cache", "True", "Argo's `when` compares the text: 'True' == true is false"),
    ("warm-cache", "yes", "YAML 1.1 boolean, not Argo's"),
    ("checkpoint-every-steps", "10000000", "no bound: a checkpoint never written"),
    ("dataset-uri", "s3://b/{{workflow.uid}}/", "an Argo tag a later substitution pass resolves"),
    ("model-name", "a\u2028b", "a line separator YAML reads as a line break"),
]


@pytest.mark.parametrize("name,value,why", MISREAD, ids=[f"{n}={v!r}" for n, v, _ in MISREAD])
def test_C22_a_value_is_accepted_only_in_the_spelling_every_reader_agrees_on(name, value, why):
    code, err = _validate({name: value})
    assert code == 1 and f"parameter {name}:" in err, (why, err)


def test_C22_the_misreadings_are_real():
    """What the refused spellings would do downstream: a YAML reader takes 010 as 8 (torchrun's
    --nnodes=010 as 10), 1_0 as 10, 0x1 as 1 — so the gang job takes no such text as it is and is
    refused (test_gang_manifest_values.py); the warm step's `when` compares the text "True" with
    "true" (the local runner's `when`, the comparison Argo makes)."""
    from pipectl.pipelines.launchers.base import refusal
    from pipectl.pipelines.substitution import evaluate_when

    assert yaml.safe_load("x: 010")["x"] == 8
    assert yaml.safe_load("x: 1_0")["x"] == 10 and yaml.safe_load("x: 0x1")["x"] == 1
    assert refusal(_train_job({"workers": "010"})).startswith("parameter workers: 010 is refused")
    when = TEMPLATES["training"]["dag"]["tasks"][2]["when"]
    assert not evaluate_when(substitute(when, {"workflow.parameters.warm-cache": "True"}, where="test"), "warm")
    assert evaluate_when(substitute(when, {"workflow.parameters.warm-cache": "true"}, where="test"), "warm")


def test_C22_every_value_the_cli_writes_is_read_back_the_same():
    """The CLI writes canonical text (floats never with an exponent) and validate accepts it."""
    params = TrainingParameters(learning_rate=1e-7, cpu_per_worker=0.5, promotion_threshold=0.0, warm_cache=True)
    args = params.as_arguments()
    assert args["learning-rate"] == "0.0000001" and args["warm-cache"] == "true"
    assert _validate(args) == (0, "")
    assert TrainingParameters.from_overrides(args) == params


@pytest.mark.parametrize("value", ["1", "10", "1024"])
def test_C22_canonical_integers_pass(value):
    assert _validate({"workers": value, "memory-gib-per-worker": value})[0] == 0
