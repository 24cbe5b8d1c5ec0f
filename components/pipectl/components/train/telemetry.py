"""Step anatomy: where each rank's training step time goes, and what to do about it.

Every step of :meth:`TrainContext.batches` is split, per rank, into

- **data**: waiting for the batch (the shard stream, the copy to the device);
- **compute**: the rank's own forward and backward, up to the moment its last gradient is
  accumulated, which makes DDP's last bucket ready (a hook on each parameter, registered by
  :meth:`TrainContext.wrap`, notes that moment; DDP's all-reduce itself is left alone);
- **sync**: the gradient synchronisation the step actually waits for — from the last gradient
  to the end of the backward, when DDP has waited for every all-reduce and handed the averaged
  gradients over (DDP overlaps the earlier buckets with the backward: only this part is
  exposed) — and the gang's per-step stop check after it (one small all-reduce, where
  every rank meets: :class:`~pipectl.components.train.preemption.PreemptionWatch`);
- **optimizer**: the rest of the body (optimiser step, loss bookkeeping);
- **checkpoint**: writing checkpoints and the barrier after them.

Without the hooks (a model wrapped by the user's own DDP) compute holds the sync too. At the end of
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
"""A rank whose own time (data + compute + optimizer) per step is 20% above the other ranks'
median, over 20 steps, holds every other rank back at each all-reduce. Checked every 20 steps
(the last 20) and over each epoch of at least 20; a rank's time over a span is the median of its
steps (one step held up by a passing hiccup moves no verdict), compared with the median of the
other ranks' (in a gang of two: the other rank)."""


def place(node: str, pod: str) -> str:
    """``node N`` or ``node N (pod P)``."""
    return f"node {node}" + (f" (pod {pod})" if pod and pod != node else "")


GPU_MEMORY = "GPU memory"
"""The memory kind of a rank that trains on a GPU (:attr:`RankEpoch.memory_kind`)."""


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
    memory_peak_mib: float = 0.0
    """The most of the same the process has held so far (``torch.cuda.max_memory_allocated`` on a GPU
    rank; the peak resident memory on a CPU rank)."""
    pod: str = ""
    """The rank's pod on a cluster (empty on one machine, where the node says it all)."""
    own_median: float = 0.0
    """The median over the epoch's steps of this rank's own seconds per step (0: not measured)."""

    @property
    def where(self) -> str:
        """``node N`` or ``node N (pod P)``: where to look for this rank."""
        return place(self.node, self.pod)

    @property
    def on_gpu(self) -> bool:
        return self.memory_kind == GPU_MEMORY

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def images_per_s(self) -> float:
        """This rank's own throughput over the epoch: its images over the time of its own work (data,
        compute, optimizer). Over the wall clock every rank of a gang goes at one pace, the slowest's
        (the others wait for it at each all-reduce); this says which rank sets that pace."""
        own = self.own_per_step * self.steps
        return self.images / own if own > 0 else 0.0

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
    own: list[float] = field(default_factory=list)
    """This epoch's own seconds (data + compute + optimizer) of each step."""
    window: list[float] = field(default_factory=list)
    """The same since the last straggler check (:meth:`TrainContext` takes and clears it)."""
    _mark: float = 0.0
    _body: float = 0.0
    _waited: float = 0.0
    _ready: float | None = None
    _done: float | None = None

    def data_begin(self) -> None:
        self._mark = time.perf_counter()

    def body_begin(self, batch_size: int) -> None:
        """The batch is on the device: data wait ends, the train function's body begins."""
        now = time.perf_counter()
        self._waited = now - self._mark
        self.seconds["data"] += self._waited
        self._body, self._ready, self._done = now, None, None
        self.images += batch_size

    def grad_ready(self) -> bool:
        """A gradient of this step's backward is accumulated; True for the backward's first."""
        first = self._ready is None
        self._ready = time.perf_counter()
        return first

    def backward_end(self) -> None:
        self._done = max(self._done or 0.0, time.perf_counter())

    def body_end(self) -> None:
        now = time.perf_counter()
        ready = self._ready if self._ready is not None else now
        done = max(self._done or ready, ready)
        self.seconds["compute"] += ready - self._body
        self.seconds["sync"] += done - ready
        self.seconds["optimizer"] += max(0.0, now - done)
        self.steps += 1
        own = self._waited + (ready - self._body) + max(0.0, now - done)
        self.own.append(own)
        self.window.append(own)

    def checkpoint(self, seconds: float) -> None:
        self.seconds["checkpoint"] += seconds

    def gang_wait(self, seconds: float) -> None:
        """Time spent in a collective of the loop's own (the per-step stop check): ``sync``."""
        self.seconds["sync"] += seconds

    def epoch(self, rank: int) -> RankEpoch:
        """This rank's totals since the last call; the clock starts again."""
        node, pod = whereabouts()
        memory = memory_mib()
        out = RankEpoch(rank, node, self.steps, self.images, dict(self.seconds), self.hooked, memory.current, memory.kind,
                        memory.peak, pod, statistics.median(self.own) if self.own else 0.0)
        self.seconds, self.steps, self.images, self.own = dict.fromkeys(PARTS, 0.0), 0, 0, []
        return out


def whereabouts() -> tuple[str, str]:
    """(node, pod) of this process: the downward API's on a cluster, the host name and "" on one machine."""
    return os.environ.get(NODE_NAME_ENV) or socket.gethostname(), os.environ.get(POD_NAME_ENV, "")


@dataclass(frozen=True)
class Memory:
    """A process's memory now and at its peak (MiB), and what was measured."""

    current: float
    peak: float
    kind: str


def memory_mib() -> Memory:
    """On a GPU rank (CUDA in use by this process): the GPU memory its tensors hold now and at most
    so far (``torch.cuda.memory_allocated`` / ``max_memory_allocated``: the caching allocator's
    reserve, which stays near the GPU's size in a healthy run, is left out). On a CPU rank: its
    resident memory now and at its peak."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return Memory(torch.cuda.memory_allocated() / 2**20, torch.cuda.max_memory_allocated() / 2**20, GPU_MEMORY)
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB
    try:
        pages = int(open("/proc/self/statm").read().split()[1])
        current = pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        current = peak
    return Memory(current, max(peak, current), "resident memory")


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
    """Time the exposed gradient sync of a DistributedDataParallel model: a hook on every parameter
    notes when its gradient is accumulated (the last one makes DDP's last bucket ready), and the
    first of each backward queues the end-of-backward mark after DDP's finalisation.

    Why parameter hooks and not a communication hook: a Python communication hook replaces DDP's
    C++ all-reduce with a Python call per bucket and a Python callback on the communication
    thread per bucket (it waits for the GIL while the backward runs); measured with one, the step
    anatomy cost +2.5% of a 28 ms step (96 alternated pairs, 95% interval +1.4% to +3.6%;
    tests/bench/bench_telemetry.py). A gradient hook is one ``perf_counter`` per parameter, on
    the thread that runs the backward anyway."""

    def ready(_param: Any) -> None:
        if clock.grad_ready():
            _after_ddp_backward(clock.backward_end)

    for param in ddp.module.parameters():
        if param.requires_grad:
            param.register_post_accumulate_grad_hook(ready)
    clock.hooked = True


def _after_ddp_backward(fn: Any) -> None:
    """Call ``fn`` at the end of the running backward, after DDP's finalisation (which waits for
    every bucket's reduction and copies the averaged gradients to ``.grad``). DDP's reducer queues
    that as an autograd engine callback right after it calls the last bucket's hook
    (torch/csrc/distributed/c10d/reducer.cpp ``mark_variable_ready``); callbacks run in order,
    and one queued while they run goes to the end of the queue: so ``fn`` is queued from a callback."""
    from torch.autograd import Variable

    engine = Variable._execution_engine
    engine.queue_callback(lambda: engine.queue_callback(fn))


def gang_shares(ranks: list[RankEpoch]) -> dict[str, float]:
    """The gang's shares of step time per part, ``images_per_s`` and ``slowest_rank_ratio``."""
    total = sum(r.total for r in ranks) or 1.0
    out = {f"share_{p}": sum(r.seconds[p] for r in ranks) / total for p in PARTS}
    wall = max(r.total for r in ranks) or 1.0
    out["images_per_s"] = sum(r.images for r in ranks) / wall
    own = [r.own_per_step for r in ranks]
    out["slowest_rank_ratio"] = max(own) / statistics.median(own) if own and statistics.median(own) > 0 else 1.0
    out["memory_mib_max"] = max(r.memory_mib for r in ranks)
    out["memory_peak_mib_max"] = max(r.memory_peak_mib for r in ranks)
    return out


def rank_metrics(ranks: list[RankEpoch]) -> dict[str, float]:
    """Each rank's own figures of the epoch: ``rank<R>/images_per_s``, ``rank<R>/step_ms`` (its own
    time per step, median step), ``rank<R>/memory_mib`` and ``rank<R>/memory_peak_mib``."""
    out = {}
    for r in ranks:
        out[f"rank{r.rank}/images_per_s"] = r.images_per_s
        out[f"rank{r.rank}/step_ms"] = 1000 * (r.own_median or r.own_per_step)
        out[f"rank{r.rank}/memory_mib"] = r.memory_mib
        out[f"rank{r.rank}/memory_peak_mib"] = r.memory_peak_mib
    return out


def describe(ranks: list[RankEpoch], shares: dict[str, float], listed: int = 8) -> str:
    """The epoch's anatomy in one line: the shares, the gang's images/s, each rank's (up to
    ``listed`` ranks; more: the slowest), and the largest memory (now and peak)."""
    text = ", ".join(f"{p} {shares['share_' + p]:.0%}" for p in PARTS) + f"; {shares['images_per_s']:.0f} images/s"
    if len(ranks) > 1:
        ordered = sorted(ranks, key=lambda r: r.rank)
        each = ordered if len(ordered) <= listed else [min(ordered, key=lambda r: r.images_per_s)]
        label = "per rank" if len(ordered) <= listed else "slowest rank"
        text += f" ({label}: " + ", ".join(f"{r.rank}: {r.images_per_s:.0f}" for r in each) + ")"
    kind = ranks[0].memory_kind if ranks else "memory"
    return text + f"; {kind} {shares['memory_mib_max']:.0f} MiB (peak {shares['memory_peak_mib_max']:.0f} MiB)"


def verdicts(ranks: list[RankEpoch]) -> list[str]:
    """What the epoch's anatomy says, each with its rule (the thresholds above). A straggler
    explains the gang's sync wait (the others wait for it), so it replaces the fabric verdict; a
    gang on one node has no fabric verdict."""
    shares = gang_shares(ranks)
    out = []
    if shares["share_data"] > STARVED_SHARE:
        gpu = ranks and all(r.on_gpu for r in ranks)
        out.append(f"starved: {shares['share_data']:.0%} of the step waits for data (rule: > {STARVED_SHARE:.0%}); "
                   + ("decode on the GPU (DALI mixed), give the workers more CPU (cpu-per-worker), or warm the cache (warm-cache=true)"
                      if gpu else "give the workers more CPU (cpu-per-worker), or warm the cache (warm-cache=true)"))
    slow = _stragglers(ranks)
    out += slow
    across_nodes = len({r.node for r in ranks}) > 1  # on one node the sync never crosses a fabric
    if not slow and across_nodes and all(r.sync_measured for r in ranks) and shares["share_sync"] > FABRIC_SHARE:
        then = ("adding nodes will not pay: " if shares["share_sync"] > NO_SCALE_SHARE else "") + \
            "check InfiniBand/RoCE and NCCL_IB_DISABLE / NCCL_SOCKET_IFNAME"
        out.append(f"fabric-bound: {shares['share_sync']:.0%} of the step waits for gradient sync "
                   f"(rule: > {FABRIC_SHARE:.0%}; > {NO_SCALE_SHARE:.0%}: more nodes will not pay); {then}")
    return out


def _stragglers(ranks: list[RankEpoch]) -> list[str]:
    if any(r.steps < STRAGGLER_STEPS for r in ranks):
        return []
    own = [r.own_median or r.own_per_step for r in ranks]
    return stragglers(own, [f"rank {r.rank} on {r.where}" for r in ranks], "over the epoch", gpu=all(r.on_gpu for r in ranks))


def stragglers(own: list[float], who: list[str], span: str, *, gpu: bool = True) -> list[str]:
    """The straggler verdicts for a gang whose member ``who[i]`` (``rank R on node N``) took
    ``own[i]`` seconds of its own per step (its median over ``span``, at least
    :data:`STRAGGLER_STEPS` steps): each one at least :data:`STRAGGLER_RATIO` times the median of
    the others'. ``gpu``: the ranks train on GPUs (what to check on the node says so)."""
    check = "(GPU clocks, thermal, noisy neighbours)" if gpu else "(CPU throttling, its CPU limit, noisy neighbours)"
    out = []
    for i, mine in enumerate(own):
        others = own[:i] + own[i + 1:]
        median = statistics.median(others) if others else 0.0
        if median > 0 and mine >= STRAGGLER_RATIO * median:
            out.append(f"straggler: {who[i]} takes {mine * 1000:.0f} ms of its own per step {span}, "
                       f"{mine / median:.1f}x the other ranks' median (rule: >= {STRAGGLER_RATIO}x over >= {STRAGGLER_STEPS} steps, "
                       f"each rank's median step); every other rank waits for it at each all-reduce — check that node "
                       f"{check} or its shards")
    return out
