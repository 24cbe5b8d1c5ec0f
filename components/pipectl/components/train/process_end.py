"""How a training process ends once its work is done: as Python would, but without the
interpreter's finalization.

Why. torch's gloo worker threads (``pt_gloo_runloop``) can still hold the last reference to a
finished collective when the main thread returns: the final barrier's work keeps the earlier
all-gathers, and their tensors keep Python objects. When such a thread drops it while the
interpreter is finalizing, it needs the GIL to free those objects; Python ends the thread
instead (``PyThread_exit_thread``), and that unwind through a C++ destructor calls
``std::terminate``: the process dies by SIGABRT ("terminate called without an active
exception") after all its work was done, and a worker killed by SIGABRT reads as a failure of
the code. Seen in a core dump of the built-in train loop's rank 1 (``ProcessGroupGloo::runLoop``
→ ``~AsyncBarrierWork`` → ``decref`` → ``take_gil`` → ``PyThread_exit_thread`` → ``abort``) and
in a user's script's rank 0 after its own ``destroy_process_group`` — the user's code does
nothing wrong; the race is in torch's teardown.

So :func:`end_process` does what finalization would do for the program — threading's exit
hooks and a join of the threads that are not daemons, then the ``atexit`` handlers (MLflow ends its run, logging flushes),
flushes every open file — and then ``os._exit(code)``: no C++ destructor runs and no other
thread runs on. Used by pipectl's own train step (its ``__main__``) and by
:mod:`pipectl.components.train.runner`, which pipectl puts in front of a user's training code.

Example::

    from pipectl.components.train.process_end import end_process

    end_process(main())  # never returns
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import threading
from typing import NoReturn


def _join_threads() -> None:
    """What the interpreter does first at exit (``threading._shutdown``): threading's own exit
    hooks — every ``concurrent.futures`` executor tells its idle workers to stop (MLflow's async
    logging pools are such workers) — then every thread that is not a daemon is joined. Joining
    those workers without the hooks first would wait for ever."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None and threading.current_thread() is threading.main_thread():
        shutdown()


def _flush_open_files() -> None:
    """Flush every open file object (finalization would close them: a program that left a
    file open still finds its last writes on disk)."""
    for obj in gc.get_objects():
        if issubclass(type(obj), io.IOBase):  # type(), not isinstance: no object's __class__ is run
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except Exception:  # noqa: BLE001 - best effort, as finalization's own closing is
                pass


def end_process(code: int) -> NoReturn:
    """End this process with ``code`` after what finalization would do for the program (see the
    module's docstring); never returns."""
    try:
        _join_threads()
        atexit._run_exitfuncs()  # prints what a handler raises, as at a normal exit
        _flush_open_files()
    finally:
        os._exit(code)
