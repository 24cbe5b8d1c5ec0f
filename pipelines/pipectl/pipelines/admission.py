"""The API server's admission rules for pipectl: who may submit what, and which namespaces may use
which lane. Pure: dicts for ``argo/cluster/admission/`` (:func:`admission_policies`).

Three ValidatingAdmissionPolicies (GA since Kubernetes 1.30; evaluated inside the API server, so
they need no webhook and no API-server flag, and work on managed clusters):

``pipectl-submission`` (Workflows and CronWorkflows in namespaces labelled ``SUBMISSION_LABEL``):
a submission may only name a WorkflowTemplate of its namespace and set that template's declared
arguments, each in the one spelling every reader of it agrees on (the same rules as the
``validate`` step: :class:`~pipectl.components.contracts.TrainingParameters`). No templates of its
own, no other ServiceAccount, no ``podSpecPatch``, volumes, security context or priority class —
every other field of a Workflow's spec is refused by name. The rules apply on creation and on
every change of the spec, so a retry with overridden parameters (``argo retry -p``, the UI's
RETRY with "Override Parameters") is held to them too. A submitter cannot edit WorkflowTemplates
(:func:`submitter_role`), so whatever a template runs was put there by the namespace's owner.

A pipeline's own parameters (``Pipeline(parameters=...)``) are not in the policy: their rules are
keys of the ConfigMap ``PARAMETER_RULES_CONFIGMAP`` in the submitting namespace, the policy's
param (``paramKind`` ConfigMap; the binding names it without a namespace, so each namespace's own
is read). ``<template>.<parameter>.kind`` and, as the kind has them, bounds, ``max_length`` and an
anchored RE2 ``pattern`` (:func:`parameter_rules_data`); an argument is admitted when it is
pipectl's or the referenced template (``workflowTemplateRef.name``) has keys for it, and its value
is held to the same one-spelling rules (text also without quotes or backslashes). ``pipectl
templates apply`` writes a template's keys with server-side apply under a field manager of that
template's own (``pipectl-parameters-<template>``), so templates never overwrite each other's keys
and a parameter a template dropped loses its keys; ``pipectl templates delete`` removes them. A
namespace without the ConfigMap refuses every Workflow and CronWorkflow write (the binding's
``parameterNotFoundAction: Deny``; the lookup comes before the policy's match conditions, so the
exempt identities below too): ``argo/namespace`` creates it empty, ``pipectl templates apply``
creates it when missing. Submitters cannot write ConfigMaps.
Exempt: the break-glass group ``system:masters`` and the Argo workflow controller's
ServiceAccount (it updates workflows it runs; the CronWorkflows it starts runs from were checked).

Models: where teams share one MLflow registry, a namespace labelled ``MODEL_PREFIX_LABEL`` may
only train and promote models named ``<prefix>-...``, passed explicitly (a team cannot take
another's champion; a template's own default name is not known here). Likewise a namespace
annotated ``DATA_PREFIX_ANNOTATION`` may only read datasets under that S3 prefix, passed explicitly.

``pipectl-lanes`` (pods, Volcano Jobs and PodGroups, every namespace): a pod of a preempting
lane's PriorityClass, or anything in that lane's Volcano queue, is admitted only in a namespace
the cluster admin labelled ``lanes.pipectl.io/<lane>: "true"`` (a namespace owner cannot label
their own namespace). The namespace's ResourceQuota then caps how much it may take.

``pipectl-namespaces`` (Namespaces): the labels above that grant or hold a namespace (its team, its
preempting lanes, its model prefix, the submission policy) and its data-prefix annotation are set,
changed or removed (and, on a namespace with the submission-policy or team label, its Pod Security
labels) only by a platform admin: ``system:masters`` or the site's ``admin_groups`` /
``admin_users`` (:func:`namespaces_policy`). RBAC cannot say which labels a Namespace may carry, so
without it anyone allowed to create a Namespace could claim a team's queues.
"""

from __future__ import annotations

import enum
import json
import re
from typing import Any

import annotated_types as at

from pipectl.components.contracts import _DECIMAL_TEXT, _INT_TEXT, _LINE_SEPARATORS, _MODEL_NAME, TrainingParameters
from pipectl.components.names import LANE_NAMES, PART_OF, TEAM_QUEUE_PREFIX, kebab
from pipectl.pipelines.policy import LANES

MODEL_PREFIX_LABEL = "pipectl.io/model-prefix"
"""Namespace label: every ``model-name`` submitted in the namespace must start with ``<value>-``
(the models a team owns when teams share one MLflow registry)."""
DATA_PREFIX_ANNOTATION = "pipectl.io/data-prefix"
"""Namespace annotation (``s3://bucket/path/``): every ``dataset-uri`` submitted in the namespace
must start with it (the data a team's runs may read when teams share one object store)."""
TEAM_LABEL = "pipectl.io/team"
"""Namespace label: the team the namespace belongs to (its gangs use only the team's queues)."""
QUOTA_SETTING_ANNOTATION = "pipectl.io/site-setting"
"""ResourceQuota annotation: the site setting that sets the quota (what an admin raises for a larger one)."""
SUBMISSION_LABEL = "pipectl.io/submission-policy"
"""Namespace label (value ``enforce``) that puts a namespace's Workflows under ``pipectl-submission``."""
LANE_LABEL_PREFIX = "lanes.pipectl.io/"
"""``lanes.pipectl.io/<lane>: "true"`` on a namespace: its pods may use that preempting lane."""
ARGO_CONTROLLER_SA = "system:serviceaccount:argo:argo"
"""The Argo workflow controller's identity in Argo's own install manifests (namespace ``argo``)."""

ALLOWED_SPEC_FIELDS = ("workflowTemplateRef", "arguments", "entrypoint", "priority", "shutdown", "suspend", "workflowMetadata")
"""What a submission may set in a Workflow's spec: what ``pipectl submit``, the Argo UI's SUBMIT
(Argo's ApplySubmitOpts), its stop/suspend/retry and a CronWorkflow's run labels write
(``workflowMetadata``: labels and annotations, not ``labelsFrom`` expressions). Every other field is refused."""
MAX_VALUE_CHARS = 2048
PARAMETER_RULES_CONFIGMAP = "pipectl-parameter-rules"
"""The ConfigMap in each submitting namespace holding the rules of its templates' own parameters
(:func:`parameter_rules_data`), read by ``pipectl-submission`` as its param."""
RULES_MANAGER_PREFIX = "pipectl-parameters-"
"""Server-side apply field manager of one template's keys: ``pipectl-parameters-<template>``."""
_INT_RULE = f"p.value.matches({json.dumps('^(' + _INT_TEXT.pattern + ')$')}) && size(p.value) <= 18"
"""Integers: digits, no sign or leading zero; at most 18 digits (int() of longer text overflows,
a CEL error rather than a refusal)."""
_DECIMAL_RULE = f"p.value.matches({json.dumps('^' + _DECIMAL_TEXT.pattern + '$')}) && size(p.value) <= 40"
_OWN_NAME = r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$"
_INT_BOUND = 10**18


def _spec_fields() -> list[str]:
    """Every field of Argo's WorkflowSpec (the vendored schema of the CRD)."""
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "schemas" / "argoproj.io_v1alpha1_Workflow.json").read_text())
    return sorted(doc["schema"]["properties"]["spec"]["properties"])


def _cel(s: str) -> str:
    """A CEL string literal."""
    return json.dumps(s)


def _bounds(field: Any, conv: str) -> list[str]:
    """CEL comparisons of ``conv(p.value)`` with the field's bounds (its ge/gt/le/lt constraints)."""
    ops = {at.Ge: (">=", "ge"), at.Gt: (">", "gt"), at.Le: ("<=", "le"), at.Lt: ("<", "lt")}
    out = []
    for m in field.metadata:
        for kind, (op, attr) in ops.items():
            if isinstance(m, kind):
                bound = getattr(m, attr)
                out.append(f"{conv}(p.value) {op} {float(bound) if conv == 'double' else int(bound)!r}")
    return out


def parameter_rule(name: str, field: Any) -> str:
    """CEL over ``p`` (one argument) true when its value is one the contract accepts in its
    canonical spelling: integers ``0|[1-9][0-9]*`` within bounds, plain decimals within bounds,
    booleans ``true|false``, enum members, the model name's pattern."""
    kind = field.annotation
    if kind is bool:
        return "p.value in ['true', 'false']"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return f"p.value in {json.dumps([m.value for m in kind])}"
    if kind is int:
        return " && ".join([_INT_RULE, *_bounds(field, "int")])
    if kind is float:
        return " && ".join([_DECIMAL_RULE, *_bounds(field, "double")])
    if name == "model_name":
        return f"p.value.matches({_cel(_MODEL_NAME.pattern)})"
    return "true"


def _plain_text() -> str:
    """CEL over ``p``: no control character or line separator, no surrounding whitespace, no Argo
    tag, bounded length (what the contract requires of every value)."""
    seps = "".join(f"\\x{{{ord(c):x}}}" for c in _LINE_SEPARATORS)
    controls = _cel("[\\x00-\\x1f\\x7f" + seps + "]")
    return (f"!p.value.matches({controls}) && p.value == p.value.trim() "
            f"&& !p.value.contains('{{{{') && !p.value.contains('}}}}') && size(p.value) <= {MAX_VALUE_CHARS}")


def _re2_literal(text: str) -> str:
    """``text`` as an RE2 pattern matching exactly it (letters and digits as they are, ASCII
    punctuation escaped, anything else as ``\\x{hex}``)."""
    out = []
    for c in text:
        if c.isascii() and (c.isalnum() or c in "-_"):
            out.append(c)
        elif c.isascii() and 0x21 <= ord(c) <= 0x7e:
            out.append("\\" + c)
        else:
            out.append(f"\\x{{{ord(c):x}}}")
    return "".join(out)


def _bound_text(kind: str, bound: float) -> str:
    """A bound as the text CEL's ``int()``/``double()`` read. Integer bounds as the validate step
    holds them (``int()`` of the spec's), clamped to +-10^18: values have at most 18 digits, so
    that refuses and admits exactly the same values while never overflowing CEL's int."""
    if kind == "integer":
        return str(max(-_INT_BOUND, min(_INT_BOUND, int(bound))))
    return repr(float(bound))


def parameter_rules_data(template: str, specs: Any) -> dict[str, str]:
    """The keys of ``template``'s own parameters (``specs``: :class:`~pipectl.components.pipeline_parameters.ParameterSpec`)
    in :data:`PARAMETER_RULES_CONFIGMAP`: ``<template>.<parameter>.kind`` (integer, decimal, boolean,
    text, choice) and, as the kind has them, ``.ge``/``.gt``/``.le``/``.lt`` (numbers), ``.max_length``
    and ``.pattern`` (text; choices as a pattern of the choices). A pattern is the RE2 expression
    CEL's ``matches`` is given, anchored as ``^(?:...)$`` (the whole value, as the validate step
    reads it). Empty for no specs. ValueError for a key Kubernetes would refuse."""
    data: dict[str, str] = {}
    for spec in specs:
        key = f"{template}.{spec.name}."
        data[key + "kind"] = spec.kind
        if spec.kind in ("integer", "decimal"):
            for attr in ("ge", "gt", "le", "lt"):
                if (bound := getattr(spec, attr)) is not None:
                    data[key + attr] = _bound_text(spec.kind, bound)
        elif spec.kind == "text":
            data[key + "max_length"] = str(spec.max_length)
            if spec.pattern is not None:
                data[key + "pattern"] = f"^(?:{spec.pattern})$"
        elif spec.kind == "choice":
            data[key + "pattern"] = "^(?:" + "|".join(_re2_literal(c) for c in spec.choices) + ")$"
    for k in data:
        if len(k) > 253 or not re.fullmatch(r"[-._a-zA-Z0-9]+", k):
            raise ValueError(f"ConfigMap key {k!r}: template and parameter names make keys of at most 253 "
                             "characters of -._a-zA-Z0-9")
    return data


def parameter_rules_configmap(namespace: str, data: dict[str, str] | None = None, *, labels: bool = True) -> dict:
    """:data:`PARAMETER_RULES_CONFIGMAP` in ``namespace`` with ``data`` (no ``data`` field when None:
    what pipectl's namespace starts with, and what one template's server-side apply of no keys sends)."""
    meta: dict[str, Any] = {"name": PARAMETER_RULES_CONFIGMAP, "namespace": namespace}
    if labels:
        meta["labels"] = dict(PART_OF)
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **({"data": data} if data is not None else {})}


def rules_field_manager(template: str) -> str:
    """The server-side apply field manager owning ``template``'s keys (at most 128 characters)."""
    return (RULES_MANAGER_PREFIX + template)[:128]


def _rule_key(attr: str) -> str:
    return f"(variables.rulePrefix + p.name + {_cel('.' + attr)})"


def _own_rule() -> str:
    """CEL over ``p``: true when ``p`` is a parameter the referenced template declares in the
    namespace's :data:`PARAMETER_RULES_CONFIGMAP` and its value is one that rule accepts. Numbers as
    pipectl's own (one spelling, bounds); text without quotes or backslashes, within its length,
    matching its pattern; choices by their pattern."""
    def has(attr: str) -> str:
        return f"{_rule_key(attr)} in variables.rules"

    def get(attr: str) -> str:
        return f"variables.rules[{_rule_key(attr)}]"

    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}

    def bounds(conv: str) -> str:
        return " && ".join(f"(!({has(a)}) || {conv}(p.value) {op} {conv}({get(a)}))" for a, op in ops.items())

    unsafe = _cel(r"[\x27\x22\x5c]")  # RE2 escapes of ' " and backslash
    kinds = [
        ("integer", f"{_INT_RULE} && {bounds('int')}"),
        ("decimal", f"{_DECIMAL_RULE} && {bounds('double')}"),
        ("boolean", "p.value in ['true', 'false']"),
        ("choice", f"{has('pattern')} && p.value.matches({get('pattern')})"),
        ("text", f"!p.value.matches({unsafe}) && (!({has('max_length')}) || size(p.value) <= int({get('max_length')})) "
                 f"&& (!({has('pattern')}) || p.value.matches({get('pattern')}))"),
    ]
    chain = "false"
    for kind, rule in reversed(kinds):
        chain = f"{get('kind')} == {_cel(kind)} ? ({rule}) : {chain}"
    return f"{_own_declared()} && ({chain})"


def _own_declared() -> str:
    """CEL over ``p``: the referenced template declares ``p.name`` in the namespace's rules."""
    return f"p.name.matches({_cel(_OWN_NAME)}) && {_rule_key('kind')} in variables.rules"


def _value_rules() -> str:
    """CEL over ``p``: a chain choosing the rule of ``p.name``: pipectl's own parameters, else
    the referenced template's own (:func:`_own_rule`; undeclared names: false)."""
    chain = _own_rule()
    for name, field in reversed(TrainingParameters.model_fields.items()):
        chain = f"p.name == {_cel(kebab(name))} ? ({parameter_rule(name, field)}) : {chain}"
    return chain


CONTROLLER_STATUS_FIELDS = ("nodes", "storedWorkflowTemplateSpec", "storedTemplates", "compressedNodes",
                            "offloadNodeStatusVersion", "synchronization", "taskResultsCompletionStatus", "outputs",
                            "artifactRepositoryRef")
"""Workflow status fields the controller acts on. The Workflow CRD has no status subresource, so
whoever may update a Workflow may write its status too: a stored template spec of its own (the
controller runs ``status.storedWorkflowTemplateSpec``, not the template, once it is there), a
step's outputs (what later steps take as inputs: evaluate's decision and digest), a step marked
Succeeded that never ran, semaphore holders."""


def _kept(new: str, old: str, field: str) -> str:
    """CEL: ``field`` is present in both or neither, and equal."""
    return (f"(has({new}.{field}) == has({old}.{field})) && (!has({new}.{field}) || {new}.{field} == {old}.{field})")


def _status_validations() -> list[dict]:
    """What a submitter may write to a Workflow's status: nothing on create; on update, what Argo's
    retry, stop and resume write (argo-workflows workflow/util: createNewRetryWorkflow, resetNode,
    overrideParameters): nodes removed or reset to run again, their outputs kept; the stored spec's
    ``shutdown``, and its ``arguments`` only as the spec's (which the rules above hold)."""
    n, o = "object.status", "oldObject.status"
    skip_create = "request.operation != 'UPDATE' || request.kind.kind != 'Workflow' || "
    both = f"(has({n}) == has({o})) && (!has({n}) || ("
    kept = " && ".join(_kept(n, o, f) for f in ("storedTemplates", "compressedNodes", "offloadNodeStatusVersion",
                                                "synchronization", "outputs", "artifactRepositoryRef"))
    ns, os_ = f"{n}.storedWorkflowTemplateSpec", f"{o}.storedWorkflowTemplateSpec"
    stored = " && ".join(_kept(ns, os_, f) for f in _spec_fields() if f not in ("shutdown", "arguments"))
    stored_args = (f"(!has({ns}.arguments) || (has(object.spec.arguments) && {ns}.arguments == object.spec.arguments) "
                   f"|| (has({os_}.arguments) && {ns}.arguments == {os_}.arguments))")
    known = f"has({o}) && has({o}.nodes) && k in {o}.nodes"
    node, old_node = f"{n}.nodes[k]", f"{o}.nodes[k]"
    not_succeeded = f"(!has({node}.phase) || {node}.phase != 'Succeeded')"
    nodes = (f"!has({n}) || !has({n}.nodes) || {n}.nodes.all(k, ({known}) ? "
             f"((!has({node}.outputs) || (has({old_node}.outputs) && {node}.outputs == {old_node}.outputs)) "
             f"&& ({not_succeeded} || (has({old_node}.phase) && {old_node}.phase == 'Succeeded'))) "
             f": (!has({node}.outputs) && {not_succeeded}))")
    results = (f"!has({n}) || !has({n}.taskResultsCompletionStatus) || {n}.taskResultsCompletionStatus.all(k, "
               f"has({o}) && has({o}.taskResultsCompletionStatus) && k in {o}.taskResultsCompletionStatus "
               f"&& {n}.taskResultsCompletionStatus[k] == {o}.taskResultsCompletionStatus[k])")
    absent = " && ".join(f"!has({n}.{f})" for f in CONTROLLER_STATUS_FIELDS)
    return [
        {"expression": f"request.operation != 'CREATE' || request.kind.kind != 'Workflow' || !has({n}) || ({absent})",
         "message": "a submission may not carry a status (nodes, stored templates, outputs, ...): the controller writes it",
         "reason": "Forbidden"},
        {"expression": skip_create + both + kept + "))",
         "message": "status.storedTemplates, compressedNodes, synchronization, outputs and artifactRepositoryRef are "
                    "the controller's to write", "reason": "Forbidden"},
        {"expression": skip_create + f"(has({n}) && has({ns})) == (has({o}) && has({os_})) && "
                       f"(!(has({n}) && has({ns})) || ({stored} && {stored_args}))",
         "message": "status.storedWorkflowTemplateSpec is the controller's copy of the template: only its shutdown, "
                    "and its arguments as the spec's, may change", "reason": "Forbidden"},
        {"expression": skip_create + nodes,
         "message": "status.nodes: a step's outputs and a Succeeded phase are the controller's to write (a retry may "
                    "remove a step or set it to run again)", "reason": "Forbidden"},
        {"expression": skip_create + results,
         "message": "status.taskResultsCompletionStatus may only lose entries", "reason": "Forbidden"},
    ]


def submission_policy(namespace_label: str = SUBMISSION_LABEL, exempt_users: tuple[str, ...] = (ARGO_CONTROLLER_SA,)) -> list[dict]:
    """``pipectl-submission`` and its binding (see the module doc). A pipeline's template is
    ``<name>-v<N>`` and starts at its DAG ``<name>`` (:func:`~pipectl.pipelines.training.workflow_template`):
    the only ``entrypoint`` a submission may name (the Argo UI always sends one)."""
    denied = [f for f in _spec_fields() if f not in ALLOWED_SPEC_FIELDS]
    spec = "variables.spec"
    declared = json.dumps([kebab(n) for n in TrainingParameters.model_fields])
    lanes = json.dumps({lane.value: s.argo_priority for lane, s in LANES.items()})
    validations = [
        {"expression": f"has({spec}.workflowTemplateRef) && has({spec}.workflowTemplateRef.name) "
                       f"&& !(has({spec}.workflowTemplateRef.clusterScope) && {spec}.workflowTemplateRef.clusterScope)",
         "message": "a submission must reference a WorkflowTemplate of its namespace (spec.workflowTemplateRef.name)",
         "reason": "Forbidden"},
        {"expression": " && ".join(f"!has({spec}.{f})" for f in denied),
         "messageExpression": "'spec fields a submission may not set: ' + ["
                              + ", ".join(f"has({spec}.{f}) ? {_cel(f)} : ''" for f in denied)
                              + "].filter(f, f != '').join(', ') + ' (allowed: " + ", ".join(ALLOWED_SPEC_FIELDS) + ")'",
         "reason": "Forbidden"},
        {"expression": f"!has({spec}.entrypoint) || ({spec}.workflowTemplateRef.name.startsWith({spec}.entrypoint + '-v') "
                       f"&& {spec}.workflowTemplateRef.name.substring(size({spec}.entrypoint) + 2).matches('^[0-9]+$'))",
         "messageExpression": f"'entrypoint ' + {spec}.entrypoint + ' is not the template\\'s (a pipeline <name>-v<N> "
                              "starts at <name>): leave it out'",
         "reason": "Forbidden"},
        {"expression": f"!has({spec}.workflowMetadata) || !has({spec}.workflowMetadata.labelsFrom)",
         "message": "workflowMetadata.labelsFrom (expressions) may not be set: plain labels only", "reason": "Forbidden"},
        {"expression": f"!has({spec}.arguments) || !has({spec}.arguments.artifacts) || size({spec}.arguments.artifacts) == 0",
         "message": "a submission may not pass artifacts", "reason": "Forbidden"},
        {"expression": "variables.params.all(p, !has(p.valueFrom) && !has(p.globalName) && !has(p.enum) && !has(p.description))",
         "message": "an argument is a name and a value only (no valueFrom, globalName, enum or description)",
         "reason": "Forbidden"},
        {"expression": f"variables.params.all(p, p.name in {declared} || ({_own_declared()}))",
         "messageExpression": f"'undeclared arguments: ' + variables.params.filter(p, !(p.name in {declared} || ({_own_declared()})))"
                              ".map(p, p.name).join(', ') + ' (not pipectl\\'s, nor declared by template ' + variables.template "
                              f"+ ' in ConfigMap {PARAMETER_RULES_CONFIGMAP}: pipectl templates apply writes them)'",
         "reason": "Invalid"},
        {"expression": "size(variables.refused) == 0",
         "messageExpression": "'arguments refused: ' + variables.refused.join(', ') + ' (integers as digits with no sign or "
                              "leading zero, decimals as digits with an optional fraction, booleans as true or false, "
                              "within the bounds pipectl submit --help lists; text without quotes or backslashes, "
                              "as its pattern and length allow; no control characters, surrounding whitespace or {{ }})'",
         "reason": "Invalid"},
        {"expression": f"!(variables.labels.exists(k, k == {_cel(MODEL_PREFIX_LABEL)})) "
                       f"|| variables.modelName.startsWith(variables.labels[{_cel(MODEL_PREFIX_LABEL)}] + '-')",
         "messageExpression": f"'model-name ' + variables.modelName + ' is not this namespace\\'s: its models are named ' "
                              f"+ variables.labels[{_cel(MODEL_PREFIX_LABEL)}] + '-<name> (namespace label {MODEL_PREFIX_LABEL})'",
         "reason": "Forbidden"},
        {"expression": f"!(variables.annotations.exists(k, k == {_cel(DATA_PREFIX_ANNOTATION)})) "
                       f"|| variables.datasetUri.startsWith(variables.annotations[{_cel(DATA_PREFIX_ANNOTATION)}])",
         "messageExpression": f"'dataset-uri ' + variables.datasetUri + ' is not under this namespace\\'s data prefix ' "
                              f"+ variables.annotations[{_cel(DATA_PREFIX_ANNOTATION)}] + ' (namespace annotation {DATA_PREFIX_ANNOTATION})'",
         "reason": "Forbidden"},
        {"expression": f"!has({spec}.priority) || (variables.lane in {lanes} && {spec}.priority == {lanes}[variables.lane])",
         "messageExpression": f"'spec.priority must be the lane\\'s (' + variables.lane + ')'",
         "reason": "Forbidden"},
    ] + _status_validations()
    params = f"has({spec}.arguments) && has({spec}.arguments.parameters) ? {spec}.arguments.parameters : []"
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "pipectl-submission", "labels": dict(PART_OF)},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["argoproj.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                "resources": ["workflows", "cronworkflows"]}]},
            "matchConditions": [
                {"name": "not-break-glass", "expression": "!('system:masters' in request.userInfo.groups)"},
                {"name": "not-the-controller", "expression": f"!(request.userInfo.username in {json.dumps(list(exempt_users))})"},
                # status too: the CRD has no status subresource (CONTROLLER_STATUS_FIELDS)
                {"name": "spec-or-status-written", "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec "
                 "|| has(object.status) != has(oldObject.status) || (has(object.status) && object.status != oldObject.status)"},
            ],
            "variables": [
                {"name": "spec", "expression": "request.kind.kind == 'CronWorkflow' ? object.spec.workflowSpec : object.spec"},
                {"name": "params", "expression": params},
                {"name": "template", "expression": f"has({spec}.workflowTemplateRef) && has({spec}.workflowTemplateRef.name) "
                                                   f"? {spec}.workflowTemplateRef.name : ''"},
                {"name": "rulePrefix", "expression": "variables.template + '.'"},
                {"name": "rules", "expression": "params != null && has(params.data) ? params.data : {}"},
                {"name": "refused", "expression": "variables.params.filter(p, has(p.value) && !((" + _plain_text() + ") && ("
                                                  + _value_rules() + "))).map(p, p.name)"},
                {"name": "lane", "expression": "variables.params.exists(p, p.name == 'lane' && has(p.value)) ? "
                                               "variables.params.filter(p, p.name == 'lane' && has(p.value))[0].value : "
                                               f"{_cel(TrainingParameters.model_fields['lane'].default.value)}"},
                {"name": "modelName", "expression": "variables.params.exists(p, p.name == 'model-name' && has(p.value)) ? "
                                                    "variables.params.filter(p, p.name == 'model-name' && has(p.value))[0].value : ''"},
                {"name": "datasetUri", "expression": "variables.params.exists(p, p.name == 'dataset-uri' && has(p.value)) ? "
                                                     "variables.params.filter(p, p.name == 'dataset-uri' && has(p.value))[0].value : ''"},
                {"name": "labels", "expression": "has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : {}"},
                {"name": "annotations", "expression": "has(namespaceObject.metadata.annotations) "
                                                      "? namespaceObject.metadata.annotations : {}"},
            ],
            "validations": validations,
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "pipectl-submission", "labels": dict(PART_OF)},
        "spec": {"policyName": "pipectl-submission", "validationActions": ["Deny"],
                 # no namespace: the ConfigMap of the submitted object's own namespace
                 "paramRef": {"name": PARAMETER_RULES_CONFIGMAP, "parameterNotFoundAction": "Deny"},
                 "matchResources": {"namespaceSelector": {"matchLabels": {namespace_label: "enforce"}}}},
    }
    return [policy, binding]


def lanes_policy() -> list[dict]:
    """``pipectl-lanes`` and its binding (see the module doc): the preempting lanes' PriorityClass
    and Volcano queue only in namespaces labelled ``lanes.pipectl.io/<lane>: "true"``."""
    bound = {s.lane.value: (s.priority_class, s.queue) for s in LANES.values() if s.preemption_policy == "PreemptLowerPriority"}
    classes = json.dumps({pc: lane for lane, (pc, _) in bound.items()})
    queues = json.dumps({q: lane for lane, (_, q) in bound.items()})
    # a team's queue of a preempting lane (pipectl-team-<team>-<lane>) is that lane's too
    team_lane = "''"
    for lane in bound:
        team_lane = (f"(variables.queue.startsWith({_cel(TEAM_QUEUE_PREFIX)}) && variables.queue.endsWith({_cel('-' + lane)}) "
                     f"? {_cel(lane)} : {team_lane})")
    variables = [
        {"name": "priorityClass", "expression": "request.resource.resource == 'pods' && has(object.spec.priorityClassName) "
                                                "? object.spec.priorityClassName : ''"},
        {"name": "queue", "expression": "request.resource.resource == 'pods' ? "
                                        "(has(object.metadata.annotations) && 'scheduling.volcano.sh/queue-name' in object.metadata.annotations "
                                        "? object.metadata.annotations['scheduling.volcano.sh/queue-name'] : '') "
                                        ": (has(object.spec.queue) ? object.spec.queue : '')"},
        {"name": "lane", "expression": f"variables.priorityClass in {classes} ? {classes}[variables.priorityClass] : "
                                       f"(variables.queue in {queues} ? {queues}[variables.queue] : {team_lane})"},
        {"name": "labels", "expression": "has(namespaceObject.metadata.labels) ? namespaceObject.metadata.labels : {}"},
        {"name": "team", "expression": f"{_cel(TEAM_LABEL)} in variables.labels ? variables.labels[{_cel(TEAM_LABEL)}] : ''"},
        {"name": "teamQueues", "expression": f"{json.dumps(list(LANE_NAMES))}.map(l, {_cel(TEAM_QUEUE_PREFIX)} + variables.team + '-' + l)"},
    ]
    # a team's namespace: its own queues only (a Job or PodGroup with no queue is Volcano's
    # "default" by the time this runs); any other namespace: no team's queue
    own_queues = {
        "expression": f"variables.queue == '' && request.resource.resource == 'pods' || (variables.team != '' "
                      f"? variables.queue in variables.teamQueues : !variables.queue.startsWith({_cel(TEAM_QUEUE_PREFIX)}))",
        "messageExpression": "variables.team != '' ? 'namespace ' + namespaceObject.metadata.name + ' belongs to team ' "
                             "+ variables.team + ': its gangs use the team queues (' + variables.teamQueues.join(', ') + ') only, not ' "
                             "+ (variables.queue == '' ? 'no queue' : variables.queue) : 'queue ' + variables.queue "
                             "+ ' is a team share: namespace ' + namespaceObject.metadata.name + ' belongs to no team'",
        "reason": "Forbidden"}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "pipectl-lanes", "labels": dict(PART_OF)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                {"apiGroups": ["batch.volcano.sh"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]},
                {"apiGroups": ["scheduling.volcano.sh"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["podgroups"]}]},
            "variables": variables,
            "validations": [{
                "expression": f"variables.lane == '' || ({_cel(LANE_LABEL_PREFIX)} + variables.lane in variables.labels "
                              f"&& variables.labels[{_cel(LANE_LABEL_PREFIX)} + variables.lane] == 'true')",
                "messageExpression": "'the ' + variables.lane + ' lane (it preempts other work) is not granted to namespace ' "
                                     f"+ namespaceObject.metadata.name + ': a cluster admin labels the namespace {LANE_LABEL_PREFIX}' "
                                     "+ variables.lane + '=true'",
                "reason": "Forbidden"}, own_queues],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "pipectl-lanes", "labels": dict(PART_OF)},
        "spec": {"policyName": "pipectl-lanes", "validationActions": ["Deny"]},
    }
    return [policy, binding]


ADMIN_GROUP = "system:masters"
"""Kubernetes' break-glass group: a platform admin whatever the site file says."""
ADMIN_LABELS = (TEAM_LABEL, MODEL_PREFIX_LABEL, SUBMISSION_LABEL)
"""Namespace labels only a platform admin may set, change or remove (with every ``LANE_LABEL_PREFIX``
label and the ``DATA_PREFIX_ANNOTATION`` annotation): what grants a namespace a team's queues or a
preempting lane, and what holds its runs to the submission policy and the team's prefixes."""
POD_SECURITY_PREFIX = "pod-security.kubernetes.io/"
"""Pod Security admission's namespace labels: on a namespace carrying ``SUBMISSION_LABEL`` or
``TEAM_LABEL``, a platform admin's too (its pods stay under the restricted standard)."""


def namespaces_policy(admin_groups: tuple[str, ...] = (), admin_users: tuple[str, ...] = ()) -> list[dict]:
    """``pipectl-namespaces`` and its binding: a Namespace's pipectl labels (:data:`ADMIN_LABELS`,
    ``lanes.pipectl.io/<lane>``) and its ``pipectl.io/data-prefix`` annotation may be set (on
    creation), changed or removed only by a platform admin: ``system:masters`` or one of
    ``admin_groups``/``admin_users`` (the site's ``admin_groups``, ``admin_users``); on a namespace
    carrying the submission-policy or team label, its Pod Security labels too. Without it,
    anyone allowed to create or label a Namespace could label one ``pipectl.io/team=<another team>``
    and use that team's queues, or grant it the urgent lane. Other labels, and writes that leave
    these keys as they were (the namespace controller finalising a deletion), are not checked."""
    labels = json.dumps(list(ADMIN_LABELS))
    # on a namespace pipectl's policies hold (pipectl's own, a team's), its Pod Security labels too
    guarded = (f"(k in {labels} || k.startsWith({_cel(LANE_LABEL_PREFIX)}) "
               f"|| (variables.held && k.startsWith({_cel(POD_SECURITY_PREFIX)})))")
    annotation = _cel(DATA_PREFIX_ANNOTATION)
    variables = [
        {"name": "labels", "expression": "has(object.metadata.labels) ? object.metadata.labels : {}"},
        {"name": "oldLabels", "expression": "oldObject != null && has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"},
        {"name": "annotations", "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}"},
        {"name": "oldAnnotations", "expression": "oldObject != null && has(oldObject.metadata.annotations) "
                                                 "? oldObject.metadata.annotations : {}"},
        {"name": "held", "expression": f"[{_cel(SUBMISSION_LABEL)}, {_cel(TEAM_LABEL)}].exists(k, k in variables.labels "
                                       "|| k in variables.oldLabels)"},
        # each guarded key set, changed or removed by this write
        {"name": "changed", "expression":
            f"variables.labels.filter(k, {guarded} && !(k in variables.oldLabels && variables.oldLabels[k] == variables.labels[k])) "
            f"+ variables.oldLabels.filter(k, {guarded} && !(k in variables.labels)) "
            f"+ (({annotation} in variables.annotations) != ({annotation} in variables.oldAnnotations) "
            f"|| ({annotation} in variables.annotations && variables.annotations[{annotation}] != variables.oldAnnotations[{annotation}]) "
            f"? [{annotation}] : [])"},
    ]
    admins = [ADMIN_GROUP, *admin_groups]
    who = f"group {', '.join(admins)}" + (f" or user {', '.join(admin_users)}" if admin_users else "")
    match = [{"name": "not-a-platform-admin",
              "expression": f"!request.userInfo.groups.exists(g, g in {json.dumps(admins)})"
                            + (f" && !(request.userInfo.username in {json.dumps(list(admin_users))})" if admin_users else "")}]
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "pipectl-namespaces", "labels": dict(PART_OF)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["namespaces"]}]},
            "matchConditions": match,
            "variables": variables,
            "validations": [{
                "expression": "size(variables.changed) == 0",
                "messageExpression": "'namespace ' + object.metadata.name + ': only a platform admin (' + " + _cel(who) + " + ') may "
                                     "set, change or remove ' + variables.changed.join(', ') + ' on a Namespace; ask one to, or "
                                     "add your group to the site file\\'s admin_groups and apply the rendered argo/cluster'",
                "reason": "Forbidden"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "pipectl-namespaces", "labels": dict(PART_OF)},
        "spec": {"policyName": "pipectl-namespaces", "validationActions": ["Deny"]},
    }
    return [policy, binding]


def preempting_lane_labels() -> dict[str, str]:
    """The namespace labels granting every preempting lane (what pipectl's own namespace gets)."""
    return {LANE_LABEL_PREFIX + s.lane.value: "true" for s in LANES.values() if s.preemption_policy == "PreemptLowerPriority"}


SUBMITTER_ROLE = "pipectl-submitter"


def submitter_role(namespace: str) -> dict:
    """``pipectl-submitter``: submit, watch, stop and retry runs, read their logs, and read the
    templates, cron schedules and quotas; no WorkflowTemplates, pods, jobs, secrets or config of its own.
    An admin binds it to a team's group (``kubectl create rolebinding ... --group``)."""
    rules = [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"],
         "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"]},
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtemplates", "cronworkflows", "workflowtaskresults"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods", "events"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
        # submit checks a gang against the namespace's quotas before it sends anything
        {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "list"]},
    ]
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": SUBMITTER_ROLE, "namespace": namespace, "labels": dict(PART_OF)}, "rules": rules}


def admission_policies(admin_groups: tuple[str, ...] = (), admin_users: tuple[str, ...] = ()) -> list[dict]:
    """The three policies and their bindings (cluster-scoped: ``argo/cluster/``); ``admin_groups``,
    ``admin_users``: the platform admins besides ``system:masters`` (:func:`namespaces_policy`)."""
    return [*submission_policy(), *lanes_policy(), *namespaces_policy(admin_groups, admin_users)]


_GPU_KEYS = ("requests.nvidia.com/gpu", "nvidia.com/gpu")


def quota_refusal(quotas: list[dict], lane: str, workers: int, gpus_per_worker: int) -> str | None:
    """Why the namespace's ResourceQuotas (``quotas``, as the API server lists them) can never admit
    a training gang of ``workers`` pods with ``gpus_per_worker`` GPUs each in ``lane``: its pods
    would never be created and the run would wait out its timeout. None when they can (what is in
    use frees up; only the hard limits are judged). Quotas with scopes other than the lanes'
    PriorityClass are not judged."""
    from pipectl.components.names import lane_object_name

    priority_class = lane_object_name(lane)
    for q in quotas:
        spec = q.get("spec") or {}
        exprs = (spec.get("scopeSelector") or {}).get("matchExpressions") or []
        if spec.get("scopes") or any(e.get("scopeName") != "PriorityClass" or e.get("operator") not in ("In", "NotIn")
                                     for e in exprs):
            continue
        if not all((priority_class in e.get("values", [])) == (e["operator"] == "In") for e in exprs):
            continue  # a quota of other lanes
        hard = spec.get("hard") or {}
        needs = [(k, workers * gpus_per_worker, "GPUs") for k in _GPU_KEYS] + [("pods", workers, "pods")]
        for key, need, what in needs:
            allowed = _int_quantity(hard.get(key))
            if allowed is not None and need > allowed:
                scope = f" for lane {lane}" if exprs else ""
                setting = (q["metadata"].get("annotations") or {}).get(QUOTA_SETTING_ANNOTATION)
                return (f"the training gang needs {need} {what} at once ({workers} workers x {gpus_per_worker} GPUs); "
                        f"ResourceQuota {q['metadata']['name']} of namespace {q['metadata'].get('namespace', '')} "
                        f"allows {allowed}{scope}" + (f" (site setting {setting})" if setting else "")
                        + ": its pods would never be created")
    return None


def _int_quantity(value: Any) -> int | None:
    """A count as a quota writes it (``64``, ``1k``); None when absent or not a plain count."""
    if value is None:
        return None
    text = str(value)
    scale = {"k": 1000, "M": 1000**2, "G": 1000**3}.get(text[-1:], 1)
    try:
        return int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        return None
