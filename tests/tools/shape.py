"""The shape of a document (a manifest as data): its key paths, not its values."""

from __future__ import annotations


def key_paths(obj, prefix: str = "") -> set[str]:
    """Every key path of a document (list items collapse to ``[]``): two documents of one shape
    have the same set whatever their values."""
    if isinstance(obj, dict):
        return {p for k, v in obj.items() for p in {f"{prefix}.{k}"} | key_paths(v, f"{prefix}.{k}")}
    if isinstance(obj, list):
        return {p for v in obj for p in key_paths(v, prefix + "[]")}
    return set()
