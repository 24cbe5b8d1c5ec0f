"""A stop signal to the gang pod's first process is never lost, whenever it comes.

The kubelet stops a gang pod (preemption, eviction, drain, a stopped run deleting its gang) with
SIGTERM to the container's first process, pipectl's launcher, then SIGKILL after the grace
period. Where the launcher is its PID namespace's first process (a container without an init:
``docker run``, a pod that does not share its PID namespace — pipectl's gang pods do), the kernel
delivers it a signal only when it has a handler for it. Python has none for SIGTERM, so until
torchrun installs its own (after its rendezvous, when it starts the workers) the signal is
dropped — through the seconds of importing torch and waiting for the gang's peers — and the pod
keeps its node, and its GPUs, for the whole grace period. A Python handler alone would not do
either: it runs only between bytecodes of the main thread, and torchrun's agent waits for its
peers inside one C++ call (the rendezvous store).

:meth:`StopSignals.install` therefore sets, before anything else is imported, a handler (so the
kernel delivers the signal) and a thread that learns of the signal from the interpreter's wakeup
file descriptor (written by the C-level handler, whatever the main thread is doing) and ends the
process at once, 128 + the signal number, while the handler is still this one — no training
process exists then, so there is nothing to checkpoint. Once torchrun has its own
handler (the workers run), the signal is torchrun's: it passes it on to the workers, which
checkpoint, then yield (:mod:`pipectl.components.train.preemption`).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class StopSignals:
    """The handlers and the wakeup-fd watcher of :meth:`install` (call it once, from the main thread)."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.signals = signals
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for sig in signals:
            signal.signal(sig, self._handler)
        threading.Thread(target=self._watch, name="stop-signals", daemon=True).start()

    @classmethod
    def install(cls, signals: tuple[int, ...] = STOP_SIGNALS) -> "StopSignals":
        return cls(signals)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        """Present so that the signal is delivered; :meth:`_watch` acts on it."""

    def owns(self, signum: int) -> bool:
        """This object's handler is still the one for ``signum`` (torchrun has not replaced it)."""
        return signal.getsignal(signum) == self._handler

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            for signum in data:
                if signum in self.signals and self.owns(signum):
                    os._exit(128 + signum)  # nothing started yet: nothing to save, nothing to wait for
