"""Pipelines by reference: what ``render``, ``run``, ``submit`` and ``templates apply`` accept.

``training`` (a built-in name), ``path/to/file.py:NAME`` or ``package.module:NAME`` (as ``uvicorn``
and ``flask`` take an app). A reference that does not lead to a :class:`pipectl.sdk.Pipeline` that
builds is exit 2 with what is wrong and where; a user module that fails to import shows the user's
traceback, not pipectl's.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from pipectl.cli.common import fail

REFERENCE_HELP = "a built-in pipeline (training), or your own: path/to/file.py:NAME or package.module:NAME"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def load_pipeline(ref: str) -> Any:
    """The :class:`pipectl.sdk.Pipeline` that ``ref`` names, checked (exit 2 otherwise)."""
    from pipectl.pipelines.builtin import PIPELINES
    from pipectl.pipelines.composer import Pipeline, PipelineError

    if ref in PIPELINES:
        return PIPELINES[ref]
    where, sep, attr = ref.rpartition(":")
    if not sep or not where or not attr:
        fail(f"unknown pipeline {ref!r}", f"use {REFERENCE_HELP}", code=2)
    module = _import_file(where) if where.endswith(".py") or os.sep in where else _import_module(where)
    if not hasattr(module, attr):
        found = sorted(k for k, v in vars(module).items() if isinstance(v, Pipeline))
        fail(f"{where} has no {attr!r}", f"pipelines it defines: {', '.join(found)}" if found else
             f"define one there: {attr} = Pipeline('my-training', [...]) (from pipectl.sdk)", code=2)
    pipeline = getattr(module, attr)
    if not isinstance(pipeline, Pipeline):
        fail(f"{ref}: {attr} is a {type(pipeline).__name__}, not a pipectl.sdk.Pipeline",
             f"point at a Pipeline object: {attr} = Pipeline('my-training', [...])", code=2)
    try:
        pipeline.check()
    except PipelineError as e:
        fail(f"pipeline {ref}: {e.message}", e.hint, code=2)
    return pipeline


def user_code_path(ref: str) -> str | None:
    """The folder of a ``file.py:NAME`` reference (steps run by ``pipectl run`` import from it, as
    the pipeline file itself did), or None."""
    where = ref.rpartition(":")[0]
    return str(Path(where).resolve().parent) if where.endswith(".py") else None


def _import_file(path_text: str) -> Any:
    path = Path(path_text)
    if not path.is_file():
        fail(f"pipeline file {path_text} does not exist", f"use {REFERENCE_HELP}", code=2)
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)  # its sibling modules import as they would with `python file.py`
    name = "_pipectl_user_" + re.sub(r"\W", "_", path.stem)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        fail(f"{path_text} cannot be imported as Python", "name a .py file", code=2)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    _run_user_code(lambda: spec.loader.exec_module(module), path_text)  # type: ignore[union-attr]
    return module


def _import_module(name: str) -> Any:
    if not _MODULE.match(name):
        fail(f"{name!r} is neither a .py file nor a module name", f"use {REFERENCE_HELP}", code=2)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    def find() -> bool:
        try:
            return importlib.util.find_spec(name) is not None  # imports the parent packages
        except ModuleNotFoundError:  # a parent package is missing
            return False

    if not _run_user_code(find, name):
        fail(f"module {name} not found", "install your package in this environment, or run from its folder", code=2)
    return _run_user_code(lambda: importlib.import_module(name), name)


def _run_user_code(load: Any, where: str) -> Any:
    """Run ``load``; an exception in the user's module exits 2 with the user's frames only."""
    try:
        return load()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - any error of the user's module is reported, not crashed on
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename
                  and not f.filename.startswith(str(Path(__file__).parent))]
        text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(e), e))
        sys.stderr.write(f"Traceback of {where} (most recent call last):\n{text}")
        fail(f"importing {where} failed: {type(e).__name__}: {e}", "fix the error in your module (traceback above)", code=2)
