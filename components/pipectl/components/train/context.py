"""What a train function gets from pipectl: :class:`TrainContext`.

A train function takes the context and returns the trained model; pipectl does the rest (the
gang, resume after a restart, checkpoint-then-yield on SIGTERM, MLflow, the ONNX model that
evaluate scores and register registers)::

    def train(ctx: TrainContext) -> nn.Module:
        model = MyNet(ctx.num_classes, ctx.channels).to(ctx.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=ctx.params.learning_rate)
        net = ctx.wrap(model)                                   # DDP when the gang has >1 process
        for images, labels in ctx.batches(model, optimizer):    # resumes from the latest checkpoint
            optimizer.zero_grad()
            loss = F.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            ctx.record_loss(loss)
        return model

``ctx.batches`` restores the newest checkpoint of the run into ``model`` and ``optimizer`` first
(a restarted gang continues at the same global step, with the same sample order), streams this
process's share of the training split shard by shard (memory does not grow with the dataset), and after each
batch the body handled it counts the step, checkpoints every ``checkpoint-every-steps`` (rank 0),
and stops the gang together when a member was told to stop (it checkpoints that step, then raises
``Preempted``: let it through). Do not catch ``BaseException`` or ``Exception`` around the loop.
Call ``batches`` once per run: its steps are the run's steps (``ctx.step`` counts them across
restarts; a retried step that finds them all done does not call the function again).
"""

from __future__ import annotations

import logging
import statistics
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from pipectl.components import progress
from pipectl.components.contracts import TrainInput
from pipectl.components.runtime import StepError
from pipectl.components.shard_stream import ShardStream
from pipectl.components.train import live, telemetry
from pipectl.components.train.preemption import PreemptionWatch
from pipectl.components.train.exporter import RankExporter
from pipectl.components.train.telemetry import StepClock

log = logging.getLogger("pipectl.train")


class Preempted(StepError):
    """The gang was told to stop (SIGTERM) and wrote a checkpoint of its step first."""

    def __init__(self, step: int, total_steps: int) -> None:
        super().__init__(f"told to stop (SIGTERM) at step {step} of {total_steps}: checkpoint written",
                         "the next attempt resumes from it", transient=True)


@dataclass
class TrainContext:
    """The gang process a train function runs in, its data and its run.

    ``data``: the training split (preprocessed: resized uint8 pixels, which ``batches`` and
    ``data.model_input`` normalise with the index's mean and std), read shard by shard;
    ``batches`` gives this process its share, never the whole split in memory.
    ``label_names[i]`` is the class of label ``i``."""

    params: TrainInput
    rank: int
    world_size: int
    device: torch.device
    distributed: bool
    data: ShardStream = field(repr=False)
    label_names: list[str]
    image_size: int
    checkpoint: Callable[[int, nn.Module, torch.optim.Optimizer], None] = field(repr=False)
    restore: Callable[[nn.Module, torch.optim.Optimizer], tuple[int, str | None]] = field(repr=False)
    log_metrics: Callable[[dict[str, float], int | None], None] = field(repr=False)
    """Where metrics go (rank 0: the run's MLflow run), several in one call: per epoch, the loss and
    the step anatomy's shares go together (one request, not one per metric while the gang waits)."""
    log_tags: Callable[[dict[str, str]], None] = field(default=lambda tags: None, repr=False)
    """Where the run's tags go (rank 0: the MLflow run): each epoch's step-time line and the verdicts
    so far, for ``pipectl status`` while the training runs (:mod:`pipectl.components.train.live`)."""
    watch: PreemptionWatch | None = field(default=None, repr=False)
    """Set around the train function's steps only (:func:`pipectl.components.train.core.train`):
    before and after them a stop signal ends the process at once, as nothing is left to save."""
    clock: StepClock = field(default_factory=StepClock, repr=False)
    """Where each step's time goes (:mod:`pipectl.components.train.telemetry`)."""
    verdicts: list[str] = field(default_factory=list)
    """What the step anatomy said over the run (rank 0; each verdict kind once, its latest wording)."""
    step_time: str = ""
    """The last epoch's step anatomy, as the log prints it (rank 0)."""
    anatomy: dict[str, float] = field(default_factory=dict)
    """Rank 0: the last epoch's gang shares (``share_<part>``), ``images_per_s``, ``slowest_rank_ratio``,
    the largest memory (``memory_mib_max``, ``memory_peak_mib_max``) and each rank's own figures
    (``rank<R>/images_per_s``, ``rank<R>/step_ms``, ``rank<R>/memory_mib``, ``rank<R>/memory_peak_mib``)."""
    _epochs: dict[int, list[telemetry.RankEpoch]] = field(default_factory=dict, repr=False)
    """Rank 0: every rank's epochs so far (the memory trend)."""
    _epoch_numbers: list[int] = field(default_factory=list, repr=False)
    """Rank 0: the numbers (1 first) of the epochs in :attr:`_epochs`, this attempt's."""
    _who: list[str] = field(default_factory=list, repr=False)
    """``rank R on node N (pod P)`` of every rank, gathered at the first straggler check."""
    _where: list[tuple[str, str]] = field(default_factory=list, repr=False)
    """(node, pod) of every rank, gathered with :attr:`_who`."""
    exporter: RankExporter | None = field(default=None, repr=False)
    """The step anatomy of this pod's ranks for Prometheus (this pod's first process; None: not served):
    updated at each straggler check and each epoch's end (:mod:`pipectl.components.train.exporter`)."""
    step: int = 0
    """The global optimiser step: the number of batches done, over every attempt of the run."""
    resumed_from: int = 0
    optimizer: torch.optim.Optimizer | None = field(default=None, repr=False)
    """The optimiser given to :meth:`batches`: the run's last checkpoint holds its state too."""
    _epoch_loss: list[torch.Tensor] = field(default_factory=list, repr=False)
    validation: ShardStream | None = field(default=None, repr=False)
    """The held-out split (None: the dataset has none): at each epoch's end every process scores
    its own shards of it and rank 0 logs ``val_loss`` and ``val_accuracy`` (the learning curve's
    second line, and overfitting as it happens)."""

    def log_metric(self, name: str, value: float, step: int | None = None) -> None:
        """Log one metric to the run (``step``: e.g. the epoch); rank 0's are kept."""
        self.log_metrics({name: value}, step)

    @property
    def num_classes(self) -> int:
        return len(self.label_names)

    @property
    def channels(self) -> int:
        return self.data.index.channels

    @property
    def num_samples(self) -> int:
        """Images in the training split (all processes together)."""
        return self.data.num_samples

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch of every process: ``ceil(ceil(num_samples / world_size) / batch_size)``."""
        return self.data.steps_per_epoch(self.params.batch_size)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.params.epochs

    def wrap(self, model: nn.Module) -> nn.Module:
        """``model`` in DistributedDataParallel when the gang has more than one process, with the
        step clock's gradient hooks (:func:`telemetry.attach`; DDP's all-reduce is left alone: a
        communication hook of your own, e.g. PowerSGD, may be registered on it)."""
        if not self.distributed:
            return model
        ddp = DDP(model)
        telemetry.attach(self.clock, ddp)
        return ddp

    def record_loss(self, loss: torch.Tensor | float) -> None:
        """Note a batch's loss: the epoch's mean goes to the step's log and MLflow (``train_loss``)."""
        self._epoch_loss.append(loss.detach().float().reshape(()) if isinstance(loss, torch.Tensor) else torch.tensor(float(loss)))

    def batches(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(images float32 [B, C, H, W], labels int64 [B]) of this process, on ``ctx.device``, batch
        after batch until the run's last step; see the module doc. The sample order depends only on
        the seed, the epoch and the gang's size (:mod:`pipectl.components.shard_stream`)."""
        self.optimizer = optimizer
        self.step, uri = self.restore(model, optimizer)
        self.resumed_from = self.step
        steps_per_epoch, total = self.steps_per_epoch, self.total_steps
        if uri and self.rank == 0:
            log.info("resuming from checkpoint %s (step %d of %d)", uri, self.step, total)
        while self.step < total:
            epoch, offset = divmod(self.step, steps_per_epoch)
            model.train()
            self._epoch_loss.clear()
            with closing(self.data.batches(epoch, self.params.batch_size, offset)) as stream:
                self.clock.data_begin()
                for images, labels in stream:  # uint8 from the shards: normalised float32 on the device
                    batch = (self.data.model_input(images, self.device),
                             torch.from_numpy(labels).to(self.device, non_blocking=True))
                    self.clock.body_begin(len(labels))
                    yield batch
                    self.clock.body_end()
                    self.step += 1
                    self._after_step(model, optimizer, total)
                    self.clock.data_begin()
            self._end_epoch(epoch, model)

    def _after_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, total: int) -> None:
        """Periodic checkpoint (every rank meets at a barrier after it), then checkpoint-then-yield."""
        periodic = self.step % self.params.checkpoint_every_steps == 0
        if periodic and self.step < total:
            t0 = time.perf_counter()
            if self.rank == 0:
                self.checkpoint(self.step, model, optimizer)
            if self.distributed:
                dist.barrier()
            self.clock.checkpoint(time.perf_counter() - t0)
        self._check_stragglers()
        if self.step < total and self._should_stop():
            if self.rank == 0 and not periodic:
                self.checkpoint(self.step, model, optimizer)
                log.info("told to stop at step %d of %d: checkpoint written", self.step, total)
            if self.distributed:
                dist.barrier()
            raise Preempted(self.step, total)

    def _check_stragglers(self) -> None:
        """After every :data:`~telemetry.STRAGGLER_STEPS` steps, the gang's straggler check over
        them (a collective: every rank takes the same steps, so every rank calls it at the same one):
        rank 0 names a rank whose median step was >= 1.2x the others', with its step, not at the epoch's end."""
        window = self.clock.window
        if len(window) < telemetry.STRAGGLER_STEPS:
            return
        mine, span = statistics.median(window), f"over steps {self.step - len(window) + 1}-{self.step}"
        window.clear()
        if not self.distributed:
            if self.exporter is not None:
                self.exporter.window([mine], [telemetry.whereabouts()])
            return
        t0 = time.perf_counter()
        own = torch.tensor([mine], dtype=torch.float64, device=self.device)
        gathered = [torch.zeros_like(own) for _ in range(self.world_size)]
        dist.all_gather(gathered, own)
        if not self._who:  # once: where each rank runs
            self._where = [("", "")] * self.world_size
            dist.all_gather_object(self._where, telemetry.whereabouts())
            self._who = [f"rank {r} on {telemetry.place(*w)}" for r, w in enumerate(self._where)]
        self.clock.gang_wait(time.perf_counter() - t0)
        if self.exporter is not None:
            self.exporter.window([float(t.item()) for t in gathered], self._where)
        if self.rank == 0:
            for verdict in telemetry.stragglers([float(t.item()) for t in gathered], self._who, span,
                                                gpu=self.device.type == "cuda"):
                self._note_verdict(verdict, f"step {self.step}")

    def _should_stop(self) -> bool:
        """The gang's per-step stop check (one all-reduce: every rank meets there), its wait in the
        step clock's ``sync``."""
        if self.watch is None:
            return False
        t0 = time.perf_counter()
        try:
            return self.watch.should_stop()
        finally:
            self.clock.gang_wait(time.perf_counter() - t0)

    def _end_epoch(self, epoch: int, model: nn.Module) -> None:
        ranks = self._gather_anatomy()
        if self.exporter is not None:
            self.exporter.epoch(ranks)
        held_out = self._validate(model)
        if self.rank != 0:
            return  # progress in the step's log (`pipectl logs`): where a restart would resume from
        metrics = self._report_anatomy(ranks, epoch)
        mean = torch.stack([t.cpu() for t in self._epoch_loss]).mean().item() if self._epoch_loss else float("nan")
        log.info("epoch %d of %d done: step %d of %d, mean loss %.4f%s", epoch + 1, self.params.epochs, self.step,
                 self.total_steps, mean, "".join(f", {k} {v:.4f}" for k, v in held_out.items()))
        if self._epoch_loss:
            metrics["train_loss"] = mean
        self.log_metrics({**metrics, **held_out}, epoch)
        self.log_tags(live.epoch_tags(epoch + 1, self.params.epochs, self.step_time, self.verdicts))
        progress.report(epoch + 1, self.params.epochs, self.step, self.total_steps, mean, self.anatomy, self.verdicts)

    @torch.no_grad()
    def _validate(self, model: nn.Module) -> dict[str, float]:
        """``val_loss`` (mean cross-entropy) and ``val_accuracy`` of ``model`` on the held-out
        split, each process scoring its own shards, the gang summing (a collective: every rank
        calls it). Empty when there is no held-out split or ``model`` does not give one score
        per class (a train function's own kind of model)."""
        if self.validation is None:
            return {}
        was_training = model.training
        model.eval()
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, correct, seen, not scores per class
        try:
            for images, labels in self.validation.shards(own=True):
                if not self._score(model, images, labels, sums):
                    break
        finally:
            model.train(was_training)
        if self.distributed:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        if sums[3] > 0 or sums[2] == 0:
            return {}
        return {"val_loss": float(sums[0] / sums[2]), "val_accuracy": float(sums[1] / sums[2])}

    def _score(self, model: nn.Module, images: Any, labels: Any, sums: torch.Tensor, batch_size: int = 512) -> bool:
        """Add one shard's loss, correct and seen counts to ``sums``; False (and ``sums[3]`` set)
        when the model's output is not [batch, classes]."""
        for i in range(0, len(images), batch_size):
            x = self.validation.model_input(images[i:i + batch_size], self.device)
            y = torch.from_numpy(labels[i:i + batch_size]).to(self.device)
            try:
                logits = model(x)
            except Exception as e:  # noqa: BLE001 - a model that takes other inputs: no held-out metrics, not a failed run
                log.warning("no held-out metrics: the model did not score a batch of images (%s: %s)", type(e).__name__, e)
                logits = None
            if not isinstance(logits, torch.Tensor) or logits.ndim != 2 or logits.shape[1] != self.num_classes:
                sums[3] = 1
                return False
            sums[0] += nn.functional.cross_entropy(logits.float(), y, reduction="sum").double()
            sums[1] += (logits.argmax(dim=1) == y).sum()
            sums[2] += len(y)
        return True

    def _gather_anatomy(self) -> list[telemetry.RankEpoch]:
        """Every rank's step anatomy of the epoch (a collective: every rank calls it)."""
        mine = self.clock.epoch(self.rank)
        if not self.distributed:
            return [mine]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        return gathered

    def _report_anatomy(self, ranks: list[telemetry.RankEpoch], epoch: int) -> dict[str, float]:
        """Rank 0: the gang's shares to the log (returned, for MLflow); verdicts to the log and
        ``self.verdicts``."""
        shares = {**telemetry.gang_shares(ranks), **telemetry.rank_metrics(ranks)}
        self.anatomy = {k: round(v, 4) for k, v in shares.items()}
        self.step_time = telemetry.describe(ranks, shares)
        log.info("epoch %d step time: %s", epoch + 1, self.step_time)
        for r in ranks:
            self._epochs.setdefault(r.rank, []).append(r)
        self._epoch_numbers.append(epoch + 1)
        leaks = [telemetry.growing_memory(history) for history in self._epochs.values()]
        for verdict in telemetry.verdicts(ranks) + [v for v in leaks if v]:
            self._note_verdict(verdict, f"epoch {epoch + 1}")
        return dict(shares)

    def anatomy_history(self) -> tuple[list[list[telemetry.RankEpoch]], list[int]]:
        """Rank 0: every epoch of this attempt as the gang's numbers (one per rank), and the epochs' numbers."""
        return [list(gang) for gang in zip(*self._epochs.values())], list(self._epoch_numbers)

    def _note_verdict(self, verdict: str, when: str) -> None:
        """Rank 0: a verdict to the log and :attr:`verdicts` (each kind once: its latest wording)."""
        log.warning("%s: %s", when, verdict)
        kind = verdict.split(":", 1)[0]
        self.verdicts[:] = [v for v in self.verdicts if not v.startswith(kind + ":")] + [verdict]


TrainFunction = Callable[[TrainContext], nn.Module]
"""``def train(ctx: TrainContext) -> nn.Module``: returns the trained model (not its DDP wrapper)."""


def describe(fn: Any) -> str:
    """``module:name`` of a function, for messages."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
