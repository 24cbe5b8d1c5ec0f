"""The train step: a train function (pipectl's own, :mod:`~pipectl.components.train.builtin`, or
the user's ``module:name``) run in every process of the gang under ``torchrun``, with its
:class:`~pipectl.components.train.context.TrainContext`; then the model is published.

Every process runs :func:`run`. torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``
(= nodes x processes per node), ``MASTER_ADDR``/``MASTER_PORT``. Backend: ``nccl`` when CUDA
is available, else ``gloo``.

Checkpoints (:mod:`pipectl.components.train.checkpoints`: bound to the run, digest-checked,
tensors only) every ``checkpoint-every-steps``, and at the step the gang is told to stop (SIGTERM: preemption,
eviction, drain; :mod:`pipectl.components.train.preemption`). A restarted run (a retried step, a rescheduled gang) loads the latest
checkpoint and continues at the same global step with the same sample order
(:mod:`pipectl.components.shard_stream`), so only the steps after the last checkpoint are recomputed.

Published by rank 0 after the last step: a final checkpoint, the model as ONNX and its weights in
the run's MLflow run (:mod:`pipectl.components.models.portable`), then the train output.

MLflow: rank 0 alone logs. The run is found again by the tag ``pipectl.workflow`` so a restart
continues the same MLflow run instead of opening a second one.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from pipectl.components.contracts import RunLayout, StoreSettings, TrainInput, TrainOutput
from pipectl.components.mlflow_access import mlflow_access
from pipectl.components.models import ExportError, log_model
from pipectl.components.runtime import (
    StepError,
    available_cpus,
    object_exists,
    parse_s3_uri,
    read_json,
    resolve_callable,
    s3_client,
    write_json,
)
from pipectl.components.shard_stream import ShardStream
from pipectl.components.train import anatomy_chart, builtin, exporter, preflight, telemetry
from pipectl.components.train.checkpoints import latest_checkpoint, resume, save_checkpoint
from pipectl.components.train.context import TrainContext, TrainFunction
from pipectl.components.train.live import VERDICTS_TAG, WORKFLOW_TAG
from pipectl.components.train.preemption import PreemptionWatch

log = logging.getLogger("pipectl.train")



def _mlflow_run(inp: TrainInput, settings: StoreSettings) -> Any:
    """Start (or re-attach to) the MLflow run of this workflow. Rank 0 only."""
    import mlflow

    if settings.mlflow_uri:
        mlflow.set_tracking_uri(settings.mlflow_uri)
    # the experiment is the model's name: with auth, another team's is read-only (a clear failure, not retried)
    with mlflow_access(f"log a run to experiment {inp.model_name}"):
        experiment = mlflow.set_experiment(inp.model_name)
        found = mlflow.search_runs(
            experiment_ids=[experiment.experiment_id],
            filter_string=f"tags.`{WORKFLOW_TAG}` = '{inp.workflow_name}'",
            output_format="list",
            max_results=1,
        )
        if found:
            return mlflow.start_run(run_id=found[0].info.run_id)
        return mlflow.start_run(run_name=inp.workflow_name, tags={WORKFLOW_TAG: inp.workflow_name})


@dataclass(frozen=True)
class _Process:
    """This process's place in the gang (torchrun's environment) and its device."""

    rank: int
    world_size: int
    device: torch.device
    distributed: bool


def _init_process() -> _Process:
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    else:
        # 2 processes each using every core thrash (torch's default is one thread per core);
        # the CPUs this pod may use, not the node's (a CPU limit or cpuset: available_cpus).
        torch.set_num_threads(max(1, available_cpus() // local_world))
    distributed = "MASTER_ADDR" in os.environ
    if distributed and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    return _Process(rank, world_size, torch.device("cuda") if use_cuda else torch.device("cpu"), distributed)


def _finished_output(s3: Any, output_uri: str, total_steps: int) -> TrainOutput | None:
    """The output of an earlier attempt that trained all ``total_steps`` (a retried step), else None."""
    if object_exists(s3, *parse_s3_uri(output_uri)) is None:
        return None
    previous = TrainOutput.model_validate(read_json(s3, output_uri))
    return previous if previous.steps == total_steps else None


def _log_model(inp: TrainInput, model: nn.Module, example: torch.Tensor, num_classes: int) -> str:
    """Log the trained model to the active MLflow run as ONNX (registered and scored by evaluate
    whatever its architecture, with no code of the model's) and its weights. Returns its model URI.
    A model that cannot be exported is a failure of the code, naming the layer."""
    try:
        return log_model(model, example, inp.architecture.value, num_classes, int(example.shape[1]))
    except ExportError as e:
        raise StepError(str(e), "use operators ONNX supports in that layer (torch.onnx), or register the model "
                        "with your own training code") from e


def _publish(inp: TrainInput, s3: Any, out: TrainOutput, model: nn.Module, optimizer: torch.optim.Optimizer | None, example: torch.Tensor,
             num_classes: int, accuracy: float, elapsed_s: float, run: Any, output_uri: str) -> None:
    """Rank 0, after the last step: final checkpoint, MLflow metrics and model, then the train
    output (written last: its presence means this run trained completely)."""
    import mlflow

    if out.steps_this_attempt and optimizer is not None:
        save_checkpoint(s3, inp.run_uri, out.steps, model, optimizer)
    mlflow.log_metrics({
        "train_accuracy": accuracy,
        "samples_per_s": out.steps_this_attempt * inp.batch_size * out.world_size / elapsed_s if elapsed_s > 0 else 0.0,
        "steps_recomputed_after_resume": float(out.steps_this_attempt),
    })
    if out.verdicts:
        mlflow.set_tag(VERDICTS_TAG, "\n".join(out.verdicts))
    out.mlflow_run_id, out.model_uri = run.info.run_id, _log_model(inp, model, example, num_classes)
    write_json(s3, output_uri, out.model_dump(mode="json"))
    mlflow.end_run()
    log.info("trained %d steps (%d this attempt, resumed from %d) on world size %d; train accuracy %.4f",
             out.steps, out.steps_this_attempt, out.resumed_from_step, out.world_size, accuracy)


def resolve_function(ref: str) -> TrainFunction:
    """The train function ``module.path:name``; StepError naming what is wrong (:func:`resolve_callable`)."""
    return resolve_callable(ref, "train function", 1, f"def {ref.partition(':')[2]}(ctx: TrainContext) -> torch.nn.Module")


def mlflow_metrics(rank: int) -> Callable[[dict[str, float], int | None], None]:
    """:attr:`TrainContext.log_metrics` of a gang process: rank 0 logs to the active MLflow run,
    every metric of a call in one request, sent by MLflow's own logging thread (flushed when the
    run ends), so the gang does not wait on the tracking server at each epoch's end."""
    def log_metrics(values: dict[str, float], step: int | None = None) -> None:
        import mlflow

        if rank == 0 and values and mlflow.active_run() is not None:
            mlflow.log_metrics(values, step=step, synchronous=False)
    return log_metrics


def mlflow_tags(rank: int) -> Callable[[dict[str, str]], None]:
    """:attr:`TrainContext.log_tags` of a gang process: rank 0 sets the tags on the active MLflow run
    in the background, as :func:`mlflow_metrics` logs."""
    def log_tags(tags: dict[str, str]) -> None:
        import mlflow

        if rank == 0 and tags and mlflow.active_run() is not None:
            mlflow.set_tags(tags, synchronous=False)
    return log_tags


def _context(inp: TrainInput, s3: Any, reader: Any, proc: _Process) -> TrainContext:
    """The context of this process: the training split, and the run's checkpoints and metrics."""
    data = ShardStream(s3 if reader is None else reader, inp.shards_uri, "train", rank=proc.rank,
                       world_size=proc.world_size, seed=inp.seed)
    held_out = (ShardStream(data.reader, inp.shards_uri, "validation", rank=proc.rank, world_size=proc.world_size,
                            seed=inp.seed, index=data.index) if data.index.validation_count else None)

    return TrainContext(
        params=inp, rank=proc.rank, world_size=proc.world_size, device=proc.device, distributed=proc.distributed,
        data=data, label_names=list(data.index.labels),
        image_size=data.index.image_size, checkpoint=lambda step, model, opt: save_checkpoint(s3, inp.run_uri, step, model, opt),
        restore=lambda model, opt: resume(s3, inp.run_uri, model, opt), log_metrics=mlflow_metrics(proc.rank),
        log_tags=mlflow_tags(proc.rank),
        validation=held_out)


@torch.no_grad()
def _train_accuracy(model: nn.Module, ctx: TrainContext, batch_size: int = 512) -> float:
    """Accuracy on the training split: each process scores its own shards (``rank``, ``rank + W``,
    ...), one at a time, and the gang sums the counts."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=ctx.device)  # correct, seen
    for images, labels in ctx.data.shards(own=True):
        for i in range(0, len(images), batch_size):
            x = ctx.data.model_input(images[i:i + batch_size], ctx.device)
            y = torch.from_numpy(labels[i:i + batch_size]).to(ctx.device)
            counts[0] += (model(x).argmax(dim=1) == y).sum()
            counts[1] += len(y)
    if ctx.distributed:
        dist.all_reduce(counts)
    return float(counts[0] / counts[1]) if counts[1] else 0.0


def _peak_rss_mib(ctx: TrainContext) -> float:
    """The largest peak resident memory of the gang's processes (MiB; Linux reports ru_maxrss in KiB)."""
    import resource

    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0], dtype=torch.float64, device=ctx.device)
    if ctx.distributed:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return float(peak[0])


def _log_params(inp: TrainInput, ctx: TrainContext, function: str) -> None:
    import mlflow

    mlflow.log_params({"architecture": inp.architecture.value if not inp.function else "", "train_function": function,
                       "epochs": inp.epochs, "batch_size": inp.batch_size, "learning_rate": inp.learning_rate,
                       "world_size": ctx.world_size, "seed": inp.seed, "image_size": ctx.image_size,
                       "train_images": ctx.num_samples, "shards_uri": inp.shards_uri})


def _trained(ctx: TrainContext, function: TrainFunction, ref: str) -> nn.Module:
    """Run the train function; its returned model (unwrapped from DDP)."""
    ctx.watch = PreemptionWatch()  # only around the steps: elsewhere SIGTERM ends the process at once
    try:
        model = function(ctx)
    finally:
        watch, ctx.watch = ctx.watch, None
        watch.close()  # a stop the steps did not answer ends the process here
    model = getattr(model, "module", model) if isinstance(model, DDP) else model
    if not isinstance(model, nn.Module):
        raise StepError(f"train function {ref} returned {type(model).__name__}, not the trained torch.nn.Module",
                        "end it with `return model`")
    return model


def train(inp: TrainInput, settings: StoreSettings, s3: Any, *, reader: Any = None) -> TrainOutput:
    """Train one process of the gang with the train function (pipectl's own, or ``inp.function``);
    returns the output (meaningful on rank 0). See module doc.

    ``s3``: the store (checkpoints, outputs); ``reader``: where the shards are read from (default
    ``s3``; Alluxio's S3 proxy when configured). Checkpoints never go through the cache.
    """
    function, ref = (resolve_function(inp.function), inp.function) if inp.function else (builtin.train, "pipectl")
    proc = _init_process()
    output_uri = RunLayout(run_uri=inp.run_uri).train_output_uri
    ctx = _context(inp, s3, reader, proc)
    previous = _finished_output(s3, output_uri, ctx.total_steps)
    if previous is not None:
        log.info("already trained: %s (%d steps); nothing to do", output_uri, previous.steps)
        if proc.distributed:
            dist.destroy_process_group()
        return previous
    ctx.exporter = exporter.from_env(inp.workflow_name, *telemetry.whereabouts())
    if proc.distributed and inp.gang_preflight:
        preflight.check_gang()
    run = _mlflow_run(inp, settings) if proc.rank == 0 else None
    if run is not None and latest_checkpoint(s3, inp.run_uri) is None:
        _log_params(inp, ctx, ref)
    if proc.rank == 0:
        log.info("train function %s, %s, %d classes, %d training images of %dx%d, world size %d, %d steps", ref,
                 f"architecture {inp.architecture.value}" if not inp.function else "its own model", ctx.num_classes,
                 ctx.num_samples, ctx.image_size, ctx.image_size, proc.world_size, ctx.total_steps)
    torch.manual_seed(inp.seed)
    t0 = time.perf_counter()
    model = _trained(ctx, function, ref)
    steps_this_attempt, elapsed = ctx.step - ctx.resumed_from, time.perf_counter() - t0

    accuracy = _train_accuracy(model, ctx)
    ctx.log_metric("peak_rss_mib", _peak_rss_mib(ctx), None)
    out = TrainOutput(mlflow_run_id="", model_uri="", steps=ctx.step, steps_this_attempt=steps_this_attempt,
                      resumed_from_step=ctx.resumed_from, world_size=proc.world_size, train_accuracy=round(accuracy, 6),
                      verdicts=ctx.verdicts, step_time=ctx.step_time, anatomy=ctx.anatomy)
    if run is not None:
        import mlflow

        anatomy_chart.log_chart(mlflow, *ctx.anatomy_history())
        example = ctx.data.model_input(ctx.data.example(2), "cpu")
        _publish(inp, s3, out, model, ctx.optimizer, example, ctx.num_classes, accuracy, elapsed, run, output_uri)
    if proc.distributed:
        dist.barrier()
        dist.destroy_process_group()
    return out


def run(inp: TrainInput, settings: StoreSettings) -> TrainOutput:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" not in os.environ:
        raise StepError("WORLD_SIZE > 1 but MASTER_ADDR is unset", "launch with torchrun")
    from pipectl.components.alluxio import data_read_client

    return train(inp, settings, s3_client(settings), reader=data_read_client(settings))
