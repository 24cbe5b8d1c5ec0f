"""The gang reaper: no gang outlives its run, whoever ends the run.

A long-running process in the namespace (``python -m pipectl.components.gang reap``; the Deployment
``pipectl-gang-reaper``). The ``gang-release`` exit handler covers the endings Argo runs exit
handlers for; TERMINATE in the Argo UI, ``argo terminate`` or anything else that sets
``spec.shutdown: Terminate`` runs none, and a workflow kept for days after a failure would keep
its gang's GPUs. The reaper watches the namespace's Workflows and releases a run's gang with the
one rule every caller uses (:func:`pipectl.components.gang.core.release`) when the workflow, read
again when the release starts, is gone, being deleted, has ``spec.shutdown`` set (Terminate or
Stop), or ended Failed or Error. A Succeeded run is left alone: its completed job holds no GPU and
keeps its pods for their logs. A run that is retried (``argo retry``, the UI's RETRY) is Running
again by the time its next gang exists, so that gang is kept; the decision is read again after
the jobs are listed, and each job is deleted only as the object that was listed.

At start, after every re-list (the watch's resourceVersion expired: 410) and every ``resync_s``,
it also sweeps: each gang job whose workflow is gone or wants its gang released is released.
API errors are logged and retried after a backoff; one bad object never stops the watch.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

from pipectl.components.gang.core import JobKind, release
from pipectl.components.names import STEP_LABEL, WORKFLOW_LABEL

log = logging.getLogger(__name__)

ARGO = ("argoproj.io", "v1alpha1", "workflows")
RELEASED_PHASES = ("Failed", "Error")
RETRIES = (2.0, 5.0, 15.0)
"""Seconds before each new try of a release that failed on an API error; then the next sweep."""


def wants_release(workflow: dict | None) -> bool:
    """Whether the gang of ``workflow`` (None: it is gone) must go, by what the workflow is now."""
    if workflow is None or workflow.get("metadata", {}).get("deletionTimestamp"):
        return True
    phase = (workflow.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return False
    return bool((workflow.get("spec") or {}).get("shutdown")) or phase in RELEASED_PHASES


class Reaper:
    """Watches ``namespace``'s Workflows and releases the gangs (jobs of ``kinds``) they leave."""

    def __init__(self, api_client: Any, namespace: str, kinds: Iterable[JobKind], *, workers: int = 4,
                 release_timeout_s: float = 120.0, resync_s: float = 600.0) -> None:
        from kubernetes import client

        self.api, self.namespace, self.kinds = api_client, namespace, list(kinds)
        self.custom = client.CustomObjectsApi(api_client)
        self.release_timeout_s, self.resync_s = release_timeout_s, resync_s
        self.stopped = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="release")
        self._lock = threading.Lock()
        self._busy: set[str] = set()  # a release of this run is running
        self._again: set[str] = set()  # ... and was asked for again meanwhile

    # -- one run -------------------------------------------------------------------------------

    def workflow_now(self, name: str) -> dict | None:
        """The workflow as the API server has it now; None when it is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            return self.custom.get_namespaced_custom_object(ARGO[0], ARGO[1], self.namespace, ARGO[2], name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def reap(self, name: str) -> list[str] | None:
        """Release ``name``'s gang if the workflow, read now, wants it (None when it does not)."""
        workflow = self.workflow_now(name)
        if not wants_release(workflow):
            return None
        asked: dict[str, bool] = {}

        def keep(job: dict) -> bool:  # read again once the jobs are listed: a retry may have come between
            if "release" not in asked:
                asked["release"] = wants_release(self.workflow_now(name))
            return not asked["release"]
        return release(self.api, self.namespace, name, self.kinds, keep=keep, timeout_s=self.release_timeout_s)

    def request(self, name: str) -> None:
        """Release ``name``'s gang on a worker thread; asked again while one runs, it runs once more after."""
        with self._lock:
            if name in self._busy:
                self._again.add(name)
                return
            self._busy.add(name)
        self._pool.submit(self._work, name)

    def _work(self, name: str) -> None:
        while True:
            self._reap_with_retries(name)
            with self._lock:
                if name not in self._again:
                    self._busy.discard(name)
                    return
                self._again.discard(name)

    def _reap_with_retries(self, name: str) -> None:
        for attempt, delay in enumerate((*RETRIES, None)):
            try:
                deleted = self.reap(name)
                if deleted:
                    log.info("workflow %s: gang released (%s)", name, ", ".join(deleted))
                return
            except TimeoutError as e:
                log.warning("workflow %s: gang jobs deleted, but not gone after %g s: %s", name, self.release_timeout_s, e)
                return
            except Exception as e:  # noqa: BLE001 - an API error: log, back off, try again
                if delay is None or self.stopped.is_set():
                    log.error("workflow %s: releasing its gang failed %d times, left to the next sweep: %s",
                              name, attempt + 1, e)
                    return
                log.warning("workflow %s: releasing its gang failed (%s); again in %g s", name, e, delay)
                if self.stopped.wait(delay):
                    return

    # -- the namespace -------------------------------------------------------------------------

    def on_event(self, kind: str, workflow: dict) -> None:
        """A watch event: a run that was deleted or wants its gang released gets a release (one
        whose gang is gone already costs a read of its workflow, its jobs and its pods)."""
        if kind == "DELETED" or wants_release(workflow):
            self.request(workflow["metadata"]["name"])

    def gang_runs(self) -> set[str]:
        """The runs that have a gang job of ``kinds`` now (their workflow label)."""
        from kubernetes.client.exceptions import ApiException

        runs: set[str] = set()
        for kind in self.kinds:
            try:
                jobs = self.custom.list_namespaced_custom_object(kind.group, kind.version, self.namespace, kind.plural,
                                                                 label_selector=f"{STEP_LABEL}=train")
            except ApiException as e:
                if e.status == 404:  # this kind's CRD is not installed
                    continue
                raise
            runs |= {(j["metadata"].get("labels") or {}).get(WORKFLOW_LABEL, "") for j in jobs["items"]}
        return runs - {""}

    def workflows(self) -> tuple[dict[str, dict], str]:
        """Every workflow of the namespace as far as :func:`wants_release` reads it (name -> the
        fields it reads), a page at a time (a namespace keeps days of runs, each with its status),
        and the list's resourceVersion (where a watch starts)."""
        out: dict[str, dict] = {}
        token = None
        while True:
            page = self.custom.list_namespaced_custom_object(*ARGO[:2], self.namespace, ARGO[2], limit=200,
                                                             **({"_continue": token} if token else {}))
            for w in page["items"]:
                meta = w["metadata"]
                out[meta["name"]] = {"metadata": {k: meta[k] for k in ("name", "uid", "deletionTimestamp") if k in meta},
                                     "spec": {"shutdown": (w.get("spec") or {}).get("shutdown")},
                                     "status": {"phase": (w.get("status") or {}).get("phase")}}
            token = page["metadata"].get("continue")
            if not token:
                return out, page["metadata"]["resourceVersion"]

    def sweep(self) -> str:
        """List the workflows, release every gang whose workflow is gone or wants it released;
        returns the list's resourceVersion (where the watch starts)."""
        workflows, version = self.workflows()
        for name in sorted(self.gang_runs()):
            if name not in workflows or wants_release(workflows[name]):
                self.request(name)
        log.info("swept %d workflows of namespace %s; watching them", len(workflows), self.namespace)
        return version

    def watch(self, version: str) -> None:
        """Watch the workflows from ``version`` until the resync is due, the version expired (410),
        or :meth:`stop`; an event's bad object is logged and skipped."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + self.resync_s
        while not self.stopped.is_set() and (left := deadline - time.monotonic()) > 0:
            w = watch.Watch()
            try:
                for event in w.stream(self.custom.list_namespaced_custom_object, *ARGO[:2], self.namespace, ARGO[2],
                                      resource_version=version, allow_watch_bookmarks=True,
                                      timeout_seconds=max(1, int(min(left, 300)))):
                    obj = event.get("raw_object") or {}
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        try:
                            self.on_event(event["type"], obj)
                        except Exception:  # noqa: BLE001 - never stop the watch for one object
                            log.exception("skipped a %s event of an unreadable workflow", event.get("type"))
            except ApiException as e:
                if e.status == 410:  # the version expired: list again
                    return
                raise
            finally:
                w.stop()

    def run(self) -> None:
        """Sweep, then watch; list again on 410 and every ``resync_s``; after an API error, back
        off (1 s doubling to 60 s) and list again. Returns once :attr:`stopped` is set and the
        watch has ended (at the latest ``resync_s`` or 300 s later); releases under way finish."""
        backoff = 0.0
        try:
            while not self.stopped.is_set():
                try:
                    self.watch(self.sweep())
                    backoff = 0.0
                except Exception as e:  # noqa: BLE001 - the API server restarting, a network blip
                    backoff = min(max(1.0, backoff * 2), 60.0)
                    log.warning("watching workflows of %s failed (%s); listing again in %g s", self.namespace, e, backoff)
                    self.stopped.wait(backoff)
        finally:
            self.stopped.set()  # no more retries
            self._pool.shutdown(wait=False, cancel_futures=True)


def api_client() -> Any:
    """The API client: in-cluster (the pod's ServiceAccount), else the caller's kubeconfig; with the
    client's own retry of connection errors and of 429/5xx answers to reads and deletes."""
    from kubernetes import client, config
    from urllib3.util.retry import Retry

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    configuration.retries = Retry(total=5, backoff_factor=1, status_forcelist=(429, 500, 502, 503, 504),
                                  allowed_methods=("GET", "DELETE"), respect_retry_after_header=True, raise_on_status=False)
    return client.ApiClient(configuration)


def _job_kind(text: str) -> JobKind:
    if len(text.split("/")) != 3 or not all(text.split("/")):
        raise argparse.ArgumentTypeError(f"{text!r} is not group/version/plural (the gang job kind as the API names it)")
    return JobKind.parse(text)


def _stop_now(reaper: Reaper) -> Any:
    def handler(signum: int, frame: Any) -> None:
        log.info("stopping (signal %d)", signum)
        reaper.stopped.set()
        raise SystemExit(0)  # out of the watch's blocking read at once
    return handler


def parser() -> argparse.ArgumentParser:
    """``reap --namespace NS --job-kind GROUP/VERSION/PLURAL [...]``."""
    p = argparse.ArgumentParser(prog="python -m pipectl.components.gang reap",
                                description="Release the gang of every run that ended other than Succeeded.")
    p.add_argument("--namespace", required=True, help="the namespace whose workflows are watched")
    p.add_argument("--job-kind", action="append", required=True, type=_job_kind,
                   help="a gang job kind as group/version/plural (repeatable)")
    p.add_argument("--release-timeout-s", type=float, default=120.0, help="how long one release waits for the gang's pods")
    p.add_argument("--resync-s", type=float, default=600.0, help="how often everything is listed and swept again")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the reaper until SIGTERM or SIGINT."""
    from kubernetes.config import ConfigException

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        api = api_client()
    except ConfigException as e:
        print(f"error: no Kubernetes credentials: {e}\nhint: run it in a pod with its ServiceAccount's token, "
              "or set KUBECONFIG", file=sys.stderr)
        return 2
    reaper = Reaper(api, args.namespace, args.job_kind, release_timeout_s=args.release_timeout_s,
                    resync_s=args.resync_s)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop_now(reaper))
    try:
        reaper.run()
    except SystemExit:
        pass
    log.info("stopped")
    return 0
