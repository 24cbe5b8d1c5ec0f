"""``pipectl doctor --from-pod``: ask the object store and MLflow from where the steps ask them,
and start both step images.

One short pod in the namespace, as a step runs: the steps' ServiceAccount (no token), the
restricted security context, two containers. ``probe`` (the step-light image, the store ConfigMap
as its environment) GETs the S3 endpoint and MLflow's ``/health`` (any HTTP answer counts: an S3
endpoint answers 403 to an anonymous GET), times a small request to the store on a kept-alive
connection (:mod:`~pipectl.components.store_latency`) and prints one JSON line; ``train-image`` (the
step-train image) imports what preprocess and train import (torch, DALI, the steps) and prints
their versions. What it shows, as :class:`~pipectl.pipelines.backends.doctor.Row`\\ s: each image
can be pulled and started, and each service answers from the namespace's network (cluster DNS,
NetworkPolicies, egress). The pod is deleted whatever happens.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from pipectl.components.names import PART_OF, STORE_CONFIGMAP
from pipectl.pipelines.backends.doctor import Row
from pipectl.pipelines.security import restricted_container_security_context, restricted_pod_security_context

SERVICES = (("object store", "PIPECTL_S3_ENDPOINT", "/"), ("MLflow", "PIPECTL_MLFLOW_URI", "/health"))
"""(row name, the store ConfigMap's key, the path asked)."""
LATENCY = "store_latency_ms"
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
if out.get("PIPECTL_S3_ENDPOINT") == "":
    try:
        from pipectl.components.store_latency import small_request_ms
        out["%s"] = round(small_request_ms(os.environ["PIPECTL_S3_ENDPOINT"]), 2)
    except Exception as e:
        out["%s"] = "not measured: %%s" %% e
print(json.dumps(out))
""" % ([(k, p) for _, k, p in SERVICES], STORE_CONFIGMAP, LATENCY, LATENCY)
"""Run with ``python -c`` in the pod: ``{key: ""}`` when the service answered, else why not; and
``LATENCY``: the store's answer time for a small request (ms), or why it was not measured."""
TRAIN_SCRIPT = """
import json, torch, nvidia.dali
import pipectl.components.preprocess.core, pipectl.components.train.core
print(json.dumps({"torch": torch.__version__, "DALI": nvidia.dali.__version__}))
"""
"""Run with ``python -c`` in the step-train image: what preprocess and train import, then their versions."""
IMAGE_ERRORS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
PROBE, TRAIN = "probe", "train-image"
"""The pod's containers: the services asked from the step-light image; the step-train image started."""


def probe_pod(cfg: Any, deadline_s: int = 180) -> dict:
    """The probe Pod for a :class:`~pipectl.pipelines.training.CompileConfig` (namespace, images,
    ServiceAccount): restricted, no token, ended by the kubelet after ``deadline_s`` seconds, never restarted."""
    def container(name: str, image: str, script: str, memory: str) -> dict:
        return {"name": name, "image": image, "command": ["python", "-c", script],
                "resources": {"requests": {"cpu": "50m", "memory": memory}},
                "securityContext": restricted_container_security_context()}

    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "pipectl-doctor-", "namespace": cfg.namespace,
                     "labels": {**PART_OF, "app.kubernetes.io/component": "doctor"}},
        "spec": {
            "restartPolicy": "Never", "activeDeadlineSeconds": deadline_s,
            "serviceAccountName": cfg.service_account, "automountServiceAccountToken": False,
            "securityContext": restricted_pod_security_context(),
            "containers": [
                {**container(PROBE, cfg.light_image, PROBE_SCRIPT, "128Mi"), "envFrom": [{"configMapRef": {"name": STORE_CONFIGMAP}}]},
                container(TRAIN, cfg.train_image, TRAIN_SCRIPT, "1Gi"),
            ],
        },
    }


def from_pod(api: Any, cfg: Any, timeout_s: int = 180) -> list[Row]:
    """Start :func:`probe_pod`, follow it (a watch) until each container has ended or cannot get its
    image, or ``timeout_s`` passes; the rows it shows. Deletes the pod before returning."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        pod = core.create_namespaced_pod(cfg.namespace, probe_pod(cfg, timeout_s))
    except ApiException as e:
        if e.status in (403, 422):
            return [Row("probe pod", "warn", f"could not start a pod in {cfg.namespace} ({e.status} {e.reason}): "
                        "the step images and the services were not checked from the namespace",
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


def _statuses(pod: Any) -> dict[str, Any]:
    """The pod's container statuses by container name."""
    return {c.name: c for c in ((pod.status.container_statuses or []) if pod.status else [])}


def _image_error(status: Any) -> str:
    """``reason: message`` when the container cannot get its image, else ""."""
    waiting = status.state.waiting if status is not None and status.state else None
    if waiting and waiting.reason in IMAGE_ERRORS:
        return f"{waiting.reason}: {waiting.message or ''}".rstrip(": ")
    return ""


def _settled(pod: Any) -> bool:
    """Whether the pod has ended, or each container has ended or cannot get its image."""
    if pod.status.phase in ("Succeeded", "Failed"):
        return True
    statuses = _statuses(pod)
    return len(statuses) == len(pod.spec.containers) and all(
        (s.state and s.state.terminated) or _image_error(s) for s in statuses.values())


def _until_settled(core: Any, namespace: str, name: str, deadline: float) -> Any:
    """The pod once it has settled (:func:`_settled`), or as it is at ``deadline``."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    pod = core.read_namespaced_pod(name, namespace)
    while not _settled(pod):
        left = int(deadline - time.monotonic())
        if left <= 0:
            return pod
        stream = watch.Watch().stream(core.list_namespaced_pod, namespace, field_selector=f"metadata.name={name}",
                                      resource_version=pod.metadata.resource_version, timeout_seconds=max(1, min(left, 60)))
        try:
            for event in stream:
                pod = event["object"]
                if _settled(pod):
                    break
        except ApiException as e:
            if e.status != 410:  # Gone: the version watched from is too old; read the pod again
                raise
            pod = core.read_namespaced_pod(name, namespace)
    return pod


def _rows(core: Any, cfg: Any, pod: Any, timeout_s: int) -> list[Row]:
    """A row per image, then a row per service when the probe container answered."""
    def read_log(container: str) -> str:
        return core.read_namespaced_pod_log(pod.metadata.name, cfg.namespace, container=container)

    light, answers = _image_row(pod, PROBE, cfg.light_image, timeout_s, read_log)
    train, versions = _image_row(pod, TRAIN, cfg.train_image, timeout_s, read_log)
    if versions:
        train = Row(train.check, train.status, f"{train.detail} ({', '.join(f'{k} {v}' for k, v in versions.items())})")
    rows = [light, train]
    for what, key, _ in SERVICES if answers else ():
        why = answers.get(key, "not asked")
        rows.append(Row(f"{what} (from a pod)", "fail" if why else "ok", why or f"answers in namespace {cfg.namespace}",
                        "check the address in the site file, the cluster's DNS, and NetworkPolicies/egress of the namespace" if why else ""))
    if LATENCY in answers:
        from pipectl.components.store_latency import verdict

        ms = answers[LATENCY]
        rows.append(Row("object store latency (from a pod)", *(verdict(ms) if isinstance(ms, (int, float)) else ("warn", str(ms), ""))))
    return rows


def _image_row(pod: Any, container: str, image: str, timeout_s: int, read_log: Callable[[str], str]) -> tuple[Row, dict]:
    """Whether ``container`` got ``image`` and ran it to its JSON line (``read_log(container)``);
    the row and that line."""
    from kubernetes.client.exceptions import ApiException

    kind = "step-light" if container == PROBE else "step-train"
    check, status = f"{kind} image (from a pod)", _statuses(pod).get(container)
    error = _image_error(status)
    if error:
        return Row(check, "fail", f"{image}: {error}",
                   "push the image there (make images-push REGISTRY=...), fix registry/images in the site file, "
                   "or give the namespace's pods pull credentials (imagePullSecrets of its ServiceAccounts)"), {}
    ended = status.state.terminated if status is not None and status.state else None
    if ended is None:
        where = f"on {pod.spec.node_name}" if pod.spec.node_name else "not scheduled"
        return Row(check, "warn", f"{image} not finished ({pod.status.phase}, {where}) after {timeout_s:.0f} s: a first pull "
                   "of a step image (GBs) can take longer" + ("; the services were not checked from the namespace" if container == PROBE else ""),
                   "run pipectl doctor --from-pod again (a longer --pod-timeout) once the image is on a node"), {}
    try:
        text = read_log(container)
    except ApiException as e:
        return Row(check, "warn", f"{image} ended ({ended.reason or e.reason}) and its log cannot be read",
                   "run pipectl doctor --from-pod again"), {}
    try:
        answer = json.loads(text.strip().splitlines()[-1]) if ended.exit_code == 0 else None
    except (ValueError, IndexError):
        answer = None
    if not isinstance(answer, dict) and pod.status.reason == "DeadlineExceeded":
        return Row(check, "warn", f"{image}: the pod's deadline ({timeout_s:.0f} s) ended it before it answered",
                   "run pipectl doctor --from-pod again, with a longer --pod-timeout for a first pull"), {}
    if not isinstance(answer, dict):
        return Row(check, "fail", f"{image} started on {pod.spec.node_name} but exited {ended.exit_code} without its answer: "
                   f"{text.strip()[-300:]!r}", f"is it pipectl's {kind} image? (images/Dockerfile, target {kind})"), {}
    return Row(check, "ok", f"{image} pulled and ran on {pod.spec.node_name}"), answer
