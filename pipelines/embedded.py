"""Loopback services for the embedded default of ``pipectl run``: an S3 server and an MLflow server.

- S3: moto's server (``moto[server]``), a real S3 HTTP endpoint, in memory. Production points
  ``--s3-endpoint`` at Ceph RGW instead.
- MLflow: ``mlflow server`` with a sqlite backend store and artifacts under the state folder,
  so the registry and the champion survive from one ``pipectl run`` to the next.
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: 2 processes (~540 MB) instead of 9 (~2.3 GB)
  (REFERENCE.md §1).

Each runs in its own process group and the whole group is stopped on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from pipectl.pipelines.local import free_port

S3_ACCESS_KEY = "pipectl"
S3_SECRET_KEY = "pipectl-embedded"


class ServiceStartError(Exception):
    """An embedded service did not become ready; ``log_path`` has its output."""

    def __init__(self, message: str, log_path: Path) -> None:
        super().__init__(message)
        self.log_path = log_path


@dataclass
class Service:
    name: str
    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass


def _wait_http(url: str, proc: subprocess.Popen, log_path: Path, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceStartError(f"{name} exited with code {proc.returncode} during start-up", log_path)
        try:
            with urllib.request.urlopen(url, timeout=1) as r:  # noqa: S310 - loopback only
                if r.status < 500:
                    return
        except Exception:
            time.sleep(0.2)
    raise ServiceStartError(f"{name} not ready at {url} after {timeout_s:.0f} s", log_path)


def _spawn(name: str, argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = open(log_path, "ab")
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, **(env or {})},
    )


def start_s3(state_dir: Path, timeout_s: float = 30.0) -> Service:
    """Start moto's S3 server on a free loopback port. Returns the running :class:`Service`."""
    port = free_port()
    log_path = state_dir / "logs" / "s3.log"
    proc = _spawn("s3", [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], log_path)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/moto-api/", proc, log_path, "S3 server (moto)", timeout_s)
    except BaseException:
        Service("s3", url, proc, log_path).stop()
        raise
    return Service("s3", url, proc, log_path)


def start_mlflow(state_dir: Path, timeout_s: float = 90.0) -> Service:
    """Start an MLflow tracking server (sqlite store, artifacts under ``state_dir/mlflow``)."""
    port = free_port()
    root = (state_dir / "mlflow").resolve()
    root.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "logs" / "mlflow.log"
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
    proc = _spawn("mlflow", argv, log_path, env={"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_http(url + "/health", proc, log_path, "MLflow server", timeout_s)
    except BaseException:
        Service("mlflow", url, proc, log_path).stop()
        raise
    return Service("mlflow", url, proc, log_path)


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
