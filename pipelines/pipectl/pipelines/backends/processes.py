"""The one process supervisor: start processes in sessions of their own with their output in a
log file, wait for them to be ready, and stop them with everything they started.

Used by the local backend (gang processes, :mod:`.runner`), the embedded services
(:mod:`.services`) and the test harness (the loopback cluster, the real node, Ceph, Alluxio).

Stopping is by process tree, not by process group alone: torchrun starts its workers in sessions
of their own, so signalling torchrun's group leaves them running (seen with torch 2.15); the tree
is collected before anything is signalled, so children re-parented on the way are not missed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable


class ProcessError(RuntimeError):
    """A supervised process exited or did not become ready; ``log_path`` has its output (or None)."""

    def __init__(self, message: str, log_path: Path | None = None) -> None:
        super().__init__(message)
        self.log_path = log_path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now (the OS picks it; another process may take it later)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports (all held open together while they are picked)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def spawn(argv: list[str], log_path: Path | None, env: dict[str, str] | None = None, *,
          cwd: Path | str | None = None, stdin: int | None = subprocess.DEVNULL) -> subprocess.Popen:
    """Start ``argv`` in a new session (its own process group), stdout and stderr appended to
    ``log_path`` (discarded when None). ``env`` replaces the environment when given."""
    if log_path is None:
        out: int | object = subprocess.DEVNULL
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=out, stderr=out, start_new_session=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def kill_tree(pid: int, sig: int = signal.SIGKILL, wait_s: float = 10.0) -> None:
    """Send ``sig`` to ``pid`` and every descendant (found before any is signalled); wait up to
    ``wait_s`` seconds for them to exit."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=wait_s)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = 0.0) -> int | None:
    """Stop ``proc`` (started by :func:`spawn`), its process group and its descendants; reap it.

    ``grace_s`` > 0: SIGTERM first and up to that many seconds to exit, then SIGKILL.
    Returns its exit status (None if it could not be reaped).
    """
    if grace_s > 0 and proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        kill_tree(proc.pid, signal.SIGTERM, wait_s=grace_s)
    kill_tree(proc.pid, signal.SIGKILL)
    _signal_group(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        return None


def kill_group(pgid: int, grace_s: float = 0.0) -> None:
    """Stop the process group ``pgid`` known only by its id (a process :func:`spawn` started in an
    earlier Python process, e.g. a detached test cluster whose ids were written to a state file).

    ``grace_s`` > 0: SIGTERM first and up to that many seconds for the group to vanish, then
    SIGKILL; 0: SIGKILL at once. A group that is already gone is not an error."""
    if grace_s > 0:
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)


def die_with_parent(argv: list[str]) -> list[str]:
    """``argv`` run through util-linux ``setpriv --pdeathsig KILL``: Linux SIGKILLs the process when
    the thread that started it ends (a killed test run leaves no daemons behind). Unchanged when
    setpriv is missing. (Not a ``preexec_fn``: that is unsafe in a process with threads.)"""
    import shutil

    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--", *argv] if setpriv else list(argv)


def wait_until(what: str, ready: Callable[[], bool], timeout_s: float, *,
               procs: Iterable[tuple[str, subprocess.Popen, Path | None]] = (), poll_s: float = 0.2) -> None:
    """Poll ``ready()`` until it returns True (exceptions count as not ready).

    Raises :class:`ProcessError` as soon as one of ``procs`` (name, process, log) exits, or when
    ``timeout_s`` seconds pass (naming ``what``).
    """
    watched = list(procs)
    deadline = time.monotonic() + timeout_s
    while True:
        for name, proc, log in watched:
            if proc.poll() is not None:
                raise ProcessError(f"{name} exited with code {proc.returncode} while waiting for {what}", log)
        try:
            if ready():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            log = watched[0][2] if watched else None
            raise ProcessError(f"{what} not ready after {timeout_s:.0f} s", log)
        time.sleep(poll_s)


def http_ok(url: str, timeout_s: float = 1.0) -> bool:
    """True when ``url`` answers with a status below 500 (an HTTP error below 500 counts as up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - loopback services
            return r.status < 500
    except urllib.error.HTTPError as e:
        return e.code < 500


def listens(pid: int, port: int) -> bool:
    """True when process ``pid`` or one of its descendants listens on TCP ``port``: the answer
    on a port comes from the server started there, not from another process that took the port
    between :func:`free_port` and the server's bind (an HTTP check alone cannot tell them apart)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for proc in procs:
        try:
            conns = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False


def tcp_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when a TCP connection to ``host:port`` succeeds."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False
