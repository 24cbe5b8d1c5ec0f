"""`python -m pipectl.components.train.launch ARGS`: torchrun that keeps the step's exit code.

torchrun (``torch.distributed.run``) exits 1 whatever ended its workers: a worker that exited 75
(EX_TEMPFAIL, a transient failure worth retrying: DESIGN.md exit codes) and a worker killed by a
bug both become exit 1, and a SIGTERM from the kubelet (node shutdown, eviction) becomes a
traceback and exit 1. The gang's retry rules (Volcano Job policies in pipelines/launchers/volcano.py, Argo's
retryStrategy in pipelines/policy.py) tell infrastructure from code by exit code, so this wrapper
runs torchrun's own ``main`` unchanged and maps its outcome:

- a worker failed (``ChildFailedError``): the first failure's exit code (the failure torchrun
  reports as root cause); a worker killed by signal N: 128 + N (shell convention);
- torchrun itself got SIGTERM/SIGINT/... (``SignalException``): 128 + the signal number;
- success: 0.

Arguments are torchrun's, unchanged (``--nnodes``, ``--nproc-per-node``, ``-m MODULE`` ...).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(argv)
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        code = failure.exitcode
        return 128 - code if code < 0 else (code or 1)
    except SignalException as e:
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
