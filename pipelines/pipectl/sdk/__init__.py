"""pipectl's Python API: define a training pipeline in your own file, from pipectl's steps and yours.

A pipeline is a name and its steps in order; ``validate`` always runs first. Run it with the CLI by
reference, as ``uvicorn`` and ``flask`` take an app::

    # pipeline.py
    from pipectl.sdk import RUN_URI, ContainerStep, Pipeline, evaluate, preprocess, register, stage, train

    export = ContainerStep("export-onnx", image="registry.example.com/me/export:1.0",
                           command=["python", "-m", "mypkg.export"], args=["--run-uri", RUN_URI])
    pipeline = Pipeline("my-training", [stage(), preprocess(), train(), export, evaluate(), register()])

    $ pipectl render pipeline.py:pipeline          # the WorkflowTemplate my-training-v1
    $ pipectl run pipeline.py:pipeline -p dataset-uri=./images     # on this machine
    $ pipectl templates apply pipeline.py:pipeline && pipectl submit pipeline.py:pipeline -p ...

pipectl's steps (each a function returning a step; what each needs is made by an earlier one):

=============  ======================================================  =============
step           does                                                    needs
=============  ======================================================  =============
stage()        copy the dataset into the store, with a manifest        —
warm()         load it into Alluxio when ``warm-cache`` is true         stage
preprocess()   DALI decode/resize/normalise into shards                stage
train()        PyTorch DDP as one gang, checkpointed, resumed          preprocess
evaluate()     score against the ``champion``; promote or keep          train
register()     one MLflow model version per run; move ``champion``      evaluate
=============  ======================================================  =============

Values a :class:`ContainerStep` can read: :data:`RUN_URI`, :data:`SHARDS_URI`,
:data:`MANIFEST_URI`, :data:`WORKFLOW_NAME`, :func:`parameter`, :func:`output`.
A definition that cannot work raises :class:`PipelineError` naming the step and the fix.
"""

from pipectl.pipelines.composer import (
    MANIFEST_URI,
    RUN_URI,
    SHARDS_URI,
    WORKFLOW_NAME,
    ContainerStep,
    Pipeline,
    PipelineError,
    Step,
    Value,
    evaluate,
    output,
    parameter,
    preprocess,
    register,
    stage,
    train,
    warm,
)
from pipectl.pipelines.training import CompileConfig

__all__ = [
    "CompileConfig", "ContainerStep", "MANIFEST_URI", "Pipeline", "PipelineError", "RUN_URI", "SHARDS_URI", "Step",
    "Value", "WORKFLOW_NAME", "evaluate", "output", "parameter", "preprocess", "register", "stage", "train", "warm",
]
