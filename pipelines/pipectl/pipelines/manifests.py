"""Cluster manifests under ``argo/`` (kustomize), rendered from the typed tables.

Pure: :func:`cluster_manifests` maps a :class:`CompileConfig` to ``{relative path: [objects]}``;
``pipectl render cluster --write argo/`` writes them and tests/golden keeps them in sync.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from hera.workflows import CronWorkflow
from hera.workflows.models import Metadata, WorkflowTemplateRef

from pipectl.components.train.telemetry import STARVED_SHARE
from pipectl.components.names import PART_OF, SEMAPHORE_CONFIGMAP, STEP_LABEL, STORE_CONFIGMAP, STORE_SECRET, TEMPLATE_NAME, template_name
from pipectl.pipelines.admission import (
    QUOTA_SETTING_ANNOTATION,
    SUBMISSION_LABEL,
    admission_policies,
    parameter_rules_configmap,
    preempting_lane_labels,
    submitter_role,
)
from pipectl.pipelines.autoscaling import buffer_node_pool, node_pools
from pipectl.pipelines.gang_reaper import gang_reaper
from pipectl.pipelines.launchers import LAUNCHERS
from pipectl.pipelines.policy import LANES, LaneSpec, exported
from pipectl.pipelines.rank_monitoring import pod_monitor, rank_alerts, rank_panels
from pipectl.pipelines.security import POD_SECURITY_LABELS, restricted_container_security_context
from pipectl.pipelines.teams import teams_files
from pipectl.pipelines.builtin import build_training
from pipectl.pipelines.training import DEFAULT_MLFLOW_URI, DEFAULT_S3_ENDPOINT, CompileConfig

ARTIFACT_BUCKET = "pipectl-artifacts"
CEPH_RGW_ENDPOINT = DEFAULT_S3_ENDPOINT.removeprefix("http://")
MLFLOW_URI = DEFAULT_MLFLOW_URI
RETRAIN_TIMEZONE = "Europe/Berlin"
# 05:30 local: outside the 01:00-03:59 window in which EU/US DST changes skip or repeat an hour.
RETRAIN_SCHEDULE = "30 5 * * *"


def _meta(name: str, cfg: CompileConfig, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": cfg.namespace, "labels": dict(PART_OF), **extra}


ARGO_PARALLELISM_LABEL = "workflows.argoproj.io/parallelism-limit"
"""Namespace label: how many workflows of the namespace Argo's controller runs at once (its
namespace watcher, argo-workflows v4 workflow/controller/ns_watcher.go; the controller's ClusterRole
in Argo's install may list and watch namespaces). Unlike the controller's ``namespaceParallelism``,
it holds for this namespace only."""
NAMESPACE_PARALLELISM = 50


def namespace(cfg: CompileConfig) -> list[dict]:
    """The namespace, enforcing the restricted Pod Security Standard and the submission policy,
    granted the preempting lanes (:mod:`~pipectl.pipelines.admission`), and their quota (cluster
    admin: a namespace owner must not relax any of them)."""
    labels = {**PART_OF, **POD_SECURITY_LABELS, SUBMISSION_LABEL: "enforce", **preempting_lane_labels(),
              ARGO_PARALLELISM_LABEL: str(NAMESPACE_PARALLELISM)}
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": cfg.namespace, "labels": labels}},
            *preempting_lane_quota(cfg), *namespace_limits(cfg)]


def cpu_quantity(cores: float) -> str:
    """``cores`` as the API server writes it back (``1``, ``250m``): a re-apply then changes nothing."""
    return str(int(cores)) if float(cores).is_integer() else f"{round(cores * 1000)}m"


def memory_quantity(gib: float) -> str:
    """``gib`` as the API server writes it back (``1Gi``, ``1536Mi``)."""
    return f"{int(gib)}Gi" if float(gib).is_integer() else f"{round(gib * 1024)}Mi"


def namespace_limits(cfg: CompileConfig) -> list[dict]:
    """What the namespace may hold beside other teams, whatever its pods ask for: a ResourceQuota
    on the GPUs of all its pods together (every lane), and a LimitRange giving a container that
    requests nothing the steps' requests (so no pod of the namespace is BestEffort, the kubelet's
    first eviction victims: C07). No default limits: steps may burst, as they are compiled."""
    setting = f"teams[{cfg.team}].max_gpus" if cfg.team else "namespace_max_gpus"
    quota = {"apiVersion": "v1", "kind": "ResourceQuota",
             "metadata": _meta("pipectl-namespace-gpus", cfg, annotations={QUOTA_SETTING_ANNOTATION: setting}),
             "spec": {"hard": {"requests.nvidia.com/gpu": str(cfg.namespace_max_gpus)}}}
    limits = {"apiVersion": "v1", "kind": "LimitRange", "metadata": _meta("pipectl-defaults", cfg),
              "spec": {"limits": [{"type": "Container",
                                   "defaultRequest": {"cpu": cpu_quantity(cfg.step_cpu),
                                                      "memory": memory_quantity(cfg.step_memory_gib)}}]}}
    return [quota, limits]


def preempting_lanes() -> list[str]:
    """PriorityClasses that may preempt other work (``PreemptLowerPriority`` in the lanes table)."""
    return [spec.priority_class for spec in LANES.values() if spec.preemption_policy == "PreemptLowerPriority"]


def preempting_lane_quota(cfg: CompileConfig) -> list[dict]:
    """A ResourceQuota scoped to the preempting lanes' PriorityClasses: how many pods and GPUs this
    namespace may run in them (Kubernetes docs, "Resource Quotas" / "Limit Priority Class
    consumption by default"). Who may use those classes at all is the admission policy's
    (``pipectl-lanes``: a namespace label only the cluster admin sets)."""
    scope = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": preempting_lanes()}]}
    setting = {QUOTA_SETTING_ANNOTATION: "preempting_max_gpus, preempting_max_pods"}
    return [{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": _meta("pipectl-preempting-lanes", cfg, annotations=setting),
             "spec": {"hard": {"pods": str(cfg.preempting_max_pods), "requests.nvidia.com/gpu": str(cfg.preempting_max_gpus)},
                      "scopeSelector": scope}}]


def _task_results_rule() -> dict:
    """What Argo's executor (emissary, Argo >= 3.4) needs in every workflow pod: report the step's
    outputs as WorkflowTaskResults. A new dict each call (shared lists become YAML aliases)."""
    return {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]}


def _role_for(name: str, rules: list[dict], cfg: CompileConfig) -> list[dict]:
    """A ServiceAccount, a Role with ``rules`` and the RoleBinding between them, all named ``name``,
    and the ServiceAccount's token Secret (``<name>.service-account-token``: what Argo mounts into
    its executor containers only, when a workflow sets ``automountServiceAccountToken: false``;
    Kubernetes fills it in)."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, cfg)},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
         "metadata": _meta(f"{name}.service-account-token", cfg, annotations={"kubernetes.io/service-account.name": name})},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(name, cfg), "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(name, cfg),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": cfg.namespace}],
        },
    ]


GANG_PODS_RULE = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
"""The ``gang-release`` exit handler waits (a watch) until no gang pod of its run is left."""


def rbac(cfg: CompileConfig) -> list[dict]:
    """Least privilege, one ServiceAccount per kind of pod, namespaced Roles only, no
    wildcards:

    - ``service_account`` (every step pod): the executor's WorkflowTaskResults, nothing else;
    - ``launcher_service_account`` (the train step's resource pod, argoexec running ``kubectl apply
      --server-side`` then polling the job with GET, and the ``gang-release`` exit handler): that
      plus create/get/patch/list/watch/delete on the ONE gang job kind of ``cfg.launcher``
      (server-side apply that creates needs create and patch) and list/watch of pods;
    - ``training_service_account`` (the gang's pods): no Role, and its token is not mounted;
    - ``pipectl-submitter`` (people and CI that submit runs; an admin binds it to their group): see
      :func:`~pipectl.pipelines.admission.submitter_role`.
    """
    job_rule = LAUNCHERS[cfg.launcher].rbac_rule()
    return [
        *_role_for(cfg.service_account, [_task_results_rule()], cfg),
        *_role_for(cfg.launcher_service_account, [_task_results_rule(), job_rule, GANG_PODS_RULE], cfg),
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(cfg.training_service_account, cfg),
         "automountServiceAccountToken": False},
        submitter_role(cfg.namespace),
    ]


def priority_classes() -> list[dict]:
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": spec.priority_class, "labels": dict(PART_OF)},
            "value": spec.priority_value,
            "preemptionPolicy": spec.preemption_policy,
            # no `globalDefault: false`: the API server drops a false bool (omitempty), so
            # `kubectl apply` would report every PriorityClass "configured" on every apply
            # (seen on the test cluster with kubectl v1.34.4)
            "description": f"pipectl lane {spec.lane.value}",
        }
        for spec in LANES.values()
    ]


# A lane with no bound on what it deserves (LaneSpec.queue_deserved_gpus None): the capacity plugin
# compares every dimension a task requests with the queue's deserved (a dimension left out counts as
# 0, not as unbounded), so CPU, memory and GPUs are all written, each far above any cluster. The
# plugin clamps deserved to what the queue requests, so these never reserve anything.
UNBOUNDED_DESERVED = {"cpu": "1000000", "memory": "1000Pi", "nvidia.com/gpu": "1000000"}


def lane_queue(spec: LaneSpec, name: str | None = None, gpus: int | None = None) -> dict:
    """The Volcano Queue of a lane (``spec``): ``name`` (default: the lane's own), and with ``gpus``
    a share of that many GPUs at most (a team's queue of the lane: deserved and capability no more
    than ``gpus``)."""
    deserved = (dict(UNBOUNDED_DESERVED) if spec.queue_deserved_gpus is None
                else {"nvidia.com/gpu": str(spec.queue_deserved_gpus)})
    capability = spec.queue_capability_gpus
    if gpus is not None:
        deserved["nvidia.com/gpu"] = str(min(int(deserved["nvidia.com/gpu"]), gpus))
        capability = gpus if capability is None else min(capability, gpus)
    # weight: Volcano's webhook default, written out; the capacity plugin does not read it
    queue: dict[str, Any] = {"weight": 1, "reclaimable": spec.queue_reclaimable, "deserved": deserved}
    if capability is not None:
        queue["capability"] = {"nvidia.com/gpu": str(capability)}
    return {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
            "metadata": {"name": name or spec.queue, "labels": dict(PART_OF)}, "spec": queue}


def volcano_queues() -> list[dict]:
    return [lane_queue(spec) for spec in LANES.values()]


# Volcano scheduler configuration that makes the lanes work (Volcano v1.10 docs, "Scheduler
# configuration", "Actions", "Plugins"):
# - NO enqueue action: enqueue admits a PodGroup only when the resources the cluster has NOW could
#   run it (overcommit and proportion compare with the current nodes' total), so on an autoscaled
#   cluster with no GPU node a GPU gang is never admitted, its pods are never created, and no
#   autoscaler ever sees a pending pod (seen on the test cluster with Karpenter: PodGroup Pending,
#   no pods, no NodeClaim, for as long as we waited). Without enqueue, allocate admits every
#   PodGroup (allocate.go: "If not config enqueue action, change Pending pg into Inqueue"), the
#   pods exist, Volcano marks them PodScheduled=False/Unschedulable, and the autoscaler provisions;
# - allocate binds whole gangs (gang plugin: minAvailable or nothing), so a partial scale-up
#   binds nothing and holds no GPU;
# - preempt lets a higher-priority job take resources from lower-priority ones in the SAME queue
#   (priority plugin: PriorityClass values of the lanes);
# - reclaim lets a queue below what it deserves take resources back from reclaimable queues that
#   hold more than theirs: how an urgent gang gets GPUs that batch work is holding. The capacity
#   plugin, with each lane's deserved written in its Queue (policy.LANES: batch deserves 0), and
#   NOT the proportion plugin: proportion derives deserved from the cluster's total, cordoned
#   nodes, idle GPUs on other node pools and GPUs left in fragments included, so once those add
#   up to what the urgent gang asks for, a batch queue filling every node it can use is "within
#   its share" and nothing is reclaimed (seen on the
#   test cluster: 2 of 6 GPU nodes cordoned, batch gangs on the other 4, an urgent 2 x 8-GPU
#   gang never bound; with capacity it bound in 3.2 s, one batch gang restarted whole);
# - backfill places best-effort pods in the gaps.
# gang.enablePreemptable=false: the gang plugin would otherwise refuse any victim that leaves its
# job below minAvailable, so one running batch gang could block every urgent gang; the evicted
# gang restarts whole (Volcano Job policy PodEvicted -> RestartJob, pipelines/pipectl/pipelines/launchers/volcano.py) and resumes
# from its checkpoint. drf.enablePreemptable=false: fairness by dominant share must not veto lanes.
VOLCANO_SCHEDULER_CONF = {
    "actions": "allocate, preempt, reclaim, backfill",
    "tiers": [
        {"plugins": [{"name": "priority"}, {"name": "gang", "enablePreemptable": False}, {"name": "conformance"}]},
        {"plugins": [{"name": "drf", "enablePreemptable": False}, {"name": "predicates"},
                     {"name": "capacity"}, {"name": "nodeorder"}, {"name": "binpack"}]},
    ],
}


def volcano_scheduler_config() -> list[dict]:
    """``volcano-scheduler-configmap`` (namespace ``volcano-system``, key ``volcano-scheduler.conf``
    as Volcano's Helm chart names them): the actions and plugins the lanes rely on."""
    import yaml

    return [{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "volcano-scheduler-configmap", "namespace": "volcano-system",
                     "labels": dict(PART_OF)},
        "data": {"volcano-scheduler.conf": yaml.safe_dump(VOLCANO_SCHEDULER_CONF, sort_keys=False)},
    }]


def config_maps(cfg: CompileConfig) -> list[dict]:
    """Semaphore sizes per lane, store settings for steps, the Argo artifact repository on
    Ceph RGW (credentials only as Secret references), and the (empty) rules of the templates' own
    parameters the submission policy reads (``pipectl templates apply`` adds each template's keys). ``archiveLogs``: every step pod's main log is
    saved to ``s3://pipectl-artifacts/<workflow>/<pod>/main.log`` by argoexec's wait container, so
    logs outlive pod GC (the Argo UI and `pipectl logs` read pods while they exist). In a declared
    team's namespace they go under the team's prefix, ``<s3_prefix>logs/<workflow>/<pod>/main.log``:
    its key may write nowhere else (:mod:`~pipectl.pipelines.store_policy`)."""
    from pipectl.components.runtime import parse_s3_uri

    team = cfg.own_team()
    bucket, key_prefix = parse_s3_uri(team.s3_prefix) if team is not None else (ARTIFACT_BUCKET, "")
    artifact_repo = {
        "archiveLogs": True,
        "s3": {
            "bucket": bucket,
            "endpoint": urlsplit(cfg.s3_endpoint).netloc,
            "insecure": urlsplit(cfg.s3_endpoint).scheme == "http",
            "keyFormat": (key_prefix + "logs/" if team is not None else "") + "{{workflow.name}}/{{pod.name}}",
            "accessKeySecret": {"name": STORE_SECRET, "key": "PIPECTL_S3_ACCESS_KEY"},
            "secretKeySecret": {"name": STORE_SECRET, "key": "PIPECTL_S3_SECRET_KEY"},
        }
    }
    import yaml

    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(SEMAPHORE_CONFIGMAP, cfg),
         "data": {spec.lane.value: str(spec.concurrency) for spec in LANES.values()}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(STORE_CONFIGMAP, cfg),
         "data": {"PIPECTL_S3_ENDPOINT": cfg.s3_endpoint.rstrip("/"), "PIPECTL_BUCKET": cfg.bucket, "PIPECTL_MLFLOW_URI": cfg.mlflow_uri.rstrip("/")}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": _meta("artifact-repositories", cfg, annotations={"workflows.argoproj.io/default-artifact-repository": "ceph-rgw"}),
         "data": {"ceph-rgw": yaml.safe_dump(artifact_repo, sort_keys=True)}},
        parameter_rules_configmap(cfg.namespace),
    ]


def controller_config(cfg: CompileConfig) -> list[dict]:
    """workflow-controller-configmap (namespace ``argo``): only what pipectl cannot set per workflow
    or per namespace, each key a setting of the controller for every tenant (docs/security.md,
    "Shared settings"): metrics on, the executor containers' requests and restricted fields, the
    UI's link to a run's MLflow run. Pod GC and TTL are the WorkflowTemplate's own
    (:data:`~pipectl.pipelines.training.POD_GC`, :data:`~pipectl.pipelines.training.TTL`), the
    namespace's parallelism a label of its own namespace (:data:`ARGO_PARALLELISM_LABEL`)."""
    import yaml

    return [{
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "workflow-controller-configmap", "namespace": "argo", "labels": dict(PART_OF)},
        "data": {
            "metricsConfig": yaml.safe_dump({"enabled": True, "path": "/metrics", "port": 9090}, sort_keys=True),
            # Argo's executor containers (init, wait, and the main container of resource pods such
            # as the train step) get no resources unless configured (workflowpod.go:
            # Config.GetExecutor().Resources): without requests a resource pod is BestEffort (C07).
            # and restricted container fields (the pod-level ones come from the workflow)
            "executor": yaml.safe_dump({"resources": {"requests": {"cpu": "10m", "memory": "64Mi"}},
                                        "securityContext": restricted_container_security_context(read_only_root=False)}),
            # Argo UI: a link from every workflow to its MLflow run. The run id is the workflow's
            # output `mlflow-run-id` (evaluate exports it: training.WORKFLOW_OUTPUTS; the UI offers
            # a workflow link `status` with only startedAt/finishedAt, the whole object as
            # `workflow`); MLflow's #/runs/<id> opens the run itself (seen with a browser: the earlier
            # #/experiments?searchFilter=tags... landed on the list of experiments, not the run).
            "links": yaml.safe_dump([{
                "name": "MLflow run",
                "scope": "workflow",
                "url": cfg.mlflow_uri.rstrip("/") + "/#/runs/${workflow.status.outputs.parameters.0.value}",
            }]),
        },
    }]


def _counter_increase(selector: str, window: str) -> str:
    """PromQL: per series, how much the counter ``selector`` grew within ``window`` (a PromQL
    duration such as ``10m``), counting a series BORN within the window from 0.

    Argo creates a workflow counter's series at its first increment, with value 1 (seen on the test
    cluster: ``argo_workflows_total_count{phase="Failed"} 1`` after the first failed workflow), and
    ``increase()`` only sees the difference between samples in the window: the first event of every
    label combination counted 0, so the first failed workflow after a controller start never fired
    the alert (field case C12, found by tests/cluster/test_monitoring.py; upstream
    prometheus/prometheus#1673). Series that existed before the window: ``increase()`` (counter resets
    handled); series that did not: their current value. Only for counters whose series start at their
    first event (Argo's); an exporter that keeps a series from 0 (DCGM) needs plain ``increase()``.
    """
    return (f"((increase({selector}[{window}]) and {selector} offset {window})"
            f" or ({selector} unless {selector} offset {window}))")


DCGM_IDLE_UTIL_PCT = 5
"""A training pod's GPU averaging below this utilisation (%, DCGM_FI_DEV_GPU_UTIL) for 10 minutes is
idle: a dead data loader, a hang before the first step, a rank waiting on a lost peer. (An NCCL
collective that hangs keeps the GPU at ~100 % and is not seen here: the step-duration panel and the
workflow's timeout catch it.)"""
DCGM_NOTES = ("dcgm-exporter's default counters (etc/default-counters.csv) and its Kubernetes labels "
              "(pod, namespace, container: set for the GPUs a container holds; gpu, UUID, Hostname); "
              "scraped with honorLabels: true as the GPU Operator's ServiceMonitor does")


def prometheus_rules(cfg: CompileConfig) -> list[dict]:
    """PrometheusRule ``pipectl``: the alerts (prometheus-operator's CRD; a plain Prometheus loads
    ``spec.groups`` as a rule file).

    - PipectlWorkflowFailed: a workflow in the namespace ended Failed or Error in the last 10 minutes
      (Argo's ``argo_workflows_total_count``; :func:`_counter_increase`).
    - PipectlTrainingStarvedForData: the last run of a model waited for data more than
      ``STARVED_SHARE`` of its step time (the train step's starved verdict, as a gauge of evaluate's).
    - PipectlTrainingPendingTooLong: a train pod Pending longer than the autoscaler's scale-up budget
      (``cfg.retry.scale_up_s``). kube-state-metrics; its ``kube_pod_labels`` carries the pod label
      ``pipectl.io/step`` only with ``--metric-labels-allowlist=pods=[pipectl.io/step]``.
    - GPU (dcgm-exporter, :data:`DCGM_NOTES`): PipectlTrainingGPUIdle (a GPU held by a pipectl pod
      averaging below :data:`DCGM_IDLE_UTIL_PCT` % for 10 minutes, for 10 minutes), PipectlGPUXidError
      (``DCGM_FI_DEV_XID_ERRORS``, the last XID, non-zero: the driver reported a GPU fault; NVIDIA's
      "XID Errors" catalogue), PipectlGPURowRemapFailure (``DCGM_FI_DEV_ROW_REMAP_FAILURE``: the memory
      cannot remap a failing row any more: replace the GPU), PipectlGPUUncorrectableMemoryError
      (``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS`` grew: an uncorrectable ECC error; the GPU needs a
      reset before the remap takes effect). High GPU memory use is NOT an alert: PyTorch's caching
      allocator keeps 90 %+ of the memory reserved in a healthy run.
    Every expression is run against a real Prometheus: tests/cluster/test_monitoring.py (Argo) and
    tests/unit/test_monitoring_rules.py (``promtool test rules``, DCGM and kube-state-metrics).
    """
    ns = cfg.namespace
    pending_s = cfg.retry.scale_up_s
    step_label = "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", STEP_LABEL)  # kube-state-metrics' sanitised name
    failed = _counter_increase(f'argo_workflows_total_count{{namespace="{ns}", phase=~"Failed|Error"}}', "10m")
    gpu = f'namespace="{ns}", pod!=""'
    return [{
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": _meta("pipectl", cfg),
        "spec": {"groups": [{
            "name": "pipectl",
            "rules": [
                {"alert": "PipectlWorkflowFailed",
                 "expr": f"sum by (namespace, phase) ({failed}) > 0",
                 "labels": {"severity": "warning"},
                 "annotations": {"summary": "{{ $value }} pipectl workflow(s) ended {{ $labels.phase }} in the last 10 minutes"}},
                {"alert": "PipectlTrainingStarvedForData",
                 "expr": f"max by (model) ({exported('pipectl_training_data_share')}) > {STARVED_SHARE}",
                 "labels": {"severity": "warning"},
                 "annotations": {"summary": "training of {{ $labels.model }} waited for data {{ $value | humanizePercentage }} "
                                            "of its step time in its last epoch: more loader workers, Alluxio warm-up, or a faster store"}},
                {"alert": "PipectlTrainingPendingTooLong",
                 "expr": f'max by (namespace, pod) (kube_pod_status_phase{{phase="Pending", namespace="{ns}"}} '
                         f'* on (namespace, pod) group_left kube_pod_labels{{{step_label}="train"}}) > 0',
                 "for": f"{pending_s}s", "labels": {"severity": "critical"},
                 "annotations": {"summary": f"training pod {{{{ $labels.pod }}}} Pending longer than the scale-up budget ({pending_s} s)"}},
                {"alert": "PipectlTrainingGPUIdle",
                 "expr": f"avg_over_time(DCGM_FI_DEV_GPU_UTIL{{{gpu}}}[10m]) < {DCGM_IDLE_UTIL_PCT}",
                 "for": "10m", "labels": {"severity": "warning"},
                 "annotations": {"summary": "GPU {{ $labels.gpu }} of pod {{ $labels.pod }} on {{ $labels.Hostname }} "
                                            f"below {DCGM_IDLE_UTIL_PCT}% utilisation for 10 minutes: data starvation or a hang"}},
                {"alert": "PipectlGPUXidError",
                 "expr": "DCGM_FI_DEV_XID_ERRORS > 0",
                 "labels": {"severity": "critical"},
                 "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} reported XID {{ $value }} "
                                            "(pod {{ $labels.pod }}): a driver-reported GPU fault, see NVIDIA's XID catalogue"}},
                {"alert": "PipectlGPURowRemapFailure",
                 "expr": "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
                 "labels": {"severity": "critical"},
                 "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} can no longer remap failing "
                                            "memory rows: drain the node and replace the GPU"}},
                {"alert": "PipectlGPUUncorrectableMemoryError",
                 "expr": "increase(DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS[1h]) > 0",
                 "labels": {"severity": "critical"},
                 "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} had an uncorrectable memory "
                                            "error (rows remapped): drain the node and reset the GPU"}},
                *rank_alerts(ns),
            ],
        }]},
    }]


def grafana_dashboard(cfg: CompileConfig) -> list[dict]:
    """ConfigMap with the Grafana dashboard ``pipectl`` (label ``grafana_dashboard: "1"`` for
    Grafana's dashboard sidecar). Panels: step duration, attempts that did not succeed by class,
    failed attempts by exit code (Argo custom metrics, ``argo_workflows_`` prefix:
    :func:`pipectl.pipelines.policy.exported`; counters through :func:`_counter_increase`), gangs
    waiting per lane (Volcano's queue metrics from vc-scheduler ``--enable-metrics``), pods waiting
    per lane (kube-state-metrics), GPU utilisation of the namespace's pods and the growth of their GPU
    memory (dcgm-exporter: ``DCGM_FI_DEV_FB_USED``, MiB, one of its default counters; its trend, not
    its level: PyTorch's caching allocator holds most of a GPU in a healthy run, and a memory that
    climbs for half an hour is the leak the train step's "memory growing" verdict names per rank)."""
    def panel(i: int, title: str, expr: str) -> dict:
        return {"id": i, "type": "timeseries", "title": title, "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
                "targets": [{"expr": expr, "refId": "A"}]}

    ns = cfg.namespace
    queues = "|".join(spec.queue for spec in LANES.values())
    priority_classes = "|".join(spec.priority_class for spec in LANES.values())
    attempts = _counter_increase(f'{exported("pipectl_step_attempts")}{{class!="succeeded"}}', "1h")
    by_exit_code = _counter_increase(exported("pipectl_step_failures_by_exit_code"), "1h")
    dashboard = {
        "title": "pipectl training pipelines",
        "uid": "pipectl",
        "schemaVersion": 39,
        "panels": [
            panel(0, "Step duration (s)", f"max by (step) ({exported('pipectl_step_duration_seconds')})"),
            panel(1, "Attempts that did not succeed, by class (1h): infrastructure (Error: pod lost), failed",
                  f"sum by (step, class) ({attempts})"),
            panel(2, "Pods waiting per lane (Pending, by PriorityClass)",
                  f'sum by (priority_class) (kube_pod_status_phase{{phase="Pending", namespace="{ns}"}} '
                  f'* on (namespace, pod) group_left (priority_class) kube_pod_info{{priority_class=~"{priority_classes}"}})'),
            panel(3, "GPU utilisation of the namespace's pods (%)",
                  f'avg by (pod) (DCGM_FI_DEV_GPU_UTIL{{namespace="{ns}", pod!=""}})'),
            panel(4, "Failed attempts by exit code (1h): 75 = declared transient, other = code",
                  f"sum by (step, exit_code) ({by_exit_code})"),
            panel(5, "Gangs waiting per lane (Volcano queue: PodGroups Pending or Inqueue)",
                  f'sum by (queue_name) (volcano_queue_pod_group_pending_count{{queue_name=~"{queues}"}} '
                  f'+ volcano_queue_pod_group_inqueue_count{{queue_name=~"{queues}"}})'),
            panel(6, "Training throughput by model (images/s, last epoch of the last run)",
                  f"max by (model) ({exported('pipectl_training_images_per_second')})"),
            panel(7, "Training step time waiting for data, by model (share; above 0.2: starved)",
                  f"max by (model) ({exported('pipectl_training_data_share')})"),
            panel(8, "Training step time in exposed gradient sync, by model (share; above 0.15: fabric-bound)",
                  f"max by (model) ({exported('pipectl_training_sync_share')})"),
            panel(9, "Slowest training rank over the gang's median, by model (above 1.2: a straggler)",
                  f"max by (model) ({exported('pipectl_training_slowest_rank_ratio')})"),
            panel(10, "GPU memory growth of the namespace's pods (MiB per hour over 30 minutes; a steady climb: likely a leak)",
                  f'max by (pod) (deriv(DCGM_FI_DEV_FB_USED{{namespace="{ns}", pod!=""}}[30m])) * 3600'),
            # the gang pods' own figures, per rank (pipectl.pipelines.rank_monitoring)
            *({**panel(11 + j, title, expr), "type": kind, "targets": [{"expr": expr, "refId": "A", "legendFormat": legend}],
               **({"options": {"calculate": False, "yAxis": {"unit": "s"}}} if kind == "heatmap" else {})}
              for j, (kind, title, expr, legend) in enumerate(rank_panels(ns))),
        ],
    }
    return [{"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": _meta("pipectl-grafana-dashboard", cfg, labels={**PART_OF, "grafana_dashboard": "1"}),
             "data": {"pipectl.json": json.dumps(dashboard, indent=2, sort_keys=True)}}]


def retrain_cron(cfg: CompileConfig, pipeline: str = "training") -> CronWorkflow:
    """CronWorkflow ``retrain``: the WorkflowTemplate ``<pipeline>-v1`` (default: the built-in
    ``training``) daily at 05:30 Europe/Berlin. Another pipeline's schedule is ``retrain-<pipeline>``,
    so each pipeline has its own and applying one leaves the others in place.

    DST-safe: the time is outside the hours a DST change skips or repeats, and ``when`` skips a
    run if the previous one started less than 20 hours ago (a repeated hour can never run twice).
    ``concurrencyPolicy: Forbid``: a retrain never overlaps the previous one.
    ``workflowMetadata`` labels each run as pipectl's (``pipectl list``, the Argo UI's label filter);
    the controller adds ``workflows.argoproj.io/cron-workflow: <its name>`` itself.
    """
    builtin = pipeline == "training"
    return CronWorkflow(
        name="retrain" if builtin else f"retrain-{pipeline}",
        namespace=cfg.namespace,
        labels=dict(PART_OF),
        annotations={"workflows.argoproj.io/title": "Scheduled retraining" if builtin else f"Scheduled {pipeline}",
                     "workflows.argoproj.io/description": "Retrains and registers the model daily." if builtin
                     else f"Runs WorkflowTemplate {template_name(pipeline)} daily."},
        schedules=[RETRAIN_SCHEDULE],
        timezone=RETRAIN_TIMEZONE,
        concurrency_policy="Forbid",
        starting_deadline_seconds=3600,
        successful_jobs_history_limit=3,
        failed_jobs_history_limit=5,
        when="{{= cronworkflow.lastScheduledTime == nil || (now() - cronworkflow.lastScheduledTime).Hours() >= 20 }}",
        workflow_template_ref=WorkflowTemplateRef(name=template_name(pipeline)),
        workflow_metadata=Metadata(labels=dict(PART_OF)),
    )


CLUSTER_ADMIN_DIR = "cluster"
NAMESPACE_OWNER_DIR = "namespace"
TEMPLATE_FILE = f"{NAMESPACE_OWNER_DIR}/workflowtemplates/{TEMPLATE_NAME}.yaml"
CRON_FILE = f"{NAMESPACE_OWNER_DIR}/cronworkflows/retrain.yaml"
KARPENTER_DIR = "autoscaling/karpenter"
KUSTOMIZATION_DIRS = (CLUSTER_ADMIN_DIR, NAMESPACE_OWNER_DIR, KARPENTER_DIR)
"""Each its own kustomization; the top-level one has only the first two (a cluster runs Karpenter,
the Cluster Autoscaler or neither: ``autoscaling/`` is applied on purpose)."""


def cluster_manifests(cfg: CompileConfig | None = None) -> dict[str, list[dict]]:
    """Every manifest under ``argo/``: relative path -> objects (a multi-document YAML file).

    Two kustomizations: ``cluster/`` is what a cluster admin applies once (the namespace
    with its Pod Security labels and preempting-lane quota, PriorityClasses, Volcano queues and
    scheduler configuration, Argo controller settings; applied server-side, the shared ConfigMaps
    get only pipectl's keys and other tenants' keys stay), ``namespace/`` what the namespace owner
    applies (RBAC, the gang reaper, config, templates, cron, monitoring), all namespaced. ``autoscaling/karpenter/``
    (NodePools, the urgent lane's warm buffer among them) is a cluster-admin kustomization of its
    own, applied when the cluster runs Karpenter. ``cluster/teams/<name>.yaml``: each team of the
    site's ``teams`` (:mod:`~pipectl.pipelines.teams`). Rendered for a team's namespace (``team``),
    ``namespace/`` has no retrain schedule: its runs must name their model and dataset.
    """
    cfg = cfg or CompileConfig()
    admin, owner = CLUSTER_ADMIN_DIR, NAMESPACE_OWNER_DIR
    return {
        # rendered for one of the site's teams (``team:`` among ``teams:``), the namespace is its team file's
        **({} if cfg.own_team() else {f"{admin}/namespace.yaml": namespace(cfg)}),
        f"{admin}/priorityclasses.yaml": priority_classes(),
        f"{admin}/volcano-queues.yaml": volcano_queues(),
        f"{admin}/volcano/volcano-scheduler-configmap.yaml": volcano_scheduler_config(),
        f"{admin}/controller/workflow-controller-configmap.yaml": controller_config(cfg),
        f"{admin}/admission/policies.yaml": admission_policies(cfg.admin_groups, cfg.admin_users),
        f"{owner}/rbac.yaml": rbac(cfg),
        f"{owner}/gang-reaper.yaml": gang_reaper(cfg),
        f"{owner}/configmaps.yaml": config_maps(cfg),
        f"{owner}/monitoring/prometheus-rules.yaml": prometheus_rules(cfg),
        f"{owner}/monitoring/grafana-dashboard.yaml": grafana_dashboard(cfg),
        f"{owner}/monitoring/pod-monitor.yaml": [pod_monitor(cfg.namespace)],
        TEMPLATE_FILE: [build_training(cfg).to_dict()],
        # a team's namespace: runs must name their model and dataset (the team's prefixes), which
        # pipectl cannot choose for a schedule; the team writes its own (docs/security.md, "Teams")
        **({} if cfg.team else {CRON_FILE: [retrain_cron(cfg).to_dict()]}),
        f"{KARPENTER_DIR}/nodepools.yaml": node_pools(cfg.autoscaling) + buffer_node_pool(cfg.autoscaling),
        **teams_files(cfg, admin, namespace_limits, (ARGO_PARALLELISM_LABEL, NAMESPACE_PARALLELISM), lane_queue),
    }


def kustomization(resources: list[str]) -> dict:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": sorted(resources)}


RENDERED_HEADER = "# Rendered by `pipectl render cluster --write argo` (make golden). Do not edit by hand.\n"
"""The first line of every file ``render cluster --write`` writes."""
TEAMS_DIR = f"{CLUSTER_ADMIN_DIR}/teams"
"""Where each team's file goes: the one folder whose files come and go with the site file."""


def stale_files(existing: dict[str, str], files: dict[str, str]) -> list[str]:
    """Of ``existing`` (relative path under ``argo/`` -> the file's first line), the team files a
    render wrote earlier (:data:`RENDERED_HEADER`) that this render (``files``) no longer makes: a
    team removed from the site file. Any other file there (one an admin added) is never listed."""
    return sorted(rel for rel, first in existing.items()
                  if rel.startswith(TEAMS_DIR + "/") and rel not in files and first + "\n" == RENDERED_HEADER)


def render_files(cfg: CompileConfig | None = None) -> dict[str, str]:
    """``argo/`` as text: each manifest file (multi-document YAML), ``cluster/`` and ``namespace/``
    kustomizations, and a top-level one with both (a single-tenant install: ``kubectl apply
    --server-side -k argo/``)."""
    import yaml

    manifests = cluster_manifests(cfg)
    header = RENDERED_HEADER
    files = {path: header + yaml.safe_dump_all(objs, sort_keys=False) for path, objs in manifests.items()}
    for folder in KUSTOMIZATION_DIRS:
        members = [p[len(folder) + 1:] for p in manifests if p.startswith(folder + "/")]
        files[f"{folder}/kustomization.yaml"] = header + yaml.safe_dump(kustomization(members), sort_keys=False)
    files["kustomization.yaml"] = header + yaml.safe_dump(kustomization([CLUSTER_ADMIN_DIR, NAMESPACE_OWNER_DIR]), sort_keys=False)
    return files
