"""Checkpoint, then yield: a gang told to stop saves its step before it exits.

A gang pod is told to stop with SIGTERM and a grace period: preemption by an urgent lane, a
kubelet eviction, a node drain or shutdown, a stopped run. The kubelet signals the container's
first process, pipectl's launcher (torchrun's agent), which passes SIGTERM on to every training
process and gives them 30 s before SIGKILL (torch.distributed.elastic ``PContext.close``); the
pods' grace period is longer than that (:data:`GRACE_PERIOD_S`).

:class:`PreemptionWatch` turns the signal into a decision every rank takes at the same step: each
process notes a SIGTERM in a flag, and after every optimiser step the gang agrees (one all-reduce
of one integer: MAX over the ranks) whether any member was told to stop. Then rank 0 writes a
checkpoint of that step and every rank exits, so a preempted gang loses at most the step it was
in, not up to ``checkpoint-every-steps``. Without a process group (one process) the flag alone
decides.

Your own training loop gets the same::

    from pipectl.sdk import PreemptionWatch

    watch = PreemptionWatch()          # after init_process_group
    for step in range(start, total):
        train_one_step()
        if watch.should_stop():        # every rank gets the same answer
            if rank == 0:
                save_checkpoint(step)
            sys.exit(143)
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

GRACE_PERIOD_S = 60
"""``terminationGracePeriodSeconds`` of gang pods: torchrun's 30 s for its workers to end after
the SIGTERM, plus the time to write a checkpoint to the store and leave (measured for the digits
model in well under a second; a large model's checkpoint is what this margin is for)."""


class PreemptionWatch:
    """Notes SIGTERM in this process; :meth:`should_stop` says, the same on every rank, whether
    any rank of the gang was told to stop. Create it once per process, after the process group."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self._told = False
        self._previous: dict[int, Any] = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._told = True

    @property
    def told(self) -> bool:
        """This process got the signal."""
        return self._told

    def should_stop(self) -> bool:
        """True on every rank when any rank was told to stop (a collective: call it on every rank,
        at the same point of the loop)."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self._told
        backend = dist.get_backend()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        flag = torch.tensor([1 if self._told else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def close(self) -> None:
        """Give the signals their earlier handlers back."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
