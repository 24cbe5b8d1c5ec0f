"""The process pipectl puts in front of a user's own training code in each torchrun process.

``python -m pipectl.components.train.runner (-m MODULE | SCRIPT) [ARGS...]`` — the launcher
rewrites torchrun's target to this (:func:`pipectl.components.train.launch.with_runner`) for a
pipeline's ``train(module=...)`` or ``script``. In each process it:

1. times the gang's ring (:mod:`preflight`) when the run asks for it (``gang-preflight``, on by
   default) and the gang has 3 processes or more; a slow link ends the process with 76 before
   the user's code starts;
2. runs the user's target in this same process as ``__main__`` with its own ``sys.argv``, as
   torchrun would have run it (same environment, rank variables, port);
3. ends the process with the target's exit status through :func:`process_end.end_process`, so
   that torch's teardown cannot turn a finished run into a SIGABRT at interpreter exit.

Exit status as Python gives it: 0 at the end of the code, ``SystemExit``'s code, 1 with the
traceback printed for an exception the code did not catch.
"""

from __future__ import annotations

import os
import runpy
import sys

from pipectl.components.train.process_end import end_process

PREFLIGHT_ENV = "PIPECTL_TRAIN_GANG_PREFLIGHT"
"""The run's ``gang-preflight`` parameter, in the gang's environment (``true``/``false``)."""
PREFLIGHT_MIN_PROCESSES = 3
"""With two processes both ranks wait on the same pair of transfers: no link stands out."""

USAGE = "usage: python -m pipectl.components.train.runner (-m MODULE | SCRIPT) [ARGS...]"


def _wants_preflight() -> bool:
    world = os.environ.get("WORLD_SIZE", "1")
    return (os.environ.get(PREFLIGHT_ENV, "true") == "true" and world.isdigit()
            and int(world) >= PREFLIGHT_MIN_PROCESSES)


def _exit_status(e: SystemExit) -> int:
    """The status Python gives a ``SystemExit``: None is 0, an int is itself, anything else is
    printed to stderr and is 1."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


def run_target(argv: list[str]) -> int:
    """Run ``-m MODULE ARGS`` or ``SCRIPT ARGS`` as ``__main__``; its exit status."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python SCRIPT` does
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:
        return _exit_status(e)
    except Exception:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def main(argv: list[str]) -> int:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 2
    if _wants_preflight():
        from pipectl.components.train.preflight import run_preflight

        code = run_preflight()
        if code is not None:
            return code
    return run_target(argv)


if __name__ == "__main__":
    end_process(main(sys.argv[1:]))
