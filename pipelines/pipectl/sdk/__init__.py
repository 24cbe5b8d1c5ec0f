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
preprocess()   DALI decode/resize into shards of pixels                stage
shards()       shards you already have (``dataset-uri``), checked      —
train()        PyTorch DDP as one gang, checkpointed, resumed          preprocess
evaluate()     score against the ``champion``; promote or keep          train
register()     one MLflow model version per run; move ``champion``      evaluate
=============  ======================================================  =============

Values a :class:`ContainerStep` can read: :data:`RUN_URI`, :data:`SHARDS_URI`,
:data:`MANIFEST_URI`, :data:`WORKFLOW_NAME`, :func:`parameter`, :func:`output`.
A definition that cannot work raises :class:`PipelineError` naming the step and the fix.

Your train function (``train(function="mypkg.train:train")``) takes a :class:`TrainContext` and
returns the trained model: the gang, the data, resume and checkpoint-then-yield come from it, and
pipectl registers the model (ONNX) so ``evaluate()`` and ``register()`` work as for its own::

    def train(ctx: TrainContext) -> torch.nn.Module:
        model = MyNet(ctx.num_classes, ctx.channels).to(ctx.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=ctx.params.learning_rate)
        net = ctx.wrap(model)
        for images, labels in ctx.batches(model, optimizer):
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            ctx.record_loss(loss)
        return model

A pipeline's own parameters (beside pipectl's, in the Argo UI and ``-p``) are a
:class:`Parameters` class: ``Pipeline(..., parameters=MyParameters)``; the gang reads them with
``MyParameters.from_env()``, a ContainerStep with ``parameter("my-name")``.

Inside your own torchrun code (``train(module=...)``): :class:`PreemptionWatch` tells every rank
at once that the gang was told to stop (SIGTERM: preemption, eviction, drain), so rank 0 can write
a checkpoint of the current step before the pods go.
"""

from typing import TYPE_CHECKING

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
    shards,
    stage,
    train,
    warm,
)
from pipectl.components.pipeline_parameters import Parameters
from pipectl.components.train.preemption import PreemptionWatch
from pipectl.pipelines.training import CompileConfig

if TYPE_CHECKING:  # torch is in the steps' install only: `pipectl.sdk.TrainContext` imports it when used
    from pipectl.components.train.context import TrainContext


def __getattr__(name: str) -> object:
    if name == "TrainContext":
        from pipectl.components.train.context import TrainContext

        return TrainContext
    raise AttributeError(f"module 'pipectl.sdk' has no attribute {name!r}")


__all__ = [
    "CompileConfig", "ContainerStep", "MANIFEST_URI", "Parameters", "Pipeline", "PipelineError", "PreemptionWatch", "RUN_URI", "SHARDS_URI", "Step",
    "TrainContext",
    "Value", "WORKFLOW_NAME", "evaluate", "output", "parameter", "preprocess", "register", "shards", "stage", "train", "warm",
]
