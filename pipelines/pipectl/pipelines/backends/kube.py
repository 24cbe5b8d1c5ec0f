"""The cluster backend: Workflows, WorkflowTemplates and CronWorkflows through the Kubernetes API.

Objects are built by the compile layer (:mod:`pipectl.pipelines.workflows`), so ``--dry-run``
prints exactly what would be sent; :class:`ArgoCluster` does the I/O with the
official ``kubernetes`` client (kubeconfig, or in-cluster config) and maps its failures to the
CLI's exit codes: unreachable/unauthorised -> :class:`Unreachable` (3), rejected as invalid ->
:class:`ValidationFailed` (2), anything else -> :class:`PipectlError` (1).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Iterator

from pipectl.components.errors import PipectlError, Unreachable, ValidationFailed
from pipectl.components.names import STEP_LABEL, WORKFLOW_LABEL
from pipectl.pipelines.launchers import LAUNCHERS
from pipectl.pipelines.launchers.base import JOB_NAME
from pipectl.pipelines.workflows import GROUP, VERSION

TERMINAL = ("Succeeded", "Failed", "Error")
TEMPLATE_SETTLE_S = 60.0
"""Seconds after a WorkflowTemplate's creation during which the controller's cache may not have it
yet (it follows the API server within a second or two when the controller is healthy)."""


def _age_s(older: dict[str, Any], newer: dict[str, Any]) -> float:
    """Seconds from ``older``'s creation to ``newer``'s (``metadata.creationTimestamp``, RFC 3339
    to the second, both from the API server's clock)."""
    from datetime import datetime

    def created(obj: dict[str, Any]) -> datetime:
        return datetime.fromisoformat(obj["metadata"]["creationTimestamp"].replace("Z", "+00:00"))

    return (created(newer) - created(older)).total_seconds()


def _missing_template(wf: dict[str, Any], template: str) -> bool:
    """Whether the controller failed ``wf`` at once because its cache had no WorkflowTemplate
    ``template`` (Error, no step started)."""
    status = wf.get("status") or {}
    return (status.get("phase") == "Error" and not status.get("nodes")
            and f'workflowtemplates.argoproj.io "{template}" not found' in (status.get("message") or ""))


def kubeconfig_files() -> list[str]:
    """The kubeconfig files kubectl reads, those that exist: ``$KUBECONFIG`` (a list separated by
    ``os.pathsep``, read now, not when the client library was imported), else ``~/.kube/config``."""
    value = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    return [p for p in value.split(os.pathsep) if p and os.path.isfile(p)]


def kubeconfig_context(context: str | None) -> tuple[str | None, str | None]:
    """``(name, namespace)`` of the kubeconfig context ``context`` (None: the current one); the
    namespace is None when the context sets none. ``(None, None)`` when there is no kubeconfig and
    no context was asked for (in-cluster). Files merge as kubectl merges them: the first file
    that names a context or sets ``current-context`` wins.

    Raises :class:`ValidationFailed` (exit 2) for a ``context`` the kubeconfig does not define, or
    asked for with no kubeconfig at all; :class:`Unreachable` (exit 3) for a kubeconfig that is
    not YAML.
    """
    import yaml

    files = kubeconfig_files()
    if not files:
        if context:
            where = os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise ValidationFailed(f"--context {context}: there is no kubeconfig ({where} does not exist)",
                                   "set KUBECONFIG to the file that defines the context")
        return None, None
    contexts: dict[str, dict] = {}
    current = None
    for path in files:
        try:
            with open(path) as f:
                doc = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            raise Unreachable(f"kubeconfig {path} cannot be read: {e}", "fix the file or point KUBECONFIG elsewhere") from e
        for c in doc.get("contexts") or []:
            contexts.setdefault(c.get("name"), c.get("context") or {})
        current = current or doc.get("current-context") or None
    if context and context not in contexts:
        raise ValidationFailed(f"--context {context}: no such context in the kubeconfig ({os.pathsep.join(files)})",
                               f"contexts there: {', '.join(sorted(map(str, contexts))) or 'none'} (kubectl config get-contexts)")
    name = context or current
    return name, (contexts.get(name) or {}).get("namespace") or None


def _log_container(pod: Any) -> str:
    """The container whose log is the step's: Argo's ``main`` (beside its ``wait``), else the only one."""
    names = [c.name for c in pod.spec.containers]
    return "main" if "main" in names else names[0]


def pod_step(pod: Any) -> str:
    """The step a pod of a workflow belongs to: its ``pipectl.io/step`` label (gang pods), else the
    last part of Argo's node name without its attempt (``wf.train.train(1)`` -> ``train``)."""
    labels, annotations = pod.metadata.labels or {}, pod.metadata.annotations or {}
    if labels.get(STEP_LABEL):
        return labels[STEP_LABEL]
    node = annotations.get("workflows.argoproj.io/node-name", "")
    return node.rsplit(".", 1)[-1].split("(", 1)[0] if node else ""


def _message(e: Any) -> str:
    """The API server's message of an ApiException (its Status), else its body."""
    import json

    try:
        return str(json.loads(e.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(e.body or e.reason)


def _admission_hint(detail: str) -> str:
    from pipectl.pipelines.admission import PARAMETER_RULES_CONFIGMAP

    if "no params found" in detail:
        return (f"the namespace has no ConfigMap {PARAMETER_RULES_CONFIGMAP} (the rules of its templates' own parameters): "
                "its owner runs `pipectl templates apply` (or applies argo/namespace)")
    return "pass only the template's declared arguments, in the spelling `pipectl submit PIPELINE --help` lists"


class ArgoCluster:
    """Kubernetes API access for Argo objects in one namespace."""

    def __init__(self, namespace: str, context: str | None = None) -> None:
        """Credentials as kubectl finds them: the kubeconfig (``context``, else its current one);
        in-cluster (a pod's service account) ONLY when there is no kubeconfig and no ``context``.
        Raises :class:`ValidationFailed` (2) for an unknown ``context``, :class:`Unreachable` (3)
        when no usable configuration is found."""
        from kubernetes import client, config

        self.namespace = namespace
        kubeconfig_context(context)  # an unknown --context is a usage error, never a fallback
        files = kubeconfig_files()
        try:
            if files:
                config.load_kube_config(config_file=os.pathsep.join(files), context=context)
            else:
                config.load_incluster_config()
        except config.ConfigException as e:
            where = f"kubeconfig {os.pathsep.join(files)}" if files else "no kubeconfig (KUBECONFIG unset, no ~/.kube/config) and not in a cluster"
            raise Unreachable(f"no usable Kubernetes configuration: {where}: {e}", "set KUBECONFIG or run inside a cluster") from e
        self.api = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.host = client.Configuration.get_default_copy().host

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=30, **kwargs)
        except ApiException as e:
            if e.status == 404 and missing_ok:
                return None
            detail = (e.body or "")[:500] if isinstance(e.body, str) else str(e.reason)
            if e.status in (403, 422) and "denied request" in detail:  # an admission policy, not RBAC
                raise ValidationFailed(f"{what}: refused by the cluster's admission policy: {_message(e)}", _admission_hint(detail)) from e
            if e.status in (401, 403):
                raise Unreachable(f"{what}: the API server {self.host} refused us ({e.status} {e.reason})", "check your kubeconfig credentials and RBAC") from e
            if e.status in (400, 422):
                raise ValidationFailed(f"{what}: rejected by the API server: {detail}", "run `pipectl lint` on what you sent") from e
            if e.status == 404:
                raise PipectlError(f"{what}: not found ({detail})", f"check the name and namespace {self.namespace}") from e
            raise PipectlError(f"{what}: API error {e.status} {e.reason}: {detail}") from e
        except (HTTPError, OSError) as e:
            raise Unreachable(f"{what}: the API server {self.host} is unreachable ({e})", "check KUBECONFIG / the cluster") from e

    # ---------------------------------------------------------------- objects

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of ``obj`` (a WorkflowTemplate or CronWorkflow) as field manager
        ``pipectl``, conflicts forced: every field the rendering sets takes its value, whoever set
        it before (kubectl applying argo/namespace, an edit). Keys of the spec that another
        manager's apply left and the rendering no longer has are then removed
        (:func:`~pipectl.pipelines.backends.applied.left_over`), so the spec is the rendered one;
        labels, annotations and keys set by an update (``cron suspend``) stay. Returns the object."""
        from pipectl.pipelines.backends.applied import APPLY_PATCH, FIELD_MANAGER, JSON_PATCH, left_over, pointer, removal_patch

        plural, name, what = obj["kind"].lower() + "s", obj["metadata"]["name"], f"{obj['kind']} {obj['metadata']['name']}"
        live = self._call(f"apply {what}", self.api.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name, obj,
                          field_manager=FIELD_MANAGER, force=True, _content_type=APPLY_PATCH)
        if live is None:  # 201 Created (the client reads only a 200's body): nothing else applied it
            return self.get(plural, name)
        stale = left_over(live, obj)
        if not stale:
            return live
        return self._call(f"remove {', '.join(map(pointer, stale))} of {what} (left by an earlier apply)",
                          self.api.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name,
                          removal_patch(live["metadata"]["resourceVersion"], stale), field_manager=FIELD_MANAGER, _content_type=JSON_PATCH)

    def apply_parameter_rules(self, template: str, data: dict[str, str]) -> None:
        """Write ``template``'s keys of the namespace's parameter-rules ConfigMap
        (:func:`~pipectl.pipelines.admission.parameter_rules_data`): a server-side apply under the
        template's own field manager, so other templates' keys stay and keys this template no longer
        has are removed; an empty ``data`` removes all of its keys. Creates the ConfigMap if missing."""
        from pipectl.pipelines.admission import PARAMETER_RULES_CONFIGMAP, parameter_rules_configmap, rules_field_manager

        body = parameter_rules_configmap(self.namespace, data or None, labels=False)
        self._call(f"apply {template}'s keys of ConfigMap {PARAMETER_RULES_CONFIGMAP}", self.core.patch_namespaced_config_map,
                   PARAMETER_RULES_CONFIGMAP, self.namespace, body, field_manager=rules_field_manager(template), force=True,
                   _content_type="application/apply-patch+yaml")

    def apply_secret(self, body: dict[str, Any], *, dry_run: bool = False) -> None:
        """Server-side apply of Secret ``body`` in the namespace as field manager ``pipectl``,
        conflicts forced; ``dry_run``: the API server checks everything (the namespace, RBAC,
        admission) and stores nothing, so a write that would fail is known before anything else
        changes. Raises the errors of :meth:`_call`."""
        from pipectl.pipelines.backends.applied import APPLY_PATCH, FIELD_MANAGER

        name = body["metadata"]["name"]
        self._call(f"apply Secret {name} in namespace {self.namespace}", self.core.patch_namespaced_secret, name,
                   self.namespace, body, field_manager=FIELD_MANAGER, force=True, _content_type=APPLY_PATCH,
                   **({"dry_run": "All"} if dry_run else {}))

    def remove_parameter_rules(self, template: str) -> None:
        """Remove ``template``'s keys from the namespace's parameter-rules ConfigMap (nothing when
        it does not exist)."""
        from pipectl.pipelines.admission import PARAMETER_RULES_CONFIGMAP

        if self._call(f"get ConfigMap {PARAMETER_RULES_CONFIGMAP}", self.core.read_namespaced_config_map, PARAMETER_RULES_CONFIGMAP,
                      self.namespace, missing_ok=True) is not None:
            self.apply_parameter_rules(template, {})

    def release_gangs(self, workflow: str, *, failed_only: bool = False, timeout_s: float = 120) -> list[str]:
        """Delete the gang jobs (every launcher's kind) of ``workflow`` and wait until they are gone
        (:func:`pipectl.components.gang.core.release`); with ``failed_only`` only those that ended
        failed (before an in-place retry: the retried attempt applies the run's one job name, and
        a failed job is never adopted). Checkpoints live in the store, not in the job, so nothing
        is lost. Returns the deleted names. Errors as :meth:`_call`; PipectlError when they are not
        gone after ``timeout_s``."""
        from pipectl.components.gang.core import JobKind, release

        kinds = [JobKind(l.api_group, l.version, l.resource) for l in LAUNCHERS.values()]
        failed = lambda job: any(l.handles(job) and l.failed(job) for l in LAUNCHERS.values())  # noqa: E731
        keep = (lambda job: not failed(job)) if failed_only else (lambda job: False)

        def run(**_: Any) -> list[str]:  # release bounds its own waits (no _request_timeout)
            try:
                return release(self.api.api_client, self.namespace, workflow, kinds, keep=keep, timeout_s=timeout_s)
            except TimeoutError as e:  # an OSError: not "unreachable" to _call
                raise PipectlError(f"the gang of workflow {workflow} is not gone after {timeout_s:g} s: {e}",
                                   "check its pods' nodes, then run the command again") from e

        return self._call(f"release the gang of {workflow}", run)  # API errors mapped as every other call's

    def unscheduled_gang_pods(self, workflow: str) -> dict[str, str]:
        """Gang pods of ``workflow`` that never got a node: pod name -> why, from the pods' latest
        scheduling events (Volcano's "pod group is not ready", an autoscaler's "Failed to schedule
        pod, incompatible with nodepool ..."), one line per reporting component. What `pipectl
        status` shows for a train step that timed out Pending: a gang that can never fit. Read from
        the events, which outlive the pods (the API server keeps them an hour): the run's
        ``gang-release`` exit handler has deleted a failed run's gang by the time one asks."""
        pods = {p.metadata.name: p for p in self._call(f"list gang pods of {workflow}", self.core.list_namespaced_pod, self.namespace,
                                                       label_selector=f"{WORKFLOW_LABEL}={workflow},{STEP_LABEL}=train").items}
        events = self._call("list pod events", self.core.list_namespaced_event, self.namespace,
                            field_selector="involvedObject.kind=Pod").items
        gang_prefix = JOB_NAME.replace("{{workflow.name}}", workflow) + "-"
        by_pod: dict[str, list[Any]] = {name: [] for name in pods}
        for e in events:
            if e.involved_object.name in pods or e.involved_object.name.startswith(gang_prefix):
                by_pod.setdefault(e.involved_object.name, []).append(e)
        out = {}
        for name, evs in sorted(by_pod.items()):
            if (name in pods and pods[name].spec.node_name) or any(e.reason == "Scheduled" for e in evs):
                continue
            latest: dict[str, Any] = {}
            for e in sorted(evs, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp):
                if e.type == "Warning":
                    latest[e.reporting_component or (e.source.component if e.source else "") or "?"] = e
            out[name] = "; ".join(f"{who}: {e.message}" for who, e in sorted(latest.items())) or "no scheduling event"
        return out

    def gang_creation_failures(self, workflow: str) -> list[str]:
        """The gang job of ``workflow``'s latest warning of each kind: why it has not all its pods,
        e.g. the API server refusing a pod (a quota exceeded) or Volcano keeping its group Pending.
        A pod never created has no event of its own."""
        job = JOB_NAME.replace("{{workflow.name}}", workflow)
        events = self._call("list gang job events", self.core.list_namespaced_event, self.namespace,
                            field_selector=f"involvedObject.name={job},type=Warning").items
        latest: dict[str, Any] = {}  # per reason, the newest
        for e in sorted(events, key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp):
            latest[e.reason] = e
        return [f"gang job {job}: {reason}: {e.message}" for reason, e in sorted(latest.items())]

    def resource_quotas(self) -> list[dict[str, Any]] | None:
        """The namespace's ResourceQuotas (as plain objects); None when we may not read them."""
        from kubernetes.client.exceptions import ApiException

        def listed(**kwargs: Any) -> list[Any] | None:
            try:
                return self.core.list_namespaced_resource_quota(self.namespace, **kwargs).items
            except ApiException as e:
                if e.status == 403:  # not allowed to read them: not checked
                    return None
                raise

        items = self._call("list the namespace's quotas", listed)
        return None if items is None else [self.core.api_client.sanitize_for_serialization(q) for q in items]

    def create_workflow(self, wf: dict[str, Any], *, settle_s: float = TEMPLATE_SETTLE_S) -> dict[str, Any]:
        """Create the Workflow ``wf``; returns it as created.

        Argo's controller resolves a run's ``workflowTemplateRef`` from its own cache of the
        namespace's WorkflowTemplates, which lags the API server: a run created right after its
        template (``pipectl templates apply`` then ``pipectl submit``) can end at once in Error,
        ``workflowtemplates.argoproj.io "<name>" not found``, though the template exists. So when
        the template is younger than ``settle_s`` seconds at the run's creation (the API server's
        clock for both), the controller's first pass over the run is awaited, and a run it failed
        that way is deleted and created again (with backoff, for up to ``settle_s`` seconds): the
        run returned is one the controller has started, or the last one created."""
        created = self._create_workflow(wf)
        ref = (wf.get("spec") or {}).get("workflowTemplateRef") or {}
        template = ref.get("name")
        if not template or ref.get("clusterScope"):
            return created
        try:
            tmpl = self._call(f"get WorkflowTemplate {template}", self.api.get_namespaced_custom_object, GROUP, VERSION,
                              self.namespace, "workflowtemplates", template, missing_ok=True)
        except PipectlError:  # not allowed to read templates: the run stands as created
            return created
        if tmpl is None or _age_s(tmpl, created) >= settle_s:
            return created  # an absent template is the controller's to report, as ever
        deadline = time.monotonic() + settle_s
        pause = 0.5
        while _missing_template(self._first_pass(created, deadline), template) and time.monotonic() < deadline:
            self.delete("workflows", created["metadata"]["name"])
            time.sleep(pause)
            pause = min(4.0, pause * 2)
            created = self._create_again(wf, deadline)
        return created

    def _create_again(self, wf: dict[str, Any], deadline: float) -> dict[str, Any]:
        """Create ``wf`` after its failed run was deleted: a run named by its submitter (no
        ``generateName``) may take a moment to be gone (409 Conflict until then)."""
        while True:
            try:
                return self._create_workflow(wf)
            except PipectlError as e:
                if "API error 409" not in str(e) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.5)

    def _create_workflow(self, wf: dict[str, Any]) -> dict[str, Any]:
        return self._call("create Workflow", self.api.create_namespaced_custom_object, GROUP, VERSION, self.namespace, "workflows", wf)

    def _first_pass(self, wf: dict[str, Any], deadline: float) -> dict[str, Any]:
        """``wf`` once the controller has given it a phase (a watch), or as it is at ``deadline``."""
        name = wf["metadata"]["name"]
        while not (wf.get("status") or {}).get("phase"):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                wf = self._next_version(name, wf, max(1, min(30, int(left) + 1)))
            except PipectlError:  # deleted meanwhile (by its owner): nothing to wait for
                break
        return wf

    def get(self, plural: str, name: str) -> dict[str, Any]:
        return self._call(f"get {plural} {name}", self.api.get_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name)

    def list(self, plural: str, label_selector: str = "", *, all_namespaces: bool = False) -> list[dict[str, Any]]:
        """``plural`` objects of this namespace (every namespace with ``all_namespaces``)."""
        if all_namespaces:
            out = self._call(f"list {plural}", self.api.list_cluster_custom_object, GROUP, VERSION, plural, label_selector=label_selector)
        else:
            out = self._call(f"list {plural}", self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, plural,
                             label_selector=label_selector)
        return out.get("items", [])

    def patch(self, plural: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(f"patch {plural} {name}", self.api.patch_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name, body)

    def delete(self, plural: str, name: str) -> None:
        """Delete ``name``; what it owns (a workflow's pods and gang jobs) goes with it (the
        garbage collector, background propagation). Errors as :meth:`_call` (404: not found, 1)."""
        self._call(f"delete {plural} {name}", self.api.delete_namespaced_custom_object, GROUP, VERSION, self.namespace, plural, name,
                   body={"propagationPolicy": "Background"})

    def shutdown(self, name: str, strategy: str) -> dict[str, Any]:
        """Set the Workflow's ``spec.shutdown`` as `argo stop` / `argo terminate` do (Argo docs,
        "Workflow shutdown"): ``Stop`` ends running steps and runs the exit handlers, ``Terminate``
        ends them and runs no exit handler. The controller does the rest.
        Raises :class:`ValidationFailed` (2) for a workflow that has already ended (as Argo:
        "cannot shutdown a completed workflow")."""
        wf = self.get("workflows", name)
        phase = wf.get("status", {}).get("phase")
        if phase in TERMINAL:
            raise ValidationFailed(f"workflow {name} has already ended ({phase}): nothing to {strategy.lower()}",
                                   f"`pipectl delete {name}` removes it")
        return self.patch("workflows", name, {"spec": {"shutdown": strategy}})

    def logs(self, workflow: str, step: str = "", **window: Any) -> Iterator[tuple[str, str]]:
        """(pod name, log text) for every pod of ``workflow`` (steps and gang pods; only ``step``'s
        when given), oldest first. ``window``: ``tail_lines``/``since_seconds`` of the log API."""
        pods = self._call("list pods", self.core.list_namespaced_pod, self.namespace, label_selector=f"{WORKFLOW_LABEL}={workflow}")
        for pod in sorted(pods.items, key=lambda p: p.metadata.creation_timestamp):
            if step and pod_step(pod) != step:
                continue
            yield pod.metadata.name, self._call(f"logs of {pod.metadata.name}", self.core.read_namespaced_pod_log, pod.metadata.name,
                                                self.namespace, container=_log_container(pod), **window)

    def follow_logs(self, workflow: str, emit: Callable[[str, str], None], step: str = "", **window: Any) -> dict[str, Any]:
        """Stream the log of every pod of ``workflow`` while it is written (``logs -f``), pods that
        start later included (the next step, a retry, gang pods), until the workflow has ended and
        every stream has closed. ``emit(pod, line)`` gets each line without its newline, from one
        thread per pod (the caller serialises). A pod whose log cannot be read gets one line
        ``(log unavailable: ...)``. Pods are found by a watch of the workflow's pods, the end by a
        watch of the workflow (:meth:`wait`); one listing after the end takes any pod the pods' watch
        had not delivered yet. Returns the ended Workflow. Errors of the API as :meth:`_call`."""
        streams: dict[str, threading.Thread] = {}
        lock = threading.Lock()
        selector = f"{WORKFLOW_LABEL}={workflow}"

        def start(pod: Any) -> None:
            if (step and pod_step(pod) != step) or pod.status.phase not in ("Running", "Succeeded", "Failed"):
                return
            with lock:
                if pod.metadata.name in streams:
                    return
                streams[pod.metadata.name] = t = threading.Thread(target=self._stream_log, args=(pod, emit), kwargs=window,
                                                                  daemon=True, name=f"log-{pod.metadata.name}")
            t.start()

        def listed() -> str:
            pods = self._call("list pods", self.core.list_namespaced_pod, self.namespace, label_selector=selector)
            for pod in sorted(pods.items, key=lambda p: p.metadata.creation_timestamp):
                start(pod)
            return pods.metadata.resource_version

        ended = threading.Event()
        threading.Thread(target=self._watch_pods, args=(selector, listed(), start, listed, ended), daemon=True,
                         name=f"pods-{workflow}").start()
        try:
            final = self.wait(workflow, lambda wf: None)
        finally:
            ended.set()
        listed()
        for t in list(streams.values()):
            t.join()
        return final

    def _watch_pods(self, selector: str, version: str, start: Callable[[Any], None], relist: Callable[[], str],
                    ended: threading.Event) -> None:
        """``start(pod)`` for every change of the pods matching ``selector`` from ``version`` on, until
        ``ended`` is set; a watch the server ends is resumed, one whose version expired (410) starts
        from ``relist()``. In its own thread: an API error ends it (the caller's last listing still
        finds the pods)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        while not ended.is_set():
            try:
                for event in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace, label_selector=selector,
                                                  resource_version=version, timeout_seconds=30, _request_timeout=60):
                    version = event["object"].metadata.resource_version
                    start(event["object"])
                    if ended.is_set():
                        return
            except ApiException as e:
                if e.status != 410:
                    return
                version = relist()
            except (HTTPError, OSError, PipectlError):  # the caller's last listing covers what this thread misses
                return

    def _stream_log(self, pod: Any, emit: Callable[[str, str], None], **window: Any) -> None:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        name = pod.metadata.name
        try:
            resp = self.core.read_namespaced_pod_log(name, self.namespace, container=_log_container(pod),
                                                     follow=True, _preload_content=False, **window)
            rest = b""
            for chunk in resp.stream(4096):
                *lines, rest = (rest + chunk).split(b"\n")
                for line in lines:
                    emit(name, line.decode(errors="replace"))
            if rest:
                emit(name, rest.decode(errors="replace"))
            resp.release_conn()
        except (ApiException, HTTPError, OSError) as e:
            reason = f"{e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
            emit(name, f"(log unavailable: {reason})")

    def wait(self, name: str, on_change: Callable[[dict[str, Any]], None], timeout_s: float | None = None) -> dict[str, Any]:
        """Follow the Workflow until it ends: a watch from the resourceVersion of a first GET, so
        every change is seen and none is missed between reads; ``on_change`` gets the workflow
        whenever a node's phase changes. A watch the API server ends (its timeout, a restart) is
        resumed from the last version seen; one whose version has expired (410) starts again from
        a new GET. PipectlError after ``timeout_s`` seconds, or when the workflow is deleted."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        seen: dict[str, str] = {}

        def changed(wf: dict[str, Any]) -> bool:
            nonlocal seen
            nodes = {n.get("displayName", k): n.get("phase", "") for k, n in (wf.get("status", {}).get("nodes") or {}).items()}
            if nodes != seen:
                seen = nodes
                on_change(wf)
            return wf.get("status", {}).get("phase") in TERMINAL

        wf = self.get("workflows", name)
        while True:
            if changed(wf):
                return wf
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise PipectlError(f"workflow {name} still {wf.get('status', {}).get('phase') or 'Pending'} after {timeout_s:.0f} s",
                                   f"it goes on running: pipectl wait {name}, or pipectl stop {name}")
            wf = self._next_version(name, wf, 60 if left is None else max(1, min(60, int(left) + 1)))

    def _next_version(self, name: str, wf: dict[str, Any], window_s: int) -> dict[str, Any]:
        """The workflow's next version from a watch of at most ``window_s`` seconds (``wf`` itself when
        nothing changed in that time; a fresh GET when its version has expired)."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        stream = watch.Watch().stream(
            self.api.list_namespaced_custom_object, GROUP, VERSION, self.namespace, "workflows",
            field_selector=f"metadata.name={name}", resource_version=wf["metadata"]["resourceVersion"],
            timeout_seconds=window_s, _request_timeout=window_s + 30)
        try:
            for event in stream:
                if event["type"] == "DELETED":
                    raise PipectlError(f"workflow {name} was deleted before it ended")
                if event["type"] in ("ADDED", "MODIFIED"):
                    return event["object"]
        except ApiException as e:
            if e.status != 410:  # Gone: the version we watched from is too old; read it again
                raise
            return self.get("workflows", name)
        return wf


class ArgoServer:
    """The Argo Server's API (what the Argo UI and the `argo` CLI use), through Hera's
    ``WorkflowsService``, for the operations the Kubernetes API alone cannot do, such as retrying a
    workflow in place.

    Configured like the `argo` CLI (Argo docs, "Argo Server" / CLI environment variables):
    ``ARGO_SERVER`` host:port, ``ARGO_SECURE`` (default true: https), ``ARGO_INSECURE_SKIP_VERIFY``,
    ``ARGO_TOKEN`` (the Authorization header, e.g. ``Bearer ...``; a bare token gets ``Bearer``).
    Errors: unreachable or 401/403 -> :class:`Unreachable` (3); 400/409 (the request does not
    fit the workflow's state) -> :class:`ValidationFailed` (2); other -> :class:`PipectlError`.
    """

    def __init__(self, server: str, *, secure: bool = True, verify: bool = True, token: str = "") -> None:
        scheme = "https" if secure else "http"
        self.base = server if "://" in server else f"{scheme}://{server}"
        self.verify = verify
        self.token = token

    @classmethod
    def from_env(cls, default: str = "") -> "ArgoServer | None":
        """The Argo Server the `argo` CLI would use (``ARGO_SERVER``), else ``default`` (an address
        such as the site file's ``argo_ui``: the Argo Server serves the UI and its API at one
        address); None when neither is set. ``ARGO_SECURE``, ``ARGO_INSECURE_SKIP_VERIFY`` and
        ``ARGO_TOKEN`` apply to either."""
        server = os.environ.get("ARGO_SERVER", "") or default
        if not server:
            return None
        truthy = ("1", "true", "yes")
        return cls(server, secure=os.environ.get("ARGO_SECURE", "true").lower() in truthy,
                   verify=os.environ.get("ARGO_INSECURE_SKIP_VERIFY", "false").lower() not in truthy,
                   token=os.environ.get("ARGO_TOKEN", ""))

    def _call(self, what: str, request: Callable[[Any], Any]) -> Any:
        """``request(service)`` with Hera's ``WorkflowsService`` for this server (30 s per HTTP
        request); its failures mapped to the CLI's errors."""
        import requests
        from hera.exceptions import HeraException
        from hera.workflows.service import WorkflowsService

        session = _timed_session()
        try:
            with WorkflowsService(host=self.base.rstrip("/") + "/", verify_ssl=self.verify, token=self.token or None,
                                  session=session) as service:
                return request(service)
        except requests.RequestException as e:
            raise Unreachable(f"{what}: the Argo Server {self.base} is unreachable ({e})", "check ARGO_SERVER / ARGO_SECURE") from e
        except HeraException as e:
            raise _server_error(what, e) from e

    def version(self) -> dict[str, Any]:
        """The Argo Server's build (GET /api/v1/version): ``version`` (e.g. ``v4.0.5``), ``gitCommit``, ``buildDate``..."""
        return self._call("version", lambda service: service.get_version()).model_dump(by_alias=True)

    def workflow_url(self, namespace: str, name: str) -> str:
        """The page of workflow ``name`` in the Argo UI, which the Argo Server serves at its own
        address (the UI's route ``/workflows/{namespace}/{name}``)."""
        return f"{self.base.rstrip('/')}/workflows/{namespace}/{name}"

    def retry(self, namespace: str, name: str) -> dict[str, Any]:
        """Retry workflow ``name`` in place: failed steps run again, succeeded ones keep their
        outputs (PUT /api/v1/workflows/{namespace}/{name}/retry)."""
        from hera.workflows.models import WorkflowRetryRequest

        request = WorkflowRetryRequest(name=name, namespace=namespace)
        return self._call(f"retry {name}", lambda service: service.retry_workflow(name, request, namespace=namespace)).model_dump(
            by_alias=True, exclude_none=True)


def _timed_session() -> Any:
    """A ``requests.Session`` whose requests time out after 30 s unless told otherwise (Hera's
    service sets no timeout of its own)."""
    import requests

    class Session(requests.Session):
        def request(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("timeout", 30)
            return super().request(*args, **kwargs)

    return Session()


def _server_error(what: str, e: Exception) -> PipectlError:
    """The CLI's error for an Argo Server's answer that Hera raised (its message carries the
    status code and the server's own message)."""
    import re

    m = re.match(r"Server returned status code (\d+) with message: `(.*)`\Z", str(e), re.S)
    status, detail = (int(m[1]), m[2]) if m else (getattr(e, "status_code", 0), str(e))
    hint = "only a Failed or Error workflow can be retried in place"
    if status in (401, 403):
        return Unreachable(f"{what}: the Argo Server refused us ({status}): {detail}", "check ARGO_TOKEN")
    if status in (400, 409, 412):
        return ValidationFailed(f"{what}: {detail}", hint)
    if status == 404:
        return PipectlError(f"{what}: not found ({detail})", "check the name and namespace")
    # the Argo Server reports a state that does not allow the operation as a 500 (seen with v4.0.5)
    if "must be" in detail or "cannot" in detail:
        return ValidationFailed(f"{what}: {detail}", hint)
    return PipectlError(f"{what}: Argo Server error {status}: {detail}")
