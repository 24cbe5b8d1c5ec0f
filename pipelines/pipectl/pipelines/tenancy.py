"""Teams sharing one cluster: the site file's ``teams:`` list and its checks. Pure: no I/O.

A team is a namespace of its own with a GPU quota across all lanes and per lane, the preempting
lanes it is granted, the groups bound to ``pipectl-submitter`` there, the prefix of the model
names it owns and the S3 prefix its runs' datasets must be under. :mod:`~pipectl.pipelines.teams`
renders each into ``argo/cluster/teams/<name>.yaml``; :func:`team_problems` lists what makes a set
of teams unsafe (two teams sharing a namespace or a prefix, a quota no cluster can honour).

Example (in the site file)::

    teams:
      - name: vision
        namespace: ml-vision
        groups: [vision-ml]
        max_gpus: 32
        lane_gpus: {urgent: 8, batch: 16}
        model_prefix: vision
        s3_prefix: s3://pipectl/teams/vision/
        s3_principal: arn:aws:iam:::user/pipectl-vision   # its store key's user (Ceph RGW)
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipectl.components.names import Lane

_DNS_LABEL = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_S3_PREFIX = r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/([A-Za-z0-9._=-]+/)*$"
_S3_PRINCIPAL = r"^arn:aws[a-z-]*:iam::[A-Za-z0-9_-]*:(user|role)/[A-Za-z0-9+=,.@_/-]+$"


EVERYONE_GROUPS = {"system:authenticated": "every signed-in identity", "system:unauthenticated": "every anonymous request",
                   "system:serviceaccounts": "every ServiceAccount of every namespace"}
"""Groups no team's ``groups`` may name: bound to ``pipectl-submitter`` in the team's namespace,
each would let everyone in it submit runs on the team's GPUs and data."""


class TeamSpec(BaseModel):
    """One team's share of the cluster (see the module doc)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=_DNS_LABEL, description="The team's name (argo/cluster/teams/<name>.yaml).")
    namespace: str = Field(pattern=_DNS_LABEL, description="The team's namespace: its runs, templates and secrets.")
    groups: tuple[str, ...] = Field(min_length=1, description="Identity groups bound to pipectl-submitter in the namespace.")
    max_gpus: int = Field(ge=0, description="GPUs all pods of the namespace may request together, every lane.")
    # a negative count is no quota the API server takes
    lane_gpus: dict[Lane, Annotated[int, Field(ge=0)]] = Field(default_factory=dict, description="GPUs per lane (a lane left out: only max_gpus "
                                       "bounds it); a preempting lane (urgent) is granted only when listed.")
    model_prefix: str = Field(pattern=_DNS_LABEL, description="The team's models are named <model_prefix>-<name>.")
    s3_prefix: str = Field(pattern=_S3_PREFIX, description="Every run's dataset-uri must be under this prefix "
                           "(s3://bucket/path/, ending in /); the team's own namespace keeps its staged datasets, "
                           "runs and logs under it too.")
    s3_principal: str | None = Field(None, pattern=_S3_PRINCIPAL, description="The store identity of the team's key "
                                     "(the Secret pipectl-s3-credentials of its namespace), as bucket policies name it: "
                                     "Ceph RGW arn:aws:iam:::user/<uid>, AWS arn:aws:iam::<account>:user/<name> or "
                                     ":role/<name>. `pipectl teams store-policy` grants it the team's s3_prefix, "
                                     "and nothing else.")

    @field_validator("groups")
    @classmethod
    def _groups_of_people(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for g in v:
            if not g or g != g.strip():
                raise ValueError(f"{g!r}: a group name, not empty, no surrounding spaces")
            if g in EVERYONE_GROUPS:
                raise ValueError(f"{g}: Kubernetes puts {EVERYONE_GROUPS[g]} in this group; name the team's own group")
        return v

    @field_validator("max_gpus", mode="before")
    @classmethod
    def _not_a_boolean(cls, v: Any) -> Any:
        if isinstance(v, bool):  # `max_gpus: true` is no quota of 1 GPU
            raise ValueError("a number of GPUs, not true or false")
        return v

    @field_validator("lane_gpus", mode="before")
    @classmethod
    def _no_boolean_lane(cls, v: Any) -> Any:
        if isinstance(v, dict) and any(isinstance(n, bool) for n in v.values()):
            raise ValueError("a number of GPUs per lane, not true or false")
        return v


def _nested(a: str, b: str) -> bool:
    """Whether one of the two prefixes contains the other (``vision-`` and ``vision-x-``)."""
    return a.startswith(b) or b.startswith(a)


SYSTEM_NAMESPACES = {"default": "Kubernetes'", "argo": "Argo's controller's", "volcano-system": "Volcano's",
                     "volcano-monitoring": "Volcano's"}
"""Namespaces neither the install nor a team may be given (besides ``kube-*``): the install's and
a team's files label their namespace with the restricted Pod Security Standard and put quotas in
it, which would stop the pods these run."""


def system_owner(namespace: str) -> str | None:
    """Whose namespace ``namespace`` is when pipectl may not be installed in it or give it to a team
    (``"Kubernetes'"``, ``"Argo's controller's"``...), else None."""
    return "Kubernetes'" if namespace.startswith("kube-") else SYSTEM_NAMESPACES.get(namespace)


def namespace_problem(namespace: str) -> str | None:
    """Why ``namespace`` cannot be the install's namespace (the site's ``namespace:``), else None:
    not a DNS label, or a system namespace (:func:`system_owner`)."""
    if not re.fullmatch(_DNS_LABEL, namespace):
        return (f"{namespace!r} is not a namespace name: lower-case letters, digits and '-', at most 63, "
                "starting and ending with a letter or digit")
    if (owner := system_owner(namespace)) is not None:
        return (f"{namespace} is {owner} own: pipectl's install labels its namespace with the restricted Pod Security "
                "Standard and puts GPU quotas and a LimitRange there, which would refuse the pods that run there. "
                "Give pipectl a namespace of its own, e.g. namespace: pipectl")
    return None


def _owner_conflicts(teams: tuple[TeamSpec, ...], own_namespace: str, own_team: str = "") -> list[str]:
    """Pairs of teams sharing a name, a namespace, model names or S3 objects; a team in the install's
    own namespace (unless the install is that team's: ``own_team``) or a system namespace
    (:func:`system_owner`)."""
    out = []
    for t in teams:
        if t.namespace == own_namespace and t.name != own_team:
            out.append(f"team {t.name}: namespace {t.namespace} is the install's own (namespace:); give the team one of its own")
        elif (owner := system_owner(t.namespace)) is not None:
            out.append(f"team {t.name}: namespace {t.namespace} is {owner} own (the team's file would enforce the "
                       "restricted Pod Security Standard and GPU quotas there); give the team one of its own")
    for i, a in enumerate(teams):
        for b in teams[i + 1:]:
            pair = f"teams {a.name} and {b.name}"
            if a.name == b.name:
                out.append(f"{pair}: two teams with one name")
            if a.namespace == b.namespace:
                out.append(f"{pair}: both name namespace {a.namespace}")
            if _nested(a.model_prefix + "-", b.model_prefix + "-"):
                out.append(f"{pair}: model prefixes {a.model_prefix} and {b.model_prefix} overlap "
                           f"(a model {b.model_prefix}-x would be both teams')")
            if _nested(a.s3_prefix, b.s3_prefix):
                out.append(f"{pair}: S3 prefixes {a.s3_prefix} and {b.s3_prefix} overlap (one holds the other's objects)")
            if a.s3_principal is not None and a.s3_principal == b.s3_principal:
                out.append(f"{pair}: both name store identity {a.s3_principal} (its key would reach both teams' prefixes); "
                           "give each team a store user of its own")
    return out


def _quota_problems(team: TeamSpec, cluster_gpus: int | None) -> list[str]:
    """A team's quotas that no cluster of ``cluster_gpus`` GPUs can honour, or that contradict each other."""
    out = []
    if cluster_gpus is not None and team.max_gpus > cluster_gpus:
        out.append(f"team {team.name}: max_gpus {team.max_gpus} is over the cluster's {cluster_gpus} GPUs "
                   "(cluster_gpus, else the GPU node pools' limit_gpus)")
    for lane, gpus in team.lane_gpus.items():
        if gpus > team.max_gpus:
            out.append(f"team {team.name}: lane_gpus.{lane.value} {gpus} is over the team's max_gpus {team.max_gpus}")
    return out


def team_problems(teams: tuple[TeamSpec, ...], own_namespace: str, cluster_gpus: int | None, own_team: str = "") -> list[str]:
    """Everything that makes ``teams`` unsafe to render, each naming the teams and keys (empty: none).
    ``own_team``: the site's ``team:`` (the install is that team's namespace: :func:`own_team_problem`)."""
    out = _owner_conflicts(teams, own_namespace, own_team)
    for t in teams:
        out += _quota_problems(t, cluster_gpus)
    return out


def own_team_problem(team: str, namespace: str, teams: tuple[TeamSpec, ...]) -> str | None:
    """Why the site's ``team: team`` (its namespace ``namespace`` belongs to that team) does not fit
    the site's ``teams:``, else None. Without ``teams:`` there is nothing to check it against (a team's
    own site file need not list the cluster's teams); with them, ``team`` must be one of them and
    ``namespace`` that team's namespace, or its gangs would go to queues its namespace may not use."""
    if not team or not teams:
        return None
    known = {t.name: t for t in teams}
    if team not in known:
        return (f"team: {team} is not one of the site's teams (known: {', '.join(sorted(known))}); "
                "name one of them, add the team under teams:, or leave team: out")
    if known[team].namespace != namespace:
        return (f"team: {team}'s namespace is {known[team].namespace} (teams:), but namespace: is {namespace}; "
                f"set namespace: {known[team].namespace}, or leave team: out")
    return None


def cluster_gpu_ceiling(cluster_gpus: int | None, autoscaling: Any) -> int | None:
    """The GPUs the cluster can hold at most: ``cluster_gpus`` when set, else the sum of the GPU
    node pools' ``limit_gpus`` (when every GPU pool has one), else unknown (None)."""
    if cluster_gpus is not None:
        return cluster_gpus
    pools = [p for p in autoscaling.node_pools if p.gpu]
    if not pools or any(p.limit_gpus is None for p in pools):
        return None
    return sum(p.limit_gpus for p in pools)
