"""The templates of pipectl's built-in steps, defined once with Hera: validate, stage, warm,
preprocess, train, evaluate, register — and the WorkflowTemplate around a pipeline's DAG.

Pure: each ``<step>_templates(cfg)`` maps a :class:`CompileConfig` to Hera templates; nothing here
does I/O. Pipelines compose these steps (:mod:`pipectl.pipelines.composer`, public as
:mod:`pipectl.sdk`); the built-in ``training`` pipeline is one such composition
(:mod:`pipectl.pipelines.builtin`). ``pipectl render`` prints it, ``pipectl submit`` sends it, and
the local backend (:mod:`pipectl.pipelines.backends.runner`) executes the very same compiled dict.

Each step's container arguments are generated from the component's Input contract
(``--<field> {{inputs.parameters.<field>}}``), so the template and the component cannot drift.
The ``train`` step is an Argo resource template that creates ONE gang job (a Volcano Job or a
PyTorchJob: :mod:`pipectl.pipelines.launchers`) and holds a slot of its lane while it runs; the
DAG task ``train`` runs it through ``train-retry``, which retries it after a backoff without
holding the slot (C10). Every template carries the typed retry policy and lane settings of
:mod:`pipectl.pipelines.policy`.
"""

from __future__ import annotations

import importlib.metadata
import json
import re

from hera.workflows import (
    DAG,
    Container,
    Suspend,
    Parameter,
    Resource,
    Resources,
    Task,
    WorkflowTemplate,
)
from hera.workflows.models import (
    ArtifactLocation,
    Backoff,
    ExecutorConfig,
    ContinueOn,
    PodGC,
    TTLStrategy,
    RetryStrategy,
    ConfigMapEnvSource,
    ConfigMapKeySelector,
    Mutex,
    SemaphoreRef,
    WorkflowMetadata,
    Synchronization,
    EmptyDirVolumeSource,
    EnvFromSource,
    PodSecurityContext,
    SecurityContext,
    SecretEnvSource,
    ValueFrom,
    Volume,
    VolumeMount,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pipectl.components.contracts import (
    AvoidInput,
    AvoidOutput,
    DatasetMax,
    EvaluateInput,
    ReleaseInput,
    ReleaseOutput,
    EvaluateOutput,
    PrebuiltInput,
    PrebuiltOutput,
    PreprocessInput,
    PreprocessOutput,
    RegisterInput,
    RegisterOutput,
    StageInput,
    StageOutput,
    TrainingParameters,
    ValidateOutput,
    WarmInput,
    WarmOutput,
)
from pipectl.components.names import (
    LANE_LABEL,
    MLFLOW_SECRET,
    OUTPUTS_DIR,
    Lane,
    PART_OF,
    SEMAPHORE_CONFIGMAP,
    STORE_CONFIGMAP,
    STORE_SECRET,
    kebab,
    lane_object_name,
    template_name,
)
from pipectl.components.pipeline_parameters import SPECS_INPUT, ParameterSpec, parameter_model, specs_json
from pipectl.pipelines.launchers import DEFAULT_LAUNCHER, LAUNCHERS, GangConfig
from pipectl.pipelines.launchers.base import GANG_AFFINITY_INPUT, TRAIN_STEP_INPUTS, job_labels
from pipectl.pipelines.autoscaling import DO_NOT_DISRUPT, AutoscalingConfig
from pipectl.pipelines.fabric import FabricProfile
from pipectl.pipelines.tenancy import (
    EVERYONE_GROUPS,
    TeamSpec,
    cluster_gpu_ceiling,
    namespace_problem,
    own_team_problem,
    team_problems,
)
from pipectl.pipelines.topology import Topology
from pipectl.pipelines.policy import LANES, RetryPolicy, lane_toleration_for, step_metrics, training_metrics
from pipectl.pipelines.security import TMP_VOLUME_NAME, restricted_container_security_context, tmp_volume, restricted_pod_security_context


REGISTER_MUTEX = "pipectl-register-{{inputs.parameters.model-name}}"
"""Argo mutex of the register step: one per model name (namespace-local, Argo docs "Synchronization")."""
STEP_IMAGES = ("step-light", "step-train")
"""The step images (images/Dockerfile targets)."""
DEFAULT_REGISTRY = "pipectl"
IMAGE_VERSION = importlib.metadata.version("pipectl-ml")
"""The release tag of the step images (the package's version, pyproject.toml): what argo/ is rendered with."""
DEFAULT_S3_ENDPOINT = "http://rook-ceph-rgw-pipectl.rook-ceph.svc:80"
"""The README's Ceph (Rook's RGW service of the object store ``pipectl``)."""
DEFAULT_MLFLOW_URI = "http://mlflow.mlflow.svc:5000"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class CompileConfig(BaseModel):
    """What the compiled template depends on besides its run-time parameters."""

    model_config = ConfigDict(extra="forbid")

    bucket: str = Field("pipectl", description="Bucket for datasets, shards, checkpoints (PIPECTL_BUCKET).")
    namespace: str = Field("pipectl", description="Namespace of the WorkflowTemplate and its workflows.")
    registry: str = Field(DEFAULT_REGISTRY, pattern=r"^[a-z0-9]([a-z0-9.:_/-]*[a-z0-9])?$",
                          description="Registry and path the step images come from (e.g. registry.example.com/ml).")
    images: dict[str, str] = Field(
        default_factory=dict,
        description="Per step image (step-light, step-train): an immutable reference that replaces the release tag: "
        "a digest (sha256:<64 hex>) or a content tag (c-<hash>, what scripts/images.sh tags each build with), so a "
        "rebuilt image never reuses a tag a node may have cached.")
    s3_endpoint: str = Field(DEFAULT_S3_ENDPOINT, pattern=r"^https?://[^/\s?#@]+/?$",
                             description="The object store's S3 endpoint as step pods reach it (the pipectl-store ConfigMap, "
                             "Argo's artifact repository), e.g. https://s3.example.com; credentials go in the Secret, never here.")
    mlflow_uri: str = Field(DEFAULT_MLFLOW_URI, pattern=r"^https?://[^\s?#@]+$",
                            description="The MLflow tracking server as step pods reach it; also the Argo UI's link to a run.")
    argo_ui: str = Field("", pattern=r"^(https?://[^\s?#@]+)?$",
                         description="The Argo UI's address as users open it (e.g. https://argo.example.com): `submit --wait` "
                         "and `wait` end with the run's page there. Empty: only when ARGO_SERVER is set, at its address.")
    service_account: str = Field("pipectl-workflow", description="ServiceAccount of step pods: Argo's executor reports results (WorkflowTaskResults), nothing more.")
    launcher_service_account: str = Field("pipectl-launcher", description="ServiceAccount of the train step's resource pod: creates, gets and patches the gang job kind in use.")
    training_service_account: str = Field("pipectl-training", description="ServiceAccount of the gang's pods: no Role, token not mounted.")
    shm_gib: int = Field(2, ge=1, le=256, description="Size of the in-memory /dev/shm of training pods (C06).")
    step_cpu: float = Field(0.25, gt=0, le=64, description="CPU cores each step pod requests (no limit: it may burst), so no pod is BestEffort (C07).")
    step_memory_gib: float = Field(1, gt=0, le=1024, description="Memory each step pod requests in GiB (no limit).")
    preempting_max_pods: int = Field(32, ge=0, description="Pods this namespace may run in preempting lanes (urgent): its ResourceQuota.")
    preempting_max_gpus: int = Field(16, ge=0, description="GPUs those pods may request in all.")
    namespace_max_gpus: int = Field(64, ge=0, description="GPUs all pods of this namespace may request together, "
                                    "every lane (its ResourceQuota): a team's share of the cluster.")
    step_tmp_gib: int = Field(20, ge=1, le=4096, description="Size limit of the writable /tmp of every step and gang "
                              "pod (an emptyDir on the node's disk): a step that writes more is evicted, not the "
                              "node's other pods.")
    launcher: str = Field(DEFAULT_LAUNCHER, description=f"Gang job kind the train step creates: one of {', '.join(LAUNCHERS)}.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Retries by failure class; backoff from scale_up_s.")
    autoscaling: AutoscalingConfig = Field(default_factory=AutoscalingConfig,
                                           description="Karpenter NodePools and the urgent lane's buffer (argo/autoscaling/).")
    fabric: FabricProfile = Field(default_factory=FabricProfile,
                                  description="The gang's network: NCCL's interfaces, adapters, RoCE GID, log level, RDMA devices.")
    topology: Topology | None = Field(None, description="The gang's pods in one network domain: the node label naming "
                                      "a node's rack or block, preferred or required (none: no placement constraint).")
    cluster_gpus: int | None = Field(None, ge=1, description="GPUs the cluster holds at most: no team's max_gpus may be "
                                     "over it (none: the sum of the Karpenter GPU node pools' limit_gpus, when each has one).")
    team: str = Field("", pattern=r"^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)?$",
                      description="The team this namespace belongs to (a name under teams: in the cluster admin's site "
                      "file), when argo/namespace is rendered for a team's namespace: its gangs use the team's Volcano "
                      "queues (pipectl-team-<team>-<lane>), the only ones the team's namespace may use. Empty: the lanes' own.")
    teams: tuple[TeamSpec, ...] = Field((), description="Teams sharing the cluster, each with a namespace of its own "
                                        "(argo/cluster/teams/): name, namespace, groups (bound to pipectl-submitter), "
                                        "max_gpus, lane_gpus per lane (urgent granted only when listed), model_prefix, s3_prefix.")
    admin_groups: tuple[str, ...] = Field((), description="Identity groups of the platform admins, besides Kubernetes' "
                                          "system:masters: only they may set, change or remove pipectl's labels on a "
                                          "Namespace (pipectl.io/team, lanes.pipectl.io/<lane>, pipectl.io/model-prefix, "
                                          "pipectl.io/submission-policy) and its pipectl.io/data-prefix annotation (the "
                                          "pipectl-namespaces admission policy). Name the group your admins apply "
                                          "argo/cluster as (on a managed cluster they are often not in system:masters).")
    admin_users: tuple[str, ...] = Field((), description="User names with the same right as admin_groups (e.g. the "
                                         "ServiceAccount of a GitOps controller that applies argo/cluster: "
                                         "system:serviceaccount:<namespace>:<name>).")
    lane_dataset_max: dict[Lane, DatasetMax] = Field(
        default_factory=dict, description="The largest dataset a lane takes, per lane: max_samples (images) and max_gib "
        "(GiB of staged files or shard files); a key left out keeps the lane's default (urgent 100000 images, 20 GiB; "
        "standard 5000000, 500 GiB; batch 100000000, 20480 GiB), null removes that bound. A bigger dataset is refused: "
        "at submit when its size is known then (staged, or shards you already have), else by stage or the shards step.")
    pipeline_parameters: tuple[ParameterSpec, ...] = Field(
        (), exclude=True, description="The pipeline's own parameters (set by Pipeline.build from its parameters class).")

    @field_validator("images")
    @classmethod
    def _image_references(cls, v: dict[str, str]) -> dict[str, str]:
        for name, ref in v.items():
            if name not in STEP_IMAGES:
                raise ValueError(f"unknown step image {name!r}: one of {', '.join(STEP_IMAGES)}")
            if not (_DIGEST.fullmatch(ref) or _TAG.fullmatch(ref)) or ref == "latest":
                raise ValueError(f"{name}={ref!r}: write a digest sha256:<64 hex> or a tag such as c-0123abcd (never latest)")
        return v

    def image(self, name: str) -> str:
        """The reference of step image ``name``: ``<registry>/<name>@sha256:…``, ``<registry>/<name>:<tag>``,
        or the release tag ``<registry>/<name>:<version>``."""
        ref = self.images.get(name, IMAGE_VERSION)
        return f"{self.registry}/{name}@{ref}" if ref.startswith("sha256:") else f"{self.registry}/{name}:{ref}"

    @property
    def light_image(self) -> str:
        """stage, warm, evaluate, register, validate."""
        return self.image("step-light")

    @property
    def train_image(self) -> str:
        """preprocess (DALI) and the gang (torch)."""
        return self.image("step-train")

    @field_validator("namespace")
    @classmethod
    def _own_namespace(cls, v: str) -> str:
        if (problem := namespace_problem(v)) is not None:
            raise ValueError(problem)
        return v

    @field_validator("teams")
    @classmethod
    def _teams_apart(cls, v: tuple[TeamSpec, ...], info: ValidationInfo) -> tuple[TeamSpec, ...]:
        autoscaling = info.data.get("autoscaling")
        ceiling = cluster_gpu_ceiling(info.data.get("cluster_gpus"), autoscaling) if autoscaling else info.data.get("cluster_gpus")
        problems = team_problems(v, info.data.get("namespace", ""), ceiling, own_team=info.data.get("team", ""))
        if problems:
            raise ValueError("; ".join(problems))
        return v

    @field_validator("admin_groups", "admin_users")
    @classmethod
    def _admin_identities(cls, v: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        for name in v:
            if not name or name != name.strip():
                raise ValueError(f"{name!r}: an identity's name, not empty, no surrounding spaces")
            if info.field_name == "admin_groups" and name in EVERYONE_GROUPS:
                raise ValueError(f"{name}: Kubernetes puts {EVERYONE_GROUPS[name]} in this group; name your admins' own group")
            if info.field_name == "admin_users" and name == "system:anonymous":
                raise ValueError("system:anonymous: every anonymous request is this user; name your admins")
        return v

    @model_validator(mode="after")
    def _team_declared(self) -> "CompileConfig":
        # reported by the site file's loader under the key the message starts with (``team: ...``)
        if (problem := own_team_problem(self.team, self.namespace, self.teams)) is not None:
            raise ValueError(problem)
        return self

    def own_team(self) -> TeamSpec | None:
        """The declared team (``teams:``) this install's namespace belongs to (``team:``), if any."""
        return next((t for t in self.teams if t.name == self.team), None) if self.team else None

    def store_root(self) -> str:
        """Where this namespace's runs keep their objects (staged datasets, runs, step logs): the
        team's ``s3_prefix`` when the install is a declared team's (``team:`` among ``teams:``), so a
        team's key restricted to its prefix (:mod:`~pipectl.pipelines.store_policy`) does all its
        runs need; else ``s3://<bucket>/``."""
        team = self.own_team()
        return team.s3_prefix if team is not None else f"s3://{self.bucket}/"

    @field_validator("launcher")
    @classmethod
    def _known_launcher(cls, v: str) -> str:
        if v not in LAUNCHERS:
            raise ValueError(f"unknown launcher {v!r}: one of {', '.join(LAUNCHERS)}")
        return v

    def dataset_maxima(self) -> dict[Lane, DatasetMax]:
        """The largest dataset of each lane: :data:`~pipectl.pipelines.policy.LANES`' ``dataset_max``
        with the keys :attr:`lane_dataset_max` sets on top."""
        return {lane: spec.dataset_max.model_copy(update=self.lane_dataset_max[lane].model_dump(exclude_unset=True))
                if lane in self.lane_dataset_max else spec.dataset_max for lane, spec in LANES.items()}

    def dataset_max_json(self) -> str:
        """:meth:`dataset_maxima` as the one-line JSON the stage and shards steps take (``--dataset-max``)."""
        return json.dumps([{"lane": lane.value, **m.model_dump(mode="json")} for lane, m in self.dataset_maxima().items()],
                          separators=(",", ":"))

    def gang_affinity(self) -> str:
        """The train step's first ``gang-affinity`` (JSON, one line): the site's :attr:`topology`
        placement for the run's gang pods, ``{}`` without one."""
        if self.topology is None:
            return "{}"
        return json.dumps(self.topology.affinity(job_labels()), separators=(",", ":"))

    def gang(self, entry: tuple[str, ...] = (), image: str | None = None, function: str = "",
             exports_onnx: bool = False) -> GangConfig:
        """The gang's pods; ``entry``/``function``/``image``: the user's training code and image (:class:`GangConfig`)."""
        return GangConfig(image=image or self.train_image, service_account=self.training_service_account, shm_gib=self.shm_gib, tmp_gib=self.step_tmp_gib,
                          max_restarts=self.retry.infra_limit, retry_oom=self.retry.retry_oom, entry=entry,
                          function=function, exports_onnx=exports_onnx,
                          parameters=tuple(p.name for p in self.pipeline_parameters), fabric=self.fabric,
                          team=self.team)


def _input_params(names: list[str]) -> list[Parameter]:
    return [Parameter(name=kebab(n)) for n in names]


def _cli_args(names: list[str]) -> list[str]:
    args: list[str] = []
    for n in names:
        args += [f"--{kebab(n)}", "{{inputs.parameters.%s}}" % kebab(n)]
    return args


WORKFLOW_OUTPUTS = ("mlflow_run_id",)
"""Step outputs also exported as the workflow's own outputs (``globalName``; Argo keeps them in
``status.outputs.parameters``): the Argo UI's link to the MLflow run reads the run id from there
(manifests.controller_config ``links``; it must stay the only one: the link takes the first)."""


def _outputs(model: type[BaseModel]) -> list[Parameter]:
    return [
        Parameter(name=kebab(n), value_from=ValueFrom(path=f"{OUTPUTS_DIR}/{kebab(n)}"),
                  global_name=kebab(n) if n in WORKFLOW_OUTPUTS else None)
        for n in model.model_fields
    ]


def _store_env(mlflow: bool = False) -> list[EnvFromSource]:
    """Store endpoint/bucket/MLflow URI from a ConfigMap, credentials from a Secret (never literals);
    ``mlflow``: the step talks to MLflow, so it also gets the namespace's team's MLflow user
    (:data:`~pipectl.components.names.MLFLOW_SECRET`, optional: an MLflow without auth needs none)."""
    return [
        EnvFromSource(config_map_ref=ConfigMapEnvSource(name=STORE_CONFIGMAP, optional=True)),
        EnvFromSource(secret_ref=SecretEnvSource(name=STORE_SECRET, optional=True)),
    ] + ([EnvFromSource(secret_ref=SecretEnvSource(name=MLFLOW_SECRET, optional=True))] if mlflow else [])


def _step_pod_fields(cfg: CompileConfig, name: str) -> dict:
    """What every container step's pod gets: the restricted security context, a writable /tmp, the
    retry policy, the attempt timeout, the lane's priority and toleration, the step's metrics."""
    return dict(
        security_context=SecurityContext.model_validate(restricted_container_security_context()),
        volume_mounts=[VolumeMount(name=TMP_VOLUME_NAME, mount_path="/tmp")],
        volumes=[Volume.model_validate(tmp_volume(cfg.step_tmp_gib))],
        retry_strategy=cfg.retry.build(),
        timeout=f"{cfg.retry.attempt_timeout_s}s",
        priority_class_name=lane_object_name("{{workflow.parameters.lane}}"),
        tolerations=[lane_toleration_for("{{workflow.parameters.lane}}")],
        metrics=step_metrics(name, container=True),
    )


def _step(cfg: CompileConfig, name: str, image: str, module: str, contract: type[BaseModel], output: type[BaseModel],
          fixed: dict[str, str] | None = None, every_field: bool = False, store: bool = True, mlflow: bool = False) -> Container:
    """A container template running ``python -m pipectl.components.<module>``.

    Inputs are the contract's required fields (every field with ``every_field``) minus ``fixed``
    (compile-time values baked into args). ``store``: the step reads or writes the object store
    and MLflow, so its pod gets their settings and the store's credentials; a step that does not
    gets neither. ``mlflow``: it writes to MLflow, so it also gets the team's MLflow user.
    """
    fixed = fixed or {}
    names = [n for n in contract.model_fields
             if n not in fixed and (every_field or contract.model_fields[n].is_required())]
    args = _cli_args(names)
    for n, v in fixed.items():
        args += [f"--{kebab(n)}", v]
    return Container(
        name=name,
        image=image,
        command=["python", "-m", f"pipectl.components.{module}"],
        args=args + ["--outputs-dir", OUTPUTS_DIR],
        inputs=_input_params(names),
        outputs=_outputs(output) or None,
        env_from=_store_env(mlflow) if store else None,
        resources=Resources(cpu_request=cfg.step_cpu, memory_request=f"{cfg.step_memory_gib:g}Gi"),
        **_step_pod_fields(cfg, name),
    )


# Server-side apply: one idempotent request (see _train_template). The field manager names who
# owns the job's fields; --force-conflicts lets a re-sent apply take them over again.
TRAIN_APPLY_FLAGS = ("--server-side", "--force-conflicts", "--field-manager=pipectl-train")

TRAIN_RETRY_TEMPLATE = "train-retry"
"""The template of the DAG task ``train``: one attempt of the train step (the resource template
``train``) and, when it ended in Error, the retry after a backoff (:func:`_train_retry_templates`, C10)."""
TRAIN_BACKOFF_TEMPLATE = "train-backoff"
TRAIN_WAIT_TEMPLATE = "train-wait"
TRAIN_REROUTE_TEMPLATE = "train-reroute"
GANG_AVOID_TEMPLATE = "gang-avoid"


def _in_place_retry(cfg: CompileConfig) -> RetryStrategy:
    """The ``train`` resource template's own retries: NO backoff, so the lane slot it holds is never
    held by an attempt that only waits (C10).

    Takes exactly the Failed attempts the policy retries (:meth:`RetryPolicy.expression`: a node
    shutdown, a kubelet eviction or admission refusal of the launcher pod; exit 75), in place, at
    once, on another node: their classification needs ``lastRetry.message``, which only the retry
    node directly above the attempt can read (operator.go buildRetryStrategyLocalScope). Errors
    (``pod deleted``, quota) are left to the backoff around it (:func:`_train_retry_templates`).
    Budgets: ``infra_limit`` retries in place per backoff attempt; ``transient_limit`` counted here.
    """
    policy = cfg.retry.build()
    return RetryStrategy(limit=policy.limit, retry_policy="Always",
                         expression=f'lastRetry.status == "Failed" && ({cfg.retry.expression()})',
                         affinity=policy.affinity)


def _train_template(cfg: CompileConfig, entry: tuple[str, ...] = (), image: str | None = None, function: str = "",
                    exports_onnx: bool = False) -> Resource:
    """Resource template creating ONE gang job (Volcano Job or PyTorchJob) and waiting for it: ONE
    attempt of the train step, holding a slot of the lane's semaphore while it runs (C10).

    The slot is taken when the attempt starts and given back when it ends: Argo holds a template's
    lock under its RETRY node until every retry is over, backoff included (workflow/controller
    operator.go executeTemplate v4.0.5; argoproj/argo-workflows#9875), so this template has no
    backoff (:func:`_in_place_retry`) and the retries that wait are around it
    (:func:`_train_retry_templates`). The gang job's name is the run's (launchers/base.py
    JOB_NAME): an attempt after a lost launcher pod, at either level, adopts the gang still
    training instead of adding a second one.
    The launcher pod lives as long as the training: it is kept from voluntary disruption
    (Karpenter consolidation, Cluster Autoscaler scale-down) and runs at its lane's priority, with
    its lane's toleration.

    Conditions look only at terminal states (C02); ``setOwnerReference`` makes the job (and its
    pods) go when the Workflow is deleted.
    Creating the job must be idempotent under every re-send, because two are known:
    argoexec re-runs kubectl on transient errors (workflow/executor/resource.go, ``retry.OnError``
    with ``IsTransientErr``), and client-go inside one kubectl call re-sends a POST whose response
    was a 5xx/429 with ``Retry-After`` — what the API server answers when etcd is slow
    (``ServerTimeout``, ``retryAfterSeconds: 2``) although the write may have committed. Plain
    ``create`` fails both with AlreadyExists; client-side ``apply`` (GET, then POST) still fails the
    second one (C16: ``error when creating ... already exists`` with the job running).
    So the step is ``kubectl apply --server-side`` (:data:`TRAIN_APPLY_FLAGS`): ONE PATCH request
    that creates the object if absent and otherwise applies the same fields again, so any re-send
    answers 200 with the job that exists (tests/cluster: a proxy that fails the first write's
    response, with the real kubectl and on the real node). RBAC: create + patch.
    No log archiving for this pod (its log is argoexec polling the job): with ``archiveLogs`` Argo
    adds a wait container to resource pods and cancels the still-polling main container when the
    node completes (exit 64, pod shown as Error although the step Succeeded; seen on the real node).
    """
    launcher = LAUNCHERS[cfg.launcher]
    return Resource(
        name="train",
        action="apply",
        flags=list(TRAIN_APPLY_FLAGS),
        service_account_name=cfg.launcher_service_account,
        executor=ExecutorConfig(service_account_name=cfg.launcher_service_account),  # argoexec applies the job
        set_owner_reference=True,
        archive_location=ArtifactLocation(archive_logs=False),
        manifest=launcher.manifest(cfg.gang(entry, image, function, exports_onnx)),
        success_condition=launcher.success_condition,
        failure_condition=launcher.failure_condition,
        inputs=_input_params(list(TRAIN_STEP_INPUTS)) + [Parameter(name=GANG_AFFINITY_INPUT, default=cfg.gang_affinity())],
        metrics=step_metrics("train", container=False),
        retry_strategy=_in_place_retry(cfg),
        timeout=f"{cfg.retry.attempt_timeout_s}s",
        annotations=dict(DO_NOT_DISRUPT),
        priority_class_name=lane_object_name("{{inputs.parameters.lane}}"),
        tolerations=[lane_toleration_for("{{inputs.parameters.lane}}")],
        synchronization=Synchronization(
            semaphores=[SemaphoreRef(config_map_key_ref=ConfigMapKeySelector(name=SEMAPHORE_CONFIGMAP, key="{{inputs.parameters.lane}}"))]
        ),
    )


def _train_retry_templates(train: Resource, cfg: CompileConfig) -> list[DAG | Suspend | Container]:
    """The train step as the pipeline's DAG sees it, ``train-retry`` (then ``train-backoff``,
    ``train-wait``, ``train-reroute`` and ``gang-avoid``): the attempt ``train`` (lane slot, in-place
    retries) and, when it ended in Error, a wait and the next ``train-retry`` — Argo's retry with
    backoff written as recursion, so no lock is held while a failed attempt waits (C10); when it
    ended Failed, ``gang-avoid`` (:func:`gang_avoid_templates`), which retries at once, away from
    the nodes, an attempt the gang preflight ended for a slow link, and fails for any other cause.

    Why not a ``retryStrategy`` with backoff: on ``train`` Argo keeps the lane semaphore through
    the backoff (operator.go executeTemplate, v4.0.5; argo-workflows#9875); on a template around
    ``train`` its retry node's outbound node is a DAG node (operator.go getOutboundNodes), which an
    in-place retry of the workflow (Argo UI RETRY, ``pipectl retry``) resets but keeps with the
    omitted ``evaluate``/``register`` hanging below it: the retried workflow stayed Running (seen
    on the control plane). Here every node after a failed attempt hangs below its pod, which such a
    retry deletes, so the workflow runs again from that attempt.

    What the backoff level knows: only the attempt's phase (a DAG ``when`` cannot read a node's
    message), so every Error is retried — ``pod deleted``, quota, and, lost against a retry
    expression on one template, an Error whose message shows the API server refused the launcher
    pod's spec (policy.SPEC_ERROR_PATTERNS): retried up to ``infra_limit`` times with the lane slot
    free; the launcher pod's spec is fixed at compile time and linted, and a bad lane never gets
    past ``validate`` (C15). Failed attempts the policy retries were retried in place
    (:func:`_in_place_retry`). Delays: :meth:`RetryPolicy.delays_s` (duration x 2^n, capped at
    scale_up_s); at most ``infra_limit`` of them (no ``maxDuration``: attempts are bounded by their
    timeout), counted together with the retries ``gang-avoid`` starts. Argo names the nodes
    ``train`` (this DAG) > ``train`` (``train``'s retry node) > ``train(m)`` (its pod), and
    ``retry`` > ``wait``, ``next`` > ... for each retry.

    The DAG's phase is its one leaf's, ``reroute``, which depends on ``retry``: a task skipped by
    its ``when`` takes the phase of the last task that ran on its branch (so a Succeeded attempt
    leaves the DAG Succeeded, an Error with no retry left Error, a Failed one ``gang-avoid``'s).
    """
    delays = cfg.retry.delays_s()
    limit = len(delays)
    step_inputs = [kebab(n) for n in TRAIN_STEP_INPUTS]
    passed = [Parameter(name=n, value="{{inputs.parameters.%s}}" % n) for n in step_inputs]
    affinity = Parameter(name=GANG_AFFINITY_INPUT, value="{{inputs.parameters.%s}}" % GANG_AFFINITY_INPUT)
    inputs = _input_params(list(TRAIN_STEP_INPUTS)) + [Parameter(name="retries"), Parameter(name=GANG_AFFINITY_INPUT)]
    retries = "{{inputs.parameters.retries}}"
    retry_on = "{{=asInt(inputs.parameters.retries) + 1 < %d ? 'Error' : 'none'}}" % limit
    wait = Suspend(name=TRAIN_WAIT_TEMPLATE, inputs=[Parameter(name="delay")], duration="{{inputs.parameters.delay}}")
    backoff = DAG(name=TRAIN_BACKOFF_TEMPLATE, inputs=inputs, tasks=[
        Task(name="wait", template=wait,
             arguments=[Parameter(name="delay", value="{{=%s[asInt(inputs.parameters.retries)]}}" % json.dumps(delays))]),
        Task(name="next", template=TRAIN_RETRY_TEMPLATE, dependencies=["wait"], arguments=passed + [
            Parameter(name="retries", value="{{=asInt(inputs.parameters.retries) + 1}}"),
            Parameter(name="retry-on", value=retry_on), affinity]),
    ])
    avoid = gang_avoid_templates(cfg)[0]
    reroute = DAG(name=TRAIN_REROUTE_TEMPLATE, inputs=inputs, tasks=[
        Task(name="avoid", template=avoid, arguments=[Parameter(name="retries", value=retries), affinity]),
        Task(name="next", template=TRAIN_RETRY_TEMPLATE, dependencies=["avoid"], arguments=passed + [
            Parameter(name="retries", value="{{=asInt(inputs.parameters.retries) + 1}}"),
            Parameter(name="retry-on", value=retry_on),
            Parameter(name=GANG_AFFINITY_INPUT, value="{{tasks.avoid.outputs.parameters.%s}}" % GANG_AFFINITY_INPUT)]),
    ])
    # an Error or a Failed attempt is handled: by the retry or the reroute below, or it ends the DAG
    attempt = Task(name="train", template=train, arguments=passed + [affinity], continue_on=ContinueOn(error=True, failed=True))
    retry = Task(name="retry", template=backoff, dependencies=["train"],
                 when="{{tasks.train.status}} == {{inputs.parameters.retry-on}}",
                 arguments=passed + [Parameter(name="retries", value=retries), affinity])
    rerouted = Task(name="reroute", template=reroute, dependencies=["retry"], when="{{tasks.train.status}} == Failed",
                    arguments=passed + [Parameter(name="retries", value=retries), affinity])
    # inputs besides the step's: the attempt number (0 first), the phase that earns a retry after
    # a backoff (Error; "none" once infra_limit retries happened), the gang's affinity ({} first)
    step = DAG(name=TRAIN_RETRY_TEMPLATE, tasks=[attempt, retry, rerouted],
               inputs=_input_params(list(TRAIN_STEP_INPUTS)) + [
                   Parameter(name="retries", default="0"), Parameter(name="retry-on", default="Error" if limit else "none"),
                   Parameter(name=GANG_AFFINITY_INPUT, default=cfg.gang_affinity())])
    return [step, backoff, wait, reroute, avoid]


def gang_avoid_templates(cfg: CompileConfig) -> list:
    """``gang-avoid`` (:mod:`pipectl.components.gang.avoid`), after a Failed train attempt: when the
    gang preflight named slow nodes and a retry is left, the failed job deleted and the next
    attempt's gang affinity written (a preferred anti-affinity to at most ``avoid_nodes_limit``
    nodes); otherwise it fails with what the gang's pods show, which ends the step. As the
    launcher's ServiceAccount (it lists the gang's pods and deletes its job), no store credentials;
    its log tail is its message in Argo and the UI."""
    kind = LAUNCHERS[cfg.launcher]
    avoid = _step(cfg, GANG_AVOID_TEMPLATE, cfg.light_image, "gang.avoid", AvoidInput, AvoidOutput, store=False, fixed={
        "workflow_name": "{{workflow.name}}", "namespace": "{{workflow.namespace}}",
        "job_kind": f"{kind.api_group}/{kind.version}/{kind.resource}",
        "retry_limit": str(cfg.retry.infra_limit), "avoid_limit": str(cfg.retry.avoid_nodes_limit)})
    avoid.service_account_name = cfg.launcher_service_account
    avoid.automount_service_account_token = True  # its own code reads the gang's pods and deletes its job
    avoid.termination_message_policy = "FallbackToLogsOnError"
    # its verdict (exit 1) is final and its message quotes the gang's pods, which may read like an
    # infrastructure message: retried only when its own pod was lost (Error) or the API blinked (75)
    avoid.retry_strategy = RetryStrategy(limit=3, retry_policy="Always", backoff=Backoff(duration="5s", factor=2, cap=f"{cfg.retry.backoff_cap_s}s"),
                                         expression='lastRetry.status == "Error" || lastRetry.exitCode == "75"')
    return [avoid]


def workflow_parameters(defaults: dict[str, str] | None = None, specs: tuple[ParameterSpec, ...] = ()) -> list[Parameter]:
    """The WorkflowTemplate's arguments: one per :class:`TrainingParameters` field, then one per
    pipeline parameter of ``specs``, with its default (or the pipeline's, ``defaults`` by
    kebab-case name, as text), description, and enum for Enum fields (the Argo UI shows them as a
    drop-down)."""
    import enum as _enum

    params = []
    for name, field in parameter_model(specs).model_fields.items():
        default = field.default
        choices = None
        if isinstance(field.annotation, type) and issubclass(field.annotation, _enum.Enum):
            choices = [member.value for member in field.annotation]
        value = default.value if isinstance(default, _enum.Enum) else str(default)
        if field.annotation is bool:
            choices, value = ["false", "true"], "true" if default else "false"
        value = (defaults or {}).get(kebab(name), value)
        params.append(Parameter(name=kebab(name), value=value, description=field.description, enum=choices))
    return params


# -- one builder per built-in step: its templates (the first is the one the DAG task runs) --------

def validate_templates(cfg: CompileConfig) -> list:
    """C15: every workflow parameter parsed by the CLI's own contract inside the cluster, first;
    its log tail (the parameter named) becomes the step's message in Argo and the UI."""
    specs = cfg.pipeline_parameters
    validate = _step(cfg, "validate", cfg.light_image, "validate", parameter_model(specs), ValidateOutput, every_field=True,
                     store=False, fixed={SPECS_INPUT: specs_json(specs)} if specs else None)
    validate.termination_message_policy = "FallbackToLogsOnError"
    return [validate]


def stage_templates(cfg: CompileConfig) -> list:
    # a team's namespace stages under the team's prefix (its key may write nowhere else)
    target = {"target_uri": cfg.store_root()} if cfg.own_team() is not None else {}
    return [_step(cfg, "stage", cfg.light_image, "stage", StageInput, StageOutput,
                  fixed={"bucket": cfg.bucket, **target, **_dataset_max(cfg)})]


def _dataset_max(cfg: CompileConfig) -> dict[str, str]:
    """The run's lane and every lane's dataset maximum: what stage and the shards step refuse."""
    return {"lane": "{{workflow.parameters.lane}}", "dataset_max": cfg.dataset_max_json()}


def warm_templates(cfg: CompileConfig) -> list:
    return [_step(cfg, "warm", cfg.light_image, "stage.warm", WarmInput, WarmOutput)]


def preprocess_templates(cfg: CompileConfig) -> list:
    preprocess = _step(cfg, "preprocess", cfg.train_image, "preprocess", PreprocessInput, PreprocessOutput,
                       fixed={"shard_mib": "{{workflow.parameters.shard-mib}}"})
    preprocess.volume_mounts += [VolumeMount(name="dshm", mount_path="/dev/shm")]
    preprocess.volumes += [Volume(name="dshm", empty_dir=EmptyDirVolumeSource(medium="Memory", size_limit=f"{cfg.shm_gib}Gi"))]
    return [preprocess]


def prebuilt_templates(cfg: CompileConfig) -> list:
    """``shards``: check pre-built shards (:mod:`pipectl.components.prebuilt`) in place of stage and preprocess."""
    return [_step(cfg, "shards", cfg.light_image, "prebuilt", PrebuiltInput, PrebuiltOutput, fixed=_dataset_max(cfg))]


def train_templates(cfg: CompileConfig, entry: tuple[str, ...] = (), image: str | None = None, function: str = "",
                    exports_onnx: bool = False) -> list:
    """``train-retry`` (what the DAG task runs), ``train`` (the attempt), ``train-backoff``, ``train-wait``,
    and the exit handler that ends the gang with the run (:func:`gang_release_templates`);
    ``entry``/``function``/``image``: the user's training code in the gang instead of pipectl's (:class:`GangConfig`)."""
    step, backoff, wait, reroute, avoid = _train_retry_templates(_train_template(cfg, entry, image, function, exports_onnx), cfg)
    inner = [t.template for t in step.tasks if not isinstance(t.template, DAG)]
    return [step, *inner, backoff, wait, reroute, avoid, *gang_release_templates(cfg)]


GANG_RELEASE_TEMPLATE = "gang-release"


def gang_release_templates(cfg: CompileConfig) -> list:
    """The workflow's exit handler when it trains (``onExit``: :func:`workflow_template`):
    ``gang-release`` runs when the workflow has ended and, unless it Succeeded, deletes every gang
    job of the run, then waits until their pods are gone (:mod:`pipectl.components.gang`). Argo
    runs exit handlers after a success, a failure, an error, a timeout and ``stop``; not after
    ``terminate`` (``pipectl terminate`` releases the gang itself). A plain container template:
    Argo holds the workflow's end until it is done. It runs as the launcher's ServiceAccount
    (list, watch and delete of the gang job kind; list and watch of pods), with no store
    credentials and at the default priority (a run refused for its lane still releases its gang)."""
    kind = LAUNCHERS[cfg.launcher]
    release = _step(cfg, GANG_RELEASE_TEMPLATE, cfg.light_image, "gang", ReleaseInput, ReleaseOutput, fixed={
        "workflow_name": "{{workflow.name}}", "workflow_status": "{{workflow.status}}", "namespace": "{{workflow.namespace}}",
        "job_kind": f"{kind.api_group}/{kind.version}/{kind.resource}"})
    release.service_account_name = cfg.launcher_service_account
    release.automount_service_account_token = True  # its own code deletes the gang jobs: the one step that needs a token
    release.env_from = None
    release.timeout = "300s"
    # no lane priority: it must start even when the run's lane value is what failed the run
    release.priority_class_name, release.tolerations = None, None
    release.retry_strategy = RetryStrategy(limit=3, retry_policy="Always")  # an API server that blinked
    return [release]


def evaluate_templates(cfg: CompileConfig, metric: str = "", image: str | None = None) -> list:
    """``evaluate``; ``metric``/``image``: the user's metric function and the image that has it."""
    evaluate = _step(cfg, "evaluate", image or cfg.light_image, "evaluate", EvaluateInput, EvaluateOutput,
                     fixed={"metric_function": metric} if metric else None, mlflow=True)
    evaluate.metrics = [*evaluate.metrics, *training_metrics()]  # how training went, for Prometheus
    return [evaluate]


def register_templates(cfg: CompileConfig) -> list:
    # every field: what evaluate hands over with a default (the champion it compared against, the
    # deciding metric's name, the evaluation set) reaches the step too
    register = _step(cfg, "register", cfg.light_image, "register", RegisterInput, RegisterOutput, every_field=True, mlflow=True)
    # C08: promotions of one model run one at a time (the step also verifies after writing)
    register.synchronization = Synchronization(mutexes=[Mutex(name=REGISTER_MUTEX)])
    return [register]


def user_container_template(cfg: CompileConfig, name: str, image: str, command: list[str], args: list[str],
                            inputs: list[str], outputs: list[str], env: dict[str, str], store_access: bool,
                            cpu: float | None, memory_gib: float | None) -> Container:
    """A user's own container step, with what every step pod gets (restricted security context,
    requests, lane priority and toleration, the retry policy, a timeout, metrics): ``inputs`` are
    input parameter names (``{{inputs.parameters.<name>}}`` in ``args``/``env``), ``outputs`` are
    read from ``$PIPECTL_OUTPUTS_DIR/<name>`` (``/tmp/outputs``) when the container ends; the store's ConfigMap and Secret
    and the team's MLflow user (the ConfigMap names MLflow to it) only with ``store_access``."""
    from hera.workflows import Env

    if outputs:
        env = {**env, "PIPECTL_OUTPUTS_DIR": OUTPUTS_DIR}
    return Container(
        name=name,
        image=image,
        command=list(command),
        args=list(args) or None,
        inputs=_input_params(inputs) or None,
        outputs=[Parameter(name=o, value_from=ValueFrom(path=f"{OUTPUTS_DIR}/{o}")) for o in outputs] or None,
        env=[Env(name=k, value=v) for k, v in env.items()] or None,
        env_from=_store_env(mlflow=True) if store_access else None,
        resources=Resources(cpu_request=cpu or cfg.step_cpu, memory_request=f"{memory_gib or cfg.step_memory_gib:g}Gi"),
        **_step_pod_fields(cfg, name),
    )


POD_GC = PodGC(strategy="OnPodSuccess", delete_delay_duration="10m")
"""A succeeded step's pod is deleted 10 minutes after it ends (its log stays in the artifact
repository: ``archiveLogs``); a failed one's stays for ``kubectl describe``."""
TTL = TTLStrategy(seconds_after_success=86400, seconds_after_failure=7 * 86400)
"""A run is deleted a day after it succeeds, a week after it fails (with its gang jobs: owner references)."""


def workflow_template(cfg: CompileConfig, name: str, title: str, description: str, entry: DAG, templates: list,
                      defaults: dict[str, str] | None = None) -> WorkflowTemplate:
    """The WorkflowTemplate :func:`~pipectl.components.names.template_name` around a pipeline's entry DAG ``entry`` (named ``name``)
    and its step templates: service account, restricted pod security, labels, the UI's title and
    description, the typed arguments (``defaults``: the pipeline's own, by kebab-case name), and
    its runs' pod GC and TTL (:data:`POD_GC`, :data:`TTL`: the template's own, so the Argo
    controller's defaults for every other tenant's workflows stay as they are)."""
    return WorkflowTemplate(
        name=template_name(name),
        namespace=cfg.namespace,
        entrypoint=entry.name,
        service_account_name=cfg.service_account,
        # No step's own code holds a Kubernetes token (a preprocess decoding hostile images could
        # otherwise rewrite any step's outputs, the decision register acts on among them): only
        # Argo's executor containers get one, the executor ServiceAccount's, from its token Secret
        # (Argo docs, "Service Accounts": executor.serviceAccountName; rbac() renders the Secret).
        automount_service_account_token=False,
        executor=ExecutorConfig(service_account_name=cfg.service_account),
        # every pod of the workflow, resource pods and Argo's own containers included
        security_context=PodSecurityContext.model_validate(restricted_pod_security_context()),
        pod_gc=POD_GC,
        ttl_strategy=TTL,
        labels=dict(PART_OF),
        annotations={"workflows.argoproj.io/title": title, "workflows.argoproj.io/description": description},
        workflow_metadata=WorkflowMetadata(
            annotations={
                "workflows.argoproj.io/title": name + ": {{workflow.parameters.model-name}} ({{workflow.parameters.lane}} lane)",
                "workflows.argoproj.io/description": "dataset {{workflow.parameters.dataset-uri}}",
            },
            labels={LANE_LABEL: "{{workflow.parameters.lane}}"},
        ),
        arguments=workflow_parameters(defaults, cfg.pipeline_parameters),
        on_exit=GANG_RELEASE_TEMPLATE if any(getattr(t, "name", "") == "train" for t in templates) else None,
        templates=[entry, *templates],
    )
