"""The named processes of one test fixture (control plane, real node, Ceph, Alluxio).

Every process mechanic — a session of its own, output to a log file, stopping the process with
its whole tree, waiting for readiness while watching for an exit — is the product's one process
supervisor, :mod:`pipectl.pipelines.backends.processes`. This class only keeps what the fixtures
share on top of it: a name per process (for state files, stop orders, log names and error
messages), the fixture's working folder and environment, and ``die_with_parent``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterable

from pipectl.pipelines.backends.processes import ProcessError, die_with_parent, spawn, stop, wait_until


class Components:
    """Processes by name: ``procs`` (name -> Popen, in start order).

    log_dir / log_suffix: each process logs to ``<log_dir>/<name><log_suffix>``.
    cwd: their working folder. base_env: a function giving the environment each starts from (None:
    this process's). die_with_parent: run each through ``setpriv --pdeathsig KILL``.
    on_change: called after a process is started or stopped (the fixtures rewrite a state file).
    tail: ``tail(name)`` for error messages (default: the end of the process's log).
    """

    def __init__(self, log_dir: Path, *, log_suffix: str = ".log", cwd: Path | None = None,
                 base_env: Callable[[], dict[str, str]] | None = None, die_with_parent: bool = False,
                 on_change: Callable[[], None] | None = None,
                 tail: Callable[[str], str] | None = None) -> None:
        self.log_dir = log_dir
        self.log_suffix = log_suffix
        self.cwd = cwd
        self.base_env = base_env
        self.die_with_parent = die_with_parent
        self.on_change = on_change or (lambda: None)
        self._tail = tail
        self.procs: dict[str, subprocess.Popen] = {}

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}{self.log_suffix}"

    def tail(self, name: str, n: int = 3000) -> str:
        if self._tail is not None:
            return self._tail(name)
        f = self.log(name)
        return f.read_text(errors="replace")[-n:] if f.exists() else ""

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` as ``name`` (:func:`spawn`); ``env`` is added to the base environment."""
        if env is None and self.base_env is None:
            full_env = None
        else:
            full_env = {**(self.base_env() if self.base_env else os.environ), **(env or {})}
        argv = die_with_parent(argv) if self.die_with_parent else argv
        proc = spawn(argv, self.log(name), full_env, cwd=self.cwd)
        self.procs[name] = proc
        self.on_change()
        return proc

    def exited(self, names: Iterable[str] | None = None) -> list[str]:
        """Names (of ``names``, default all) whose process has exited."""
        wanted = self.procs if names is None else [n for n in names if n in self.procs]
        return [n for n in wanted if self.procs[n].poll() is not None]

    def describe_exit(self, name: str) -> str:
        return f"{name} exited with rc={self.procs[name].returncode}; log tail:\n{self.tail(name)}"

    def wait(self, what: str, ready: Callable[[], bool], timeout_s: float, *, error: type[Exception],
             watch: Iterable[str] | None = None, poll_s: float = 0.2) -> None:
        """:func:`wait_until` ``ready()`` watching the processes ``watch`` (default all); raises
        ``error`` naming the process that exited (with its log tail) or what did not get ready."""
        names = list(self.procs) if watch is None else [n for n in watch if n in self.procs]
        watched = [(n, self.procs[n], self.log(n)) for n in names]
        try:
            wait_until(what, ready, timeout_s, procs=watched, poll_s=poll_s)
        except ProcessError as e:
            dead = self.exited(names)
            if dead:
                raise error(self.describe_exit(dead[0])) from e
            raise error(f"{e}; logs in {self.log_dir}") from e

    def stop(self, name: str, grace_s: float = 0.0) -> None:
        """Stop ``name`` with its tree (SIGKILL, or SIGTERM and ``grace_s`` first) and forget it."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            stop(proc, grace_s)
            self.on_change()

    def stop_all(self, order: Iterable[str] = (), grace_s: float = 0.0) -> None:
        """Stop the processes named in ``order`` first, in that order, then the rest."""
        order = list(order)
        for name in [n for n in order if n in self.procs] + [n for n in self.procs if n not in order]:
            self.stop(name, grace_s)

    def pgids(self) -> dict[str, int]:
        """name -> process group id (= pid: each runs in a session of its own)."""
        return {n: p.pid for n, p in self.procs.items()}

    def detach(self) -> None:
        """Forget every process without stopping it (a detached ``up`` command: ``down`` finds
        them again by the process group ids in the fixture's state file)."""
        self.procs.clear()
