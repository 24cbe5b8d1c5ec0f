"""`python -m pipectl.components.train.launch ARGS`: torchrun that keeps the step's exit code.

torchrun (``torch.distributed.run``) exits 1 whatever ended its workers: a worker that exited 75
(EX_TEMPFAIL, a transient failure worth retrying: DESIGN.md exit codes) and a worker killed by a
bug both become exit 1, and a SIGTERM from the kubelet (node shutdown, eviction) becomes a
traceback and exit 1. The gang's retry rules (Volcano Job policies in pipelines/pipectl/pipelines/launchers/volcano.py, Argo's
retryStrategy in pipelines/pipectl/pipelines/policy.py) tell infrastructure from code by exit code, so this wrapper
runs torchrun's own ``main`` unchanged and maps its outcome:

- a worker failed (``ChildFailedError``): the first failure's exit code (the failure torchrun
  reports as root cause); a worker killed by signal N: 128 + N (shell convention);
- torchrun itself got SIGTERM/SIGINT/... (``SignalException``): 128 + the signal number;
- success: 0.

Arguments are torchrun's, unchanged (``--nnodes``, ``--nproc-per-node``, ``-m MODULE`` ...).

Loopback rendezvous (issue 13): torchrun's rendezvous store (a ``TCPStore`` server in the rank-0
agent) listens on every interface (``::``), whatever ``--master-addr`` says (seen with torch 2.15).
On one machine (the local backend: a loopback master address) that would expose the gang's
store to the network, so node rank 0 first starts the store itself on a socket bound to the
loopback address (``master_listen_fd``) as a ``multi_tenant`` store, which torchrun's static
rendezvous then reuses for the same port. In a pod the master address is the pod's, and the
store stays as torchrun makes it.
"""

from __future__ import annotations

import argparse
import datetime
import socket
import sys
from typing import Any

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _loopback_store(argv: list[str]) -> tuple[Any, socket.socket] | None:
    """Rank 0 on a loopback master: a multi-tenant TCPStore listening on loopback only (see the
    module doc), returned with its socket (both must live until torchrun ends); else None."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=29500)
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--standalone", action="store_true")
    known, _ = parser.parse_known_args(argv)
    if known.standalone or known.node_rank != 0 or known.master_addr not in LOOPBACK:
        return None
    import torch.distributed as dist

    family = socket.AF_INET6 if known.master_addr == "::1" else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", known.master_port))
    sock.listen(128)
    store = dist.TCPStore(known.master_addr, known.master_port, int(str(known.nnodes).split(":")[-1]), True,
                          datetime.timedelta(minutes=15), wait_for_workers=False, multi_tenant=True,
                          master_listen_fd=sock.fileno())
    return store, sock


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    argv = sys.argv[1:] if argv is None else argv
    store = _loopback_store(argv)  # noqa: F841 - kept alive until torchrun returns
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
