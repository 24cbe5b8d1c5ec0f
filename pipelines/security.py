"""Pod security: the Kubernetes "restricted" Pod Security Standard (issue 13), as plain dicts.

Pure and light (no hera, no pydantic): the launchers' pod templates, the step templates and Argo's
executor settings (:mod:`pipectl.pipelines.manifests`) all take their security fields from here.
"""

from __future__ import annotations

# https://kubernetes.io/docs/concepts/security/pod-security-standards/#restricted : non-root,
# no privilege escalation, every capability dropped, a RuntimeDefault seccomp profile.

RUN_AS_UID = 10001
"""The step images' user (images/Dockerfile: ``USER 10001:10001``)."""

POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
    "pod-security.kubernetes.io/warn": "restricted",
}
"""Namespace labels: the API server's built-in PodSecurity admission refuses any other pod."""

TMP_VOLUME = {"name": "tmp", "emptyDir": {}}
"""Writable /tmp (outputs, temporary files) for containers whose root file system is read-only."""


def restricted_pod_security_context() -> dict:
    """Pod-level fields of "restricted" (Kubernetes API field names): non-root as RUN_AS_UID, with
    its group owning volumes, RuntimeDefault seccomp."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_UID, "fsGroup": RUN_AS_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def restricted_container_security_context(read_only_root: bool = True) -> dict:
    """Container-level fields of "restricted" (they cannot be set for the whole pod); the root file
    system read-only unless ``read_only_root`` is False (Argo's init/wait containers: argo-workflows
    #10787), with TMP_VOLUME mounted at /tmp where it is."""
    sc = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
          "seccompProfile": {"type": "RuntimeDefault"}}
    if read_only_root:
        sc["readOnlyRootFilesystem"] = True
    return sc
