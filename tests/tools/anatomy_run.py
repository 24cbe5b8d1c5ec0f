"""Faults injected into a real training loop, and what the step anatomy reports of them.

The processes run :class:`~pipectl.components.train.context.TrainContext` as the train step builds
it — its ``batches`` over a real :class:`~pipectl.components.shard_stream.ShardStream` (random
float16 shards in a local folder), ``wrap`` (DistributedDataParallel on a gloo process group, with
the step clock's gradient hooks) — with a step whose own compute is a linear layer plus a
fixed sleep (a step of ``BASE_MS`` that the machine's load barely moves).

``single`` (one process, one epoch of :data:`STEPS` steps per case) injects

- ``sync:SHARE``: a delay into the gradient all-reduce of the last bucket (the part of the sync
  the backward cannot hide: what a slow fabric adds to every step), sized ``SHARE`` of the step;
- ``data:SHARE``: a delay before each batch leaves the shard stream (a slow loader);

sized from the steps' time without the delays (a first case without a fault, then the case's own
steps as they go: the share holds when the load changes). One JSON line per case: the
target share, the share the delays took of the epoch's wall time, the true shares of data wait and
sync (timed here around the loop's calls, not by the clock's marks), the shares the anatomy
reported, and the verdicts for the gang (the measured rank, and the same numbers on a second node:
the fabric verdict needs ranks on two nodes).

``gang`` (two processes) runs ``straggler:SHARE`` (rank 1 slower by ``SHARE``: it sleeps that share
of its own step's time at the end of each step, for one epoch of :data:`STEPS`) or ``clean:EPOCHS``
(epochs of :data:`CLEAN_STEPS`, no fault); one JSON line: rank 0's verdicts with the step or epoch
each was named at.

    python -m tests.tools.anatomy_run single sync:0.05 sync:0.15 data:0.30 ...
    python -m tests.tools.anatomy_run gang straggler:0.3 clean:15
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from tests.tools.folder_store import FolderStore

STEPS, BATCH, BASE_MS, IMAGE = 40, 16, 30.0, 8
GANG_BASE_MS = 60.0
"""A gang member's step: two processes on a loaded machine wake from their sleeps a few ms apart,
which must stay well inside the straggler rule's 20%."""
CLEAN_STEPS = 20
"""Steps per epoch of a clean gang: the fewest the epoch's straggler check looks at (one window per epoch)."""
SHARDS_URI = "s3://anatomy/shards"


def _shards(store: FolderStore, count: int, shards_uri: str = SHARDS_URI) -> None:
    from pipectl.components.contracts import ShardIndex
    from pipectl.components.runtime import join_uri, write_json
    from pipectl.components.shards import put_npz

    rng = np.random.default_rng(0)
    uri = join_uri(shards_uri, "train-00000.npz")
    put_npz(store, uri, rng.standard_normal((count, 3, IMAGE, IMAGE)).astype(np.float16), rng.integers(0, 10, count))
    index = ShardIndex(labels=[str(i) for i in range(10)], image_size=IMAGE, channels=3, mean=[0.0] * 3, std=[1.0] * 3,
                       train=[uri], validation=[], train_count=count, validation_count=0, train_sizes=[count], validation_sizes=[])
    write_json(store, join_uri(shards_uri, "index.json"), index.model_dump(mode="json"))


@dataclasses.dataclass
class Faults:
    """What one case injects, as a share of the step, and what was slept.

    Each delay is sized from the steps the case has taken so far (the median of the last few
    steps' time less their own delays): the share holds when the machine's load changes mid-run."""

    sync_share: float = 0.0
    data_share: float = 0.0
    free_step_s: float = BASE_MS / 1000
    """A step's time without the injected delays (the running median)."""
    slept: float = 0.0
    ready: float = 0.0
    """When the last gradient bucket of the step was ready (its all-reduce hook called)."""
    _recent: list[float] = dataclasses.field(default_factory=list)

    @property
    def sync_s(self) -> float:
        return self.sync_share / (1 - self.sync_share) * self.free_step_s

    @property
    def data_s(self) -> float:
        return self.data_share / (1 - self.data_share) * self.free_step_s

    def sleep(self, seconds: float) -> None:
        t0 = time.perf_counter()
        time.sleep(seconds)
        self.slept += time.perf_counter() - t0

    def step_took(self, seconds: float) -> None:
        """A step (without its injected delays) took ``seconds``."""
        self._recent = (self._recent + [seconds])[-5:]
        self.free_step_s = statistics.median(self._recent)


def _slow_allreduce(net: Any, faults: Faults) -> None:
    """DDP's default all-reduce as a communication hook of ``net``, its last bucket
    ``faults.sync_s`` slower (what a slow fabric adds to every step; a user's own communication
    hook, which the step clock leaves free)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def slow(process_group, bucket):  # noqa: ANN001, ANN202 - DDP checks the annotations: none, or the real classes
        if bucket.is_last():
            faults.ready = time.perf_counter()
            if faults.sync_s:
                faults.sleep(faults.sync_s)
        return allreduce_hook(process_group, bucket)

    net.register_comm_hook(None, slow)


def _stream(store: FolderStore, faults: Faults, rank: int, world: int, shards_uri: str) -> Any:
    from pipectl.components.shard_stream import ShardStream

    class SlowLoader(ShardStream):
        """The shard stream, each batch ``faults.data_s`` late."""

        def batches(self, epoch: int, batch_size: int, start_step: int = 0) -> Iterator[Any]:
            for batch in super().batches(epoch, batch_size, start_step):
                if faults.data_s:
                    faults.sleep(faults.data_s)
                yield batch

    return SlowLoader(store, shards_uri, "train", rank=rank, world_size=world, seed=0)


def _timed_watch() -> Any:
    from pipectl.components.train.preemption import PreemptionWatch

    class TimedWatch(PreemptionWatch):
        """The gang's stop check, its time noted here (``spent``)."""

        spent = 0.0

        def should_stop(self) -> bool:
            t0 = time.perf_counter()
            try:
                return super().should_stop()
            finally:
                self.spent += time.perf_counter() - t0

    return TimedWatch()


def _context(store: FolderStore, faults: Faults, rank: int, world: int, epochs: int, shards_uri: str = SHARDS_URI) -> Any:
    """The train step's TrainContext over the folder's shards (the stream and the stop check timed)."""
    import torch

    from pipectl.components.contracts import TrainInput
    from pipectl.components.train.context import TrainContext

    @dataclasses.dataclass
    class Noted(TrainContext):
        """Notes when each verdict was named (``step N`` / ``epoch N``)."""

        named: list[tuple[str, str]] = dataclasses.field(default_factory=list)

        def _note_verdict(self, verdict: str, when: str) -> None:
            self.named.append((when, verdict))
            super()._note_verdict(verdict, when)

    params = TrainInput(shards_uri=shards_uri, run_uri="s3://anatomy/runs/r", workflow_name="anatomy", model_name="anatomy",
                        epochs=epochs, batch_size=BATCH, learning_rate=0.01, checkpoint_every_steps=10_000, seed=0,
                        gang_preflight=False)
    stream = _stream(store, faults, rank, world, shards_uri)
    return Noted(named=[], params=params, rank=rank, world_size=world, device=torch.device("cpu"), distributed=True, data=stream,
                 label_names=list(stream.index.labels), image_size=IMAGE, checkpoint=lambda *a: None,
                 restore=lambda m, o: (0, None), log_metrics=lambda metrics, step=None: None, watch=_timed_watch())


def _train(ctx: Any, faults: Faults, slower: float = 0.0, base_ms: float = BASE_MS) -> dict[str, float]:
    """The loop; seconds of data wait and of sync (timed here) and the wall time. ``slower``: this
    rank sleeps that share of its step's own time at the end of each step."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * IMAGE * IMAGE, 10))  # little CPU: the machine's load moves it little
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    net = ctx.wrap(model)
    _slow_allreduce(net, faults)
    faults.slept = slept_before = data = sync = 0.0
    t0 = end = time.perf_counter()
    try:
        for images, labels in ctx.batches(model, optimizer):
            begin = time.perf_counter()
            data += begin - end  # the wait for this batch, timed here: not the clock's marks
            optimizer.zero_grad(set_to_none=True)
            time.sleep(base_ms / 1000)  # the step's own compute, mostly a fixed time
            nn.functional.cross_entropy(net(images), labels).backward()  # returns when every all-reduce is done
            waited = time.perf_counter() - faults.ready
            optimizer.step()
            if slower:
                time.sleep(slower * (time.perf_counter() - begin - waited + (begin - end)))
            sync += waited
            slept, now = faults.slept, time.perf_counter()
            faults.step_took(now - end - (slept - slept_before))
            end, slept_before = now, slept
    finally:
        ctx.watch.close()
    return {"data": data - ctx.watch.spent, "sync": sync + ctx.watch.spent, "wall": end - t0}  # the stop check waits for the gang


def run_case(store: FolderStore, faults: Faults) -> dict[str, Any]:
    """One process, one epoch of :data:`STEPS` steps with ``faults``: the anatomy, the verdicts, the truth."""
    from pipectl.components.train import telemetry

    ctx = _context(store, faults, 0, 1, 1)
    timed = _train(ctx, faults)
    wall = timed["wall"]
    (rank,) = ctx._epochs[0]
    on_two_nodes = [rank, dataclasses.replace(rank, rank=1, node=rank.node + "-b")]
    return {"steps": rank.steps, "wall_s": wall, "injected": faults.slept / wall,
            "true": {"data": timed["data"] / wall, "sync": timed["sync"] / wall},
            "reported": {"data": ctx.anatomy["share_data"], "sync": ctx.anatomy["share_sync"]},
            "verdicts": telemetry.verdicts(on_two_nodes)}


def _process_group(folder: str, rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{folder}/pg", rank=rank, world_size=world)


def single(cases: list[str]) -> None:
    import torch.distributed as dist

    with tempfile.TemporaryDirectory(prefix="anatomy-") as tmp:
        store = FolderStore(Path(tmp))
        _shards(store, STEPS * BATCH)
        _process_group(tmp, 0, 1)
        faults = Faults()
        base = run_case(store, faults)  # also the warm-up: allocator, first shard read
        print(json.dumps({"case": "none", "target": 0.0, **base}), flush=True)
        for case in cases:
            kind, share = case.split(":")
            faults.sync_share, faults.data_share = (float(share), 0.0) if kind == "sync" else (0.0, float(share))
            print(json.dumps({"case": kind, "target": float(share), **run_case(store, faults)}), flush=True)
        dist.destroy_process_group()


def _gang_shards(case: str) -> tuple[str, int]:
    """(shards URI, steps per epoch) of a gang case."""
    return (f"{SHARDS_URI}-straggler", STEPS) if case.startswith("straggler:") else (f"{SHARDS_URI}-clean", CLEAN_STEPS)


def gang_member(folder: str, rank: int, cases: list[str]) -> None:
    """Rank ``rank`` of a gang of two in ``folder`` (its shards and process group): each case in turn."""
    import torch.distributed as dist

    _process_group(folder, rank, 2)
    faults = Faults()
    for case in cases:
        kind, value = case.split(":")
        ctx = _context(FolderStore(Path(folder)), faults, rank, 2, 1 if kind == "straggler" else int(value), _gang_shards(case)[0])
        _train(ctx, faults, slower=float(value) if kind == "straggler" and rank == 1 else 0.0, base_ms=GANG_BASE_MS)
        if rank == 0:
            print(json.dumps({"case": case, "steps_per_epoch": ctx.steps_per_epoch, "named": ctx.named,
                              "verdicts": ctx.verdicts}), flush=True)
        dist.barrier()
    dist.destroy_process_group()


def gang(cases: list[str]) -> None:
    """Two processes (this module with ``member``), each its own rank; rank 0's lines printed."""
    import subprocess

    with tempfile.TemporaryDirectory(prefix="anatomy-gang-") as tmp:
        for case in cases:
            uri, steps = _gang_shards(case)
            _shards(FolderStore(Path(tmp)), 2 * steps * BATCH, uri)
        members = [subprocess.Popen([sys.executable, "-m", "tests.tools.anatomy_run", "member", tmp, str(rank), *cases],
                                    stdout=subprocess.PIPE, text=True) for rank in (0, 1)]
        outs = [m.communicate(timeout=600)[0] for m in members]
        if any(m.returncode for m in members):
            raise SystemExit(f"a gang member failed: {[m.returncode for m in members]}")
        print(outs[0].strip(), flush=True)


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    if mode == "member":
        gang_member(rest[0], int(rest[1]), rest[2:])
    elif mode == "gang":
        gang(rest)
    else:
        single(rest)
