"""`python -m pipectl.components.train.launch ARGS`: torchrun that keeps the step's exit code.

torchrun (``torch.distributed.run``) exits 1 whatever ended its workers: a worker that exited 75
(EX_TEMPFAIL, a transient failure worth retrying: ``ExitCode`` in contracts.py) and a worker killed by a
bug both become exit 1, and a SIGTERM from the kubelet (node shutdown, eviction) becomes a
traceback and exit 1. The gang's retry rules (Volcano Job policies in pipelines/pipectl/pipelines/launchers/volcano.py, Argo's
retryStrategy in pipelines/pipectl/pipelines/policy.py) tell infrastructure from code by exit code, so this wrapper
runs torchrun's own ``main`` unchanged and maps its outcome:

- torchrun itself got SIGTERM/SIGINT/... (``SignalException``): 128 + the signal number (143 for
  the kubelet's SIGTERM: node shutdown, eviction, preemption) — the infrastructure ended the pod;
  the same at once when the signal comes before the workers started (importing torch, waiting in
  the rendezvous for the gang's peers: :mod:`pipectl.components.train.stop`);
- a worker exited 75 (EX_TEMPFAIL): 75, declared transient;
- a worker exited 76: the gang preflight found a slow link (:mod:`pipectl.components.train.preflight`):
  76, the job ends and the next attempt avoids the nodes it named;
- a worker killed by SIGKILL while this process lives: the kernel's OOM killer inside the
  container (the kubelet and the runtime kill the whole container, this process first): a code
  failure, 1, unless ``PIPECTL_RETRY_OOM=1`` (the retry policy's ``retry_oom``), then 137;
- a failure torch records as the infrastructure's (:mod:`pipectl.components.train.faults`: the
  gang's rendezvous timing out in torchrun's agent before any worker ran, a GPU hardware fault or
  a collective timeout in a worker's recorded exception): 75, with the fault and the node on
  stderr and as the pod's termination message;
- any other worker failure (exit 1, 2, a traceback, SIGSEGV, SIGBUS from a full /dev/shm): 1;
- success: 0.

So the container's exit code has exactly one code-failure value, 1, and the gang's policy can end
the job on 1 and restart it on everything else a failed pod can show — 143, 137 (killed from
outside the container), 75, or no exit code at all (a pod the kubelet failed before or without
recording its container's end: node-pressure eviction, admission rejection after a node restart;
field case C07). See :data:`pipectl.pipelines.launchers.volcano.VOLCANO_POLICIES`.

Arguments are torchrun's, unchanged (``--nnodes``, ``--nproc-per-node``, ``-m MODULE`` ...).

Loopback rendezvous: torchrun's rendezvous store (a ``TCPStore`` server in the rank-0
agent) listens on every interface (``::``), whatever ``--master-addr`` says (seen with torch 2.15).
On one machine (the local backend: a loopback master address) that would expose the gang's
store to the network, so node rank 0 first starts the store itself on a socket bound to the
loopback address (``master_listen_fd``) as a ``multi_tenant`` store, which torchrun's static
rendezvous then reuses for the same port. In a pod the master address is the pod's, and the
store stays as torchrun makes it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import signal
import socket
import sys
from typing import Any

from pipectl.components.train.stop import StopSignals

if __name__ == "__main__":  # first, before the imports below: see pipectl.components.train.stop
    StopSignals.install()

from pipectl.components.contracts import ExitCode  # noqa: E402 - after the stop signals' handler
from pipectl.components.names import NODE_NAME_ENV, PUBLISH_ONNX_ENV, RETRY_OOM_ENV  # noqa: E402
from pipectl.components.train import publish  # noqa: E402
from pipectl.components.train.faults import INFRASTRUCTURE_FAULTS, Fault, classify, recorded_message  # noqa: E402

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def _torchrun_args(argv: list[str]) -> argparse.Namespace:
    """The torchrun options this wrapper reads (the rest stays torchrun's)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--master-addr", "--master_addr", default="127.0.0.1")
    parser.add_argument("--master-port", "--master_port", type=int, default=29500)
    parser.add_argument("--node-rank", "--node_rank", type=int, default=0)
    parser.add_argument("--nnodes", default="1")
    parser.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    parser.add_argument("--standalone", action="store_true")
    return parser.parse_known_args(argv)[0]


def _loopback_store(argv: list[str]) -> tuple[Any, socket.socket] | None:
    """Rank 0 on a loopback master: a multi-tenant TCPStore listening on loopback only (see the
    module doc), returned with its socket (both must live until torchrun ends); else None."""
    known = _torchrun_args(argv)
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


OWN_TARGET = "pipectl.components.train"
"""torchrun's target when pipectl's train function runs (it times the gang and ends its processes itself)."""
RUNNER_TARGET = "pipectl.components.train.runner"


_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "--run-path", "--run_path"}
"""torchrun's options that take no value (every other one does: ``--opt=value`` or ``--opt value``)."""


def _target_at(argv: list[str]) -> int:
    """Index in ``argv`` of torchrun's target: ``-m`` (a module), else the first argument that is
    no option nor an option's value (the script); len(argv) when there is none."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-m", "--module") or not a.startswith("-"):
            return i
        i += 1 if "=" in a or a in _TORCHRUN_FLAGS else 2
    return len(argv)


def with_runner(argv: list[str]) -> list[str]:
    """torchrun's arguments with pipectl's runner (:mod:`pipectl.components.train.runner`) in front
    of the user's own training code (``train(module=...)``/``script``, which pipectl does not run
    in-process): the target becomes ``-m pipectl.components.train.runner <the user's target and
    arguments>``; each process times the ring when the run asks for it, runs the user's target in
    the same process (no second torchrun, no other port) and ends cleanly. Unchanged for
    pipectl's own train function and for ``--no-python`` (the target is not Python)."""
    at = _target_at(argv)
    if at >= len(argv) or any(a in ("--no-python", "--no_python") for a in argv[:at]):
        return argv
    target = argv[at:]
    if target[0] in ("-m", "--module") and (len(target) < 2 or target[1] in (OWN_TARGET, RUNNER_TARGET)):
        return argv
    return [*argv[:at], "-m", RUNNER_TARGET, *("-m" if a == "--module" else a for a in target[:1]), *target[1:]]


def main(argv: list[str] | None = None) -> int:
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    argv = with_runner(sys.argv[1:] if argv is None else argv)
    publishes = os.environ.get(PUBLISH_ONNX_ENV) == "1" and _torchrun_args(argv).node_rank == 0
    if publishes:  # an earlier attempt's file is not this attempt's model
        publish.model_path().unlink(missing_ok=True)
    try:
        store = _loopback_store(argv)  # noqa: F841 - kept alive until torchrun returns
        torchrun_main(argv)
        return _published(_torchrun_args(argv)) if publishes else 0
    except ChildFailedError as e:
        _, failure = e.get_first_failure()
        fault = classify(recorded_message(failure.error_file_data)) if failure.exitcode > 0 else None
        if fault is not None:
            return infrastructure_exit(fault, recorded_message(failure.error_file_data), f"rank {failure.local_rank} (local)")
        return container_exit_code(failure.exitcode, retry_oom=os.environ.get(RETRY_OOM_ENV) == "1")
    except SignalException as e:
        return 128 + int(e.sigval)
    except (DistError, RendezvousError) as e:  # torchrun's agent: the gang's store or rendezvous (C20)
        recorded = f"{type(e).__name__}: {e}"
        return infrastructure_exit(classify(recorded) or INFRASTRUCTURE_FAULTS[0], recorded, "the agent")
    except SystemExit as e:  # torchrun's own argument errors: the spec's fault, never restarted
        return int(ExitCode.FAILED) if e.code not in (None, 0) else 0


def _published(known: argparse.Namespace) -> int:
    """Node rank 0 of ``train(module=..., exports_onnx=True)`` after success: publish the model the
    code wrote (:mod:`.publish`); 1 for a missing or unusable file, 75 for an unreachable store."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from pipectl.components.runtime import classify_exception

    try:
        nnodes, nproc = str(known.nnodes).split(":")[-1], str(known.nproc_per_node)
        out = publish.publish(world_size=int(nnodes) * int(nproc) if nnodes.isdigit() and nproc.isdigit() else 0)
    except SignalException:
        raise  # told to stop while publishing (torchrun's handler is still set): main's 128 + N
    except Exception as e:  # the step's boundary: a message and an exit code, as step_main does
        print(f"error: {getattr(e, 'headline', None) or f'{type(e).__name__}: {e}'}", file=sys.stderr, flush=True)
        if getattr(e, "hint", ""):
            print(f"hint: {e.hint}", file=sys.stderr, flush=True)
        return int(classify_exception(e))
    print(f"pipectl: published the training code's model as {out.model_uri} (MLflow run {out.mlflow_run_id})",
          file=sys.stderr, flush=True)
    return 0


TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default terminationMessagePath: what the pod's status shows as its message."""


def infrastructure_exit(fault: Fault, recorded: str, where: str) -> int:
    """Report an infrastructure fault (its class, the node, the recorded exception) on stderr and
    as the pod's termination message, and return 75: the gang restarts within its budget."""
    node = os.environ.get(NODE_NAME_ENV) or socket.gethostname()
    line = f"infrastructure fault ({fault.name}) on node {node}, {where}: {recorded.splitlines()[0][:300]} — {fault.hint}"
    print(f"pipectl: {line}", file=sys.stderr, flush=True)
    with contextlib.suppress(OSError):
        if os.path.exists(TERMINATION_LOG):
            with open(TERMINATION_LOG, "w") as f:
                f.write(line)
    return int(ExitCode.TEMPFAIL)


def container_exit_code(worker_exit: int, *, retry_oom: bool = False) -> int:
    """The container's exit code for a failed worker: ``worker_exit`` is torchrun's (a negative
    number -N for a worker killed by signal N). 75 stays 75 and 76 (the gang preflight's slow
    link: :mod:`.preflight`) 76; SIGKILL (-9: the OOM killer, see the
    module doc) is 1, or 137 with ``retry_oom``; every other failure is 1."""
    if worker_exit in (int(ExitCode.TEMPFAIL), int(ExitCode.AVOID_NODES)):
        return worker_exit
    if worker_exit == -signal.SIGKILL:
        print(f"a training process was killed by SIGKILL inside the container: the kernel's OOM killer "
              f"(memory.oom_kill: {_oom_kills()}); {'retried (retry_oom)' if retry_oom else 'not retried: raise memory-gib-per-worker'}",
              file=sys.stderr, flush=True)
        return 128 + signal.SIGKILL if retry_oom else int(ExitCode.FAILED)
    return int(ExitCode.FAILED)


def _oom_kills() -> str:
    """The container cgroup's OOM-kill count (cgroup v2 memory.events, v1 memory.oom_control), or "unknown"."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"), ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            for line in open(path).read().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return value
        except OSError:
            continue
    return "unknown"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
