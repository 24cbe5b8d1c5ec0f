"""The gang reaper's objects (``argo/namespace/gang-reaper.yaml``): its Deployment, ServiceAccount,
Role and RoleBinding.

The reaper (:mod:`pipectl.components.gang.reaper`) releases the gang of every run that ends other
than Succeeded, however it ends (TERMINATE in the Argo UI and ``argo terminate`` run no exit
handler). One replica of the light step image; a second one during a rollout does no harm (a
release is idempotent). Its Role holds only what it does: read and watch workflows, list, watch
and delete the ONE gang job kind of ``cfg.launcher``, list and watch pods (a release waits until
the gang's pods are gone).
"""

from __future__ import annotations

from pipectl.components.names import PART_OF, Lane
from pipectl.pipelines.launchers import LAUNCHERS
from pipectl.pipelines.policy import LANES
from pipectl.pipelines.security import restricted_container_security_context, restricted_pod_security_context
from pipectl.pipelines.training import CompileConfig

GANG_REAPER = "pipectl-gang-reaper"
"""The Deployment, its ServiceAccount, Role and RoleBinding."""
REAPER_RESOURCES = {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}
"""A Python process with the Kubernetes client, reading workflows a page at a time."""


def gang_reaper_rules(cfg: CompileConfig) -> list[dict]:
    """The reaper's Role: workflows get/list/watch, the gang job kind list/watch/delete, pods list/watch."""
    launcher = LAUNCHERS[cfg.launcher]
    return [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [launcher.api_group], "resources": [launcher.resource], "verbs": ["list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]


def gang_reaper_command(cfg: CompileConfig) -> list[str]:
    """What the reaper's container runs (and what a test runs as the reaper's ServiceAccount)."""
    launcher = LAUNCHERS[cfg.launcher]
    return ["python", "-m", "pipectl.components.gang", "reap", "--namespace", cfg.namespace,
            "--job-kind", f"{launcher.api_group}/{launcher.version}/{launcher.resource}"]


def _labels() -> dict[str, str]:
    """A new dict each call (a dict shared by two objects becomes a YAML alias)."""
    return {**PART_OF, "app.kubernetes.io/name": GANG_REAPER}


def _deployment(cfg: CompileConfig) -> dict:
    command = gang_reaper_command(cfg)
    container = {
        "name": "reaper",
        "image": cfg.light_image,
        "command": command[:3],
        "args": command[3:],
        "resources": {k: dict(v) for k, v in REAPER_RESOURCES.items()},
        "securityContext": restricted_container_security_context(),
    }
    pod = {
        "serviceAccountName": GANG_REAPER,
        "automountServiceAccountToken": True,  # its own code calls the API: the one pipectl pod outside a workflow with a token
        # the standard lane's priority: never preempts, and batch work never comes first
        "priorityClassName": LANES[Lane.standard].priority_class,
        "securityContext": restricted_pod_security_context(),
        "containers": [container],
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": GANG_REAPER, "namespace": cfg.namespace, "labels": _labels()},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": GANG_REAPER}},
                     "template": {"metadata": {"labels": _labels()}, "spec": pod}}}


def gang_reaper(cfg: CompileConfig) -> list[dict]:
    """ServiceAccount, Role, RoleBinding (all named :data:`GANG_REAPER`) and the Deployment."""
    def meta() -> dict:
        return {"name": GANG_REAPER, "namespace": cfg.namespace, "labels": dict(PART_OF)}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta(), "rules": gang_reaper_rules(cfg)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta(),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": GANG_REAPER},
         "subjects": [{"kind": "ServiceAccount", "name": GANG_REAPER, "namespace": cfg.namespace}]},
        _deployment(cfg),
    ]
