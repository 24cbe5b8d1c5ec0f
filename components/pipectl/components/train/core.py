"""PyTorch DDP training under ``torchrun``, checkpointing to the store and resuming from it.

Every process runs :func:`run`. torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``
(= nodes x processes per node), ``MASTER_ADDR``/``MASTER_PORT``. Backend: ``nccl`` when CUDA
is available, else ``gloo``.

Checkpoints: ``<run_uri>/checkpoints/step-<nnnnnnnn>.pt`` (model, optimiser, global step), then
``<run_uri>/checkpoints/latest.json`` pointing at it (one PUT each: a reader never sees a
half-written checkpoint). A restarted run (a retried step, a rescheduled gang) loads the latest
checkpoint and continues at the same global step with the same sample order
(``DistributedSampler.set_epoch``), so only the steps after the last checkpoint are recomputed.

MLflow: rank 0 alone logs. The run is found again by the tag ``pipectl.workflow`` so a restart
continues the same MLflow run instead of opening a second one.
"""

from __future__ import annotations

import io
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data.distributed import DistributedSampler

from pipectl.components.contracts import RunLayout, StoreSettings, TrainInput, TrainOutput
from pipectl.components.models import SmallCNN, classification_metrics, log_weights, predict
from pipectl.components.runtime import StepError, available_cpus, object_exists, parse_s3_uri, read_json, s3_client, write_json
from pipectl.components.shards import load_split

log = logging.getLogger("pipectl.train")

WORKFLOW_TAG = "pipectl.workflow"


def latest_checkpoint(s3: Any, run_uri: str) -> dict | None:
    """``{"step": int, "uri": str}`` of the newest checkpoint under ``run_uri``, or None."""
    latest = RunLayout(run_uri=run_uri).latest_checkpoint_uri
    bucket, key = parse_s3_uri(latest)
    if object_exists(s3, bucket, key) is None:
        return None
    return read_json(s3, latest)


def save_checkpoint(s3: Any, run_uri: str, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Write a checkpoint, then move ``latest.json`` to it. Returns its URI."""
    layout = RunLayout(run_uri=run_uri)
    uri = layout.checkpoint_uri(step)
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, buf)
    bucket, key = parse_s3_uri(uri)
    s3.put_object(Bucket=bucket, Key=key, Body=buf.getvalue())
    write_json(s3, layout.latest_checkpoint_uri, {"step": step, "uri": uri})
    return uri


def load_checkpoint(s3: Any, uri: str) -> dict:
    bucket, key = parse_s3_uri(uri)
    return torch.load(io.BytesIO(s3.get_object(Bucket=bucket, Key=key)["Body"].read()), map_location="cpu")


def _mlflow_run(inp: TrainInput, settings: StoreSettings) -> Any:
    """Start (or re-attach to) the MLflow run of this workflow. Rank 0 only."""
    import mlflow

    if settings.mlflow_uri:
        mlflow.set_tracking_uri(settings.mlflow_uri)
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
        # 2 processes each using every core thrash (REFERENCE.md §1: "set OMP_NUM_THREADS");
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


def _resume(s3: Any, run_uri: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[int, str | None]:
    """Load the newest checkpoint of the run into ``model``/``optimizer``: (its step, its URI), or (0, None)."""
    latest = latest_checkpoint(s3, run_uri)
    if latest is None:
        return 0, None
    state = load_checkpoint(s3, latest["uri"])
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), latest["uri"]


def _run_steps(inp: TrainInput, proc: _Process, ddp: nn.Module, optimizer: torch.optim.Optimizer, sampler: DistributedSampler,
               x: torch.Tensor, y: torch.Tensor, start: int, total_steps: int, checkpoint: Callable[[int], None],
               on_epoch: Callable[[int, float], None]) -> int:
    """Optimiser steps ``start`` .. ``total_steps`` (resuming mid-epoch at the same sample order:
    the sampler's permutation depends only on seed and epoch). Rank 0 calls ``checkpoint(step)``
    every ``checkpoint_every_steps`` (then every rank meets at a barrier) and ``on_epoch(epoch,
    mean loss)`` after each epoch. Returns the last step."""
    steps_per_epoch = math.ceil(len(sampler) / inp.batch_size)
    loss_fn = nn.CrossEntropyLoss()
    step = start
    while step < total_steps:
        epoch, offset = divmod(step, steps_per_epoch)
        sampler.set_epoch(epoch)
        order = list(sampler)
        ddp.train()
        epoch_loss = torch.zeros((), device=proc.device)
        for b in range(offset, steps_per_epoch):
            idx = torch.tensor(order[b * inp.batch_size:(b + 1) * inp.batch_size])
            xb, yb = x[idx].to(proc.device, non_blocking=True), y[idx].to(proc.device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach()
            step += 1
            if step % inp.checkpoint_every_steps == 0 and step < total_steps:
                if proc.rank == 0:
                    checkpoint(step)
                if proc.distributed:
                    dist.barrier()
        if proc.rank == 0:  # progress in the step's log (`pipectl logs`): where a restart would resume from
            mean_loss = (epoch_loss / max(1, steps_per_epoch - offset)).item()
            log.info("epoch %d of %d done: step %d of %d, mean loss %.4f", epoch + 1, inp.epochs, step, total_steps, mean_loss)
            on_epoch(epoch, mean_loss)
    return step


def _log_model(model: nn.Module, channels: int) -> str:
    """Log the trained model to the active MLflow run: MLflow's pytorch flavour (for serving) and
    the weights evaluate loads (tensors only, no pickle: components/pipectl/components/models.py). Returns its model URI."""
    import mlflow

    model_info = mlflow.pytorch.log_model(
        model.cpu(),
        name="model",
        serialization_format="pickle",
        pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
    )
    log_weights(model, channels=channels)
    return model_info.model_uri


def _publish(inp: TrainInput, s3: Any, out: TrainOutput, model: nn.Module, optimizer: torch.optim.Optimizer, channels: int,
             accuracy: float, elapsed_s: float, run: Any, output_uri: str) -> None:
    """Rank 0, after the last step: final checkpoint, MLflow metrics and model, then the train
    output (written last: its presence means this run trained completely)."""
    import mlflow

    if out.steps_this_attempt:
        save_checkpoint(s3, inp.run_uri, out.steps, model, optimizer)
    mlflow.log_metrics({
        "train_accuracy": accuracy,
        "samples_per_s": out.steps_this_attempt * inp.batch_size * out.world_size / elapsed_s if elapsed_s > 0 else 0.0,
        "steps_recomputed_after_resume": float(out.steps_this_attempt),
    })
    out.mlflow_run_id, out.model_uri = run.info.run_id, _log_model(model, channels)
    write_json(s3, output_uri, out.model_dump(mode="json"))
    mlflow.end_run()
    log.info("trained %d steps (%d this attempt, resumed from %d) on world size %d; train accuracy %.4f",
             out.steps, out.steps_this_attempt, out.resumed_from_step, out.world_size, accuracy)


def train(inp: TrainInput, settings: StoreSettings, s3: Any, *, reader: Any = None) -> TrainOutput:
    """Train one process of the gang; returns the output (meaningful on rank 0). See module doc.

    ``s3``: the store (checkpoints, outputs); ``reader``: where the shards are read from (default
    ``s3``; Alluxio's S3 proxy when configured). Checkpoints never go through the cache.
    """
    proc = _init_process()
    output_uri = RunLayout(run_uri=inp.run_uri).train_output_uri
    images, labels, index = load_split(s3 if reader is None else reader, inp.shards_uri, "train")
    num_classes = len(index.labels)
    x, y = torch.from_numpy(images), torch.from_numpy(labels)

    torch.manual_seed(inp.seed)
    model = SmallCNN(num_classes=num_classes, channels=index.channels).to(proc.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=inp.learning_rate)
    sampler = DistributedSampler(range(len(x)), num_replicas=proc.world_size, rank=proc.rank, shuffle=True, seed=inp.seed)
    total_steps = math.ceil(len(sampler) / inp.batch_size) * inp.epochs

    previous = _finished_output(s3, output_uri, total_steps)
    if previous is not None:
        log.info("already trained: %s (%d steps); nothing to do", output_uri, previous.steps)
        if proc.distributed:
            dist.destroy_process_group()
        return previous
    resumed_from, checkpoint_uri = _resume(s3, inp.run_uri, model, optimizer)
    if checkpoint_uri and proc.rank == 0:
        log.info("resuming from checkpoint %s (step %d of %d)", checkpoint_uri, resumed_from, total_steps)
    ddp = DDP(model) if proc.distributed else model

    run = _mlflow_run(inp, settings) if proc.rank == 0 else None
    if run is not None and resumed_from == 0:
        import mlflow

        mlflow.log_params({"epochs": inp.epochs, "batch_size": inp.batch_size, "learning_rate": inp.learning_rate,
                           "world_size": proc.world_size, "seed": inp.seed, "image_size": index.image_size,
                           "train_images": len(x), "shards_uri": inp.shards_uri})

    def on_epoch(epoch: int, mean_loss: float) -> None:
        if run is not None:
            import mlflow

            mlflow.log_metric("train_loss", mean_loss, step=epoch)

    t0 = time.perf_counter()
    step = _run_steps(inp, proc, ddp, optimizer, sampler, x, y, resumed_from, total_steps,
                      lambda s: save_checkpoint(s3, inp.run_uri, s, model, optimizer), on_epoch)
    steps_this_attempt, elapsed = step - resumed_from, time.perf_counter() - t0

    metrics = classification_metrics(predict(model, x.to(proc.device)), y.to(proc.device), num_classes)
    out = TrainOutput(mlflow_run_id="", model_uri="", steps=step, steps_this_attempt=steps_this_attempt,
                      resumed_from_step=resumed_from, world_size=proc.world_size, train_accuracy=round(metrics["accuracy"], 6))
    if run is not None:
        _publish(inp, s3, out, model, optimizer, index.channels, metrics["accuracy"], elapsed, run, output_uri)
    if proc.distributed:
        dist.barrier()
        dist.destroy_process_group()
    return out


def run(inp: TrainInput, settings: StoreSettings) -> TrainOutput:
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" not in os.environ:
        raise StepError("WORLD_SIZE > 1 but MASTER_ADDR is unset", "launch with torchrun")
    from pipectl.components.alluxio import data_read_client

    return train(inp, settings, s3_client(settings), reader=data_read_client(settings))
