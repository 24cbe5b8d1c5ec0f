"""Argo's substitution, as far as pipectl's compiled workflows use it: ``{{name}}`` tags,
``{{=expr}}`` expressions (arithmetic, comparisons, typed conversions to JSON, a random name suffix), a task's ``when`` (``A == B`` / ``A != B``), and Kubernetes'
``$(VAR)`` expansion in commands.

Pure. Used by ``pipectl lint`` (gang manifests rendered with every lane) and by the local backend
(:mod:`pipectl.pipelines.backends.runner`). The cluster uses Argo's own code; tests/unit compares
the two (tests/tools/argoexpr: Argo's ``template.Replace``).
"""

from __future__ import annotations

import ast
import base64
import json
import re
import secrets
import string
from typing import Any, Callable

_TAG = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class TemplateError(ValueError):
    """A tag that cannot be resolved, or an expression or condition beyond what is evaluated here."""


def _name(node: ast.AST) -> str | None:
    """The dotted name of ``a.b['c-d']`` (``a.b.c-d``), None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _name(node.value)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        base = _name(node.value)
        return None if base is None else f"{base}.{node.slice.value}"
    return None


def _atoi(v: Any) -> int:
    """Go's ``strconv.Atoi`` as sprig's ``atoi`` uses it: 0 for text it cannot read, a number past
    a 64-bit integer as the nearest one (Go returns it with the error sprig drops)."""
    text = str(v)
    return max(-(2**63), min(2**63 - 1, int(text))) if re.fullmatch(r"[+-]?[0-9]+", text) else 0


def _float64(v: Any) -> float:
    """sprig's ``float64`` (Go's ``strconv.ParseFloat``): 0 for text it cannot read."""
    try:
        return float(v) if "_" not in str(v) else 0.0
    except ValueError:
        return 0.0


def _go_pattern(pattern: str) -> str:
    """A Go (RE2) pattern as Python's ``re`` reads it the same: ``$`` outside a class is the end of
    the text in Go, where Python's also matches before a last newline (``standard\\n`` would pass
    ``^(standard)$``)."""
    out, in_class, i = [], False, 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        in_class = (in_class and c != "]") or (not in_class and c == "[")
        out.append("\\Z" if c == "$" and not in_class else c)
        i += 1
    return "".join(out)


def _from_json(v: Any) -> Any:
    try:
        return json.loads(v)
    except (TypeError, ValueError):
        return None


_SPRIG: dict[str, Callable[..., Any]] = {
    "randAlphaNum": lambda n: "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(n)),
    "lower": lambda s: s.lower(),
    "atoi": _atoi,
    "float64": _float64,
    "regexMatch": lambda pattern, s: re.search(_go_pattern(pattern), s) is not None,
    "ternary": lambda vt, vf, cond: vt if cond else vf,
    "fromJson": _from_json,
    "compact": lambda items: [v for v in items if v not in ("", None, 0, False, [], {})],
    "join": lambda sep, items: sep.join(str(v) for v in items),
    "default": lambda d, given: given if given not in ("", None, 0, False, [], {}) else d,
    "replace": lambda old, new, s: s.replace(old, new),
    "b64dec": lambda s: base64.b64decode(s).decode(),
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "asInt": int,
    "asFloat": float,
    "len": len,
    "toJson": lambda v: json.dumps(v, separators=(",", ":")),
}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
_ARITHMETIC = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a / b}


def _eval_expression(expr: str, values: dict[str, str], where: str) -> str:
    """Evaluate an Argo ``{{=...}}`` expression tag over ``values``: number and string literals,
    names (``inputs.parameters['x']``), arithmetic and string ``+``, comparisons, ``and``/``or``,
    ``asInt``/``asFloat``/``toJson`` and the sprig functions pipectl's templates use (:data:`_SPRIG`,
    as Go reads text). Anything else is an error here (the local backend does not embed expr-lang)."""

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
            return node.value
        if (name := _name(node)) is not None:
            if name not in values:
                raise TemplateError(f"{where}: cannot resolve {name} in expression {expr!r}")
            return values[name]
        if isinstance(node, ast.Call) and not node.keywords:
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "sprig":
                fn = _SPRIG.get(func.attr)
            else:
                fn = _FUNCTIONS.get(func.id) if isinstance(func, ast.Name) else None
            if fn is not None:
                return fn(*(ev(a) for a in node.args))
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            a, b = ev(node.left), ev(node.right)
            if isinstance(a, str) != isinstance(b, str) or (isinstance(a, str) and not isinstance(node.op, ast.Add)):
                raise TemplateError(f"{where}: expression {expr!r}: arithmetic on a string")
            return _ARITHMETIC[type(node.op)](a, b)
        if isinstance(node, ast.List):
            return [ev(v) for v in node.elts]
        if isinstance(node, ast.BoolOp):
            results = (ev(v) for v in node.values)
            return all(results) if isinstance(node.op, ast.And) else any(results)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            return _COMPARE[type(node.ops[0])](ev(node.left), ev(node.comparators[0]))
        raise TemplateError(f"{where}: expression {expr!r} is beyond what the local backend evaluates")

    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise TemplateError(f"{where}: bad expression {expr!r}: {e}") from e
    try:
        result = ev(tree)
    except (TypeError, ValueError, re.error) as e:
        raise TemplateError(f"{where}: expression {expr!r}: {e}") from e
    if result is None:
        raise TemplateError(f"{where}: expression {expr!r} has no value")
    if isinstance(result, bool):
        return "true" if result else "false"
    if isinstance(result, str):
        return result
    return str(int(result)) if float(result).is_integer() else str(result)


def substitute(text: str, values: dict[str, str], *, where: str) -> str:
    """Replace Argo ``{{name}}`` tags from ``values`` and evaluate ``{{=expr}}`` tags.

    An unknown tag raises TemplateError.
    """

    def repl(m: re.Match[str]) -> str:
        key = m.group(1)
        if key.startswith("="):
            return _eval_expression(key[1:], values, where)
        if key not in values:
            raise TemplateError(f"{where}: cannot resolve {{{{{key}}}}}")
        return values[key]

    return _TAG.sub(repl, text)


def resolve_known(text: str, values: dict[str, str]) -> str:
    """Argo's first pass over a template (workflow/common/util.go ``SubstituteParams``, v4.0.5:
    globals first, "because globals could be referenced in the inputs"): the tags ``values`` holds
    are replaced, every other tag is left for the later pass. What a template's own input value or
    default (the train step's ``gang-affinity``: the run's name) goes through before use."""
    return _TAG.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def expand_k8s_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command/args: defined vars expand, others stay as is."""
    return _K8S_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), text.replace("$$(", "\0")).replace("\0", "$(")


def evaluate_when(expr: str, task: str) -> bool:
    """A task's ``when`` after substitution: ``A == B`` or ``A != B`` (strings, optionally quoted),
    as Argo evaluates them (govaluate; Argo docs, "Conditionals"). Anything richer raises
    TemplateError naming the task: the local backend does not guess."""
    import re

    m = re.fullmatch(r"\s*(.+?)\s*(==|!=)\s*(.+?)\s*", expr)
    if not m:
        raise TemplateError(f"task {task!r}: when {expr!r} is not supported locally (only A == B, A != B)")
    a, op, b = (x.strip("'\"") for x in m.groups())
    return (a == b) if op == "==" else (a != b)
