"""The embedded local backend: executes a *compiled* WorkflowTemplate dict on this machine.

It walks the entry DAG in dependency order and runs each task's template as Argo would,
with local processes standing in for pods:

- ``container`` templates: ``command + args`` after Argo parameter substitution
  (``{{workflow.*}}``, ``{{inputs.parameters.*}}``, ``{{tasks.<t>.outputs.parameters.*}}``);
  output parameters are read from their ``valueFrom.path`` files.
- ``resource`` templates creating a launcher's gang job (:mod:`pipectl.pipelines.launchers`):
  every pod of every replica group runs as a process, with what the launcher's operator or plugins
  would give it (``Launcher.local_env``: ``VC_TASK_INDEX`` for Volcano, ``RANK``/``MASTER_*`` for
  a PyTorchJob; the job's pod DNS names resolve to 127.0.0.1). The job is Completed when every pod
  exits 0. When one fails, the others are stopped and the job's own policy decides, as its
  operator would: Volcano's restarts the whole gang on an infrastructure exit code (143, 137, 75)
  up to ``maxRetry`` runs and ends the job on 1; a PyTorchJob fails.

What a container filesystem would give a pod is mapped, and only that: the image's
``python``/``torchrun`` are this interpreter's; the output folder ``/tmp/outputs`` is a per-task
folder (like a volume mount); pods share the host network, so a fixed ``MASTER_PORT`` is
replaced by a free port. Anything the local backend cannot honour is an error, not a skip.

Every run keeps a record, ``<workdir>/run.json`` (:class:`RunRecord`), rewritten atomically after
each task: workflow name and uid, parameters, the compiled template, each task's phase, outputs
and executions. A run that did not succeed can be resumed from it (``LocalRunner(...,
resume=record)``): same workflow name and uid (so the same run prefix in the store, the same
MLflow run, the same registration key), Succeeded tasks are not run again and their recorded
outputs feed their dependants, the others run again. This is Argo's ``argo retry`` /
``resubmit --memoized`` for one machine.
"""

from __future__ import annotations

import json
import os
import platform
import re
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import contextlib

import yaml

from pipectl.components.names import METRICS_HOST_ENV, METRICS_PORT_ENV
from pipectl.components.names import OUTPUTS_DIR as CONTAINER_OUTPUTS_DIR
from pipectl.pipelines.backends.processes import free_port, spawn, stop
from pipectl.pipelines.launchers import launcher_for
from pipectl.pipelines.launchers.base import NODE_NAME_FIELD, POD_NAME_FIELD, refusal
from pipectl.pipelines.substitution import TemplateError, evaluate_when, expand_k8s_vars, resolve_known, substitute


class LocalBackendError(TemplateError):
    """The compiled workflow uses something the local backend cannot execute, or is malformed
    (substitution problems arrive as the base class, :class:`TemplateError`)."""



def _skipped(when: str, condition: str) -> str:
    """Why a task was skipped, for people: its ``when`` with parameter names, and what it read."""
    readable = re.sub(r"\{\{workflow\.parameters\.([A-Za-z0-9_-]+)\}\}", r"\1", when)
    flag = re.fullmatch(r"\s*([A-Za-z0-9_-]+)\s*==\s*true\s*", readable)
    if flag and condition.split("==")[0].strip() == "false":  # a switch: `warm-cache == true`, read as false
        return f"skipped: {flag.group(1)} is false"
    return f"skipped: {readable} does not hold ({condition})"

@dataclass
class NodeResult:
    """One executed task: ``phase`` is Succeeded, Failed or Skipped (``when`` false); ``duration_s`` seconds."""

    task: str
    template: str
    phase: str
    exit_code: int
    duration_s: float
    outputs: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    message: str = ""
    attempts: int = 1
    reused: bool = False
    """True when the task Succeeded in an earlier (interrupted) execution of this run and was not run again."""
    gang_restarts: int = 0
    """A gang job: how many times its policy restarted the whole gang after a pod failed."""
    gang_restarts_spent: bool = False
    """A gang job that failed although its policy restarts the gang on that failure: its restart
    budget is spent (the job Failed, as its operator ends it); the step is not retried on top."""


@dataclass
class RunResult:
    workflow_name: str
    workflow_uid: str
    phase: str
    nodes: list[NodeResult]
    workdir: Path

    def node(self, task: str) -> NodeResult | None:
        return next((n for n in self.nodes if n.task == task), None)


RECORD_FILE = "run.json"


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write ``doc`` as JSON to ``path`` so a reader sees the old file or the new one, never a part:
    a temporary file in the same folder, fsync, ``os.replace``, fsync of the folder (POSIX rename
    is atomic within a file system; the fsyncs make it survive a power loss)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


@dataclass
class RunRecord:
    """The durable record of one local run, ``<state>/runs/<workflow name>/run.json``.

    ``phase``: Running (or the process was killed), Succeeded, Failed, Interrupted (a signal or
    Ctrl-C unwound it), Error (the runner itself raised). ``started_at``: Unix time (s) of the first execution. ``executions``: how many
    times the run was started (1 + resumes). ``tasks``: task name -> ``{"phase", "exit_code",
    "outputs", "message", "attempts", "log", "started_at", "finished_at", "duration_s",
    "executions": [{"execution", "phase", "started_at", "finished_at"}]}`` (times in Unix seconds;
    ``executions`` lists every time the task actually ran, a reused task is not listed again).
    ``extra``: what the caller wants kept (the local backend: launcher, store, compile settings).
    """

    name: str
    uid: str
    parameters: dict[str, str]
    template: dict[str, Any]
    phase: str = "Running"
    started_at: float = 0.0
    finished_at: float | None = None
    executions: int = 0
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def save(self, workdir: Path) -> None:
        write_json_atomic(workdir / RECORD_FILE, asdict(self))

    @classmethod
    def load(cls, path: Path) -> "RunRecord":
        """Read ``path`` (a ``run.json``). Raises OSError, ValueError (not JSON) or TypeError (not a record)."""
        return cls(**json.loads(path.read_text()))

    def succeeded(self, task: str) -> bool:
        return (self.tasks.get(task) or {}).get("phase") == "Succeeded"


def _globals(values: dict[str, str]) -> dict[str, str]:
    """The workflow's global values in a scope (``workflow.*``): what Argo resolves in a template's
    own input values before anything else (:func:`~pipectl.pipelines.substitution.resolve_known`)."""
    return {k: v for k, v in values.items() if k.startswith("workflow.")}


def _topological(tasks: list[dict]) -> list[dict]:
    by_name = {t["name"]: t for t in tasks}
    order: list[dict] = []
    state: dict[str, int] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise LocalBackendError(f"dependency cycle: {' -> '.join(chain + (name,))}")
        if name not in by_name:
            raise LocalBackendError(f"task {chain[-1]!r} depends on unknown task {name!r}")
        state[name] = 1
        task = by_name[name]
        if "depends" in task:
            raise LocalBackendError(f"task {name!r}: 'depends' expressions are not supported locally; use dependencies")
        for dep in task.get("dependencies", []) or []:
            visit(dep, chain + (name,))
        state[name] = 2
        order.append(task)

    for t in tasks:
        visit(t["name"], ())
    return order


class LocalRunner:
    """Run one workflow from a compiled WorkflowTemplate ``template`` (its ``to_dict()``).

    ``parameters``: workflow argument overrides (kebab names -> strings).
    ``env``: environment for every step process (the store settings as ``PIPECTL_*``).
    ``workdir``: where per-task folders and logs go.
    ``on_event(kind, task, node_or_none)``: progress callback; kind is "start" or "end".
    ``resume``: the record of an earlier run of the same template (:class:`RunRecord`) to continue:
    its name, uid and parameters are kept; ``parameters`` must resolve to the same values
    (LocalBackendError otherwise), as must ``template``.
    ``extra``: kept in the record's ``extra`` (a new run only).
    """

    def __init__(
        self,
        template: dict[str, Any],
        parameters: dict[str, str],
        env: dict[str, str],
        workdir: Path,
        on_event: Callable[[str, str, NodeResult | None], None] | None = None,
        *,
        resume: RunRecord | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.template = template
        self.spec = template["spec"]
        self.templates = {t["name"]: t for t in self.spec["templates"]}
        base = template["metadata"]["name"].rsplit("-v", 1)[0]
        self.workflow_name = resume.name if resume else f"{base}-{secrets.token_hex(3)[:5]}"
        self.workflow_uid = resume.uid if resume else str(uuid.uuid4())
        self.workdir = workdir / self.workflow_name
        self.env = env
        self.on_event = on_event or (lambda *a: None)
        declared = {p["name"]: p for p in self.spec.get("arguments", {}).get("parameters", [])}
        unknown = set(parameters) - set(declared)
        if unknown:
            raise LocalBackendError(f"unknown workflow parameters: {', '.join(sorted(unknown))}")
        self.parameters = {name: str(parameters.get(name, p.get("value", ""))) for name, p in declared.items()}
        for name, p in declared.items():
            if p.get("enum") and self.parameters[name] not in p["enum"]:
                raise LocalBackendError(f"parameter {name}={self.parameters[name]!r} not in {p['enum']}")
        if resume is not None:
            if resume.template != template:
                raise LocalBackendError(f"run {resume.name} ran another compiled workflow; it can only be resumed with the same one")
            changed = sorted(k for k in set(resume.parameters) | set(self.parameters) if resume.parameters.get(k) != self.parameters.get(k))
            if changed:
                raise LocalBackendError(f"run {resume.name} ran with other parameters: "
                                        + ", ".join(f"{k}={resume.parameters.get(k)!r} (now {self.parameters.get(k)!r})" for k in changed))
        self.record = resume or RunRecord(self.workflow_name, self.workflow_uid, dict(self.parameters), template,
                                          started_at=time.time(), extra=dict(extra or {}))

    # ------------------------------------------------------------------ run

    def run(self) -> RunResult:
        """Execute the entry DAG (or what is left of it when resuming); the record is saved after
        every task. A BaseException (Ctrl-C, a signal turned into SystemExit) marks the record
        Interrupted (any other exception: Error), and the task it hit as well, before it propagates."""
        entry = self.templates.get(self.spec["entrypoint"])
        if entry is None or "dag" not in entry:
            raise LocalBackendError(f"entrypoint {self.spec['entrypoint']!r} must be a DAG template")
        order = _topological(entry["dag"]["tasks"])
        self.workdir.mkdir(parents=True, exist_ok=True)
        record = self.record
        record.executions += 1
        record.phase, record.finished_at = "Running", None
        if record.executions == 1:
            # What was executed, for `pipectl render` comparisons and post-mortems.
            (self.workdir / "workflow.json").write_text(
                json.dumps({"name": self.workflow_name, "uid": self.workflow_uid, "parameters": self.parameters,
                            "template": self.template}, indent=2, sort_keys=True)
            )
        record.save(self.workdir)
        values = {
            "workflow.name": self.workflow_name,
            "workflow.uid": self.workflow_uid,
            "workflow.namespace": self.template["metadata"].get("namespace", "default"),
            **{f"workflow.parameters.{k}": v for k, v in self.parameters.items()},
        }
        nodes: list[NodeResult] = []
        current: str | None = None
        started = 0.0
        try:
            for task in order:
                name = task["name"]
                if record.succeeded(name):
                    node = self._reused(name, task["template"])
                    nodes.append(node)
                    self.on_event("end", name, node)
                    for out_name, out_value in node.outputs.items():
                        values[f"tasks.{name}.outputs.parameters.{out_name}"] = out_value
                    continue
                args = {
                    p["name"]: substitute(str(p.get("value", "")), values, where=f"task {name}")
                    for p in task.get("arguments", {}).get("parameters", [])
                }
                condition = substitute(task["when"], values, where=f"task {name} when") if "when" in task else ""
                if "when" in task and not evaluate_when(condition, name):
                    node = NodeResult(name, task["template"], "Skipped", 0, 0.0, message=_skipped(task["when"], condition))
                    nodes.append(node)
                    self._record(node, time.time(), ran=False)
                    self.on_event("end", name, node)
                    continue
                current, started = name, time.time()
                self.on_event("start", name, None)
                node = self._run_template(name, self.templates[task["template"]], args, values)
                current = None
                nodes.append(node)
                self._record(node, started, ran=True)
                self.on_event("end", name, node)
                if node.phase != "Succeeded":
                    return self._finish("Failed", nodes)
                for out_name, out_value in node.outputs.items():
                    values[f"tasks.{name}.outputs.parameters.{out_name}"] = out_value
        except BaseException as e:
            # Ctrl-C or a signal: Interrupted; anything else (this runner's own error): Error, as Argo calls it.
            phase = "Interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "Error"
            with contextlib.suppress(Exception):
                if current is not None:
                    self._record(NodeResult(current, "", phase, -1, time.time() - started, log_path=self._taskdir(current, 0) / "main.log",
                                            message="interrupted" if phase == "Interrupted" else f"{type(e).__name__}: {e}"),
                                 started, ran=True)
                record.phase, record.finished_at = phase, time.time()
                record.save(self.workdir)
            raise
        return self._finish("Succeeded", nodes)

    def _finish(self, phase: str, nodes: list[NodeResult]) -> RunResult:
        self.record.phase, self.record.finished_at = phase, time.time()
        self.record.save(self.workdir)
        return RunResult(self.workflow_name, self.workflow_uid, phase, nodes, self.workdir)

    def _taskdir(self, task: str, attempt: int) -> Path:
        """``<task>``; a retry ``<task>(n)`` as Argo names it; in the k-th resumed execution ``<task>.resume<k>``."""
        name = task if self.record.executions <= 1 else f"{task}.resume{self.record.executions - 1}"
        return self.workdir / (name if attempt == 0 else f"{name}({attempt})")

    def _reused(self, task: str, template: str) -> NodeResult:
        done = self.record.tasks[task]
        return NodeResult(task, template, "Succeeded", 0, float(done.get("duration_s", 0.0)), dict(done.get("outputs", {})),
                          Path(done["log"]) if done.get("log") else None,
                          "Succeeded in an earlier execution of this run: not run again", int(done.get("attempts", 1)), reused=True)

    def _record(self, node: NodeResult, started: float, *, ran: bool) -> None:
        finished = time.time()
        previous = self.record.tasks.get(node.task, {}).get("executions", [])
        self.record.tasks[node.task] = {
            "phase": node.phase, "exit_code": node.exit_code, "outputs": node.outputs, "message": node.message,
            "attempts": node.attempts, "log": str(node.log_path) if node.log_path else None,
            "started_at": started, "finished_at": finished, "duration_s": round(node.duration_s, 3),
            "executions": previous + ([{"execution": self.record.executions, "phase": node.phase,
                                        "started_at": started, "finished_at": finished}] if ran else []),
        }
        self.record.save(self.workdir)

    def _run_template(self, task: str, tmpl: dict, args: dict[str, str], values: dict[str, str],
                      dirname: str | None = None) -> NodeResult:
        """Run ``tmpl`` for ``task`` with its input ``args``; its files go to the folder ``dirname``
        (default ``task``) of the run's workdir."""
        inputs: dict[str, str] = {}
        for p in tmpl.get("inputs", {}).get("parameters", []):
            if p["name"] in args:
                inputs[p["name"]] = args[p["name"]]
            elif "value" in p or "default" in p:  # the template's own: its globals resolved first, as Argo does
                inputs[p["name"]] = resolve_known(str(p.get("value", p.get("default"))), _globals(values))
            else:
                raise LocalBackendError(f"task {task}: input parameter {p['name']!r} has no value")
        if "dag" in tmpl:
            return self._run_dag_template(task, tmpl, {**values, **{f"inputs.parameters.{k}": v for k, v in inputs.items()}},
                                          dirname or task)
        limit = int((tmpl.get("retryStrategy") or {}).get("limit", 0))
        attempt = 0
        while True:
            scope = {**values, "retries": str(attempt), **{f"inputs.parameters.{k}": v for k, v in inputs.items()}}
            taskdir = self._taskdir(dirname or task, attempt)
            taskdir.mkdir(parents=True, exist_ok=True)
            if "container" in tmpl:
                node = self._run_container(task, tmpl, scope, taskdir)
            elif "resource" in tmpl:
                node = self._run_resource(task, tmpl, scope, taskdir)
            else:
                raise LocalBackendError(f"task {task}: template {tmpl['name']!r} kind is not supported locally")
            # Locally no pod is deleted, refused or preempted by a scheduler: the only retryable
            # class is a step that declares itself transient (exit 75), within the template's retry
            # limit (a gang job restarts its gang itself first: _run_resource).
            if node.phase == "Succeeded" or node.exit_code != 75 or attempt >= limit or node.gang_restarts_spent:
                node.attempts = attempt + 1
                return node
            attempt += 1
            time.sleep(1)

    def _run_dag_template(self, task: str, tmpl: dict, scope: dict[str, str], dirname: str) -> NodeResult:
        """A DAG template used as a task's template (the train step's ``train-retry`` around the
        ``train`` resource template): its tasks in dependency order, ``{{inputs.parameters.*}}`` of
        the DAG in scope; the first one that does not succeed ends it with its phase and exit code.
        An inner task named like ``task`` uses ``task``'s folder, others ``<task>.<inner>``.
        Outputs: the template's ``outputs.parameters[].valueFrom.parameter`` expressions.

        The DAG template's own ``retryStrategy`` is not applied locally: its inner templates' are
        (exit 75 within their limit); an attempt here ends Succeeded or Failed, never Error (no pod
        is deleted or refused), and Argo's retry of a DAG node sees the same phases."""
        t0 = time.perf_counter()
        values = dict(scope)
        last: NodeResult | None = None
        for inner in _topological(tmpl["dag"]["tasks"]):
            name = inner["name"]
            args = {p["name"]: substitute(str(p.get("value", "")), values, where=f"task {task}.{name}")
                    for p in inner.get("arguments", {}).get("parameters", [])}
            if "when" in inner and not evaluate_when(substitute(inner["when"], values, where=f"task {task}.{name} when"), name):
                continue
            if inner["template"] not in self.templates:
                raise LocalBackendError(f"task {task}.{name}: no template {inner['template']!r}")
            last = self._run_template(f"{task}.{name}" if name != task else task, self.templates[inner["template"]], args, values,
                                      dirname if name == task else f"{dirname}.{name}")
            values[f"tasks.{name}.status"] = last.phase  # for a later task's `when` (the train step's retry: training.py)
            if last.phase != "Succeeded":
                return NodeResult(task, tmpl["name"], last.phase, last.exit_code, time.perf_counter() - t0,
                                  log_path=last.log_path, message=last.message, attempts=last.attempts)
            for out_name, out_value in last.outputs.items():
                values[f"tasks.{name}.outputs.parameters.{out_name}"] = out_value
        node = NodeResult(task, tmpl["name"], "Succeeded", 0, time.perf_counter() - t0, log_path=last.log_path if last else None,
                          message=last.message if last else "", attempts=last.attempts if last else 1)
        for p in tmpl.get("outputs", {}).get("parameters", []):
            expr = (p.get("valueFrom") or {}).get("parameter")
            if expr is None:
                raise LocalBackendError(f"task {task}: DAG output {p['name']!r} needs valueFrom.parameter")
            node.outputs[p["name"]] = substitute(expr, values, where=f"task {task} output {p['name']}")
        return node

    # ------------------------------------------------------------------ containers

    def _map_path(self, text: str, taskdir: Path) -> str:
        return text.replace(CONTAINER_OUTPUTS_DIR, str(taskdir / "outputs"))

    def _resolve_command(self, argv: list[str]) -> list[str]:
        exe = argv[0]
        if exe == "python":
            return [sys.executable, *argv[1:]]
        local = Path(sys.executable).parent / exe
        if local.exists():
            return [str(local), *argv[1:]]
        found = shutil.which(exe)
        if not found:
            raise LocalBackendError(f"command {exe!r} not found next to {sys.executable} or on PATH")
        return [found, *argv[1:]]

    def _container_env(self, container: dict, where: str, fields: dict[str, str] | None = None,
                       taskdir: Path | None = None) -> dict[str, str]:
        """The container's env over the runner's; ``valueFrom.fieldRef`` from ``fields`` (what the
        operator would put on the pod), ``$(VAR)`` of earlier variables expanded as Kubernetes does;
        with ``taskdir``, the container's outputs folder in a value is that task's (as in argv)."""
        env = dict(self.env)
        for item in container.get("env", []) or []:
            path = (item.get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
            if "value" in item:
                value = expand_k8s_vars(str(item["value"]), env)
                env[item["name"]] = self._map_path(value, taskdir) if taskdir else value
            elif path in (fields or {}):
                env[item["name"]] = (fields or {})[path]
            else:
                raise LocalBackendError(f"{where}: env {item['name']} uses valueFrom, not supported locally")
        return env

    def _run_container(self, task: str, tmpl: dict, scope: dict[str, str], taskdir: Path) -> NodeResult:
        c = tmpl["container"]
        argv = [substitute(a, scope, where=f"task {task}") for a in (c.get("command", []) + c.get("args", []))]
        if not argv:
            raise LocalBackendError(f"task {task}: container has no command (templates must set command:)")
        argv = [self._map_path(a, taskdir) for a in argv]
        env = self._container_env(c, f"task {task}", taskdir=taskdir)
        argv = [expand_k8s_vars(a, env) for a in argv]
        log_path = taskdir / "main.log"
        (taskdir / "argv.json").write_text(json.dumps([argv]))
        t0 = time.perf_counter()
        code = self._spawn_all([(self._resolve_command(argv), env)], log_path)
        node = NodeResult(task, tmpl["name"], "Succeeded" if code == 0 else "Failed", code, time.perf_counter() - t0, log_path=log_path)
        if code == 0:
            for p in tmpl.get("outputs", {}).get("parameters", []):
                path = p.get("valueFrom", {}).get("path")
                if not path:
                    continue
                local = Path(self._map_path(path, taskdir))
                if not local.exists():
                    node.phase, node.message = "Failed", f"output parameter {p['name']!r}: {path} was not written"
                    break
                node.outputs[p["name"]] = local.read_text()
        else:
            node.message = f"exit code {code}"
        return node

    # ------------------------------------------------------------------ resources

    def _run_resource(self, task: str, tmpl: dict, scope: dict[str, str], taskdir: Path) -> NodeResult:
        """A launcher's gang job: every pod as a process, all started and stopped together. When a
        pod fails, the others are stopped; the job's own policy then either fails it or restarts
        the whole gang (new processes, a new rendezvous port), within the job's restart budget
        (:meth:`Launcher.local_gang_restarts`), as its operator would on a cluster."""
        res = tmpl["resource"]
        if res.get("action") not in ("create", "apply"):  # no object exists beforehand here: both create
            raise LocalBackendError(f"task {task}: resource action {res.get('action')!r} not supported locally")
        manifest = yaml.safe_load(substitute(res["manifest"], scope, where=f"task {task} manifest"))
        launcher = launcher_for(manifest)
        if launcher is None:
            raise LocalBackendError(f"task {task}: resource {manifest.get('apiVersion')}/{manifest.get('kind')} is not a launcher's job")
        if (why := refusal(manifest)) is not None:  # what the API server refuses on a cluster: no gang
            raise LocalBackendError(f"task {task}: the gang job is refused: {why}")
        job = manifest["metadata"]["name"]
        log_path = taskdir / "main.log"
        (taskdir / "manifest.json").write_text(json.dumps(manifest, indent=2))
        t0 = time.perf_counter()
        restarts = 0
        while True:
            pods, names = self._gang_pods(task, manifest, launcher, taskdir)
            code, failed = self._spawn_gang(pods, log_path)
            budget = launcher.local_gang_restarts(manifest, code) if code != 0 else 0
            if code == 0 or restarts >= budget:
                break
            restarts += 1
            with open(log_path, "a") as log:
                log.write(f"pipectl run: pod {names[failed]} of {launcher.kind} {job} exited {code}: the job's policy "
                          f"restarts the whole gang (restart {restarts} of {budget})\n")
        spent = code != 0 and budget > 0
        restarted = f", its {restarts} gang restart(s) spent" if spent else f", {restarts} gang restart(s)" if restarts else ""
        node = NodeResult(task, tmpl["name"], "Succeeded" if code == 0 else "Failed", code, time.perf_counter() - t0,
                          log_path=log_path, message=f"{launcher.kind} {job}: {'Completed' if code == 0 else 'Failed'} "
                                                     f"({len(pods)} pods{restarted})")
        node.gang_restarts, node.gang_restarts_spent = restarts, spent
        return node

    def _gang_pods(self, task: str, manifest: dict, launcher: Any, taskdir: Path) -> tuple[list[tuple[list[str], dict[str, str]]], list[str]]:
        """The job's pods as processes to start (argv, env) on a fresh rendezvous port, and their
        names (``<group>-<index>``); their argv are written to ``argv.json``."""
        job = manifest["metadata"]["name"]
        port = str(free_port())
        groups = launcher.replica_groups(manifest)
        min_available, _ = launcher.gang_fields(manifest)
        total = sum(g.replicas for g in groups if isinstance(g.replicas, int))
        pods: list[tuple[list[str], dict[str, str]]] = []
        names: list[str] = []
        pod_argvs: list[list[str]] = []
        rank = 0
        for group in groups:
            if not isinstance(group.replicas, int):
                raise LocalBackendError(f"task {task}: replicas must be an integer after substitution, got {group.replicas!r}")
            if len(group.pod_spec["containers"]) != 1:
                raise LocalBackendError(f"task {task}: local pods must have exactly one container")
            c = group.pod_spec["containers"][0]
            downward = {item["name"] for item in c.get("env", []) or [] if "valueFrom" in item}
            for index in range(group.replicas):
                name = f"{group.name.lower()}-{index}"
                fields = {**launcher.pod_fields(job), NODE_NAME_FIELD: platform.node(),  # the node: this machine
                          POD_NAME_FIELD: f"{job}-{name}"}  # the operator's pod name: <job>-<group>-<index>
                env = self._container_env(c, f"task {task} pod {group.name}-{index}", fields, taskdir)
                env.update(launcher.local_env(group.name, index, rank, total, port))
                rank += 1
                for k, v in list(env.items()):
                    if k not in downward and re.fullmatch(rf"{re.escape(job)}-[a-z0-9-]+-\d+(\.{re.escape(job)})?(\..*)?", v):
                        env[k] = "127.0.0.1"  # the job's headless Service, on loopback
                if "MASTER_PORT" in env:
                    env["MASTER_PORT"] = port
                if METRICS_PORT_ENV in env:  # every pod's metrics endpoint on this one machine: a port of its own
                    env[METRICS_PORT_ENV] = str(free_port())
                    env[METRICS_HOST_ENV] = "127.0.0.1"  # served to this machine only
                argv = [self._map_path(expand_k8s_vars(a, env), taskdir) for a in c.get("command", []) + c.get("args", [])]
                pod_argvs.append(argv)
                pods.append((self._resolve_command(argv), env))
                names.append(name)
        if min_available is None:
            min_available = len(pods)
        if not isinstance(min_available, int) or min_available > len(pods):
            raise LocalBackendError(f"task {task}: minAvailable {min_available!r} invalid for {len(pods)} pods")
        (taskdir / "argv.json").write_text(json.dumps(pod_argvs))
        return pods, names

    # ------------------------------------------------------------------ processes

    def _spawn_all(self, procs: list[tuple[list[str], dict[str, str]]], log_path: Path) -> int:
        """Start every process (a gang starts together), wait for all; first non-zero exit code wins."""
        return self._spawn_gang(procs, log_path)[0]

    def _spawn_gang(self, procs: list[tuple[list[str], dict[str, str]]], log_path: Path) -> tuple[int, int]:
        """Start every process (a gang starts together), wait for all. Returns the first non-zero
        exit code (0 when all succeeded) and the index of the process that exited with it.

        If one process fails the others are stopped (a gang cannot continue without a member).
        """
        running = [spawn(argv, log_path, env) for argv, env in procs]
        try:
            code, failed = 0, -1
            pending = list(running)
            while pending:
                for p in list(pending):
                    rc = p.poll()
                    if rc is None:
                        continue
                    pending.remove(p)
                    if rc != 0 and code == 0:
                        code, failed = (rc if rc > 0 else 128 - rc), running.index(p)
                        for other in pending:
                            stop(other)
                time.sleep(0.05)
            return code, failed
        except BaseException:
            for p in running:
                stop(p)
            raise
