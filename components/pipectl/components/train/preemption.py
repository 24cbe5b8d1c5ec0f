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
    watch.close()                      # a stop that came after the last check ends the process now

Only the steps are watched: before the loop and after :meth:`PreemptionWatch.close` a stop signal
ends the process at once (nothing is left to save there), so a stop is never noted where no one
will answer it and the pod never holds its node until the grace period's SIGKILL.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

log = logging.getLogger("pipectl.train")

GRACE_PERIOD_S = 60
"""``terminationGracePeriodSeconds`` of gang pods: torchrun's 30 s for its workers to end after
the SIGTERM, plus the time to write a checkpoint to the store and leave (measured for the digits
model in well under a second; a large model's checkpoint is what this margin is for)."""


class PreemptionWatch:
    """Notes SIGTERM in this process; :meth:`should_stop` says, the same on every rank, whether
    any rank of the gang was told to stop. Create it once per process, after the process group."""

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
        self._told: int | None = None
        self._answered = False
        self._previous: dict[int, Any] = {}
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._note)

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self._told = self._told or signum

    @property
    def told(self) -> bool:
        """This process got the signal."""
        return self._told is not None

    def should_stop(self) -> bool:
        """True on every rank when any rank was told to stop (a collective: call it on every rank,
        at the same point of the loop)."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            stop = self.told
        else:
            backend = dist.get_backend()
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
            flag = torch.tensor([1 if self.told else 0], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        self._answered = self._answered or stop
        return stop

    def close(self) -> None:
        """Give the signals their earlier handlers back. A signal this watch noted that no
        :meth:`should_stop` answered (it came in the last step, or after the loop's last check) is
        delivered again, now to those handlers: a stop is never swallowed (by default it ends the
        process at once, as it would have without the watch), so the pod does not hold its node
        until the grace period's SIGKILL."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._told is not None and not self._answered:
            told, self._told = self._told, None
            log.warning("told to stop (signal %d) after the last check of the steps: stopping now", told)
            signal.raise_signal(told)
