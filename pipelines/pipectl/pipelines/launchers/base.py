"""What every launcher shares: the gang's pod, the job's name, and the :class:`Launcher` interface.

Every pod of the gang runs the same ``torchrun`` line, through pipectl's wrapper that keeps the
workers' exit code (torchrun itself exits 1 for any failure: components/pipectl/components/train/launch.py)::

    python -m pipectl.components.train.launch --nnodes=<workers> --node-rank=<pod index>
             --nproc-per-node=<processes per worker> --master-addr=$(MASTER_ADDR)
             --master-port=$(MASTER_PORT) -m pipectl.components.train --<TrainInput field> ...

so torchrun gives each process WORLD_SIZE = workers x processes per worker and
RANK = node_rank x processes per worker + local_rank (field case C04), and every pod agrees on
the rank-0 pod as master. Kubernetes expands ``$(VAR)`` in commands from the container's env.
The train arguments are :class:`TrainInput`'s fields and the gang's shape is :class:`GangShape`:
the train step's input parameters are exactly those (:data:`TRAIN_STEP_INPUTS`).

No parameter's text reaches the manifest as it is: the manifest is built as data and every value
taken from a parameter is an Argo expression tag whose result is JSON (:func:`text`,
:func:`integer`, :func:`json_input`), so a value is a string, an integer or an object whatever its
text (a quote, a newline or YAML of its own stays inside its string), and replica counts and
minAvailable are integers (C03). The job carries :data:`PARAMETERS_LABEL`, whose value is
``checked`` only when every parameter of the job is in the one spelling and within the bounds
the ``validate`` step accepts (C22: ``workers=010`` is 10 there but 8 to a YAML reader); otherwise
it is a sentence naming the parameter, which no label may hold, so the API server refuses the job
and quotes the sentence: nothing of the gang is created, whichever path the value took.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml

from pipectl.components.contracts import _MODEL_NAME, NUMBER_TEXT_MAX, GangShape, RunLayout, TrainInput
from pipectl.components.pipeline_parameters import env_name
from pipectl.components.train.preemption import GRACE_PERIOD_S
from pipectl.components.names import (
    LANE_TAINT_KEY,
    METRICS_PORT,
    METRICS_PORT_ENV,
    METRICS_PORT_NAME,
    MLFLOW_SECRET,
    NODE_NAME_ENV,
    POD_NAME_ENV,
    OUTPUTS_DIR,
    PUBLISH_ONNX_ENV,
    RETRY_OOM_ENV,
    STEP_LABEL,
    STORE_CONFIGMAP,
    STORE_SECRET,
    WORKFLOW_LABEL,
    kebab,
    lane_object_name,
    team_queue_name,
)
from pipectl.pipelines.autoscaling import DO_NOT_DISRUPT, GPU_TOLERATION
from pipectl.pipelines.fabric import FabricProfile
from pipectl.pipelines.security import TMP_VOLUME_NAME, restricted_container_security_context, tmp_volume, restricted_pod_security_context

MASTER_PORT = 29500
NODE_NAME_FIELD = "spec.nodeName"
"""Downward API field of a gang pod's node (env :data:`~pipectl.components.names.NODE_NAME_ENV`)."""
POD_NAME_FIELD = "metadata.name"
"""The downward API's pod name (a gang pod's ``fieldRef``; locally ``<job>-<group>-<index>``)."""
JOB_NAME = "{{workflow.name}}-train"
"""ONE gang job per run (C18): every attempt of the train step, retried in place after its launcher pod
was lost (evicted, node shut down) or after a backoff (the pod deleted), applies the same name, so
it ADOPTS the gang that is still training instead of starting a second one beside it (two gangs
would write one run's checkpoints and take two slots of the lane). Server-side apply of an
unchanged manifest changes nothing on the live job; the attempt then waits for its end. A job
that ended failed is never adopted: the ``gang-release`` exit handler deletes the run's jobs when
the workflow ends other than Succeeded, and ``pipectl retry`` deletes a failed job before an
in-place retry (:mod:`pipectl.components.gang`)."""

TRAIN_FIXED = {"workflow_name": "{{workflow.name}}"}
"""TrainInput fields the template fixes instead of taking them as step inputs."""
TRAIN_PER_PIPELINE = ("function",)
"""TrainInput fields a pipeline's definition fixes (:attr:`GangConfig.function`), never a run's parameter."""
TRAIN_ARGS: tuple[str, ...] = tuple(n for n in TrainInput.model_fields if n not in TRAIN_FIXED and n not in TRAIN_PER_PIPELINE)
TRAIN_STEP_INPUTS: tuple[str, ...] = TRAIN_ARGS + tuple(GangShape.model_fields)
"""Input parameters of the train step (snake_case): TrainInput's (less the fixed ones), then GangShape's."""


GANG_AFFINITY_INPUT = "gang-affinity"
"""The one input of the train step besides its contracts: the gang pods' ``affinity`` as JSON
(on the first attempt the site's topology placement, :mod:`pipectl.pipelines.topology`, or ``{}``).
After the gang preflight named slow nodes, the ``gang-avoid`` step writes the next attempt's
(:mod:`pipectl.components.gang.avoid`): the workflow's parameters never reach it."""


PARAMETERS_LABEL = "pipectl.io/parameters"
"""Label of the gang job: ``checked`` when every parameter in it passed :func:`parameters_check`."""
PARAMETERS_CHECKED = "checked"


class Bare(str):
    """A manifest value :func:`dump_manifest` writes as it is, unquoted: an Argo expression tag
    whose result is JSON (a quoted string, a number, an object)."""


def _ref(name: str) -> str:
    """The expression of train-step input ``name`` (snake_case); KeyError for any other name."""
    if name not in TRAIN_STEP_INPUTS and name != "gang_affinity":
        raise KeyError(f"{name!r} is not an input of the train step: {TRAIN_STEP_INPUTS}")
    return "inputs.parameters['%s']" % kebab(name)


def _literal(text: str) -> str:
    """``text`` as an expression string literal (no backslash: never needed here)."""
    if "\\" in text or "'" in text:
        raise ValueError(f"{text!r}: a literal of the gang manifest holds no quote or backslash")
    return f"'{text}'"


def text(template: str) -> Bare | str:
    """A string of the manifest with train-step inputs in it (``"--nnodes={workers}"``), as ONE
    JSON string whatever the inputs' text; a template without ``{name}`` is returned as it is."""
    import string

    parts = []
    for literal, field, _, _ in string.Formatter().parse(template):
        if literal:
            parts.append(_literal(literal))
        if field is not None:
            parts.append(_ref(field))
    if len(parts) == 1 and parts[0].startswith("'"):
        return template
    return Bare("{{=toJson(%s)}}" % " + ".join(parts))


def integer(name: str, minus: int = 0) -> Bare:
    """Train-step input ``name`` as a JSON integer (less ``minus``); text that is no integer reads
    as 0 here and is refused by :func:`parameters_check`."""
    return Bare("{{=sprig.atoi(%s)%s}}" % (_ref(name), f" - {minus}" if minus else ""))


def json_input(name: str) -> Bare:
    """Train-step input ``name`` holding JSON (the gang affinity) as that JSON value; text that is
    no JSON becomes ``null``."""
    return Bare("{{=toJson(sprig.fromJson(%s))}}" % _ref(name))


def workflow_parameter(name: str) -> Bare:
    """The workflow parameter ``name`` (kebab-case) as a JSON string, every ``{`` in it written as
    the escape ``\\u007b`` (the same string to a JSON or YAML reader). The controller substitutes
    the workflow's parameters first and then reads the text that pass wrote for the inputs' tags:
    a value holding ``{{`` would be a tag there, and its result text as it is (a quote could end
    the string). ``ew==`` is ``{`` in base64: no brace may stand inside a tag."""
    return Bare("{{=sprig.replace(sprig.b64dec('ew=='), '\\\\u007b', toJson(workflow.parameters[%s]))}}" % _literal(name))


def _rule(name: str) -> tuple[str, str] | None:
    """(expression true when the input's text is what ``validate`` accepts, what it must be) for a
    train-step input that is a workflow parameter; None for the others (the step's own values)."""
    import enum

    import annotated_types as at

    from pipectl.components.contracts import TrainingParameters

    field = TrainingParameters.model_fields.get(name)
    if field is None:
        return None
    ref, kind = _ref(name), field.annotation
    bounds = {k: getattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt") if hasattr(m, k)}
    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    if kind is bool:
        return f"sprig.regexMatch('^(true|false)$', {ref})", "true or false"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        values = [m.value for m in kind]
        assert all(re.fullmatch(r"[a-z0-9-]+", v) for v in values), values
        return f"sprig.regexMatch('^({'|'.join(values)})$', {ref})", "one of " + ", ".join(values)
    # no braces in a pattern: Argo reads "}}" as the end of the tag
    if kind is int:
        conv, spelled = "sprig.atoi", "a plain integer"
        pattern = "^(0|[1-9][0-9]*)$"
    elif kind is float:
        step = next((m.multiple_of for m in field.metadata if isinstance(m, at.MultipleOf)), None)
        fraction = "[0-9]+" if step is None else "[0-9]" + "[0-9]?" * (-decimal_exponent(step) - 1)
        conv, spelled = "sprig.float64", "a plain decimal"
        pattern = f"^(0|[1-9][0-9]*)([.]{fraction})?$"
    elif name == "model_name":
        # the contract's pattern with its one bounded repeat as a length check (no braces in a tag)
        longest = re.search(r"\{0,([0-9]+)\}", _MODEL_NAME.pattern)
        pattern = _MODEL_NAME.pattern.replace(longest.group(0), "*")
        return (f"sprig.regexMatch({_literal(pattern)}, {ref}) and len({ref}) <= {int(longest.group(1)) + 1}",
                "1 to 100 letters, digits, dots, underscores or dashes")
    else:
        return None
    checks = [f"sprig.regexMatch({_literal(pattern)}, {ref})", f"len({ref}) <= {NUMBER_TEXT_MAX}"]
    checks += [f"{conv}({ref}) {ops[k]} {v!r}" for k, v in bounds.items()]
    limits = " and ".join(f"{ops[k]} {v}" for k, v in bounds.items())
    return " and ".join(checks), f"{spelled} {limits}".strip()


def decimal_exponent(step: float) -> int:
    """The decimal exponent of a ``multiple_of`` step (0.001: -3)."""
    import decimal

    return decimal.Decimal(str(step)).normalize().as_tuple().exponent


def parameters_check() -> Bare:
    """The value of :data:`PARAMETERS_LABEL`: ``checked`` when every train-step input that is a
    workflow parameter is in the spelling and within the bounds ``validate`` accepts (the same
    contract, :class:`~pipectl.components.contracts.TrainingParameters`); otherwise one sentence
    per input that is not, naming it, which the API server refuses as a label value."""
    refused = []
    for name in TRAIN_STEP_INPUTS:
        if (rule := _rule(name)) is not None:
            check, must = rule
            message = f"{_literal(f'parameter {kebab(name)}: ')} + {_ref(name)} + {_literal(f' is refused, it must be {must}')}"
            refused.append(f"sprig.ternary('', {message}, {check})")
    # validate's one rule across parameters of the gang (TrainingParameters._one_process_per_gpu)
    gpus, procs = f"sprig.atoi({_ref('gpus_per_worker')})", f"sprig.atoi({_ref('processes_per_worker')})"
    message = (f"'parameter processes-per-worker: ' + {_ref('processes_per_worker')} + "
               f"' is refused, it must equal gpus-per-worker (' + {_ref('gpus_per_worker')} + ') on GPU pods'")
    refused.append(f"sprig.ternary('', {message}, {gpus} == 0 or {procs} == {gpus})")
    return Bare("{{=toJson(sprig.default(%s, sprig.join('; ', sprig.compact([%s]))))}}"
                % (_literal(PARAMETERS_CHECKED), ", ".join(refused)))


def refusal(job: dict) -> str | None:
    """Why the API server refuses ``job`` for its parameters (the sentence :func:`parameters_check`
    wrote), or None when they were checked or the job has no such label."""
    value = (job.get("metadata", {}).get("labels") or {}).get(PARAMETERS_LABEL, PARAMETERS_CHECKED)
    return None if value == PARAMETERS_CHECKED else str(value)


def dump_manifest(manifest: dict) -> str:
    """YAML text of ``manifest`` with every :class:`Bare` value written unquoted."""
    bare: list[str] = []

    def mark(obj: Any) -> Any:
        if isinstance(obj, Bare):
            bare.append(str(obj))
            return f"__PIPECTL_BARE_{len(bare) - 1}__"
        if isinstance(obj, dict):
            return {k: mark(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [mark(v) for v in obj]
        return obj

    text_ = yaml.safe_dump(mark(manifest), sort_keys=False, width=1 << 20)
    return re.sub(r"__PIPECTL_BARE_([0-9]+)__", lambda m: bare[int(m.group(1))], text_)


def job_labels() -> dict[str, str]:
    """The labels of the gang's pods (the run and the step)."""
    return {WORKFLOW_LABEL: "{{workflow.name}}", STEP_LABEL: "train"}


def job_metadata() -> dict:
    """The gang job's name and labels: the pods', and :data:`PARAMETERS_LABEL`."""
    return {"name": JOB_NAME, "labels": {**job_labels(), PARAMETERS_LABEL: parameters_check()}}


@dataclass(frozen=True)
class GangConfig:
    """Compile-time settings of the gang's pods."""

    image: str
    service_account: str
    """ServiceAccount of the gang's pods (no Role; its token is not mounted)."""
    shm_gib: int
    tmp_gib: int = 20
    """Size limit of the pods' writable /tmp (:attr:`CompileConfig.step_tmp_gib`)."""
    max_restarts: int = 6
    """Whole-gang restarts for infrastructure failures: the retry policy's ``infra_limit`` (Volcano's
    ``maxRetry`` is one more: :func:`pipectl.pipelines.launchers.volcano.max_retry`)."""
    retry_oom: bool = False
    """The retry policy's ``retry_oom``: a training process OOM-killed restarts the gang (see
    :data:`~pipectl.components.names.RETRY_OOM_ENV`) instead of ending it as a code failure."""
    entry: tuple[str, ...] = ()
    """The user's training code instead of pipectl's: torchrun's target (``("-m", "mypkg.train",
    "--flag", ...)`` or ``("train.py", ...)``); it reads the train step's inputs from the
    environment (:func:`train_env`). Empty: pipectl's own ``-m pipectl.components.train``."""
    exports_onnx: bool = False
    """With ``entry``: the user's code writes ``model.onnx`` and node rank 0 publishes it
    (:data:`~pipectl.components.names.PUBLISH_ONNX_ENV`)."""
    function: str = ""
    """The user's train function (``mypkg.train:train``) that pipectl's train step runs with its
    TrainContext; empty: pipectl's own. Ignored with ``entry``."""
    parameters: tuple[str, ...] = ()
    """The pipeline's own parameters (kebab-case names): each pod gets each as
    ``PIPECTL_PARAM_<NAME>`` (:meth:`pipectl.sdk.Parameters.from_env` reads them)."""
    fabric: FabricProfile | None = None
    """The site's network settings for the collectives (NCCL/gloo environment, RDMA devices)."""
    team: str = ""
    """The team whose namespace the template is rendered for (the site's ``teams``): the gang uses
    the team's queue of its lane; empty: the lane's own queue."""

    def queue(self) -> Bare | str:
        """The gang's Volcano queue: the team's queue of the run's lane, or the lane's own."""
        return text(team_queue_name(self.team, "{lane}") if self.team else lane_object_name("{lane}"))


TRAIN_ENV_PREFIX = "PIPECTL_TRAIN_"
"""The user's training code reads the train step's inputs as ``PIPECTL_TRAIN_<FIELD>``
(``PIPECTL_TRAIN_SHARDS_URI``, ``PIPECTL_TRAIN_RUN_URI``, ``PIPECTL_TRAIN_EPOCHS``, ...)."""


def train_env() -> list[dict]:
    """The environment contract of user training code: every :class:`TrainInput` field as
    ``PIPECTL_TRAIN_<FIELD>``, plus the run's checkpoint folder ``PIPECTL_TRAIN_CHECKPOINTS_URI``
    (:attr:`RunLayout.checkpoints_uri`: the same for every attempt of the run, so a restarted gang
    finds what the last one wrote there) and the outputs folder; rank and world size come from
    torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``)."""
    env = [{"name": TRAIN_ENV_PREFIX + n.upper(), "value": text("{%s}" % n)} for n in TRAIN_ARGS]
    env += [{"name": TRAIN_ENV_PREFIX + n.upper(), "value": v} for n, v in TRAIN_FIXED.items()]
    return env + [{"name": TRAIN_ENV_PREFIX + "CHECKPOINTS_URI", "value": text(RunLayout(run_uri="{run_uri}").checkpoints_uri)},
                  {"name": TRAIN_ENV_PREFIX + "OUTPUTS_DIR", "value": OUTPUTS_DIR}]


def _train_command(cfg: GangConfig, node_rank: str) -> list:
    """torchrun (through pipectl's exit-code wrapper) with pipectl's training code or the user's."""
    command = [
        "python", "-m", "pipectl.components.train.launch",
        text("--nnodes={workers}"),
        f"--node-rank={node_rank}",
        text("--nproc-per-node={processes_per_worker}"),
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
    ]
    if cfg.entry:
        return command + list(cfg.entry)
    command += ["-m", "pipectl.components.train"]
    for name in TRAIN_ARGS:
        command += [f"--{kebab(name)}", text("{%s}" % name)]
    for name, value in TRAIN_FIXED.items():
        command += [f"--{kebab(name)}", value]
    if cfg.function:
        command += ["--function", cfg.function]
    return command + ["--outputs-dir", OUTPUTS_DIR]


def _metrics_endpoint(cfg: GangConfig) -> tuple[list[dict], list[dict]]:
    """(env, container ports) of the step anatomy's Prometheus endpoint: pipectl's training loop
    serves its ranks' figures on the ``metrics`` port (:mod:`pipectl.components.train.exporter`,
    scraped through the PodMonitor ``pipectl-train``); a team's own torchrun code (``entry``) does not."""
    if cfg.entry:
        return [], []
    return [{"name": METRICS_PORT_ENV, "value": str(METRICS_PORT)}], [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}]


def pod_template(cfg: GangConfig, node_rank: str, env: list[dict]) -> dict:
    """Pod of the gang: torchrun, store settings from ConfigMap/Secret, GPUs, /dev/shm (C06).

    ``node_rank``: what the launcher gives each pod as its index (``$(VC_TASK_INDEX)``, ``$(RANK)``).
    """
    command = _train_command(cfg, node_rank)
    env = env + [{"name": env_name(n), "value": workflow_parameter(n)} for n in cfg.parameters]
    if cfg.entry:
        env = env + train_env() + ([{"name": PUBLISH_ONNX_ENV, "value": "1"}] if cfg.exports_onnx else [])
    cpu, memory = text("{cpu_per_worker}"), text("{memory_gib_per_worker}Gi")
    fabric = cfg.fabric or FabricProfile()
    metrics_env, metrics_port = _metrics_endpoint(cfg)
    return {
        "metadata": {
            "labels": job_labels(),
            # no voluntary disruption under a running gang (Karpenter consolidation, CA scale-down)
            "annotations": dict(DO_NOT_DISRUPT),
        },
        "spec": {
            "restartPolicy": "Never",
            # long enough for torchrun to pass SIGTERM on and the gang to checkpoint its step
            "terminationGracePeriodSeconds": GRACE_PERIOD_S,
            # the launcher is then not PID 1 (the pod's pause process is): a PID 1 drops a SIGTERM
            # that comes before it has a handler, and the pod would keep its GPUs for the whole
            # grace period (pipectl.components.train.stop)
            "shareProcessNamespace": True,
            "serviceAccountName": cfg.service_account,
            # training code never calls the Kubernetes API: no token in the pods
            "automountServiceAccountToken": False,
            "securityContext": restricted_pod_security_context(),
            "priorityClassName": text(lane_object_name("{lane}")),
            # the site's topology placement or {} first; after the gang preflight named slow nodes, a
            # preferred anti-affinity to them beside it
            "affinity": json_input("gang_affinity"),
            "tolerations": [{"key": LANE_TAINT_KEY, "operator": "Equal", "value": text("{lane}"), "effect": "NoSchedule"},
                            dict(GPU_TOLERATION)],
            "containers": [
                {
                    "name": "pytorch",
                    "image": cfg.image,
                    "command": command,
                    "env": env + [{"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": NODE_NAME_FIELD}}},
                                  {"name": POD_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": POD_NAME_FIELD}}}]
                    + metrics_env
                    + ([{"name": RETRY_OOM_ENV, "value": "1"}] if cfg.retry_oom else []) + fabric.env(),
                    "envFrom": [
                        {"configMapRef": {"name": STORE_CONFIGMAP, "optional": True}},
                        {"secretRef": {"name": STORE_SECRET, "optional": True}},
                        # rank 0 logs to MLflow as the namespace's team (absent: an MLflow without auth)
                        {"secretRef": {"name": MLFLOW_SECRET, "optional": True}},
                    ],
                    "ports": [{"name": "pytorchjob-port", "containerPort": MASTER_PORT}] + metrics_port,
                    # requests = limits: Guaranteed QoS, never BestEffort (the kubelet's first eviction
                    # victims under node pressure, field case C07); values checked by `validate`
                    "resources": {
                        "requests": {"cpu": cpu, "memory": memory},
                        "limits": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": integer("gpus_per_worker"),
                                   **fabric.limits()},
                    },
                    "securityContext": restricted_container_security_context(),
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}, {"name": TMP_VOLUME_NAME, "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{cfg.shm_gib}Gi"}}, tmp_volume(cfg.tmp_gib)],
        },
    }


# ---------------------------------------------------------------- reading a job object

_CONDITION = re.compile(r"^\s*([\w.\-]+)\s*(==|=|!=|>=|<=|>|<|in|notin)\s*(.+?)\s*$")


def _lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def _terms(condition: str) -> list[str]:
    return re.split(r",(?![^()]*\))", condition)


def condition_holds(condition: str, obj: dict) -> bool:
    """Evaluate an Argo resource ``successCondition`` on ``obj``: every term must hold.

    The grammar pipectl's launchers use, as Argo reads it (Argo docs, "Resource template":
    label-selector syntax over JSON paths): comma-separated ``path op value`` terms, all of which
    must hold; ``op`` one of ``== = != > < >= <= in notin``, ``in``/``notin`` with ``(a, b)``.
    A missing path holds for no operator but ``!=``/``notin`` (as Argo: the job is not there yet).
    """
    for term in _terms(condition):
        m = _CONDITION.match(term)
        if not m:
            raise ValueError(f"condition {condition!r}: cannot read {term!r}")
        path, op, want = m.groups()
        have = _lookup(obj, path)
        if op in ("in", "notin"):
            values = [v.strip() for v in want.strip("()").split(",")]
            ok = have is not None and str(have) in values
            if (op == "in") != ok:
                return False
            continue
        if op == "!=":
            if have is not None and str(have) == want:
                return False
            continue
        if have is None:
            return False
        if op in ("==", "="):
            if str(have) != want:
                return False
            continue
        try:
            a, b = float(have), float(want)
        except (TypeError, ValueError):
            return False
        if not {">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[op]:
            return False
    return True


def failure_condition_holds(condition: str, obj: dict) -> bool:
    """Evaluate an Argo resource ``failureCondition`` on ``obj``: ANY term holding fails the step
    (argoexec ``matchConditions`` tries each requirement of the failure selector on its own,
    workflow/executor/resource.go, Argo v4.0.5)."""
    return any(condition_holds(term, obj) for term in _terms(condition))


@dataclass(frozen=True)
class ReplicaGroup:
    """One group of identical pods in a job: ``replicas`` (an int once substituted) of ``pod_spec``."""

    name: str
    replicas: Any
    pod_spec: dict


class Launcher(ABC):
    """One kind of gang job. A new launcher is one subclass in a file of its own and one line in
    :data:`pipectl.pipelines.launchers.LAUNCHERS`; the CLI's choices, ``pipectl lint``, the local
    backend, RBAC and retry clean-up all read it from there.

    Class attributes: ``name`` (the ``--launcher`` value), ``description`` (CLI help),
    ``api_version``/``kind``/``resource`` (the job's type and plural), ``success_condition`` /
    ``failure_condition`` (what Argo's resource template waits for; terminal states only, C02).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    api_version: ClassVar[str]
    kind: ClassVar[str]
    resource: ClassVar[str]
    success_condition: ClassVar[str]
    failure_condition: ClassVar[str]

    @property
    def api_group(self) -> str:
        return self.api_version.split("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/")[1]

    def handles(self, obj: dict) -> bool:
        """True when ``obj`` is a job of this launcher's kind."""
        return (obj.get("apiVersion"), obj.get("kind")) == (self.api_version, self.kind)

    gang_restart_limitation: ClassVar[str] = ""
    """Empty when the job restarts the WHOLE gang from its checkpoint after an infrastructure loss;
    otherwise why it cannot: `pipectl render` refuses such a launcher unless told to
    accept that a lost pod fails the training attempt."""

    def failed(self, obj: dict) -> bool:
        """The job ended failed: Argo's ``failure_condition`` holds on it (one rule, two readers)."""
        return failure_condition_holds(self.failure_condition, obj)

    def required_crds(self) -> tuple[str, ...]:
        """CRDs the cluster needs for this launcher (``pipectl doctor``): its job kind, and Volcano's
        queues and PodGroups, which every launcher's gang scheduling uses."""
        return (f"{self.resource}.{self.api_group}", "queues.scheduling.volcano.sh", "podgroups.scheduling.volcano.sh")

    def rbac_rule(self) -> dict:
        """What the train step's ServiceAccount may do on this one kind, nothing else:
        ``kubectl apply --server-side`` (create, patch) and argoexec's polling (get); the
        ``gang-release`` exit handler's list, watch and delete of the run's jobs."""
        return {"apiGroups": [self.api_group], "resources": [self.resource],
                "verbs": ["create", "get", "patch", "list", "watch", "delete"]}

    @abstractmethod
    def manifest(self, cfg: GangConfig) -> str:
        """The job as YAML text with Argo tags (the train step's ``resource.manifest``)."""

    @abstractmethod
    def replica_groups(self, job: dict) -> list[ReplicaGroup]:
        """The job's pod groups, in rank order (rank 0 in the first group)."""

    @abstractmethod
    def gang_fields(self, job: dict) -> tuple[Any, Any]:
        """``(minAvailable, queue)`` of the job's gang scheduling."""

    def pod_fields(self, job: str) -> dict[str, str]:
        """Downward-API fields (``fieldRef.fieldPath`` -> value) the operator gives the job's pods,
        for the local backend: e.g. the job-name label the pods' env reads."""
        return {}

    def local_gang_restarts(self, job: dict, exit_code: int) -> int:
        """How many times the job's operator restarts the WHOLE gang when one of its pods fails
        with ``exit_code`` (the job's own policy, as the local backend reads it); 0: the job fails.
        Default: never (a launcher with a :attr:`gang_restart_limitation`)."""
        return 0

    @abstractmethod
    def local_env(self, group: str, index: int, rank: int, pods: int, master_port: str) -> dict[str, str]:
        """What the operator or its plugins give pod ``index`` of ``group`` (global ``rank`` of
        ``pods``), for the local backend, where pods are processes on loopback."""
