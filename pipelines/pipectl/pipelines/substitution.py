"""Argo's substitution, as far as pipectl's compiled workflows use it: ``{{name}}`` tags,
``{{=expr}}`` integer arithmetic and a random name suffix, a task's ``when`` (``A == B`` / ``A != B``), and Kubernetes'
``$(VAR)`` expansion in commands.

Pure. Used by ``pipectl lint`` (gang manifests rendered with every lane) and by the local backend
(:mod:`pipectl.pipelines.backends.runner`). The cluster uses Argo's own code; tests/unit compares
the two (tests/tools/argoexpr: Argo's ``template.Replace``).
"""

from __future__ import annotations

import re

_TAG = re.compile(r"\{\{\s*([^{}]+?)\s*\}\}")
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class TemplateError(ValueError):
    """A tag that cannot be resolved, or an expression or condition beyond what is evaluated here."""


def _eval_expression(expr: str, values: dict[str, str], where: str) -> str:
    """Evaluate an Argo ``{{=...}}`` expression tag: integer arithmetic (+ - * //, /) over
    ``asInt(name)``/``asFloat(name)`` and number literals, and ``sprig.randAlphaNum(n)`` /
    ``sprig.lower(...)`` (the gang job's per-attempt suffix). Anything else is an error here
    (the local backend does not embed expr-lang)."""
    import ast
    import secrets
    import string

    def ev(node: ast.AST) -> float | int | str:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "sprig" and len(node.args) == 1):
            arg = ev(node.args[0])
            if node.func.attr == "randAlphaNum" and isinstance(arg, int):
                return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(arg))
            if node.func.attr == "lower" and isinstance(arg, str):
                return arg.lower()
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Div)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(a, str) or isinstance(b, str):
                raise TemplateError(f"{where}: expression {expr!r}: arithmetic on a string")
            return {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                    ast.FloorDiv: lambda: a // b, ast.Div: lambda: a / b}[type(node.op)]()
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("asInt", "asFloat")
                and len(node.args) == 1):
            name = ast.unparse(node.args[0])
            if name not in values:
                raise TemplateError(f"{where}: cannot resolve {name} in expression {expr!r}")
            return int(values[name]) if node.func.id == "asInt" else float(values[name])
        raise TemplateError(f"{where}: expression {expr!r} is beyond what the local backend evaluates")

    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as e:
        raise TemplateError(f"{where}: bad expression {expr!r}: {e}") from e
    result = ev(tree)
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
