"""Core of the ``validate`` step (see the package doc)."""

from __future__ import annotations

from pipectl.components.contracts import StoreSettings, TrainingParameters, ValidateOutput


def run(inp: TrainingParameters, settings: StoreSettings) -> ValidateOutput:
    """Nothing left to do: the parameters were validated on parsing (``step_main``)."""
    return ValidateOutput()
