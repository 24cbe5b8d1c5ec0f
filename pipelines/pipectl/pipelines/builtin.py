"""The pipelines that ship with pipectl, written with the same API users write theirs with
(:mod:`pipectl.sdk`). ``training`` is the one every user reads first."""

from __future__ import annotations

from hera.workflows import WorkflowTemplate

from pipectl.components.contracts import TrainingParameters
from pipectl.pipelines.composer import Pipeline, evaluate, preprocess, register, stage, train, warm
from pipectl.pipelines.training import CompileConfig

training = Pipeline(
    "training",
    [stage(), warm(), preprocess(), train(), evaluate(), register()],
    title="Training pipeline",
    description="Stage, optionally warm Alluxio, preprocess (DALI), train (DDP gang), evaluate against the champion, register in MLflow.",
    defaults={"model-name": TrainingParameters.model_fields["model_name"].default},
)

PIPELINES: dict[str, Pipeline] = {p.name: p for p in (training,)}
"""Built-in pipelines by name: what ``pipectl render|submit|run NAME`` accept besides a reference."""


def build_training(cfg: CompileConfig | None = None) -> WorkflowTemplate:
    """The ``training-v1`` WorkflowTemplate for ``cfg`` (defaults when None)."""
    return training.build(cfg)
