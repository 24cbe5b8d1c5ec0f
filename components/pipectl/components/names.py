"""Names, written once and derived everywhere: lanes and the cluster objects named after them,
labels, ConfigMaps/Secrets the steps read, the output folder, parameter spelling.

Standard library only (the CLI imports it for its choices without loading pydantic or hera);
shared by every layer: the compile layer (:mod:`pipectl.pipelines`), the backends, the CLI and
the steps (:mod:`pipectl.components.contracts` re-exports what steps use).
"""

from __future__ import annotations

import enum

# ---------------------------------------------------------------- spelling


def kebab(name: str) -> str:
    """``image_size`` -> ``image-size``: Argo parameter names and CLI flags are kebab-case."""
    return name.replace("_", "-")


def snake(name: str) -> str:
    """``image-size`` -> ``image_size``: pydantic field names are snake_case."""
    return name.replace("-", "_")


# ---------------------------------------------------------------- lanes


class Lane(str, enum.Enum):
    """Priority lanes. ``urgent`` may preempt ``batch``; ``batch`` never preempts. The cluster
    objects of each lane are in the typed table ``pipectl.pipelines.policy.LANES``."""

    urgent = "urgent"
    standard = "standard"
    batch = "batch"


LANE_NAMES: tuple[str, ...] = tuple(lane.value for lane in Lane)
"""``("urgent", "standard", "batch")``: the CLI's ``--lane`` choices, the parameter's enum."""

LANE_OBJECT_PREFIX = "pipectl-"
"""Prefix of a lane's PriorityClass and Volcano Queue names (``pipectl-urgent``)."""


def lane_object_name(lane: str) -> str:
    """The PriorityClass and Volcano Queue of ``lane`` (a Lane value or an Argo tag such as
    ``{{inputs.parameters.lane}}``): ``pipectl-<lane>``."""
    return LANE_OBJECT_PREFIX + lane


LANE_OBJECT_NAMES: frozenset[str] = frozenset(lane_object_name(name) for name in LANE_NAMES)
"""Every lane's PriorityClass / Volcano Queue name (what lint accepts)."""

TEAM_QUEUE_PREFIX = "pipectl-team-"
"""Prefix of a team's Volcano Queues (``pipectl-team-<team>-<lane>``): the team's share, per lane."""


def team_queue_name(team: str, lane: str) -> str:
    """The Volcano Queue of ``lane`` (a Lane value or an expression's placeholder) for the team
    named ``team`` (:mod:`pipectl.pipelines.teams`)."""
    return f"{TEAM_QUEUE_PREFIX}{team}-{lane}"


def is_queue_name(queue: str) -> bool:
    """Whether ``queue`` is a lane's queue or a team's queue of a lane."""
    return queue in LANE_OBJECT_NAMES or (queue.startswith(TEAM_QUEUE_PREFIX) and queue.rsplit("-", 1)[-1] in LANE_NAMES)

LANE_TAINT_KEY = "pipectl.io/lane"
"""Taint (and toleration) key of reserved buffer nodes: ``pipectl.io/lane=<lane>:NoSchedule``."""

SEMAPHORE_CONFIGMAP = "pipectl-lanes"
"""ConfigMap of the lanes' Argo semaphores: one key per lane name, the value its concurrency."""

# ---------------------------------------------------------------- objects, labels, paths

DEFAULT_NAMESPACE = "pipectl"
"""The namespace of the cluster commands when neither ``-n``, ``$PIPECTL_NAMESPACE`` nor the
kubeconfig context names one."""

def template_name(pipeline: str) -> str:
    """The WorkflowTemplate of pipeline ``pipeline``: ``<pipeline>-v1`` (its major version is part
    of the name)."""
    return f"{pipeline}-v1"


TEMPLATE_NAME = template_name("training")
"""The training WorkflowTemplate."""

STORE_CONFIGMAP = "pipectl-store"
"""ConfigMap with the store settings (``PIPECTL_S3_ENDPOINT``, ``PIPECTL_BUCKET``, ``PIPECTL_MLFLOW_URI``)."""

STORE_SECRET = "pipectl-s3-credentials"
"""Secret with ``PIPECTL_S3_ACCESS_KEY`` / ``PIPECTL_S3_SECRET_KEY``."""

MLFLOW_SECRET = "pipectl-mlflow-credentials"
"""Secret with ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD`` (the names MLflow's client
reads): the namespace's team's user of an MLflow server that runs with basic auth, written by
``pipectl teams mlflow-user TEAM``. Optional in every pod that talks to MLflow: without it the
steps talk to an MLflow without auth as before."""

MLFLOW_USERNAME_ENV = "MLFLOW_TRACKING_USERNAME"
MLFLOW_PASSWORD_ENV = "MLFLOW_TRACKING_PASSWORD"

PART_OF = {"app.kubernetes.io/part-of": "pipectl"}
"""Label on every object pipectl creates (Kubernetes recommended labels)."""

WORKFLOW_LABEL = "workflows.argoproj.io/workflow"
"""Argo's label naming a pod's workflow; pipectl puts it on gang jobs and their pods too."""

STEP_LABEL = "pipectl.io/step"
LANE_LABEL = "pipectl.io/lane"

OUTPUTS_DIR = "/tmp/outputs"
"""Folder in a step's container for its output parameters, one file per field (kebab name); Argo
reads them with ``valueFrom.path``, the local backend maps it to a per-task folder."""


PUBLISH_ONNX_ENV = "PIPECTL_TRAIN_PUBLISH_ONNX"
"""``1`` in the gang pods of ``train(module=..., exports_onnx=True)``: the user's code writes the
trained model to ``$PIPECTL_TRAIN_OUTPUTS_DIR/model.onnx`` (rank 0) and the launcher of node rank 0
registers it after a successful run (:mod:`pipectl.components.train.publish`)."""
PROGRESS_FILE_ENV = "PIPECTL_PROGRESS_FILE"
"""A local run's progress file: rank 0 appends a JSON line per epoch (:mod:`pipectl.components.progress`)."""
RETRY_OOM_ENV = "PIPECTL_RETRY_OOM"
"""``1`` in the gang's pods when the retry policy retries OOM kills (``RetryPolicy.retry_oom``): the
launcher (components/pipectl/components/train/launch.py) then exits 137, not 1, for a worker the
OOM killer ended, and the gang restarts instead of ending."""

NODE_NAME_ENV = "PIPECTL_NODE_NAME"
"""The node a gang pod runs on (the downward API's ``spec.nodeName``): named in the message of an
infrastructure fault (components/pipectl/components/train/faults.py)."""
POD_NAME_ENV = "PIPECTL_POD_NAME"
"""A gang pod's own name (the downward API's ``metadata.name``): named with its node in the step
anatomy's verdicts (components/pipectl/components/train/telemetry.py)."""
METRICS_PORT_ENV = "PIPECTL_METRICS_PORT"
"""The port on which a gang pod's first process serves its ranks' step anatomy to Prometheus
(``/metrics``; components/pipectl/components/train/exporter.py); unset: not served."""
METRICS_HOST_ENV = "PIPECTL_METRICS_HOST"
"""The address that endpoint binds: unset in a pod (every interface, for Prometheus); the local
backend sets loopback, so a run on a laptop serves nothing to its network."""
METRICS_PORT = 9464
"""The gang pods' ``metrics`` container port (:data:`METRICS_PORT_NAME`), scraped through the PodMonitor
``pipectl-train`` (argo/namespace/monitoring/)."""
METRICS_PORT_NAME = "metrics"
