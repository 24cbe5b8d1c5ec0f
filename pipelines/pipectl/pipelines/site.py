"""A site file: the settings of one install in one place, from which ``argo/`` is rendered.

Every key is a field of :class:`~pipectl.pipelines.training.CompileConfig` (the object store's
and MLflow's endpoints, the namespace, the image registry, quotas, the retry policy and its
``scale_up_s``, Karpenter's node pools and the urgent buffer, the gang's network settings:
:mod:`~pipectl.pipelines.fabric`). A key left out keeps its default;
an unknown key or a bad value is refused with the file and the key named. ``pipectl site init``
writes every key with its default and description; ``pipectl --site FILE render cluster --write
argo`` renders the install from it (or ``PIPECTL_SITE=FILE``).

Example::

    # site.yaml
    namespace: ml-vision
    s3_endpoint: https://s3.example.com
    mlflow_uri: https://mlflow.example.com
    registry: registry.example.com/ml
    namespace_max_gpus: 128
    retry:
      scale_up_s: 900
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pipectl.components.errors import ValidationFailed

SITE_ENV = "PIPECTL_SITE"
"""Environment variable naming the site file (the CLI's ``--site`` wins)."""
_INTERNAL = {"pipeline_parameters"}
_CASE_ID = re.compile(r"\s*\(C\d\d\)")


def load_site(path: Path) -> dict[str, Any]:
    """The mapping in the site file ``path`` (empty file: ``{}``); exit 2 naming what is wrong."""
    return _load_site(path)[0]


def _key_lines(text: str) -> dict[str, int]:
    """Line (1-based) of each top-level key of a site file's text (``{}`` when it has none)."""
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}


def _load_site(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """:func:`load_site` and the line of each top-level key (:func:`_key_lines`)."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValidationFailed(f"site file {path} cannot be read: {e.strerror or e}",
                               "give an existing file: pipectl site init site.yaml writes one") from e
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValidationFailed(f"site file {path}{where} is not valid YAML: {getattr(e, 'problem', None) or e}",
                               "fix the YAML (indentation, a ':' after each key)") from e
    if doc is None:
        return {}, {}
    if not isinstance(doc, dict):
        raise ValidationFailed(f"site file {path} holds a {type(doc).__name__}, not a mapping of settings",
                               "write one `key: value` a line, e.g. namespace: ml-vision (pipectl site init lists every key)")
    return doc, _key_lines(text)


def site_config(path: Path | None, **given: Any) -> Any:
    """The :class:`CompileConfig` of the site file ``path`` (None: none) with ``given`` on top
    (a command's options; ``images`` entries are added to the file's). Exit 2 naming the file or
    the option and the key of a bad value."""
    from pydantic import ValidationError

    from pipectl.pipelines.training import CompileConfig

    site, lines = _load_site(path) if path is not None else ({}, {})
    internal = sorted(_INTERNAL & set(site))
    if internal:
        raise ValidationFailed(f"site file {path}: {', '.join(internal)} is not a site setting",
                               "a pipeline's own parameters come from its parameters class, not the site file")
    merged = {**site, **given}
    if isinstance(site.get("images"), dict) and "images" in given:
        merged["images"] = {**site["images"], **given["images"]}
    try:
        return CompileConfig.model_validate(merged)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            msg, top = err["msg"], str(err["loc"][0]) if err["loc"] else ""
            if not top:  # a rule across settings: its message starts with the key it is about (``team: ...``)
                msg = msg.removeprefix("Value error, ")
                top = next((k for k in merged if msg.startswith(f"{k}: ")), "")
                what = msg
            else:
                got = err.get("input")
                shown = f" (got {got!r})" if isinstance(got, (str, int, float, bool)) else ""
                what = f"{'.'.join(str(x) for x in err['loc'])}: {msg}{shown}"
            # an option that repeats the file's value (the site's namespace, passed on as -n) is the file's
            if top in given and not (top in site and site[top] == given[top]):
                source = "option"
            else:
                source = f"site file {path}" + (f", line {lines[top]}" if top in lines else "")
            problems.append(f"{source}: {what}")
        raise ValidationFailed("; ".join(problems), "pipectl site init writes every key with its default and description") from e


def site_template() -> str:
    """Every site setting with its default, each under its description: what ``pipectl site init`` writes."""
    import yaml

    from pipectl.pipelines.training import CompileConfig

    values = CompileConfig().model_dump(mode="json", exclude=_INTERNAL)
    lines = ["# pipectl site file: every setting with its default. Keep the ones you change; a setting left out takes its default.",
             "# Render the install from it: pipectl --site THIS_FILE render cluster --write argo", ""]
    for name, field in CompileConfig.model_fields.items():
        if name in _INTERNAL:
            continue
        for part in _wrap(_CASE_ID.sub("", field.description or "")):
            lines.append(f"# {part}")
        lines.append(yaml.safe_dump({name: values[name]}, sort_keys=False, default_flow_style=False).rstrip())
        lines.append("")
    return "\n".join(lines)


def _wrap(text: str, width: int = 98) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width) if text else []
