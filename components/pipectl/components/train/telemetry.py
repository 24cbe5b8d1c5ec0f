"""Step anatomy: where each rank's training step time goes, and what to do about it.

Every step of :meth:`TrainContext.batches` is split, per rank, into

- **data**: waiting for the batch (the shard stream, the copy to the device);
- **compute**: the rank's own forward and backward, up to the moment its last gradient bucket is
  ready (DDP's communication hook, registered by :meth:`TrainContext.wrap`, notes that moment);
- **sync**: the gradient synchronisation the step actually waits for — from the last bucket ready
  to the last all-reduce done (DDP overlaps the earlier buckets with the backward: only this
  part is exposed);
- **optimizer**: the rest of the body (optimiser step, loss bookkeeping);
- **checkpoint**: writing checkpoints and the barrier after them.

Without the hook (a model wrapped by the user's own DDP) compute holds the sync too. At the end of
every epoch the ranks' totals are gathered; rank 0 logs the gang's shares to MLflow
(``share_data`` ... ``share_checkpoint``, ``images_per_s``, ``slowest_rank_ratio``) and the
verdicts of :func:`verdicts`, each with its rule, to the step's log and the run's MLflow tags.
The clock costs a few ``perf_counter`` calls per step.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from pipectl.components.names import NODE_NAME_ENV, POD_NAME_ENV

PARTS = ("data", "compute", "sync", "optimizer", "checkpoint")

STARVED_SHARE = 0.20
"""Data wait above this share of the step: the accelerators wait for input."""
FABRIC_SHARE, NO_SCALE_SHARE = 0.15, 0.30
"""Exposed gradient sync above 15% of the step: the fabric is the bottleneck (the field's rule of
thumb for data-parallel training); above 30%: more nodes will not make the run faster."""
LEAK_EPOCHS, LEAK_MIN_MIB, LEAK_MIN_FRACTION = 4, 64.0, 0.10
"""Memory (GPU memory allocated on a GPU, resident memory on a CPU) that grew at every one of the
last 4 epoch ends, by at least 64 MiB and 10% in all, is a likely leak: a healthy loop's memory
settles after its first epoch (its model, optimiser state, a window of shards)."""
STRAGGLER_RATIO, STRAGGLER_STEPS = 1.2, 20
"""A rank whose own time (data + compute + optimizer) per step is 20% above the gang's median,
over an epoch of at least 20 steps, holds every other rank back at each all-reduce."""


@dataclass
class RankEpoch:
    """One rank's totals over an epoch (seconds)."""

    rank: int
    node: str
    steps: int
    images: int
    seconds: dict[str, float]
    sync_measured: bool
    memory_mib: float = 0.0
    """At the epoch's end: GPU memory allocated (a GPU rank) or resident memory (a CPU rank)."""
    memory_kind: str = "resident memory"
    pod: str = ""
    """The rank's pod on a cluster (empty on one machine, where the node says it all)."""

    @property
    def where(self) -> str:
        """``node N`` or ``node N (pod P)``: where to look for this rank."""
        return f"node {self.node}" + (f" (pod {self.pod})" if self.pod and self.pod != self.node else "")

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def own_per_step(self) -> float:
        """Seconds per step this rank spends on its own work (not waiting for its peers)."""
        own = self.seconds["data"] + self.seconds["compute"] + self.seconds["optimizer"]
        return own / self.steps if self.steps else 0.0


@dataclass
class StepClock:
    """The per-step marks of one rank (see the module doc)."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    steps: int = 0
    images: int = 0
    hooked: bool = False
    _mark: float = 0.0
    _body: float = 0.0
    _ready: float | None = None
    _done: float | None = None

    def data_begin(self) -> None:
        self._mark = time.perf_counter()

    def body_begin(self, batch_size: int) -> None:
        """The batch is on the device: data wait ends, the train function's body begins."""
        now = time.perf_counter()
        self.seconds["data"] += now - self._mark
        self._body, self._ready, self._done = now, None, None
        self.images += batch_size

    def bucket_ready(self) -> None:
        self._ready = time.perf_counter()

    def bucket_done(self) -> None:
        self._done = time.perf_counter()

    def body_end(self) -> None:
        now = time.perf_counter()
        ready = self._ready if self._ready is not None else now
        done = max(self._done or ready, ready)
        self.seconds["compute"] += ready - self._body
        self.seconds["sync"] += done - ready
        self.seconds["optimizer"] += max(0.0, now - done)
        self.steps += 1

    def checkpoint(self, seconds: float) -> None:
        self.seconds["checkpoint"] += seconds

    def epoch(self, rank: int) -> RankEpoch:
        """This rank's totals since the last call; the clock starts again."""
        node = os.environ.get(NODE_NAME_ENV) or socket.gethostname()
        memory, kind = current_memory_mib()
        out = RankEpoch(rank, node, self.steps, self.images, dict(self.seconds), self.hooked, memory, kind,
                        os.environ.get(POD_NAME_ENV, ""))
        self.seconds, self.steps, self.images = dict.fromkeys(PARTS, 0.0), 0, 0
        return out


def current_memory_mib() -> tuple[float, str]:
    """(MiB, what): GPU memory allocated by this process's tensors on its GPU, else its resident memory."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.memory_allocated() / 2**20, "GPU memory"
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20, "resident memory"
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "resident memory"


def growing_memory(history: list[RankEpoch]) -> str | None:
    """The leak verdict for one rank's epochs so far (oldest first), or None (see :data:`LEAK_EPOCHS`)."""
    last = history[-(LEAK_EPOCHS + 1):]
    if len(last) < LEAK_EPOCHS + 1:
        return None
    values = [r.memory_mib for r in last]
    grown = values[-1] - values[0]
    if not all(b > a for a, b in zip(values, values[1:])) or grown < max(LEAK_MIN_MIB, LEAK_MIN_FRACTION * values[0]):
        return None
    r = last[-1]
    return (f"memory growing: rank {r.rank} on {r.where}: {r.memory_kind} grew at each of the last {LEAK_EPOCHS} epochs, "
            f"{values[0]:.0f} -> {values[-1]:.0f} MiB (+{grown / LEAK_EPOCHS:.0f} MiB per epoch; rule: every epoch, "
            f">= {LEAK_MIN_MIB:.0f} MiB and {LEAK_MIN_FRACTION:.0%} in all) — likely a leak: tensors kept across steps "
            "(a loss appended without .item(), a list that grows, a graph kept alive); it ends in an out-of-memory kill")


def attach(clock: StepClock, ddp: Any) -> None:
    """Register the timing all-reduce hook on a DistributedDataParallel model (the default
    all-reduce, timed: the moment a bucket is ready and the moment its reduction is done)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def timed(state, bucket):  # noqa: ANN001, ANN202 - DDP checks the annotations: none, or the real classes
        state.bucket_ready()

        def done(fut: Any) -> Any:
            state.bucket_done()
            return fut.value()

        return allreduce_hook(dist.group.WORLD, bucket).then(done)

    ddp.register_comm_hook(clock, timed)
    clock.hooked = True


def gang_shares(ranks: list[RankEpoch]) -> dict[str, float]:
    """The gang's shares of step time per part, ``images_per_s`` and ``slowest_rank_ratio``."""
    total = sum(r.total for r in ranks) or 1.0
    out = {f"share_{p}": sum(r.seconds[p] for r in ranks) / total for p in PARTS}
    wall = max(r.total for r in ranks) or 1.0
    out["images_per_s"] = sum(r.images for r in ranks) / wall
    own = [r.own_per_step for r in ranks]
    out["slowest_rank_ratio"] = max(own) / statistics.median(own) if own and statistics.median(own) > 0 else 1.0
    out["memory_mib_max"] = max(r.memory_mib for r in ranks)
    return out


def verdicts(ranks: list[RankEpoch]) -> list[str]:
    """What the epoch's anatomy says, each with its rule (the thresholds above). A straggler
    explains the gang's sync wait (the others wait for it), so it replaces the fabric verdict; a
    gang on one node has no fabric verdict."""
    shares = gang_shares(ranks)
    out = []
    if shares["share_data"] > STARVED_SHARE:
        out.append(f"starved: {shares['share_data']:.0%} of the step waits for data (rule: > {STARVED_SHARE:.0%}); "
                   "decode on the GPU (DALI mixed), give the workers more CPU (cpu-per-worker), or warm the cache (warm-cache=true)")
    stragglers = _stragglers(ranks)
    out += stragglers
    across_nodes = len({r.node for r in ranks}) > 1  # on one node the sync never crosses a fabric
    if not stragglers and across_nodes and all(r.sync_measured for r in ranks) and shares["share_sync"] > FABRIC_SHARE:
        then = ("adding nodes will not pay: " if shares["share_sync"] > NO_SCALE_SHARE else "") + \
            "check InfiniBand/RoCE and NCCL_IB_DISABLE / NCCL_SOCKET_IFNAME"
        out.append(f"fabric-bound: {shares['share_sync']:.0%} of the step waits for gradient sync "
                   f"(rule: > {FABRIC_SHARE:.0%}; > {NO_SCALE_SHARE:.0%}: more nodes will not pay); {then}")
    return out


def _stragglers(ranks: list[RankEpoch]) -> list[str]:
    own = [r.own_per_step for r in ranks]
    median = statistics.median(own) if own else 0.0
    return [f"straggler: rank {r.rank} on {r.where} takes {r.own_per_step * 1000:.0f} ms of its own per step, "
            f"{r.own_per_step / median:.1f}x the gang's median (rule: >= {STRAGGLER_RATIO}x over >= {STRAGGLER_STEPS} steps); "
            "every other rank waits for it at each all-reduce — check that node (GPU clocks, thermal, noisy neighbours) "
            "or its shards"
            for r in ranks
            if len(ranks) > 1 and r.steps >= STRAGGLER_STEPS and median > 0 and r.own_per_step >= STRAGGLER_RATIO * median]
