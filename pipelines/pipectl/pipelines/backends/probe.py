"""``pipectl doctor --from-pod``: ask the object store and MLflow from where the steps ask them.

One short pod in the namespace, as a step runs: the step-light image, the steps' ServiceAccount
(no token), the restricted security context, the store ConfigMap as its environment. It GETs the
S3 endpoint and MLflow's ``/health`` (any HTTP answer counts: an S3 endpoint answers 403 to an
anonymous GET) and prints one JSON line. What it shows, as :class:`~pipectl.pipelines.backends.doctor.Row`\\ s:
the image can be pulled and started, and each service answers from the namespace's network
(cluster DNS, NetworkPolicies, egress). The pod is deleted whatever happens.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pipectl.components.names import PART_OF, STORE_CONFIGMAP
from pipectl.pipelines.backends.doctor import Row
from pipectl.pipelines.security import restricted_container_security_context, restricted_pod_security_context

SERVICES = (("object store", "PIPECTL_S3_ENDPOINT", "/"), ("MLflow", "PIPECTL_MLFLOW_URI", "/health"))
"""(row name, the store ConfigMap's key, the path asked)."""
PROBE_SCRIPT = """
import json, os, urllib.error, urllib.request
out = {}
for key, path in %r:
    url = os.environ.get(key, "")
    if not url:
        out[key] = "not set in the ConfigMap %s"
        continue
    try:
        urllib.request.urlopen(url.rstrip("/") + path, timeout=5).close()
        out[key] = ""
    except urllib.error.HTTPError:
        out[key] = ""
    except Exception as e:
        out[key] = "%%s did not answer (%%s)" %% (url, getattr(e, "reason", e))
print(json.dumps(out))
""" % ([(k, p) for _, k, p in SERVICES], STORE_CONFIGMAP)
"""Run with ``python -c`` in the pod: ``{key: ""}`` when the service answered, else why not."""
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")


def probe_pod(cfg: Any, deadline_s: int = 180) -> dict:
    """The probe Pod for a :class:`~pipectl.pipelines.training.CompileConfig` (namespace, image,
    ServiceAccount): restricted, no token, ended by the kubelet after ``deadline_s`` seconds, never restarted."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "pipectl-doctor-", "namespace": cfg.namespace,
                     "labels": {**PART_OF, "app.kubernetes.io/component": "doctor"}},
        "spec": {
            "restartPolicy": "Never", "activeDeadlineSeconds": deadline_s,
            "serviceAccountName": cfg.service_account, "automountServiceAccountToken": False,
            "securityContext": restricted_pod_security_context(),
            "containers": [{
                "name": "probe", "image": cfg.light_image, "command": ["python", "-c", PROBE_SCRIPT],
                "envFrom": [{"configMapRef": {"name": STORE_CONFIGMAP}}],
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                "securityContext": restricted_container_security_context(),
            }],
        },
    }


def from_pod(api: Any, cfg: Any, timeout_s: int = 180) -> list[Row]:
    """Start :func:`probe_pod`, follow it (a watch) until it ends, its image fails or ``timeout_s``
    passes; the rows it shows. Deletes the pod before returning."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        pod = core.create_namespaced_pod(cfg.namespace, probe_pod(cfg, timeout_s))
    except ApiException as e:
        if e.status in (403, 422):
            return [Row("probe pod", "warn", f"could not start a pod in {cfg.namespace} ({e.status} {e.reason}): "
                        "the step image and the services were not checked from the namespace",
                        "run doctor --from-pod as someone who may create pods there")]
        raise
    name = pod.metadata.name
    try:
        pod = _until_settled(core, cfg.namespace, name, time.monotonic() + timeout_s)
        return _rows(core, cfg, pod, timeout_s)
    finally:
        try:
            core.delete_namespaced_pod(name, cfg.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise


def _image_error(pod: Any) -> str:
    """``reason: message`` of a container that cannot get its image, else ""."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason in IMAGE_ERRORS:
            return f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
    return ""


def _until_settled(core: Any, namespace: str, name: str, deadline: float) -> Any:
    """The pod once it has ended or cannot get its image, or as it is at ``deadline``."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    pod = core.read_namespaced_pod(name, namespace)
    while pod.status.phase not in ("Succeeded", "Failed") and not _image_error(pod):
        left = int(deadline - time.monotonic())
        if left <= 0:
            return pod
        stream = watch.Watch().stream(core.list_namespaced_pod, namespace, field_selector=f"metadata.name={name}",
                                      resource_version=pod.metadata.resource_version, timeout_seconds=max(1, min(left, 60)))
        try:
            for event in stream:
                pod = event["object"]
                if pod.status.phase in ("Succeeded", "Failed") or _image_error(pod):
                    break
        except ApiException as e:
            if e.status != 410:  # Gone: the version watched from is too old; read the pod again
                raise
            pod = core.read_namespaced_pod(name, namespace)
    return pod


def _rows(core: Any, cfg: Any, pod: Any, timeout_s: int) -> list[Row]:
    from kubernetes.client.exceptions import ApiException

    image, check = cfg.light_image, "step image (from a pod)"
    error = _image_error(pod)
    if error:
        return [Row(check, "fail", f"{image}: {error}",
                    "push the image there (make images-push REGISTRY=...), fix registry/images in the site file, "
                    "or give the namespace's pods pull credentials (imagePullSecrets of its ServiceAccounts)")]
    if pod.status.phase not in ("Succeeded", "Failed"):
        where = f"on {pod.spec.node_name}" if pod.spec.node_name else "not scheduled"
        return [Row(check, "warn", f"probe pod still {pod.status.phase} ({where}) after {timeout_s:.0f} s: "
                    "a first pull of a step image (GBs) can take longer; the services were not checked from the namespace",
                    "run pipectl doctor --from-pod again (a longer --pod-timeout) once the image is on a node")]
    try:
        text = core.read_namespaced_pod_log(pod.metadata.name, cfg.namespace, container="probe")
    except ApiException as e:  # it never started (e.g. ended by its deadline while pulling)
        return [Row(check, "warn", f"probe pod {pod.status.phase} ({pod.status.reason or e.reason}) before it printed anything",
                    "run pipectl doctor --from-pod again, with a longer --pod-timeout for a first pull")]
    try:
        answers = json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return [Row(check, "fail", f"{image} ran on {pod.spec.node_name} ({pod.status.phase}) but printed no answer: {text[-300:]!r}",
                    "is it pipectl's step-light image? (it needs python)")]
    rows = [Row(check, "ok", f"{image} pulled and ran on {pod.spec.node_name}")]
    for what, key, _ in SERVICES:
        why = answers.get(key, "not asked")
        rows.append(Row(f"{what} (from a pod)", "fail" if why else "ok", why or f"answers in namespace {cfg.namespace}",
                        "check the address in the site file, the cluster's DNS, and NetworkPolicies/egress of the namespace" if why else ""))
    return rows
