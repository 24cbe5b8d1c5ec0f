"""Shared fixtures. Integration fixtures start real local services themselves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")


@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> Path:
    """The bundled digits dataset written as JPEGs (ImageFolder layout)."""
    from pipectl.components.data import write_example

    d = tmp_path_factory.mktemp("digits")
    write_example("digits", d)
    return d


@pytest.fixture(scope="session")
def small_digits_dir(digits_dir, tmp_path_factory) -> Path:
    """30 digits images per class (300 in all): for tests that need a real but quick dataset."""
    import shutil

    d = tmp_path_factory.mktemp("small-digits")
    for label_dir in sorted(digits_dir.iterdir()):
        (d / label_dir.name).mkdir()
        for p in sorted(label_dir.iterdir())[:30]:
            shutil.copy(p, d / label_dir.name / p.name)
    return d
