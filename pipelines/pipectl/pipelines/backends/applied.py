"""Server-side apply as ``pipectl``: which keys of an applied object's spec another applier left.

pipectl's objects (WorkflowTemplates, CronWorkflows) are applied by ``pipectl templates apply`` /
``cron apply`` and also by ``kubectl apply --server-side -k argo/namespace`` (field manager
``kubectl``). Server-side apply removes only the fields the applying manager set before, so a key
a former rendering had, applied by another manager, would outlive the rendering that dropped it.
:func:`left_over` names those keys: in the live spec, not in the rendered one, and owned by
another manager's apply. Keys set by an update (``pipectl cron suspend``, an edit in a UI) are not
left-overs, and neither is metadata (labels and annotations other tools add): they stay.
"""

from __future__ import annotations

from typing import Any, Iterator

FIELD_MANAGER = "pipectl"
"""The field manager of everything pipectl applies."""
APPLY_PATCH = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"


def left_over(live: dict[str, Any], rendered: dict[str, Any]) -> list[tuple[str, ...]]:
    """Paths (``("spec", key, ...)``) of the keys ``live`` has and ``rendered`` lacks that another
    manager's apply owns (its ``managedFields``); mappings both have are compared key by key."""
    others = [m.get("fieldsV1") or {} for m in (live.get("metadata") or {}).get("managedFields") or []
              if m.get("operation") == "Apply" and m.get("manager") != FIELD_MANAGER]
    return [path for path in _extra(live.get("spec") or {}, rendered.get("spec") or {}, ("spec",))
            if any(_owns(fields, path) for fields in others)]


def removal_patch(resource_version: str, paths: list[tuple[str, ...]]) -> list[dict[str, Any]]:
    """A JSON patch removing ``paths``, valid only on the object at ``resource_version``."""
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
            *({"op": "remove", "path": pointer(p)} for p in paths)]


def pointer(path: tuple[str, ...]) -> str:
    """The JSON pointer (RFC 6901) of ``path``."""
    return "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in path)


def _extra(live: dict[str, Any], rendered: dict[str, Any], path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for key, value in live.items():
        if key not in rendered:
            yield (*path, key)
        elif isinstance(value, dict) and isinstance(rendered[key], dict):
            yield from _extra(value, rendered[key], (*path, key))


def _owns(fields: dict[str, Any], path: tuple[str, ...]) -> bool:
    """Whether a manager's ``fieldsV1`` holds ``path`` (``{"f:spec": {"f:key": {}}}``)."""
    for key in path:
        if not isinstance(fields, dict) or f"f:{key}" not in fields:
            return False
        fields = fields[f"f:{key}"]
    return True
