"""``pipectl lint``: schema validation against upstream CRDs/OpenAPI plus pipectl's policy rules.

Schemas (vendored under ``schemas/`` by ``scripts/vendor_schemas.py``, from argo-workflows
v4.0.5, volcano v1.10.0, training-operator v1.8.1 and kubernetes v1.34.4) are checked with
``jsonschema``; on top, fields a CRD's structural schema does not declare are reported, because
the API server silently prunes them (Hera 7 also drops unknown fields on some Argo models without an error).

Policy rules on WorkflowTemplates/CronWorkflows: every parameter default is in its enum; gang
manifests, after Argo substitution with the defaults and with every lane, have integer replicas,
``minAvailable`` equal to the gang size, whole-number GPUs, and a lane that exists; no secret
literal in any env; every container sets ``command``; images are pinned (no ``:latest``); no
template holds a semaphore through a retry backoff (C10). A Deployment's pods (the gang reaper's)
keep the restricted Pod Security Standard, pinned images and no secret literal too.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from pipectl.pipelines import security

SCHEMAS = Path(__file__).resolve().parent / "schemas"
SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)


@dataclass(frozen=True)
class Finding:
    """One problem: ``where`` is ``<source> <kind>/<name> <field path>``."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


@functools.lru_cache(maxsize=None)
def _schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in SCHEMAS.glob("*.json"):
        doc = json.loads(path.read_text())
        out[(doc["apiVersion"], doc["kind"])] = doc["schema"]
    return out


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(root)"


def _resolve(schema: dict, root: dict) -> dict:
    while "$ref" in schema:
        ref = schema["$ref"]
        node: Any = root
        for part in ref.lstrip("#/").split("/"):
            node = node[part]
        schema = node
    if "allOf" in schema and len(schema["allOf"]) == 1:
        merged = {k: v for k, v in schema.items() if k != "allOf"}
        merged.update(_resolve(schema["allOf"][0], root))
        return merged
    return schema


def _unknown_fields(obj: Any, schema: dict, root: dict, path: list) -> Iterator[tuple[list, str]]:
    """Fields the structural schema does not declare (the API server would prune them)."""
    schema = _resolve(schema, root)
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(obj, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                yield from _unknown_fields(value, props[key], root, path + [key])
            elif isinstance(extra, dict):
                yield from _unknown_fields(value, extra, root, path + [key])
            elif props is not None and extra is None and path[-1:] != ["metadata"]:
                yield path + [key], key
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            yield from _unknown_fields(item, schema["items"], root, path + [i])


def validate_schema(obj: dict, source: str) -> list[Finding]:
    """Schema findings for one object; an object of a kind with no vendored schema is a finding."""
    import jsonschema

    kind, api = obj.get("kind"), obj.get("apiVersion")
    name = (obj.get("metadata") or {}).get("name", "?")
    where = f"{source} {kind}/{name}"
    schema = _schemas().get((api, kind))
    if schema is None:
        return [Finding(where, f"no schema for {api} {kind}; pipectl lint cannot check it")]
    findings = []
    validator = jsonschema.Draft7Validator(schema)
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        findings.append(Finding(f"{where} {_path(err.absolute_path)}", err.message))
    for path, key in _unknown_fields(obj, schema, schema, []):
        findings.append(Finding(f"{where} {_path(path)}", f"unknown field {key!r}: the API server would drop it"))
    return findings


# ---------------------------------------------------------------- policy


def _containers(tmpl: dict) -> Iterator[tuple[str, dict]]:
    if "container" in tmpl:
        yield "container", tmpl["container"]
    if "script" in tmpl:
        yield "script", tmpl["script"]


def _gang_objects(wt: dict) -> Iterator[tuple[int, str, dict, str]]:
    """(template index, lane, job after substitution, label) for each resource template, with the
    workflow parameter defaults and each lane of the lane enum."""
    import yaml

    from pipectl.pipelines.substitution import TemplateError, resolve_known, substitute

    params = {p["name"]: p for p in wt["spec"].get("arguments", {}).get("parameters", [])}
    lanes = params.get("lane", {}).get("enum") or [params.get("lane", {}).get("value", "standard")]
    for i, tmpl in enumerate(wt["spec"].get("templates", [])):
        res = tmpl.get("resource")
        if not res or not res.get("manifest"):
            continue
        for lane in lanes:
            values = {"workflow.name": "lint-abcde", "workflow.uid": "0", "retries": "0",
                      **{f"workflow.parameters.{n}": str(p.get("value", "lint")) for n, p in params.items()}}
            for p in tmpl.get("inputs", {}).get("parameters", []):
                default = params.get(p["name"], {}).get("value", p.get("value", p.get("default", "lint")))
                values[f"inputs.parameters.{p['name']}"] = resolve_known(str(default), values)
            values["inputs.parameters.lane"] = values["workflow.parameters.lane"] = lane
            try:
                yield i, lane, yaml.safe_load(substitute(res["manifest"], values, where=f"templates[{i}]")), ""
            except (TemplateError, yaml.YAMLError) as e:
                yield i, lane, {}, f"manifest does not render: {e}"


def check_policy(obj: dict, source: str) -> list[Finding]:
    """pipectl's rules (see the module doc) for the kinds they concern; other kinds: none."""
    where = f"{source} {obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"
    kind = obj.get("kind")
    if kind in ("WorkflowTemplate", "Workflow"):
        return _workflow_findings(obj["spec"], where, source)
    if kind == "CronWorkflow":
        spec = obj.get("spec", {}).get("workflowSpec", {})
        return _workflow_findings(spec, f"{where} spec.workflowSpec", source) if spec.get("templates") else []
    if kind in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
        return _rbac_findings(obj, where)
    if kind == "Namespace":
        return _namespace_findings(obj, where)
    if kind == "Deployment":
        return _deployment_findings(obj, where)
    return []


def _deployment_findings(obj: dict, where: str) -> list[Finding]:
    """A Deployment's pods (the gang reaper's) keep the same rules as a step's: restricted pod and
    container fields, no host namespace or hostPath, pinned images, no secret literal in env."""
    spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    at = f"{where} spec.template.spec"
    findings = [Finding(f"{at}.securityContext", m) for m in security.pod_problems(spec.get("securityContext") or {})]
    findings += [Finding(at, m) for m in security.pod_spec_problems(spec)]
    for i, c in enumerate([*(spec.get("initContainers") or []), *(spec.get("containers") or [])]):
        findings += _container_findings(c, f"{at} container {c.get('name', i)!r}")
    return findings


def _workflow_findings(spec: dict, where: str, source: str) -> list[Finding]:
    findings: list[Finding] = []
    for j, p in enumerate(spec.get("arguments", {}).get("parameters", [])):
        if p.get("enum") and p.get("value") not in p["enum"]:
            findings.append(Finding(f"{where} spec.arguments.parameters[{j}]", f"default {p.get('value')!r} of {p['name']} is not in its enum {p['enum']}"))
    findings += _validated_first(spec, where)
    if spec.get("templates"):  # a workflow that only references a WorkflowTemplate runs the template's pods
        findings += [Finding(f"{where} spec.securityContext", m) for m in security.pod_problems(spec.get("securityContext") or {})]
        findings += _token_findings(spec, where)
    for i, tmpl in enumerate(spec.get("templates", [])):
        for kind, c in _containers(tmpl):
            at = f"{where} spec.templates[{i}].{kind}"
            if kind == "container" and not c.get("command"):
                findings.append(Finding(at, f"template {tmpl['name']!r} sets no command (entrypoint look-up needs a registry)"))
            findings += _container_findings(c, at)
        findings += [Finding(f"{where} spec.templates[{i}]", m) for m in security.pod_spec_problems(tmpl)]
        findings += _semaphore_backoff_findings(tmpl, f"{where} spec.templates[{i}]")
    for i, lane, job, error in _gang_objects({"spec": spec}):
        at = f"{where} spec.templates[{i}].resource.manifest (lane={lane})"
        if error:
            findings.append(Finding(at, error))
            continue
        findings += [Finding(f"{at} {f.where.split(' ', 2)[-1]}", f.message) for f in validate_schema(job, source) if "no schema" not in f.message]
        findings += _gang_findings(job, at)
    return findings


def _semaphore_backoff_findings(tmpl: dict, at: str) -> list[Finding]:
    """C10: Argo takes a template's locks under its RETRY node and gives them back only when every
    retry is over, so a template with a semaphore and a retry backoff keeps a lane slot while it
    only waits (workflow/controller/operator.go executeTemplate, v4.0.5; argoproj/argo-workflows#9875).
    Mutexes are left alone: holding one through a backoff delays the same key only (the register
    step's per-model mutex, C08)."""
    sync = tmpl.get("synchronization") or {}
    if (sync.get("semaphores") or sync.get("semaphore")) and (tmpl.get("retryStrategy") or {}).get("backoff"):
        return [Finding(f"{at} retryStrategy.backoff", f"template {tmpl['name']!r} holds a semaphore through its retry backoff "
                        "(C10, argo-workflows#9875): wait and retry outside it (training.py train-retry)")]
    return []


def _container_findings(c: dict, at: str) -> list[Finding]:
    return (_image_findings(c.get("image", ""), at) + _env_findings(c.get("env") or [], at)
            + [Finding(f"{at} securityContext", m) for m in security.container_problems(c.get("securityContext") or {})])


def _gang_findings(job: dict, at: str) -> list[Finding]:
    """Gang rules (C03, lanes) and pod security on one substituted gang job."""
    from pipectl.components.names import LANE_OBJECT_NAMES, is_queue_name
    from pipectl.pipelines.launchers import launcher_for
    from pipectl.pipelines.launchers.base import refusal

    launcher = launcher_for(job)
    if launcher is None:
        return []
    if (why := refusal(job)) is not None:
        return [Finding(at, f"the API server would refuse the gang job with these defaults: {why}")]
    groups = launcher.replica_groups(job)
    replicas = [g.replicas for g in groups]
    if not all(isinstance(r, int) for r in replicas):
        return [Finding(at, f"replicas must be integers after substitution, got {replicas!r}")]
    findings = []
    gang = sum(replicas)
    min_available, queue = launcher.gang_fields(job)
    if min_available != gang:
        findings.append(Finding(at, f"minAvailable {min_available!r} must equal the gang size {gang} (all pods or none)"))
    if not is_queue_name(str(queue)):
        findings.append(Finding(at, f"queue {queue!r} is not a lane's queue (nor a team's queue of a lane)"))
    for group in groups:
        pod = group.pod_spec
        findings += [Finding(f"{at} {group.name}", m) for m in security.pod_spec_problems(pod) + security.pod_problems(pod.get("securityContext") or {})]
        if pod.get("automountServiceAccountToken") is not False:
            findings.append(Finding(f"{at} {group.name}", "training pods must not mount a service-account token (automountServiceAccountToken: false)"))
        for c in pod.get("containers", []):
            gpus = (c.get("resources", {}).get("limits") or {}).get("nvidia.com/gpu")
            if gpus is not None and not isinstance(gpus, int):
                findings.append(Finding(at, f"nvidia.com/gpu must be a whole number, got {gpus!r}"))
            if not c.get("command"):
                findings.append(Finding(at, f"container {c.get('name')!r} sets no command"))
            findings += _container_findings(c, f"{at} {group.name}")
        pc = pod.get("priorityClassName")
        if pc is not None and pc not in LANE_OBJECT_NAMES:
            findings.append(Finding(at, f"priorityClassName {pc!r} is not a lane's PriorityClass"))
    return findings


TOKEN_HOLDERS = ("gang-release", "gang-avoid")
"""The only step templates whose own code talks to the Kubernetes API (they delete the gang jobs;
``gang-avoid`` also reads the gang's pods)."""


def _token_findings(spec: dict, where: str) -> list[Finding]:
    """Step code holds no Kubernetes token: ``automountServiceAccountToken: false`` with an
    executor ServiceAccount (Argo mounts its token into its own containers only); a template may
    turn it back on only when its own code needs the API (:data:`TOKEN_HOLDERS`)."""
    findings = []
    if spec.get("automountServiceAccountToken") is not False or not (spec.get("executor") or {}).get("serviceAccountName"):
        findings.append(Finding(f"{where} spec", "step containers must not mount a service-account token: set "
                                "automountServiceAccountToken: false and executor.serviceAccountName"))
    for i, tmpl in enumerate(spec.get("templates", [])):
        if tmpl.get("automountServiceAccountToken") is True and tmpl.get("name") not in TOKEN_HOLDERS:
            findings.append(Finding(f"{where} spec.templates[{i}]", f"template {tmpl.get('name')!r} mounts a service-account "
                                    "token into its own containers: only steps whose code calls the API may"))
    return findings


def _validated_first(spec: dict, where: str) -> list[Finding]:
    """C15: Argo substitutes parameters as text and neither its UI nor its API enforces enums or
    types, so a parameter must be checked inside the cluster before it reaches a manifest or a
    command: the entry DAG has a ``validate`` task that every other task depends on."""
    entry = next((t for t in spec.get("templates", []) if t.get("name") == spec.get("entrypoint")), None)
    if not entry or "dag" not in entry or not spec.get("arguments", {}).get("parameters"):
        return []
    tasks = {t["name"]: t for t in entry["dag"].get("tasks", [])}
    if "validate" not in tasks:
        return [Finding(f"{where} {entry['name']}", "no `validate` task: parameters reach manifests and commands unchecked (C15)")]

    def reaches(name: str, seen: frozenset = frozenset()) -> bool:
        deps = tasks.get(name, {}).get("dependencies") or []
        return "validate" in deps or any(reaches(d, seen | {name}) for d in deps if d not in seen)

    return [Finding(f"{where} {entry['name']}.tasks[{name}]", "runs before `validate`: it must depend on it (C15)")
            for name in tasks if name != "validate" and not reaches(name)]


def _rbac_findings(obj: dict, where: str) -> list[Finding]:
    """Least privilege: namespaced Roles only, and no wildcard anywhere in a rule."""
    kind = obj["kind"]
    if kind.startswith("Cluster"):
        return [Finding(where, f"{kind}: pipectl needs no cluster-wide rights; use a Role/RoleBinding in the namespace")]
    findings = []
    for i, rule in enumerate(obj.get("rules") or []):
        for field in ("apiGroups", "resources", "verbs", "resourceNames"):
            if "*" in (rule.get(field) or []):
                findings.append(Finding(f"{where} rules[{i}].{field}", "wildcard: name each group, resource and verb the step needs"))
    return findings


def _namespace_findings(obj: dict, where: str) -> list[Finding]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
        return [Finding(f"{where} metadata.labels", "pod-security.kubernetes.io/enforce must be restricted")]
    return []


def _image_findings(image: str, at: str) -> list[Finding]:
    if "{{" in image:
        return []
    name = image.rsplit("/", 1)[-1]
    if "@sha256:" in image:
        return []
    if ":" not in name or name.endswith(":latest"):
        return [Finding(at, f"image {image!r} is not pinned: use a version tag or a digest, never latest")]
    return []


def _env_findings(env: list[dict], at: str) -> list[Finding]:
    return [
        Finding(at, f"env {e['name']} carries a secret literal: use valueFrom.secretKeyRef or envFrom a Secret")
        for e in env
        if SECRET_NAME.search(e.get("name", "")) and "value" in e
    ]


CONFIG_FILES = {("apiserver.config.k8s.io/v1", "AdmissionConfiguration")}
"""Component configuration files under argo/ (read by the API server from disk, never applied): not API objects."""


def lint_objects(objects: list[tuple[str, dict]]) -> list[Finding]:
    """Schema and policy findings for ``(source, object)`` pairs."""
    findings: list[Finding] = []
    for source, obj in objects:
        if (obj.get("apiVersion"), obj.get("kind")) in CONFIG_FILES:
            continue
        findings += validate_schema(obj, source)
        findings += check_policy(obj, source)
    return findings


def load_paths(paths: list[Path]) -> list[tuple[str, dict]]:
    """Every YAML document in ``paths`` (files, or folders searched for ``*.yaml`` except kustomization)."""
    import yaml

    out = []
    for path in paths:
        files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
        for f in files:
            if f.name == "kustomization.yaml":
                continue
            for doc in yaml.safe_load_all(f.read_text()):
                if doc:
                    out.append((str(f), doc))
    return out
