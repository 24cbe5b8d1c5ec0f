"""Loopback services for the embedded default of ``pipectl run``: an S3 server and an MLflow server.

- S3: moto's server (``moto[server]``), a real S3 HTTP endpoint, in memory. Production points
  ``--s3-endpoint`` at Ceph RGW instead. moto keeps nothing on disk, so a run that does not finish
  saves the server's objects into its run folder (:func:`save_s3_snapshot`, through the S3 API)
  before the server stops, and ``pipectl run --resume`` loads them into the new server
  (:func:`load_s3_snapshot`): staged data, shards and checkpoints survive an interruption.
- MLflow: ``mlflow server`` with a sqlite backend store and artifacts under the state folder,
  so the registry and the champion survive from one ``pipectl run`` to the next.
  ``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``: 2 processes (~540 MB) instead of 9 (~2.3 GB).

Each runs in its own session and is stopped with its process tree on exit
(:mod:`pipectl.pipelines.backends.processes`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen
from typing import Any, Callable

from pipectl.pipelines.backends.processes import ProcessError, free_port, http_ok, listens, spawn, stop, tcp_open, wait_until

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


PORT_TRIES = 3
"""Ports tried per service: another process may take a port between :func:`free_port` and the
server's bind (each start then picks a new one)."""


def _start(name: str, what: str, argv: Callable[[int], list[str]], state_dir: Path, ready_path: str, timeout_s: float,
           env: dict[str, str] | None = None) -> Service:
    """Start ``argv(port)`` on a free loopback port; ready when that process listens on the port
    and answers ``ready_path``. A port another process took first: again on a new port."""
    log_path = state_dir / "logs" / f"{name}.log"
    for attempt in range(1, PORT_TRIES + 1):
        port = free_port()
        svc = Service(name, f"http://127.0.0.1:{port}", spawn(argv(port), log_path, {**os.environ, **(env or {})}), log_path)
        try:
            wait_until(f"{what} at {svc.url}", lambda: listens(svc.process.pid, port) and http_ok(svc.url + ready_path),
                       timeout_s, procs=[(what, svc.process, log_path)])
            return svc
        except ServiceStartError:
            svc.stop()
            if attempt == PORT_TRIES or not tcp_open("127.0.0.1", port):
                raise  # not a port someone else holds: the server's own failure
        except BaseException:
            svc.stop()
            raise
    raise AssertionError("unreachable")


def start_s3(state_dir: Path, timeout_s: float = 30.0) -> Service:
    """Start moto's S3 server on a free loopback port. Returns the running :class:`Service`."""
    def argv(port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]

    return _start("s3", "S3 server (moto)", argv, state_dir, "/moto-api/", timeout_s)


def mlflow_store_exists(state_dir: Path) -> bool:
    """``state_dir`` holds the embedded MLflow server's store (a ``pipectl run`` used it)."""
    return (state_dir / "mlflow" / "mlflow.db").is_file()


def start_mlflow(state_dir: Path, timeout_s: float = 90.0, *, auth_config: Path | None = None) -> Service:
    """Start an MLflow tracking server (sqlite store, artifacts under ``state_dir/mlflow``).

    ``auth_config``: an ini file of MLflow's basic-auth app (``mlflow server --app-name
    basic-auth``, ``MLFLOW_AUTH_CONFIG_PATH``: admin user, ``default_permission``, its user
    database): every request then needs a user's credentials, as on a site that runs MLflow with
    auth (docs/install.md). Needs the ``Flask-WTF`` package (``mlflow[auth]``)."""
    root = (state_dir / "mlflow").resolve()
    root.mkdir(parents=True, exist_ok=True)
    mlflow_bin = Path(sys.executable).parent / "mlflow"

    def argv(port: int) -> list[str]:
        return [
            str(mlflow_bin) if mlflow_bin.exists() else "mlflow",
            "server",
            "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination", (root / "artifacts").as_uri(),
            "--host", "127.0.0.1",
            "--port", str(port),
            "--workers", "1",
        ] + (["--app-name", "basic-auth"] if auth_config else [])

    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if auth_config:
        # the auth app's forms need a static CSRF key: one per server started here
        env |= {"MLFLOW_AUTH_CONFIG_PATH": str(auth_config),
                "MLFLOW_FLASK_SERVER_SECRET_KEY": os.environ.get("MLFLOW_FLASK_SERVER_SECRET_KEY") or secrets.token_hex(32)}
    # /health answers without credentials in basic-auth mode too
    return _start("mlflow", "MLflow server", argv, state_dir, "/health", timeout_s, env=env)


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


# ---------------------------------------------------------------- S3 snapshots (moto keeps no files)

SNAPSHOT_INDEX = "index.json"


def _embedded_client(url: str) -> Any:
    from pipectl.components.contracts import StoreSettings
    from pipectl.components.runtime import s3_client

    return s3_client(StoreSettings(s3_endpoint=url, s3_access_key=S3_ACCESS_KEY, s3_secret_key=S3_SECRET_KEY), max_pool=16)


Keys = list[tuple[str, str]]
"""(bucket, key) of objects of the embedded S3 server."""


def save_s3_snapshot(url: str, dest: Path, *, threads: int = 8, select: Callable[[Any, Keys], Keys] | None = None) -> int:
    """Copy every object of every bucket of the S3 server at ``url`` (the embedded one: its keys)
    into the folder ``dest`` (``select(client, keys)``: only the objects it returns); returns the
    number of objects.

    Layout: ``dest/objects/<n>`` (bodies) and ``dest/index.json``: ``[{"bucket", "key", "file",
    "content_type", "metadata"}]`` (user metadata kept: stage compares its ``sha256``). Atomic for
    a reader: built in ``<dest>.partial`` and renamed over ``dest`` (the previous snapshot is
    ``<dest>.old`` for the instant between two renames; :func:`load_s3_snapshot` reads either).
    Not fsynced: it survives the process being stopped, not the machine losing power.
    Raises botocore errors when the server does not answer.
    """
    from pipectl.components.runtime import list_objects

    s3 = _embedded_client(url)
    partial, old = dest.with_name(dest.name + ".partial"), dest.with_name(dest.name + ".old")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "objects").mkdir(parents=True)
    buckets = sorted(b["Name"] for b in s3.list_buckets().get("Buckets", []))
    keys = [(bucket, o["Key"]) for bucket in buckets for o in list_objects(s3, bucket)]
    if select is not None:
        keys = select(s3, keys)

    def copy(item: tuple[int, tuple[str, str]]) -> dict:
        n, (bucket, key) = item
        obj = s3.get_object(Bucket=bucket, Key=key)
        file = f"objects/{n:08d}"
        with open(partial / file, "wb") as f:
            shutil.copyfileobj(obj["Body"], f)
        return {"bucket": bucket, "key": key, "file": file, "content_type": obj.get("ContentType"), "metadata": obj.get("Metadata") or {}}

    with ThreadPoolExecutor(threads) as pool:
        index = list(pool.map(copy, enumerate(keys)))
    (partial / SNAPSHOT_INDEX).write_text(json.dumps({"buckets": buckets, "objects": index}))
    shutil.rmtree(old, ignore_errors=True)
    if dest.exists():
        dest.rename(old)
    partial.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    return len(index)


def held_out_splits(s3: Any, keys: Keys) -> Keys:
    """Of ``keys``: every shard index (``…/index.json`` of a preprocess output) and the validation
    shards it lists, i.e. the held-out splits model versions were evaluated on. The embedded S3
    keeps nothing between two ``pipectl run`` s, but the registry does: a later run's evaluate scores
    its candidate beside the champion on the champion's split (:mod:`pipectl.components.evaluate.champion`)."""
    from pipectl.components.contracts import ShardIndex
    from pipectl.components.runtime import parse_s3_uri

    present, kept = set(keys), []
    for bucket, key in keys:
        if not key.endswith("/index.json"):
            continue
        try:
            index = ShardIndex.model_validate_json(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
            shards = [parse_s3_uri(uri) for uri in index.validation]
        except ValueError:
            continue  # another kind of index.json
        kept += [(bucket, key), *(k for k in shards if k in present)]
    return kept


def s3_snapshot_path(dest: Path) -> Path | None:
    """The complete snapshot saved at ``dest`` (or the previous one left at ``<dest>.old`` by an
    interrupted replace), None when there is none."""
    for candidate in (dest, dest.with_name(dest.name + ".old")):
        if (candidate / SNAPSHOT_INDEX).is_file():
            return candidate
    return None


def remove_s3_snapshot(dest: Path) -> None:
    """Remove the snapshot at ``dest`` and any leftovers of an interrupted save (``.partial``, ``.old``)."""
    for path in (dest, dest.with_name(dest.name + ".partial"), dest.with_name(dest.name + ".old")):
        shutil.rmtree(path, ignore_errors=True)


def load_s3_snapshot(url: str, src: Path, *, threads: int = 8) -> int:
    """Create the buckets and put the objects of the snapshot ``src`` (see :func:`save_s3_snapshot`)
    into the S3 server at ``url``; returns the number of objects. Raises FileNotFoundError when
    ``src`` holds no complete snapshot."""
    found = s3_snapshot_path(src)
    if found is None:
        raise FileNotFoundError(f"no S3 snapshot at {src}")
    s3 = _embedded_client(url)
    doc = json.loads((found / SNAPSHOT_INDEX).read_text())
    for bucket in doc["buckets"]:
        s3.create_bucket(Bucket=bucket)

    def put(entry: dict) -> None:
        extra = {"ContentType": entry["content_type"]} if entry.get("content_type") else {}
        with open(found / entry["file"], "rb") as f:
            s3.put_object(Bucket=entry["bucket"], Key=entry["key"], Body=f, Metadata=entry.get("metadata") or {}, **extra)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, doc["objects"]))
    return len(doc["objects"])
