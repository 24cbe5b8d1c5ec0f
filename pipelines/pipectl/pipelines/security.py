"""Pod security: the Kubernetes "restricted" Pod Security Standard, as plain dicts.

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

TMP_VOLUME_NAME = "tmp"


def tmp_volume(size_gib: int) -> dict:
    """Writable /tmp (outputs, temporary files) for containers whose root file system is read-only,
    at most ``size_gib`` GiB of the node's disk (beyond it the kubelet evicts the pod)."""
    return {"name": TMP_VOLUME_NAME, "emptyDir": {"sizeLimit": f"{size_gib}Gi"}}


def restricted_pod_security_context() -> dict:
    """Pod-level fields of "restricted" (Kubernetes API field names): non-root as RUN_AS_UID, with
    its group owning volumes, RuntimeDefault seccomp."""
    return {"runAsNonRoot": True, "runAsUser": RUN_AS_UID, "runAsGroup": RUN_AS_UID, "fsGroup": RUN_AS_UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def restricted_container_security_context(read_only_root: bool = True) -> dict:
    """Container-level fields of "restricted" (they cannot be set for the whole pod); the root file
    system read-only unless ``read_only_root`` is False (Argo's init/wait containers:
    argo-workflows#10787), with tmp_volume() mounted at /tmp where it is."""
    sc = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
          "seccompProfile": {"type": "RuntimeDefault"}}
    if read_only_root:
        sc["readOnlyRootFilesystem"] = True
    return sc


# -- the same rules, read back (``pipectl lint``): one message per field that breaks "restricted" --


def pod_problems(sc: dict) -> list[str]:
    """Pod-level ``securityContext`` fields that break "restricted" (non-root, a seccomp profile)."""
    problems = []
    if sc.get("runAsNonRoot") is not True:
        problems.append("runAsNonRoot must be true (restricted Pod Security Standard)")
    if sc.get("runAsUser") == 0:
        problems.append("runAsUser 0 is root")
    if (sc.get("seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost"):
        problems.append("seccompProfile.type must be RuntimeDefault (or Localhost)")
    return problems


def container_problems(sc: dict) -> list[str]:
    """Container ``securityContext`` fields that break "restricted"."""
    problems = []
    if sc.get("privileged") is True:
        problems.append("privileged containers are not allowed")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append("allowPrivilegeEscalation must be false")
    caps = sc.get("capabilities") or {}
    if "ALL" not in (caps.get("drop") or []):
        problems.append("capabilities.drop must include ALL")
    added = set(caps.get("add") or []) - {"NET_BIND_SERVICE"}
    if added:
        problems.append(f"capabilities.add {sorted(added)}: only NET_BIND_SERVICE is allowed")
    if sc.get("runAsUser") == 0:
        problems.append("runAsUser 0 is root")
    return problems


def pod_spec_problems(spec: dict) -> list[str]:
    """Pod spec (or Argo template) fields that break "restricted": host namespaces, hostPath volumes."""
    problems = [f"{field}: true shares the node's namespace" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field) is True]
    problems += [f"volume {v.get('name')!r} is a hostPath" for v in spec.get("volumes") or [] if "hostPath" in v]
    return problems
