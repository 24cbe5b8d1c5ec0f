"""The end of a run's gang: delete its gang jobs and wait until they and their pods are gone.

One rule, three callers: the ``gang-release`` exit handler, which Argo runs when a workflow ends
other than Succeeded (a code failure, retries used up, a timeout, ``stop``), the CLI's
``pipectl terminate`` / ``pipectl retry`` (a terminated workflow runs no exit handler), and the
gang reaper (:mod:`pipectl.components.gang.reaper`), which releases the gang of a run ended any
other way (TERMINATE in the Argo UI, ``argo terminate``).

A gang job's pods carry the run's label (``workflows.argoproj.io/workflow``) and the train step's
(``pipectl.io/step=train``); the job is deleted with ``propagationPolicy: Foreground``, so its
object stays until every pod it owns is gone: a job that is gone holds no GPU.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from pipectl.components.names import STEP_LABEL, WORKFLOW_LABEL

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobKind:
    """A gang job kind as the API names it: ``group/version/plural``."""

    group: str
    version: str
    plural: str

    @classmethod
    def parse(cls, text: str) -> "JobKind":
        group, version, plural = text.split("/")
        return cls(group, version, plural)

    def __str__(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}"


def run_selector(workflow: str) -> str:
    """The label selector of ``workflow``'s gang jobs."""
    return f"{WORKFLOW_LABEL}={workflow}"


def gang_pod_selector(workflow: str) -> str:
    """The label selector of ``workflow``'s gang pods (not Argo's step pods)."""
    return f"{WORKFLOW_LABEL}={workflow},{STEP_LABEL}=train"


def _name(obj: Any) -> str:
    return obj["metadata"]["name"] if isinstance(obj, dict) else obj.metadata.name


def _uid(obj: Any) -> str:
    return obj["metadata"]["uid"] if isinstance(obj, dict) else obj.metadata.uid


def _listing(result: Any) -> tuple[list[Any], str]:
    if isinstance(result, dict):
        return result.get("items", []), result.get("metadata", {}).get("resourceVersion", "")
    return list(result.items), result.metadata.resource_version


def wait_gone(list_fn: Callable[..., Any], uids: set[str] | None, deadline: float, what: str) -> None:
    """Wait until none of the objects ``uids`` (when None: every object the first list shows) is
    listed by ``list_fn``: a list, then a watch from its resourceVersion for the deletions (no
    polling loop). Objects are told apart by uid, so one created since (a retried run's next gang,
    under the same name) is not waited for. TimeoutError naming what is left once ``deadline``
    (time.monotonic()) passes."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    while True:
        items, version = _listing(list_fn())
        left = {_uid(o): _name(o) for o in items if uids is None or _uid(o) in uids}
        uids = set(left) if uids is None else uids
        if not left:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{what} still present: {', '.join(sorted(left.values()))}")
        w = watch.Watch()
        try:
            for event in w.stream(list_fn, resource_version=version, timeout_seconds=max(1, int(remaining))):
                if event["type"] == "DELETED":
                    left.pop(_uid(event["object"]), None)
                if not left:
                    return
        except ApiException as e:
            if e.status != 410:  # the version expired: list again
                raise
        finally:
            w.stop()


def _delete_listed(custom: Any, kind: JobKind, namespace: str, job: dict) -> bool:
    """Delete ``job`` in the foreground, on condition that the object of its name is still the one
    listed (same uid). False when another object has that name now (409 Conflict); gone is fine."""
    from kubernetes.client.exceptions import ApiException

    body = {"propagationPolicy": "Foreground", "preconditions": {"uid": job["metadata"]["uid"]}}
    try:
        custom.delete_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural, _name(job), body=body)
    except ApiException as e:
        if e.status == 409:
            return False
        if e.status != 404:
            raise
    return True


def release(api_client: Any, namespace: str, workflow: str, kinds: Iterable[JobKind], *,
            keep: Callable[[dict], bool] = lambda job: False, timeout_s: float = 120.0) -> list[str]:
    """Delete ``workflow``'s gang jobs of ``kinds`` (all but those ``keep`` holds for), wait until
    they are gone, and, when none is kept, until the run's gang pods are gone. A kind whose CRD
    is not installed is skipped. ``keep`` is asked after the jobs are listed, and each job is
    deleted only as the object that was listed (its uid): a job of the same name created since
    (a retried run's next attempt) is kept. Returns the deleted job names; TimeoutError after
    ``timeout_s``."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    custom, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    deadline = time.monotonic() + timeout_s
    deleted: list[str] = []
    kept = 0
    for kind in kinds:
        def list_jobs(**kw: Any) -> Any:
            return custom.list_namespaced_custom_object(kind.group, kind.version, namespace, kind.plural,
                                                        label_selector=run_selector(workflow), **kw)
        try:
            jobs, _ = _listing(list_jobs())
        except ApiException as e:
            if e.status == 404:  # this kind's CRD is not installed
                continue
            raise
        uids, names = set(), set()
        for job in jobs:
            if keep(job):
                kept += 1
                continue
            name = _name(job)
            if not _delete_listed(custom, kind, namespace, job):
                log.info("kept %s %s of workflow %s: created again since it was listed", kind, name, workflow)
                kept += 1
                continue
            log.info("deleted %s %s of workflow %s", kind, name, workflow)
            uids.add(_uid(job))
            names.add(name)
        deleted += sorted(names)
        if uids:
            wait_gone(list_jobs, uids, deadline, f"{kind} of workflow {workflow}")
    if not kept:
        wait_gone(lambda **kw: core.list_namespaced_pod(namespace, label_selector=gang_pod_selector(workflow), **kw),
                  None, deadline, f"gang pods of workflow {workflow}")
    return deleted
