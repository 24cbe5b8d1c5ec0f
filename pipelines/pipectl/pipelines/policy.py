"""Cluster policy as typed tables: priority lanes and autoscaler-aware retries.

Pure: no I/O. :mod:`pipectl.pipelines.training` renders these into templates, and
:mod:`pipectl.pipelines.manifests` into the cluster manifests under ``argo/``.
"""

from __future__ import annotations

from hera.workflows.models import Backoff, RetryAffinity, RetryNodeAntiAffinity, RetryStrategy, Toleration
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipectl.components.contracts import DatasetMax, ExitCode
from pipectl.components.names import LANE_TAINT_KEY, Lane, lane_object_name


class LaneSpec(BaseModel):
    """What one priority lane maps to on the cluster.

    - ``priority_value``/``preemption_policy``: the Kubernetes PriorityClass
      (``PreemptLowerPriority`` lets the scheduler evict lower-priority pods; ``Never`` does not).
    - ``queue_deserved_gpus``/``queue_reclaimable``/``queue_capability_gpus``: the Volcano Queue
      (Volcano's ``capacity`` plugin). deserved: the GPUs the lane may hold against every other
      lane — a lane holding more is what reclaim takes back from (``None``: no bound, the lane is
      never above what it deserves; ``0``: everything it holds can be taken back); reclaimable:
      other queues may take its resources back at all; capability: a hard ceiling.
    - ``argo_priority``: ``Workflow.spec.priority``, which only orders the controller's own queues
      (parallelism, semaphores), never pods (pods get a Kubernetes priority only from
      ``priorityClassName``).
    - ``concurrency``: semaphore size (ConfigMap key = lane name) for gang jobs of the lane.
    - ``tolerates_reserved``: pods tolerate the taint ``pipectl.io/lane=<lane>:NoSchedule`` of
      reserved buffer nodes (only urgent nodes are tainted).
    - ``dataset_max``: the largest dataset a run of the lane takes (images and GiB): a bigger one
      is refused at submit when its size is known then, else by stage or the ``shards`` step before
      anything is copied. The site file's ``lane_dataset_max`` overrides it
      (``CompileConfig.dataset_maxima``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    lane: Lane
    priority_value: int = Field(ge=0, le=1_000_000_000)
    preemption_policy: str = Field(pattern="^(PreemptLowerPriority|Never)$")
    queue_deserved_gpus: int | None = Field(ge=0)
    queue_reclaimable: bool
    queue_capability_gpus: int | None = Field(default=None, ge=1)
    argo_priority: int
    concurrency: int = Field(ge=1)
    tolerates_reserved: bool
    dataset_max: DatasetMax = Field(default_factory=DatasetMax)

    @property
    def priority_class(self) -> str:
        return lane_object_name(self.lane.value)

    @property
    def queue(self) -> str:
        return lane_object_name(self.lane.value)


LANES: dict[Lane, LaneSpec] = {
    Lane.urgent: LaneSpec(
        lane=Lane.urgent, priority_value=1_000_000, preemption_policy="PreemptLowerPriority",
        queue_deserved_gpus=None, queue_reclaimable=False, argo_priority=100, concurrency=4, tolerates_reserved=True,
        # a retrain that must start now: 100,000 images or 20 GiB stage in minutes at what the storage
        # benchmark measured for one stage step into Ceph RGW on a 2-core machine (about 300 small
        # files/s, about 150 MB/s for large files), and preprocess in minutes more; a larger set
        # waits its turn in standard.
        dataset_max=DatasetMax(max_samples=100_000, max_gib=20),
    ),
    Lane.standard: LaneSpec(
        lane=Lane.standard, priority_value=100_000, preemption_policy="Never",
        queue_deserved_gpus=None, queue_reclaimable=False, argo_priority=50, concurrency=8, tolerates_reserved=False,
        # ImageNet-1k (1.28 million training images, about 140 GiB of JPEG) with room to spare.
        dataset_max=DatasetMax(max_samples=5_000_000, max_gib=500),
    ),
    Lane.batch: LaneSpec(
        lane=Lane.batch, priority_value=1_000, preemption_policy="Never",
        queue_deserved_gpus=0, queue_reclaimable=True, argo_priority=0, concurrency=16, tolerates_reserved=False,
        # generous, for the largest sets a team trains on (ImageNet-21k: 14 million images, about
        # 1.3 TB), yet bounded, so that a mistyped prefix (a bucket's root) is refused, not copied.
        dataset_max=DatasetMax(max_samples=100_000_000, max_gib=20 * 1024),
    ),
}


def lane_toleration_for(lane_expr: str) -> Toleration:
    """A toleration of ``pipectl.io/lane=<lane>:NoSchedule``; ``lane_expr`` may be an Argo tag.

    Only urgent buffer nodes carry the taint, so for other lanes it tolerates nothing that exists.
    """
    return Toleration(key=LANE_TAINT_KEY, operator="Equal", value=lane_expr, effect="NoSchedule")


# Messages Argo records on a node when the infrastructure, not the code, ended the pod. Argo
# records the POD's status message when it has one (controller operator.go inferFailedReason), so
# these are the kubelet's and the control plane's own words. Sources: Argo's retries docs and field
# case C01 ("Pod was terminated due to imminent node shutdown", "pod deleted", "Evicted");
# kubelet: node-pressure eviction "The node was low on resource: memory. ..." (pkg/kubelet/eviction
# helpers.go nodeLowMessageFmt — the pod's reason is Evicted but its MESSAGE, the one Argo keeps,
# never says so), graceful node shutdown "Pod was terminated in response to imminent
# node shutdown." (nodeshutdown), admission after a node restart "Pod was rejected: ..." and a
# device plugin not ready yet "Allocate failed due to ..." (UnexpectedAdmissionError), critical-pod
# preemption "Preempted in order to admit critical pod"; Kubernetes pod disruption conditions
# (DisruptionTarget: PreemptionByScheduler, DeletionByTaintManager, TerminationByKubelet);
# cluster-autoscaler scale-down.
INFRA_MESSAGE_PATTERNS = (
    "imminent node shutdown",
    "pod deleted",
    "evicted",
    "the node was low on resource",
    "pod was rejected",
    "allocate failed",
    "preempt",
    "node shutdown",
    "deletionbytaintmanager",
    "terminationbykubelet",
    "scale.?down",
)
OOM_PATTERN = "oomkilled"
# Errors (status Error) that are the SPEC's fault, never the infrastructure's: the API server
# refused the pod (admission: a PriorityClass that does not exist, e.g. a lane outside the enum
# submitted through the Argo UI/API, which do not enforce parameter enums; a field that does not
# validate; a webhook's denial). Retrying them only waits out the backoff. Quota ("is forbidden:
# exceeded quota") stays retried: it frees up.
SPEC_ERROR_PATTERNS = (
    "no priorityclass with name",
    "is invalid:",
    "denied the request",
)


STEP_FIRST_DELAY_S = 5
"""The first backoff delay of a container step: also how long its workflow waits after a code
failure before the step ends Failed (Argo waits out the backoff before the retry expression; C23)."""


class RetryPolicy(BaseModel):
    """Retries by failure class, rendered to an Argo ``retryStrategy``.

    Classes (field case C01):
    - infrastructure (status Error, or a preemption/eviction/shutdown/deletion message): up to
      ``infra_limit`` retries; an Error whose message shows the API server refused the pod's spec
      (SPEC_ERROR_PATTERNS) is not infrastructure and is not retried;
    - declared transient (exit 75, EX_TEMPFAIL): retried while fewer than ``transient_limit``
      retries have happened;
    - code (anything else, e.g. exit 1): never retried. OOM kills (exit 137 "OOMKilled") count as
      code unless ``retry_oom``.

    Backoff is derived from ``scale_up_s``, the time the Cluster Autoscaler needs to add a node:
    delays start at scale_up_s/15 (rounded up) and double, capped at scale_up_s per delay, so the
    first four retries together wait at least scale_up_s (1+2+4+8 = 15 parts: a replacement node
    has arrived; tests/cluster/test_autoscaler.py checks it against a measured scale-up); ``step_timeout_s`` plus
    ``scale_up_s`` bounds each attempt (Argo's template ``timeout`` counts Pending time).

    Container steps carry the backoff on their own ``retryStrategy``, and Argo waits it out BEFORE
    it evaluates the expression (operator.go processNodeRetries, v4.0.5): a code failure would hold
    its workflow through the first delay. So their backoff starts at :data:`STEP_FIRST_DELAY_S`
    and grows by :attr:`step_backoff_factor`, the smallest factor with which the first four
    retries still wait through a scale-up together (:meth:`step_delays_s`). The train step's
    backoff is entered only for a retryable Error (training.py ``train-retry``) and keeps
    :meth:`delays_s`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    scale_up_s: int = Field(600, ge=30, le=7200, description="Seconds the autoscaler takes to add a (GPU) node.")
    infra_limit: int = Field(6, ge=0, le=50)
    transient_limit: int = Field(3, ge=0, le=50)
    retry_oom: bool = False
    step_timeout_s: int = Field(6 * 3600, ge=60, description="Running-time budget of one attempt.")
    avoid_nodes_limit: int = Field(4, ge=0, le=64, description="Most nodes a run's gang avoids after its preflight "
                                   "named them for a slow link (a preferred anti-affinity; 0: never avoid).")

    @model_validator(mode="after")
    def _budgets(self) -> "RetryPolicy":
        if self.transient_limit > self.infra_limit:
            raise ValueError("transient_limit cannot exceed infra_limit (the retryStrategy limit)")
        return self

    @property
    def backoff_duration_s(self) -> int:
        return max(5, -(-self.scale_up_s // 15))

    @property
    def backoff_cap_s(self) -> int:
        return self.scale_up_s

    @property
    def attempt_timeout_s(self) -> int:
        """Template ``timeout``: Pending (a scale-up) plus running time."""
        return self.scale_up_s + self.step_timeout_s

    @property
    def max_duration_s(self) -> int:
        """``backoff.maxDuration``: every attempt at its timeout plus every delay at its cap."""
        return (self.infra_limit + 1) * self.attempt_timeout_s + self.infra_limit * self.backoff_cap_s

    def delays_s(self) -> list[int]:
        """Seconds Argo waits before retry 1..infra_limit: duration x 2^n, capped."""
        return [min(self.backoff_duration_s * 2**n, self.backoff_cap_s) for n in range(self.infra_limit)]

    @property
    def step_backoff_factor(self) -> int:
        """The smallest factor >= 2 with which four delays from :data:`STEP_FIRST_DELAY_S` add up
        to ``scale_up_s``."""
        factor = 2
        while STEP_FIRST_DELAY_S * sum(factor**n for n in range(4)) < self.scale_up_s:
            factor += 1
        return factor

    def step_delays_s(self) -> list[int]:
        """Seconds Argo waits before retry 1..infra_limit of a container step: the first
        :data:`STEP_FIRST_DELAY_S` (how long a code failure waits before it ends its step), then x
        :attr:`step_backoff_factor`, capped at ``scale_up_s``."""
        return [min(STEP_FIRST_DELAY_S * self.step_backoff_factor**n, self.backoff_cap_s) for n in range(self.infra_limit)]

    def expression(self) -> str:
        """The ``retryStrategy.expression`` (expr-lang, evaluated by the workflow controller)."""
        patterns = list(INFRA_MESSAGE_PATTERNS) + ([OOM_PATTERN] if self.retry_oom else [])
        spec_error = f'lastRetry.message matches "(?i)({"|".join(SPEC_ERROR_PATTERNS)})"'
        infra = (f'(lastRetry.status == "Error" && !({spec_error})) || '
                 f'lastRetry.message matches "(?i)({"|".join(patterns)})"')
        transient = f'(lastRetry.exitCode == "{int(ExitCode.TEMPFAIL)}" && asInt(retries) < {self.transient_limit})'
        return f"{infra} || {transient}"

    def build(self) -> RetryStrategy:
        """Hera model of the retryStrategy. ``retryPolicy`` is Always: the expression decides
        (a policy and an expression are ANDed: Argo's docs/retries.md, "Conditional retries")."""
        return RetryStrategy(
            limit=self.infra_limit,
            retry_policy="Always",
            expression=self.expression(),
            backoff=Backoff(
                duration=f"{STEP_FIRST_DELAY_S}s",
                factor=self.step_backoff_factor,
                cap=f"{self.backoff_cap_s}s",
                max_duration=f"{self.max_duration_s}s",
            ),
            affinity=RetryAffinity(node_anti_affinity=RetryNodeAntiAffinity()),
        )


ARGO_CUSTOM_METRIC_PREFIX = "argo_workflows_"
"""Argo >= 3.6 exports a template's custom metrics with this prefix (field case C12): queries must
name ``argo_workflows_pipectl_step_attempts``, not the metric's own name."""


def exported(metric: str) -> str:
    """The name under which the controller's /metrics serves custom metric ``metric``."""
    return ARGO_CUSTOM_METRIC_PREFIX + metric


TRAINING_GAUGES = {
    "training_images_per_s": ("pipectl_training_images_per_second", "Images per second of the training gang, last epoch"),
    "training_data_share": ("pipectl_training_data_share", "Share of step time the training gang waited for data, last epoch"),
    "training_sync_share": ("pipectl_training_sync_share", "Share of step time in gradient sync not hidden by compute, last epoch"),
    "training_slowest_rank_ratio": ("pipectl_training_slowest_rank_ratio", "Slowest rank's step time over the gang median, last epoch"),
}
"""Evaluate output -> (metric, help): the train step's anatomy as gauges (the gang itself runs in a
job Argo does not see; evaluate hands on its figures)."""


def training_metrics() -> list:
    """The evaluate step's Prometheus gauges of how training went (:data:`TRAINING_GAUGES`), by model
    and lane, from its output parameters; only when the anatomy was measured (pipectl's train
    function: images per second above 0)."""
    from hera.workflows import Gauge, Label

    from pipectl.components.names import kebab

    labels = [Label(key="model", value="{{workflow.parameters.model-name}}"), Label(key="lane", value="{{workflow.parameters.lane}}")]
    when = "{{status}} == Succeeded && {{outputs.parameters.training-images-per-s}} > 0"
    return [Gauge(name=name, help=help_, labels=labels, realtime=False, value="{{outputs.parameters.%s}}" % kebab(field), when=when)
            for field, (name, help_) in TRAINING_GAUGES.items()]


def step_metrics(step: str, *, container: bool) -> list:
    """Argo template-level Prometheus metrics behind the Grafana dashboard (argo/namespace/monitoring/).

    ``pipectl_step_attempts`` counts EVERY attempt by step, lane, final phase and failure class
    (``succeeded``; ``infrastructure`` for status Error: pod deleted, node lost, eviction;
    ``failed`` otherwise). It names only variables every attempt has: the controller substitutes a
    metric's labels all at once and drops the metric when one is missing (operator.go
    computeMetrics, ``template.Replace(..., false)``), and an attempt whose pod was deleted has no
    ``{{exitCode}}`` (field case C11: such attempts vanished from the dashboard). Exit codes go to
    ``pipectl_step_failures_by_exit_code`` (containers, Failed attempts: 75 = declared transient,
    others = code). ``pipectl_step_duration_seconds``: last duration. Variables: Argo docs,
    "Custom metrics".
    """
    from hera.workflows import Counter, Gauge, Label

    failure_class = "{{=status == 'Succeeded' ? 'succeeded' : (status == 'Error' ? 'infrastructure' : 'failed')}}"
    labels = [Label(key="step", value=step), Label(key="status", value="{{status}}"),
              Label(key="lane", value="{{workflow.parameters.lane}}"), Label(key="class", value=failure_class)]
    exit_codes = []
    if container:
        exit_codes = [Counter(name="pipectl_step_failures_by_exit_code", help="Failed attempts of a pipectl step by exit code",
                              labels=[Label(key="step", value=step), Label(key="exit_code", value="{{exitCode}}")],
                              when="{{status}} == Failed", value="1")]
    return [
        Counter(name="pipectl_step_attempts", help="Attempts of a pipectl step by outcome", labels=labels, value="1"),
        *exit_codes,
        Gauge(name="pipectl_step_duration_seconds", help="Duration of the last attempt of a pipectl step",
              labels=[Label(key="step", value=step)], realtime=False, value="{{duration}}"),
    ]
