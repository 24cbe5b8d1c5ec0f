"""The gang job's manifest takes no parameter text as it is: every value built from a parameter is a
typed conversion (a JSON string, an integer, a JSON object), so no value can change the job's shape,
and the job carries a label whose value is ``checked`` only when every parameter in it is in the one
spelling and within the bounds ``validate`` accepts; otherwise it names the parameter, and the API
server refuses the job (no label may hold that sentence), so no gang exists.

Checked with the workflow controller's own substitution code (tests/tools/argoexpr: argo-workflows
v4 util/template.Replace, both of its passes as ``SubstituteParams`` runs them), for both launchers,
whichever path the value took (an identity the admission policy exempts, a retry with overridden
parameters where no policy is installed, a template's own default). The local backend's evaluator
gives the same job.
"""

from __future__ import annotations

import re

import pytest
import yaml

from pipectl.components.contracts import GangShape, TrainingParameters, TrainInput
from pipectl.pipelines.launchers import LAUNCHERS
from pipectl.pipelines.launchers.base import PARAMETERS_CHECKED, PARAMETERS_LABEL, refusal
from pipectl.pipelines.substitution import substitute
from pipectl.pipelines.training import CompileConfig
from tests.tools.shape import key_paths

DEFAULTS = TrainingParameters().as_arguments()
TRAIN_ARGS_AND_SHAPE = set(TrainInput.model_fields) | set(GangShape.model_fields)
# a Kubernetes label value (apimachinery validation.IsValidLabelValue)
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

HOSTILE = [
    ("workers", "010", "YAML 1.1 octal: 8 pods for a gang torchrun sizes as 10"),
    ("workers", "0o12", "YAML 1.1 octal"),
    ("workers", "1_0", "YAML 1.1 drops the underscore"),
    ("workers", "+4", "a sign"),
    ("workers", "1.0", "a float where the manifest needs an integer"),
    ("workers", "4096", "beyond the bound"),
    ("workers", "1234567890123456789", "19 digits: Go's atoi reads them"),
    ("workers", "99999999999999999999", "past a 64-bit integer: Go's atoi gives the largest"),
    ("workers", "1\n  hostNetwork: true", "YAML of its own after a newline"),
    ("gpus-per-worker", "0x1", "YAML hexadecimal"),
    ("memory-gib-per-worker", "8.0", "a float where the manifest needs an integer"),
    ("cpu-per-worker", "0.0005", "finer than a millicore"),
    ("seed", "-0", "a sign"),
    ("learning-rate", "5e-324", "an exponent (subnormal: 0 in float32)"),
    ("learning-rate", "1E-3", "an exponent"),
    ("checkpoint-every-steps", "10000000", "no bound: a checkpoint never written"),
    ("checkpoint-every-steps", "99999999999999999999", "beyond a 64-bit integer"),
    ("gang-preflight", "True", "not Argo's spelling of a boolean"),
    ("gang-preflight", "yes", "a YAML 1.1 boolean"),
    ("lane", "standard\n  hostPID: true", "YAML of its own after a newline"),
    ("lane", "Urgent", "no lane"),
    ("lane", "standard\n", "a last newline (Go's $ is the end of the text, Python's passes it)"),
    ("learning-rate", "0.002\n", "a last newline"),
    ("architecture", "resnet18'", "a quote"),
    ("model-name", "x'\n          securityContext:\n            privileged: true\n          args:\n          - '", "breaks out of quotes"),
    ("model-name", "a\u2028b", "a line separator YAML reads as a line break"),
]


@pytest.fixture(scope="module")
def argo():
    from tests.tools.argo import ArgoExpr

    evaluator = ArgoExpr()
    yield evaluator
    evaluator.close()


def _train(launcher: str) -> dict:
    from pipectl.pipelines.builtin import build_training

    wt = build_training(CompileConfig(launcher=launcher)).to_dict()
    return next(t for t in wt["spec"]["templates"] if t["name"] == "train")


def _values(params: dict[str, str]) -> dict[str, str]:
    values = {f"inputs.parameters.{k}": v for k, v in {**DEFAULTS, **params}.items()}
    return values | {"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r",
                     "workflow.name": "training-abcde", "retries": "0", "inputs.parameters.gang-affinity": "{}"}


def _argo_job(argo, train: dict, params: dict[str, str]) -> dict:
    """The job the controller would send: globals first, then the inputs (operator SubstituteParams)."""
    first = argo.substitute(train, {"workflow.name": "training-abcde"})
    return yaml.safe_load(argo.substitute(first, _values(params))["resource"]["manifest"])



def _counts(launcher: str, job: dict) -> list:
    lau = LAUNCHERS[launcher]
    return [lau.gang_fields(job)[0], *(g.replicas for g in lau.replica_groups(job))]


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("name,value,why", HOSTILE, ids=[f"{n}={v!r}" for n, v, _ in HOSTILE])
def test_a_hostile_value_keeps_the_jobs_shape_and_the_api_server_refuses_the_job(argo, launcher, name, value, why):
    train = _train(launcher)
    job, default = _argo_job(argo, train, {name: value}), _argo_job(argo, train, {})
    assert key_paths(job) == key_paths(default), why
    assert all(isinstance(n, int) for n in _counts(launcher, job)), (why, _counts(launcher, job))
    label = job["metadata"]["labels"][PARAMETERS_LABEL]
    assert label.startswith(f"parameter {name}: {value} is refused, it must be "), label
    assert not LABEL_VALUE.fullmatch(label) or len(label) > 63, label  # the API server refuses the job
    assert refusal(job) == label
    local = yaml.safe_load(substitute(train["resource"]["manifest"], _values({name: value}), where="test"))
    assert local == job  # the local backend reads the same job, and refuses it (refusal)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
@pytest.mark.parametrize("workers", ["1", "10", "1024"])
def test_canonical_values_are_checked_and_every_reader_of_the_gang_size_agrees(argo, launcher, workers):
    train = _train(launcher)
    job = _argo_job(argo, train, {"workers": workers, "gpus-per-worker": "8", "processes-per-worker": "8"})
    assert job["metadata"]["labels"][PARAMETERS_LABEL] == PARAMETERS_CHECKED and refusal(job) is None
    lau = LAUNCHERS[launcher]
    assert lau.gang_fields(job)[0] == sum(g.replicas for g in lau.replica_groups(job)) == int(workers)
    pod = lau.replica_groups(job)[0].pod_spec
    assert f"--nnodes={workers}" in pod["containers"][0]["command"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_two_hostile_values_are_both_named(argo):
    job = _argo_job(argo, _train("volcano"), {"workers": "010", "seed": "-0"})
    label = job["metadata"]["labels"][PARAMETERS_LABEL]
    assert "parameter workers: 010" in label and "parameter seed: -0" in label, label


def test_a_gang_affinity_that_is_no_json_stays_out_of_the_jobs_shape(argo):
    train = _train("volcano")
    first = argo.substitute(train, {"workflow.name": "training-abcde"})
    values = _values({}) | {"inputs.parameters.gang-affinity": "{}\n      hostNetwork: true"}
    job = yaml.safe_load(argo.substitute(first, values)["resource"]["manifest"])
    pod = job["spec"]["tasks"][0]["template"]["spec"]
    assert pod["affinity"] is None and "hostNetwork" not in pod


def test_lint_names_a_default_the_api_server_would_refuse():
    from pipectl.pipelines.builtin import build_training
    from pipectl.pipelines.lint import lint_objects

    wt = build_training().to_dict()
    assert lint_objects([("test", wt)]) == []
    next(p for p in wt["spec"]["arguments"]["parameters"] if p["name"] == "workers")["value"] = "010"
    found = [str(f) for f in lint_objects([("test", wt)])]
    assert any("refuse the gang job" in f and "parameter workers: 010" in f for f in found), found


# The train step (every process of the gang) reads the same arguments as text: it holds them to the
# same spelling and bounds as validate, so the gang never trains with a value validate refuses.
TRAIN_ARGS = [(n, v) for n, v, _ in HOSTILE if n.replace("-", "_") in TrainInput.model_fields]


@pytest.mark.parametrize("name,value", TRAIN_ARGS, ids=[f"{n}={v!r}" for n, v in TRAIN_ARGS])
def test_the_train_step_refuses_what_validate_refuses(name, value):
    from pydantic import ValidationError

    from pipectl.components.runtime import build_parser

    args = {"shards-uri": "s3://b/s/", "run-uri": "s3://b/r", "workflow-name": "w",
            **{k: v for k, v in DEFAULTS.items() if k.replace("-", "_") in TrainInput.model_fields}}
    argv = [x for k, v in {**args, name: value}.items() for x in (f"--{k}", v)]
    parsed = {k: v for k, v in vars(build_parser(TrainInput, "train").parse_args(argv)).items() if v is not None}
    parsed.pop("outputs_dir", None)
    with pytest.raises(ValidationError, match=name.replace("-", "_")):
        TrainInput.model_validate(parsed)
    assert TrainInput.model_validate({**parsed, name.replace("-", "_"): DEFAULTS[name]})


def test_a_pipelines_own_parameter_reaches_the_gang_as_one_string(argo):
    """A team pipeline's parameter (``PIPECTL_PARAM_<NAME>``), substituted by the controller in its
    first pass (the workflow's parameters), stays one env value whatever its text."""
    from pydantic import Field

    from pipectl.sdk import Parameters, Pipeline, preprocess, stage, train

    class Free(Parameters):
        note: str = Field("hello", description="Free text.")

    wt = Pipeline("free", [stage(), preprocess(), train()], parameters=Free).build().to_dict()
    template = next(t for t in wt["spec"]["templates"] if t["name"] == "train")
    payload = "x', privileged: '1\"\n      hostPID: true"
    first = argo.substitute(template, {"workflow.name": "training-abcde", "workflow.parameters.note": payload})
    job = yaml.safe_load(argo.substitute(first, _values({}))["resource"]["manifest"])
    pod = job["spec"]["tasks"][0]["template"]["spec"]
    assert {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}["PIPECTL_PARAM_NOTE"] == payload
    assert key_paths(job) == key_paths(_argo_job(argo, _train("volcano"), {})) | {".spec.tasks[].template.spec.containers[].env[].value"}


@pytest.mark.parametrize("payload", ["{{inputs.parameters.lane}}", "{{=inputs.parameters['lane']}}",
                                     "{{=sprig.b64dec('Ig==')}}",  # '"': would end the string
                                     "{{=sprig.b64dec('eAogICAgICAgIGhvc3RQSUQ6IHRydWUK')}}",  # 'x\n  hostPID: true'
                                     "{ {{{ }} \\u007b \\ \"' é\u2028"])
def test_a_pipelines_own_parameter_holding_a_tag_is_not_read_again_by_the_inputs_pass(argo, payload):
    """The controller's second pass (the inputs) reads the text its first pass (the workflow's
    parameters) wrote: a team parameter holding ``{{`` reaches the pod as typed, never evaluated."""
    from pydantic import Field

    from pipectl.sdk import Parameters, Pipeline, preprocess, stage, train

    class Free(Parameters):
        note: str = Field("hello", description="Free text.")

    wt = Pipeline("free", [stage(), preprocess(), train()], parameters=Free).build().to_dict()
    template = next(t for t in wt["spec"]["templates"] if t["name"] == "train")
    first = argo.substitute(template, {"workflow.name": "training-abcde", "workflow.parameters.note": payload})
    job = yaml.safe_load(argo.substitute(first, _values({}))["resource"]["manifest"])
    env = {e["name"]: e.get("value") for e in job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"]}
    assert env["PIPECTL_PARAM_NOTE"] == payload
    local = substitute(template["resource"]["manifest"], _values({}) | {"workflow.parameters.note": payload}, where="test")
    assert yaml.safe_load(local) == job


SPELLINGS = ["1", "1.0", "1.000", "1.0000", "0.001", "0.0001", "10.000000000001", "0.0000000000000001",
             "0.00000000000000001", "1.00000000000000000", "512.000", "2147483647", "999999999999999999"]


@pytest.mark.parametrize("name", sorted(n for n in DEFAULTS if n.replace("-", "_") in TrainingParameters.model_fields
                                        and TrainingParameters.model_fields[n.replace("-", "_")].annotation in (int, float)
                                        and n.replace("-", "_") in TRAIN_ARGS_AND_SHAPE))
def test_what_validate_accepts_the_gang_job_checks(argo, name):
    """A number validate accepts is one the gang job's label checks: else the run would pass validate,
    stage and preprocess and then have its gang refused by the API server (cpu-per-worker=1.0000)."""
    train = _train("volcano")
    for value in SPELLINGS:
        try:
            TrainingParameters.from_overrides({name: value})
        except ValueError:
            continue
        label = _argo_job(argo, train, {name: value})["metadata"]["labels"][PARAMETERS_LABEL]
        assert label == PARAMETERS_CHECKED, (name, value, label)


@pytest.mark.parametrize("gpus,processes,checked", [("8", "1", False), ("1", "8", False), ("0", "4", True), ("4", "4", True)])
def test_the_gang_job_holds_one_process_per_gpu_as_validate_does(argo, gpus, processes, checked):
    """validate's rule across two parameters (processes-per-worker equals gpus-per-worker on GPU
    pods) holds for a value that never met validate too: a retry with overridden parameters."""
    for launcher in sorted(LAUNCHERS):
        train = _train(launcher)
        params = {"gpus-per-worker": gpus, "processes-per-worker": processes}
        label = _argo_job(argo, train, params)["metadata"]["labels"][PARAMETERS_LABEL]
        local = yaml.safe_load(substitute(train["resource"]["manifest"], _values(params), where="test"))
        assert local["metadata"]["labels"][PARAMETERS_LABEL] == label
        if checked:
            assert label == PARAMETERS_CHECKED
        else:
            assert label == f"parameter processes-per-worker: {processes} is refused, it must equal gpus-per-worker ({gpus}) on GPU pods"
            assert not LABEL_VALUE.fullmatch(label)
