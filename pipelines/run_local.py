"""``pipectl run``: validate, start what is not configured, run the compiled workflow locally.

Order matters for "bad input changes nothing": parameters and the dataset are validated, and
configured endpoints are probed, before any service starts or any byte is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from pipectl.components.contracts import RunSettings, TrainingParameters
from pipectl.components.errors import PipectlError, Unreachable, ValidationFailed
from pipectl.pipelines.local import LocalBackendError, LocalRunner, NodeResult, RunResult


def _probe_tcp(url: str, what: str, hint: str, timeout_s: float = 3.0) -> None:
    """Open (and close) a TCP connection to ``url``'s host and port; Unreachable if refused."""
    import socket
    from urllib.parse import urlparse

    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname or "", port), timeout=timeout_s).close()
    except OSError as e:
        raise Unreachable(f"{what} {url} is unreachable ({e.strerror or e})", hint) from e


def probe_s3(settings: RunSettings) -> None:
    """Fail fast (exit 3) when the configured S3 endpoint is unreachable or rejects our keys."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

    client = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint,
        aws_access_key_id=settings.s3_access_key,
        aws_secret_access_key=settings.s3_secret_key,
        region_name=settings.s3_region,
        config=Config(connect_timeout=3, read_timeout=10, retries={"max_attempts": 1, "mode": "standard"}, s3={"addressing_style": "path"}),
    )
    where = settings.s3_endpoint or "AWS S3"
    if settings.s3_endpoint:
        _probe_tcp(settings.s3_endpoint, "S3 endpoint", "check --s3-endpoint / PIPECTL_S3_ENDPOINT, or omit it to use the embedded S3 server")
    try:
        client.list_buckets()
    except EndpointConnectionError as e:
        raise Unreachable(f"S3 endpoint {where} is unreachable ({e})", "check --s3-endpoint / PIPECTL_S3_ENDPOINT, or omit it to use the embedded S3 server") from e
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        raise Unreachable(f"S3 endpoint {where} refused the request: {code}", "check PIPECTL_S3_ACCESS_KEY / PIPECTL_S3_SECRET_KEY") from e
    except BotoCoreError as e:
        raise Unreachable(f"S3 endpoint {where}: {e}", "check --s3-endpoint and the credentials") from e


def probe_mlflow(uri: str) -> None:
    """Fail fast (exit 3) when the MLflow tracking server does not answer ``/health``."""
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5):  # noqa: S310
            return
    except Exception as e:
        raise Unreachable(f"MLflow tracking server {uri} is unreachable ({e})", "check --mlflow-uri / PIPECTL_MLFLOW_URI, or omit it to use the embedded server") from e


def validate_dataset(parameters: TrainingParameters, settings: RunSettings) -> None:
    """Check the dataset before anything starts: missing, empty or unlabelled -> exit 2."""
    from pipectl.components.runtime import s3_client
    from pipectl.components.stage.core import DatasetError, scan_s3, validate_source

    try:
        if parameters.dataset_uri.startswith("s3://"):
            if settings.s3_endpoint is None and settings.s3_access_key is None:
                raise ValidationFailed(
                    f"dataset {parameters.dataset_uri} is on S3 but no --s3-endpoint is configured",
                    "the embedded S3 server starts empty; pass --s3-endpoint (and keys) of the store that holds it",
                )
            scan_s3(s3_client(settings), parameters.dataset_uri)
        else:
            validate_source(parameters.dataset_uri)
    except DatasetError as e:
        raise ValidationFailed(e.headline, e.hint) from e


def summarise(result: RunResult, parameters: TrainingParameters) -> dict[str, Any]:
    """What ``pipectl run`` prints: phase, each step, and the model/metrics when registered."""
    summary: dict[str, Any] = {
        "workflow": result.workflow_name,
        "phase": result.phase,
        "workdir": str(result.workdir),
        "steps": [
            {"task": n.task, "phase": n.phase, "exit_code": n.exit_code, "duration_s": round(n.duration_s, 2), "message": n.message, "log": str(n.log_path)}
            for n in result.nodes
        ],
    }
    outputs = {n.task: n.outputs for n in result.nodes}
    if "preprocess" in outputs:
        pre = outputs["preprocess"]
        summary["preprocess"] = {k: pre.get(k) for k in ("images-per-s", "device", "corrupt", "train-count", "validation-count")}
    if "evaluate" in outputs:
        ev = outputs["evaluate"]
        summary["mlflow_run_id"] = ev.get("mlflow-run-id")
        summary["metrics"] = json.loads(ev.get("metrics") or "{}")
        summary["decision"] = ev.get("decision")
    if "register" in outputs:
        reg = outputs["register"]
        summary["model"] = {
            "name": reg.get("model-name"),
            "version": reg.get("version"),
            "alias": reg.get("alias") or None,
            "champion_version": reg.get("champion-version") or None,
        }
    return summary


def run_training_locally(
    parameters: TrainingParameters,
    settings: RunSettings,
    on_event: Callable[[str, str, NodeResult | None], None] | None = None,
    on_services: Callable[[dict[str, str]], None] | None = None,
    *,
    launcher: str = "volcano",
) -> dict[str, Any]:
    """Run the compiled ``training`` workflow on this machine; returns :func:`summarise`'s dict.

    Raises :class:`ValidationFailed` (bad dataset), :class:`Unreachable` (configured endpoints
    down), :class:`PipectlError` (an embedded service failed to start).
    """
    from pipectl.pipelines.embedded import S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices, ServiceStartError
    from pipectl.pipelines.training import CompileConfig, build_training

    if settings.s3_endpoint or settings.s3_access_key:
        probe_s3(settings)
    if settings.mlflow_uri:
        probe_mlflow(settings.mlflow_uri)
    validate_dataset(parameters, settings)

    template = build_training(CompileConfig(bucket=settings.bucket, launcher=launcher)).to_dict()
    state_dir = Path(settings.state_dir).resolve()
    embed_s3 = settings.s3_endpoint is None and settings.s3_access_key is None
    try:
        services = EmbeddedServices(state_dir, s3=embed_s3, mlflow=settings.mlflow_uri is None)
        with services:
            update: dict[str, Any] = {}
            if services.s3_url:
                update.update(s3_endpoint=services.s3_url, s3_access_key=S3_ACCESS_KEY, s3_secret_key=S3_SECRET_KEY)
            if services.mlflow_url:
                update["mlflow_uri"] = services.mlflow_url
            effective = settings.model_copy(update=update)
            if on_services:
                on_services({k: v for k, v in (("s3", effective.s3_endpoint), ("mlflow", effective.mlflow_uri)) if v})
            runner = LocalRunner(template, parameters.as_arguments(), effective.step_env(), state_dir / "runs", on_event)
            result = runner.run()
    except ServiceStartError as e:
        raise PipectlError(f"{e}", f"see {e.log_path}") from e
    except LocalBackendError as e:
        raise ValidationFailed(f"the compiled workflow cannot run locally: {e}") from e
    return summarise(result, parameters)
