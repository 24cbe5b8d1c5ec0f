"""Loopback services for the embedded default of ``pipectl run``: an S3 server and an MLflow server.

- S3: moto's server (``moto[server]``), a real S3 HTTP endpoint, in memory. Production points
  ``--s3-endpoint`` at Ceph RGW instead.
- MLflow: ``mlflow server`` with a sqlite backend store and artifacts under the state folder,
  so the registry and the champion survive from one ``pipectl run`` to the next.
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: 2 processes (~540 MB) instead of 9 (~2.3 GB)
  (REFERENCE.md §1).

Each runs in its own session and is stopped with its process tree on exit
(:mod:`pipectl.pipelines.backends.processes`).
"""

from __future__ import annotations

import os
import sys
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen

from pipectl.pipelines.backends.processes import ProcessError, free_port, http_ok, spawn, stop, wait_until

S3_ACCESS_KEY = "pipectl"
S3_SECRET_KEY = "pipectl-embedded"

ServiceStartError = ProcessError
"""An embedded service did not become ready; ``log_path`` has its output."""


@dataclass
class Service:
    name: str
    url: str
    process: Popen
    log_path: Path

    def stop(self, grace_s: float = 10.0) -> None:
        stop(self.process, grace_s)


def _start(name: str, what: str, argv: list[str], state_dir: Path, port: int, ready_path: str, timeout_s: float,
           env: dict[str, str] | None = None) -> Service:
    log_path = state_dir / "logs" / f"{name}.log"
    svc = Service(name, f"http://127.0.0.1:{port}", spawn(argv, log_path, {**os.environ, **(env or {})}), log_path)
    try:
        wait_until(f"{what} at {svc.url}", lambda: http_ok(svc.url + ready_path), timeout_s, procs=[(what, svc.process, log_path)])
    except BaseException:
        svc.stop()
        raise
    return svc


def start_s3(state_dir: Path, timeout_s: float = 30.0) -> Service:
    """Start moto's S3 server on a free loopback port. Returns the running :class:`Service`."""
    port = free_port()
    argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    return _start("s3", "S3 server (moto)", argv, state_dir, port, "/moto-api/", timeout_s)


def start_mlflow(state_dir: Path, timeout_s: float = 90.0) -> Service:
    """Start an MLflow tracking server (sqlite store, artifacts under ``state_dir/mlflow``)."""
    port = free_port()
    root = (state_dir / "mlflow").resolve()
    root.mkdir(parents=True, exist_ok=True)
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    argv = [
        str(mlflow_bin) if mlflow_bin.exists() else "mlflow",
        "server",
        "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination", (root / "artifacts").as_uri(),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
    ]
    return _start("mlflow", "MLflow server", argv, state_dir, port, "/health", timeout_s,
                  env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})


class EmbeddedServices(AbstractContextManager["EmbeddedServices"]):
    """Start the services that are not configured; stop them (whole process groups) on exit.

    ``s3_url``/``mlflow_url`` are None when that service is not embedded.
    """

    def __init__(self, state_dir: Path, *, s3: bool, mlflow: bool) -> None:
        self.state_dir = state_dir
        self.want_s3, self.want_mlflow = s3, mlflow
        self.services: list[Service] = []
        self.s3_url: str | None = None
        self.mlflow_url: str | None = None

    def __enter__(self) -> "EmbeddedServices":
        try:
            if self.want_s3:
                svc = start_s3(self.state_dir)
                self.services.append(svc)
                self.s3_url = svc.url
            if self.want_mlflow:
                svc = start_mlflow(self.state_dir)
                self.services.append(svc)
                self.mlflow_url = svc.url
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for svc in reversed(self.services):
            svc.stop()
        self.services.clear()

    def __exit__(self, *exc: object) -> None:
        self.stop()
