"""Gang preflight: before the first step, every link of the gang's ring is timed, and a gang with
one link far slower than the others is not trained on.

A gang is as fast as its slowest link: one node with a degraded NIC (a bad cable, a port that
fell back to a lower speed, a misrouted RoCE queue) makes every all-reduce wait, for the whole
run, with nothing failing. After the process group is up and before training, every rank sends
:data:`PAYLOAD_BYTES` to the next rank of the ring and receives from the previous one, a few
rounds; each rank's median time is gathered by all. A rank whose time is more than
:data:`SLOW_FACTOR` times the fastest rank's (and at least :data:`MIN_SLOW_S`) is on a slow link:
the attempt fails as the infrastructure's (retried within the run's budget), the
message naming the ranks, their pods' nodes and the times. The exit code is 76
(:attr:`~pipectl.components.contracts.ExitCode.AVOID_NODES`) and the pod's termination message
ends with ``avoid nodes: <node>,...``: the gang's job ends, and the train step's next attempt is
placed away from those nodes (``gang-avoid``: :mod:`pipectl.components.gang.avoid`). In a ring a rank's time covers its
send to the next rank and its receive from the previous one, so a slow link shows on the two
ranks at its ends, both named — and not on the others, so the fastest rank is a healthy reference.

It needs three processes or more (with two, both ranks wait on the same pair of transfers and
no link stands out) and costs a few all-to-neighbour transfers: well under a second per round on
a healthy fabric. ``gang-preflight=false`` skips it for a run.

Fault injection (tests, drills): ``PIPECTL_PREFLIGHT_DELAY_RANK=R`` and
``PIPECTL_PREFLIGHT_DELAY_S=S`` delay rank R's sends by S seconds each round, as a slow outbound
link would.
"""

from __future__ import annotations

import logging
import os
import socket
import statistics
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipectl.components.contracts import AVOID_NODES_MARK, ExitCode
from pipectl.components.names import NODE_NAME_ENV
from pipectl.components.runtime import StepError

log = logging.getLogger("pipectl.train")

PAYLOAD_BYTES = 8 * 1024 * 1024
ROUNDS = 3
SLOW_FACTOR = 4.0
"""A rank this many times slower than the fastest is on a slow link (a healthy fabric's ranks are
within tens of percent of each other; a link that fell back to a lower speed is several times slower)."""
MIN_SLOW_S = 0.05
"""Times under this are never called slow: a fabric moves 8 MiB in milliseconds (67 ms at 1 Gb/s),
and below this scheduling noise dominates."""
DELAY_RANK_ENV, DELAY_S_ENV = "PIPECTL_PREFLIGHT_DELAY_RANK", "PIPECTL_PREFLIGHT_DELAY_S"


TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath: what the pod's status shows as its message."""


@dataclass(frozen=True)
class RankTime:
    rank: int
    node: str
    seconds: float


class SlowLinkError(StepError):
    """A slow link in the gang's ring: the infrastructure's, exit 76 (the next attempt avoids
    :attr:`nodes`), not 75 (a restart of the same job would land on the same nodes)."""

    def __init__(self, headline: str, hint: str, nodes: list[str]) -> None:
        super().__init__(headline, hint, transient=True)
        self.nodes = nodes

    @property
    def step_exit(self) -> ExitCode:
        return ExitCode.AVOID_NODES

    def termination_message(self) -> str:
        return f"{self.headline}\n{AVOID_NODES_MARK}{','.join(self.nodes)}"


def report_slow_link(error: SlowLinkError) -> None:
    """The verdict as the pod's termination message (in a container: Kubernetes creates the file),
    where ``gang-avoid`` reads the nodes; every process of the pod writes the same text."""
    import contextlib

    with contextlib.suppress(OSError):
        if os.path.exists(TERMINATION_LOG):
            with open(TERMINATION_LOG, "w") as f:
                f.write(error.termination_message())


def _round(rank: int, world: int, payload: torch.Tensor, inbox: torch.Tensor, delay_s: float) -> float:
    """Seconds for this rank's send to the next rank and receive from the previous one."""
    dist.barrier()
    t0 = time.perf_counter()
    receiving = dist.irecv(inbox, src=(rank - 1) % world)
    if delay_s:
        time.sleep(delay_s)
    sending = dist.isend(payload, dst=(rank + 1) % world)
    receiving.wait()
    sending.wait()
    return time.perf_counter() - t0


def ring_times(rounds: int = ROUNDS, payload_bytes: int = PAYLOAD_BYTES) -> list[RankTime]:
    """Every rank's median ring time, the same list on every rank (a collective)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    payload = torch.ones(payload_bytes // 4, dtype=torch.float32, device=device)
    inbox = torch.empty_like(payload)
    delay_s = float(os.environ.get(DELAY_S_ENV, "0")) if os.environ.get(DELAY_RANK_ENV) == str(rank) else 0.0
    _round(rank, world, payload, inbox, 0.0)  # warm-up: connections, buffers
    mine = statistics.median(_round(rank, world, payload, inbox, delay_s) for _ in range(rounds))
    node = os.environ.get(NODE_NAME_ENV) or socket.gethostname()
    gathered: list = [None] * world
    dist.all_gather_object(gathered, (mine, node))
    return [RankTime(r, n, s) for r, (s, n) in enumerate(gathered)]


def slow_ranks(times: list[RankTime]) -> list[RankTime]:
    """The ranks on a slow link (see the module doc), slowest first; none with fewer than 3 ranks."""
    if len(times) < 3:
        return []
    fastest = min(t.seconds for t in times)
    return sorted((t for t in times if t.seconds > max(SLOW_FACTOR * fastest, MIN_SLOW_S)), key=lambda t: -t.seconds)


def check_gang() -> list[RankTime]:
    """Time the ring; StepError (transient: the infrastructure's) when a link is slow. Returns the
    times (none with fewer than 3 processes: nothing to compare)."""
    if dist.get_world_size() < 3:
        return []
    times = ring_times()
    median = statistics.median(t.seconds for t in times)
    slow = slow_ranks(times)
    if slow:
        # every rank took the same decision from the same gathered times: end the group together,
        # so that no rank's exit tears the gloo connections down under another's background threads
        # (seen: one worker aborted with SIGABRT at exit, which reads as a code failure, not 75)
        dist.barrier()
        dist.destroy_process_group()
        named = ", ".join(f"rank {t.rank} on node {t.node} ({t.seconds * 1000:.0f} ms)" for t in slow)
        error = SlowLinkError(f"gang preflight: a slow link in the gang's ring: {named}, against "
                              f"{min(t.seconds for t in times) * 1000:.1f} ms on the fastest rank for {PAYLOAD_BYTES >> 20} MiB "
                              "to the next rank",
                              "check those nodes' network (link speed, errors, NCCL/RoCE settings); the next attempt "
                              "is placed on other nodes where there is room",
                              list(dict.fromkeys(t.node for t in slow)))
        report_slow_link(error)
        raise error
    if dist.get_rank() == 0:
        log.info("gang preflight: %d ranks, ring %.1f ms median, %.1f ms slowest", len(times), median * 1000,
                 max(t.seconds for t in times) * 1000)
    return times


def run_preflight() -> int | None:
    """In a process of a gang that runs the user's own torchrun code (:mod:`runner`): the ring
    timed in a process group of its own, then torn down. Returns the exit code of a slow link
    (76: the infrastructure's; the next attempt avoids its nodes), None when the gang is sound."""
    import datetime

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    gpu = torch.cuda.is_available()
    if gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    # the gang's own store (torchrun's, at MASTER_ADDR:MASTER_PORT) under a prefix of its own: the
    # user's init_process_group after this one then meets no key this group left behind (with the
    # same keys, a second default group in one process waits forever on the first one's barrier)
    store = dist.PrefixStore("pipectl-preflight/", dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=datetime.timedelta(minutes=5)))
    dist.init_process_group("nccl" if gpu else "gloo", store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        check_gang()
    except StepError as e:
        print(f"error: {e.headline}\nhint: {e.hint}", file=sys.stderr, flush=True)
        return int(e.step_exit)
    dist.barrier()
    dist.destroy_process_group()
    return None
