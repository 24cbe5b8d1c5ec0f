"""Each team of the site file (:class:`~pipectl.pipelines.tenancy.TeamSpec`) as the cluster
admin's objects of its namespace: ``argo/cluster/teams/<name>.yaml``. Pure.

The namespace carries what only the cluster admin may set: the restricted Pod Security Standard,
the submission policy, the preempting lanes granted to it (``pipectl-lanes``), its model prefix
(label) and data prefix (annotation) that ``pipectl-submission`` holds every run to. Beside it:
a GPU ResourceQuota across all lanes, one per lane listed in ``lane_gpus`` (scoped to the lane's
PriorityClass), the LimitRange of pipectl's own namespace, the ``pipectl-submitter`` Role bound
to the team's groups, the (empty) parameter-rules ConfigMap the submission policy reads, and the
team's Volcano Queues (one per lane, its GPU share), the only queues its namespace may use.
What runs in the namespace (templates, ServiceAccounts, the store's Secret) is the team's own
``argo/namespace``, rendered from a site file naming the team's namespace.
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Callable

from pipectl.components.names import (
    MLFLOW_PASSWORD_ENV,
    MLFLOW_SECRET,
    MLFLOW_USERNAME_ENV,
    PART_OF,
    Lane,
    lane_object_name,
    team_queue_name,
)
from pipectl.pipelines.admission import (
    DATA_PREFIX_ANNOTATION,
    LANE_LABEL_PREFIX,
    MODEL_PREFIX_LABEL,
    QUOTA_SETTING_ANNOTATION,
    SUBMISSION_LABEL,
    SUBMITTER_ROLE,
    TEAM_LABEL,
    parameter_rules_configmap,
    submitter_role,
)
from pipectl.pipelines.policy import LANES, LaneSpec
from pipectl.pipelines.security import POD_SECURITY_LABELS
from pipectl.pipelines.tenancy import TeamSpec

if TYPE_CHECKING:
    from pipectl.pipelines.training import CompileConfig



def team_namespace(team: TeamSpec, parallelism: tuple[str, int]) -> dict:
    """The team's Namespace: its policies' labels, granted preempting lanes, model and data prefixes."""
    granted = {LANE_LABEL_PREFIX + lane.value: "true" for lane in team.lane_gpus
               if LANES[lane].preemption_policy == "PreemptLowerPriority"}
    labels = {**PART_OF, **POD_SECURITY_LABELS, SUBMISSION_LABEL: "enforce", TEAM_LABEL: team.name,
              MODEL_PREFIX_LABEL: team.model_prefix, **granted, parallelism[0]: str(parallelism[1])}
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": team.namespace, "labels": labels, "annotations": {DATA_PREFIX_ANNOTATION: team.s3_prefix}}}


def lane_quota(team: TeamSpec, lane: Lane, gpus: int) -> dict:
    """A ResourceQuota on the GPUs the namespace's pods of ``lane`` (its PriorityClass) request together."""
    scope = {"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": [lane_object_name(lane.value)]}]}
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": f"pipectl-lane-{lane.value}", "namespace": team.namespace, "labels": dict(PART_OF),
                         "annotations": {QUOTA_SETTING_ANNOTATION: f"teams[{team.name}].lane_gpus.{lane.value}"}},
            "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}, "scopeSelector": scope}}


def submitter_binding(team: TeamSpec) -> dict:
    """``pipectl-submitter`` of the team's namespace bound to the team's groups (and nobody else)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": SUBMITTER_ROLE, "namespace": team.namespace, "labels": dict(PART_OF)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SUBMITTER_ROLE},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g} for g in team.groups]}


NamespaceLimits = Callable[["CompileConfig"], list[dict]]
"""What renders a namespace's GPU quota and LimitRange from a config
(:func:`pipectl.pipelines.manifests.namespace_limits`, the install's own namespace's)."""
LaneQueue = Callable[[LaneSpec, str, int], dict]
"""What renders a lane's Volcano Queue under another name with a GPU share
(:func:`pipectl.pipelines.manifests.lane_queue`)."""


def team_queues(team: TeamSpec, queue: LaneQueue) -> list[dict]:
    """The team's Volcano Queues, one per lane (``pipectl-team-<team>-<lane>``): each the lane's
    queue (reclaimable or not, as the lane) with the team's GPUs of that lane (``lane_gpus``, else
    ``max_gpus``) as deserved and capability, so the team's gangs never take more than its share
    in Volcano and one team's gangs cannot fill another's. A preempting lane's queue only when the
    team is granted the lane (listed in ``lane_gpus``). ``pipectl-lanes`` admits the team's
    namespace to these queues only."""
    return [queue(spec, team_queue_name(team.name, lane.value), team.lane_gpus.get(lane, team.max_gpus))
            for lane, spec in LANES.items() if spec.preemption_policy != "PreemptLowerPriority" or lane in team.lane_gpus]


def team_manifests(team: TeamSpec, cfg: CompileConfig, limits: NamespaceLimits, parallelism: tuple[str, int],
                   queue: LaneQueue) -> list[dict]:
    """Every cluster-admin object of ``team``: ``limits`` of ``cfg`` as the team's namespace and GPUs
    (the steps' default requests are the site's), ``parallelism`` the namespace's workflow-limit
    label, its queues (:func:`team_queues`)."""
    own = cfg.model_copy(update={"namespace": team.namespace, "namespace_max_gpus": team.max_gpus, "team": team.name})
    lanes = [lane_quota(team, lane, gpus) for lane, gpus in sorted(team.lane_gpus.items(), key=lambda kv: kv[0].value)]
    # rendered for this team's own namespace (the site's team:), argo/namespace holds the Role and the ConfigMap
    owner = [] if cfg.team == team.name and cfg.namespace == team.namespace else [
        submitter_role(team.namespace), parameter_rules_configmap(team.namespace)]
    return [team_namespace(team, parallelism), *limits(own), *lanes, *owner[:1], submitter_binding(team), *owner[1:],
            *team_queues(team, queue)]


def teams_files(cfg: CompileConfig, folder: str, limits: NamespaceLimits, parallelism: tuple[str, int],
                queue: LaneQueue) -> dict[str, list[dict]]:
    """``<folder>/teams/<name>.yaml`` -> objects, one file per team of the site."""
    return {f"{folder}/teams/{t.name}.yaml": team_manifests(t, cfg, limits, parallelism, queue) for t in cfg.teams}


def mlflow_credentials_secret(namespace: str, username: str, password: str) -> dict:
    """Secret :data:`~pipectl.components.names.MLFLOW_SECRET` of ``namespace``: the team's MLflow
    user as the variables MLflow's client reads (``MLFLOW_TRACKING_USERNAME``/``PASSWORD``), which
    the pods of the steps that talk to MLflow take with ``envFrom`` (written by ``pipectl teams
    mlflow-user``, never rendered into argo/: it holds a password)."""
    data = {MLFLOW_USERNAME_ENV: username, MLFLOW_PASSWORD_ENV: password}
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": MLFLOW_SECRET, "namespace": namespace, "labels": dict(PART_OF)},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}
