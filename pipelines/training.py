"""The ``training`` pipeline, defined once with Hera: stage -> preprocess -> train -> evaluate -> register.

Pure: :func:`build_training` maps a :class:`CompileConfig` to a Hera ``WorkflowTemplate``;
nothing here does I/O. ``pipectl render`` prints it, ``pipectl submit`` sends it, and the local
backend (:mod:`pipectl.pipelines.local`) executes the very same compiled dict.

Each step's container arguments are generated from the component's Input contract
(``--<field> {{inputs.parameters.<field>}}``), so the template and the component cannot drift.
The ``train`` step is an Argo resource template that creates ONE Volcano Job (a gang:
``minAvailable`` = every pod), whose pods run ``torchrun`` with
``--nnodes=<workers> --node-rank=$(VC_TASK_INDEX) --nproc-per-node=<processes per worker>``:
WORLD_SIZE = workers x processes per worker (field case C04).
"""

from __future__ import annotations

import yaml
from hera.workflows import (
    DAG,
    Container,
    Env,
    Parameter,
    Resource,
    Task,
    WorkflowTemplate,
)
from hera.workflows.models import (
    ConfigMapEnvSource,
    EmptyDirVolumeSource,
    EnvFromSource,
    SecretEnvSource,
    ValueFrom,
    Volume,
    VolumeMount,
)
from pydantic import BaseModel, ConfigDict, Field

from pipectl.components.contracts import (
    EvaluateInput,
    EvaluateOutput,
    Lane,
    PreprocessInput,
    PreprocessOutput,
    PromotionMetric,
    RegisterInput,
    RegisterOutput,
    StageInput,
    StageOutput,
    TrainingParameters,
)

TEMPLATE_NAME = "training-v1"
OUTPUTS_DIR = "/tmp/outputs"
MASTER_PORT = 29500
STORE_CONFIGMAP = "pipectl-store"
STORE_SECRET = "pipectl-s3-credentials"


class CompileConfig(BaseModel):
    """What the compiled template depends on besides its run-time parameters."""

    model_config = ConfigDict(extra="forbid")

    bucket: str = Field("pipectl", description="Bucket for datasets, shards, checkpoints (PIPECTL_BUCKET).")
    namespace: str = Field("pipectl", description="Namespace of the WorkflowTemplate and its workflows.")
    light_image: str = Field("pipectl/step-light:0.1.0", description="Image for stage, evaluate, register.")
    train_image: str = Field("pipectl/step-train:0.1.0", description="Image with DALI and torch: preprocess, train.")
    service_account: str = Field("pipectl-workflow", description="ServiceAccount of workflow pods.")
    shm_gib: int = Field(2, ge=1, le=256, description="Size of the in-memory /dev/shm of training pods (C06).")


def kebab(name: str) -> str:
    return name.replace("_", "-")


def _input_params(names: list[str]) -> list[Parameter]:
    return [Parameter(name=kebab(n)) for n in names]


def _cli_args(names: list[str]) -> list[str]:
    args: list[str] = []
    for n in names:
        args += [f"--{kebab(n)}", "{{inputs.parameters.%s}}" % kebab(n)]
    return args


def _outputs(model: type[BaseModel]) -> list[Parameter]:
    return [
        Parameter(name=kebab(n), value_from=ValueFrom(path=f"{OUTPUTS_DIR}/{kebab(n)}"))
        for n in model.model_fields
    ]


def _store_env() -> list[EnvFromSource]:
    """Store endpoint/bucket/MLflow URI from a ConfigMap, credentials from a Secret (never literals)."""
    return [
        EnvFromSource(config_map_ref=ConfigMapEnvSource(name=STORE_CONFIGMAP, optional=True)),
        EnvFromSource(secret_ref=SecretEnvSource(name=STORE_SECRET, optional=True)),
    ]


def _step(name: str, image: str, module: str, contract: type[BaseModel], output: type[BaseModel], fixed: dict[str, str] | None = None) -> Container:
    """A container template running ``python -m pipectl.components.<module>``.

    Inputs are the contract's fields minus ``fixed`` (compile-time values baked into args).
    """
    fixed = fixed or {}
    names = [n for n in contract.model_fields if n not in fixed and contract.model_fields[n].is_required()]
    args = _cli_args(names)
    for n, v in fixed.items():
        args += [f"--{kebab(n)}", v]
    return Container(
        name=name,
        image=image,
        command=["python", "-m", f"pipectl.components.{module}"],
        args=args + ["--outputs-dir", OUTPUTS_DIR],
        inputs=_input_params(names),
        outputs=_outputs(output),
        env_from=_store_env(),
    )


TRAIN_INPUTS = [
    "shards_uri",
    "run_uri",
    "model_name",
    "epochs",
    "batch_size",
    "learning_rate",
    "checkpoint_every_steps",
    "seed",
    "workers",
    "processes_per_worker",
    "gpus_per_worker",
    "lane",
]


def volcano_job_manifest(cfg: CompileConfig) -> str:
    """The Volcano ``batch.volcano.sh/v1alpha1`` Job the ``train`` step creates (YAML text).

    One task ``worker`` with ``replicas: workers`` and ``minAvailable: workers`` (the whole gang
    binds or none does). Volcano's ``svc`` plugin gives pods stable DNS names
    ``<job>-worker-<i>.<job>`` and its ``env`` plugin sets ``VC_TASK_INDEX`` (docs:
    volcano.sh "Job plugins"). Replica counts are substituted unquoted so they stay integers (C03).
    """
    p = "{{inputs.parameters.%s}}"
    job = "{{workflow.name}}-train"
    train_args = []
    for n in ("shards_uri", "run_uri", "model_name", "epochs", "batch_size", "learning_rate", "checkpoint_every_steps", "seed"):
        train_args += [f"--{kebab(n)}", p % kebab(n)]
    manifest = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {
            "name": job,
            "labels": {"workflows.argoproj.io/workflow": "{{workflow.name}}", "pipectl.io/step": "train"},
        },
        "spec": {
            "schedulerName": "volcano",
            "minAvailable": "__WORKERS__",
            "queue": "pipectl-" + p % "lane",
            "priorityClassName": "pipectl-" + p % "lane",
            "maxRetry": 0,
            "plugins": {"svc": [], "env": []},
            "tasks": [
                {
                    "name": "worker",
                    "replicas": "__WORKERS__",
                    "template": {
                        "metadata": {
                            "labels": {"workflows.argoproj.io/workflow": "{{workflow.name}}", "pipectl.io/step": "train"},
                            "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
                        },
                        "spec": {
                            "restartPolicy": "Never",
                            "serviceAccountName": cfg.service_account,
                            "containers": [
                                {
                                    "name": "train",
                                    "image": cfg.train_image,
                                    "command": [
                                        "torchrun",
                                        f"--nnodes={p % 'workers'}",
                                        "--node-rank=$(VC_TASK_INDEX)",
                                        f"--nproc-per-node={p % 'processes-per-worker'}",
                                        "--master-addr=$(MASTER_ADDR)",
                                        "--master-port=$(MASTER_PORT)",
                                        "-m",
                                        "pipectl.components.train",
                                        *train_args,
                                        "--workflow-name",
                                        "{{workflow.name}}",
                                        "--outputs-dir",
                                        OUTPUTS_DIR,
                                    ],
                                    "env": [
                                        {"name": "MASTER_ADDR", "value": f"{job}-worker-0.{job}"},
                                        {"name": "MASTER_PORT", "value": str(MASTER_PORT)},
                                    ],
                                    "envFrom": [
                                        {"configMapRef": {"name": STORE_CONFIGMAP, "optional": True}},
                                        {"secretRef": {"name": STORE_SECRET, "optional": True}},
                                    ],
                                    "resources": {"limits": {"nvidia.com/gpu": "__GPUS__"}},
                                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
                                }
                            ],
                            "volumes": [
                                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{cfg.shm_gib}Gi"}}
                            ],
                        },
                    },
                }
            ],
        },
    }
    text = yaml.safe_dump(manifest, sort_keys=False)
    # Unquoted placeholders: after Argo substitutes them the YAML scalars parse as integers.
    return text.replace("__WORKERS__", p % "workers").replace("__GPUS__", p % "gpus-per-worker")


def _train_template(cfg: CompileConfig) -> Resource:
    return Resource(
        name="train",
        action="create",
        set_owner_reference=True,
        manifest=volcano_job_manifest(cfg),
        success_condition="status.state.phase == Completed",
        failure_condition="status.state.phase in (Failed, Aborted, Terminated)",
        inputs=_input_params(TRAIN_INPUTS),
    )


def _workflow_parameters() -> list[Parameter]:
    params = []
    for name, field in TrainingParameters.model_fields.items():
        default = field.default
        enum_values = None
        if name == "lane":
            enum_values = [lane.value for lane in Lane]
        elif name == "promotion_metric":
            enum_values = [m.value for m in PromotionMetric]
        value = default.value if hasattr(default, "value") else str(default)
        params.append(Parameter(name=kebab(name), value=value, description=field.description, enum=enum_values))
    return params


def _wf(name: str) -> str:
    return "{{workflow.parameters.%s}}" % kebab(name)


def build_training(cfg: CompileConfig | None = None) -> WorkflowTemplate:
    """The ``training-v1`` WorkflowTemplate for ``cfg`` (defaults when None)."""
    cfg = cfg or CompileConfig()
    run_uri = f"s3://{cfg.bucket}/runs/{{{{workflow.name}}}}"
    stage = _step("stage", cfg.light_image, "stage", StageInput, StageOutput, fixed={"bucket": cfg.bucket})
    preprocess = _step("preprocess", cfg.train_image, "preprocess", PreprocessInput, PreprocessOutput)
    preprocess.volume_mounts = [VolumeMount(name="dshm", mount_path="/dev/shm")]
    preprocess.volumes = [Volume(name="dshm", empty_dir=EmptyDirVolumeSource(medium="Memory", size_limit=f"{cfg.shm_gib}Gi"))]
    train = _train_template(cfg)
    evaluate = _step("evaluate", cfg.light_image, "evaluate", EvaluateInput, EvaluateOutput)
    register = _step("register", cfg.light_image, "register", RegisterInput, RegisterOutput)

    def task_args(names: dict[str, str]) -> list[Parameter]:
        return [Parameter(name=kebab(k), value=v) for k, v in names.items()]

    dag = DAG(
        name="training",
        tasks=[
            Task(name="stage", template=stage, arguments=task_args({"source_uri": _wf("dataset_uri")})),
            Task(
                name="preprocess",
                template=preprocess,
                dependencies=["stage"],
                arguments=task_args(
                    {
                        "manifest_uri": "{{tasks.stage.outputs.parameters.manifest-uri}}",
                        "output_uri": f"{run_uri}/shards/",
                        "image_size": _wf("image_size"),
                        "validation_fraction": _wf("validation_fraction"),
                        "max_corrupt_fraction": _wf("max_corrupt_fraction"),
                    }
                ),
            ),
            Task(
                name="train",
                template=train,
                dependencies=["preprocess"],
                arguments=task_args(
                    {
                        "shards_uri": "{{tasks.preprocess.outputs.parameters.shards-uri}}",
                        "run_uri": run_uri,
                        **{n: _wf(n) for n in TRAIN_INPUTS if n not in ("shards_uri", "run_uri")},
                    }
                ),
            ),
            Task(
                name="evaluate",
                template=evaluate,
                dependencies=["train"],
                arguments=task_args(
                    {
                        "shards_uri": "{{tasks.preprocess.outputs.parameters.shards-uri}}",
                        "train_output_uri": f"{run_uri}/train-output.json",
                        "model_name": _wf("model_name"),
                        "promotion_metric": _wf("promotion_metric"),
                        "promotion_threshold": _wf("promotion_threshold"),
                    }
                ),
            ),
            Task(
                name="register",
                template=register,
                dependencies=["evaluate"],
                arguments=task_args(
                    {
                        "evaluate_output_uri": f"{run_uri}/evaluate-output.json",
                        "model_name": _wf("model_name"),
                        "run_key": "{{workflow.uid}}",
                        "promotion_metric": _wf("promotion_metric"),
                    }
                ),
            ),
        ],
    )
    return WorkflowTemplate(
        name=TEMPLATE_NAME,
        namespace=cfg.namespace,
        entrypoint="training",
        service_account_name=cfg.service_account,
        labels={"app.kubernetes.io/part-of": "pipectl"},
        annotations={"workflows.argoproj.io/description": "Train, evaluate and register an image classifier."},
        arguments=_workflow_parameters(),
        templates=[dag, stage, preprocess, train, evaluate, register],
    )
