"""``pipectl run``: validate, start what is not configured, run the compiled workflow locally.

Order matters for "bad input changes nothing": parameters and the dataset are validated, and
configured endpoints are probed, before any service starts or any byte is written.

``pipectl run --resume [RUN]`` continues a run of the state folder that did not succeed
(interrupted by a signal, or Failed): :func:`resumable_run` picks it and says why when nothing can
be resumed, the parameters, launcher and store must be the ones it ran with (exit 2 otherwise),
the embedded S3 server gets back the objects saved when the run stopped, and the runner skips
the tasks that Succeeded (:class:`~pipectl.pipelines.backends.runner.RunRecord`). The train step
then continues from the run's last checkpoint (same workflow name: same run prefix).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from pipectl.components.contracts import RunSettings, TrainingParameters
from pipectl.components.errors import PipectlError, Unreachable, ValidationFailed
from pipectl.components.names import PROGRESS_FILE_ENV
from pipectl.pipelines.backends.runner import RECORD_FILE, LocalRunner, NodeResult, RunRecord, RunResult
from pipectl.pipelines.launchers import DEFAULT_LAUNCHER
from pipectl.pipelines.substitution import TemplateError

if TYPE_CHECKING:
    from pipectl.pipelines.composer import Pipeline


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


def _check_url(url: str, what: str, flag: str) -> None:
    from urllib.parse import urlparse

    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValidationFailed(f"{what} {url!r} is not an http(s):// URL", f"write {flag} http://host:port")


def probe_s3(settings: RunSettings) -> None:
    """Fail fast when the configured S3 endpoint is malformed (exit 2), unreachable, not S3, or
    rejects our keys (exit 3)."""
    if settings.s3_endpoint:
        _check_url(settings.s3_endpoint, "S3 endpoint", "--s3-endpoint")
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
        status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403") or status in (401, 403):
            raise Unreachable(f"S3 endpoint {where} refused our credentials: {code}",
                              "check --s3-access-key/--s3-secret-key (or PIPECTL_S3_ACCESS_KEY/PIPECTL_S3_SECRET_KEY)") from e
        raise Unreachable(f"S3 endpoint {where} answered, but not as an S3 server would (HTTP {status} {code})",
                          "check that --s3-endpoint is the S3 gateway (Ceph RGW, MinIO...), not another service") from e
    except BotoCoreError as e:
        raise Unreachable(f"S3 endpoint {where}: {e}", "check --s3-endpoint and the credentials") from e


def probe_mlflow(uri: str) -> None:
    """Fail fast when the MLflow tracking server is not usable: exit 2 for a malformed URI,
    exit 3 when it is unreachable, is not MLflow, or refuses our credentials (MLflow's own
    ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN`` are honoured, as by the steps)."""
    _check_url(uri, "MLflow tracking URI", "--mlflow-uri")
    hint = "check --mlflow-uri / PIPECTL_MLFLOW_URI, or omit it to use the embedded server"
    _probe_tcp(uri, "MLflow tracking server", hint)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    except MlflowException as e:
        text = str(e)
        if any(code in text for code in ("401", "403", "UNAUTHENTICATED", "PERMISSION_DENIED")):
            raise Unreachable(f"MLflow tracking server {uri} refused our credentials",
                              "set MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD") from e
        raise Unreachable(f"{uri} answered, but not as an MLflow tracking server ({text.splitlines()[0][:200]})", hint) from e
    except Exception as e:
        raise Unreachable(f"MLflow tracking server {uri} is unreachable ({e})", hint) from e


def validate_dataset(parameters: TrainingParameters, settings: RunSettings, maxima: dict | None = None) -> None:
    """Check the dataset before anything starts: missing, empty or unlabelled -> exit 2; over the
    run's lane's maximum in ``maxima`` (lane -> DatasetMax; none: no bound) -> exit 2 with the numbers."""
    from pipectl.components.datasize import DatasetSize, DatasetTooLarge, check_dataset_size
    from pipectl.components.runtime import s3_client
    from pipectl.components.stage.sources import (
        EXAMPLE_SCHEME, DatasetError, is_manifest, scan_local, scan_manifest, scan_s3, validate_source,
    )

    uri = parameters.dataset_uri
    try:
        if uri.startswith("s3://"):
            if settings.s3_endpoint is None and settings.s3_access_key is None:
                raise ValidationFailed(
                    f"dataset {uri} is on S3 but no --s3-endpoint is configured",
                    "the embedded S3 server starts empty; pass --s3-endpoint (and keys) of the store that holds it",
                )
            files = (scan_manifest if is_manifest(uri) else scan_s3)(s3_client(settings), uri)
        elif uri.startswith(EXAMPLE_SCHEME):
            validate_source(uri)
            return
        else:
            files = scan_manifest(None, uri) if is_manifest(uri) else scan_local(Path(uri.removeprefix("file://")))
        if maxima:
            check_dataset_size(DatasetSize(uri, len(files), sum(f.size for f in files)), parameters.lane, maxima)
    except (DatasetError, DatasetTooLarge) as e:
        raise ValidationFailed(e.headline, e.hint) from e


def validate_shards(parameters: TrainingParameters, settings: RunSettings, maxima: dict | None) -> None:
    """Shards a team already has (``dataset-uri`` with its ``index.json``) over the run's lane's
    maximum -> exit 2 with the numbers. Checked when the run uses a configured store (the embedded
    one starts empty); a dataset without an index is the ``shards`` step's to report."""
    from pipectl.components.datasize import DatasetTooLarge, check_dataset_size, known_size
    from pipectl.components.runtime import s3_client

    if not maxima or not (settings.s3_endpoint or settings.s3_access_key):
        return
    size = known_size(s3_client(settings), parameters.dataset_uri, prebuilt=True)
    if size is not None:
        try:
            check_dataset_size(size, parameters.lane, maxima)
        except DatasetTooLarge as e:
            raise ValidationFailed(e.headline, e.hint) from e


def gpu_count() -> int:
    """NVIDIA GPUs the driver exposes on this machine (0 without a driver)."""
    gpus = Path("/proc/driver/nvidia/gpus")
    return len(list(gpus.iterdir())) if gpus.is_dir() else 0


def _number(text: str | None) -> int | float | None:
    if text in (None, ""):
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def summarise(result: RunResult, parameters: TrainingParameters) -> dict[str, Any]:
    """What ``pipectl run`` prints: phase, each step, and the model/metrics when registered."""
    summary: dict[str, Any] = {
        "workflow": result.workflow_name,
        "phase": result.phase,
        "workdir": str(result.workdir),
        "steps": [
            {"task": n.task, "phase": n.phase, "exit_code": n.exit_code, "duration_s": round(n.duration_s, 2), "message": n.message,
             "log": str(n.log_path), "reused": n.reused}
            for n in result.nodes
        ],
    }
    outputs = {n.task: n.outputs for n in result.nodes}
    if "preprocess" in outputs:
        pre = outputs["preprocess"]
        summary["preprocess"] = {
            "device": pre.get("device"),
            **{k: _number(pre.get(k)) for k in ("images-per-s", "corrupt", "train-count", "validation-count")},
        }
    if "evaluate" in outputs:
        ev = outputs["evaluate"]
        summary["mlflow_run_id"] = ev.get("mlflow-run-id")
        summary["metrics"] = json.loads(ev.get("metrics") or "{}")
        summary["decision"] = ev.get("decision")
        summary["decision_reason"] = ev.get("decision-reason") or ""
        summary["step_time"] = ev.get("training-step-time") or ""
        summary["verdicts"] = json.loads(ev.get("training-verdicts") or "[]")
        summary["pictures"] = json.loads(ev.get("pictures") or "[]")
        summary["training"] = {k: _number(ev.get(f"training-{k}")) for k in
                               ("images-per-s", "data-share", "sync-share", "slowest-rank-ratio")}
    if "register" in outputs:
        reg = outputs["register"]
        summary["model"] = {
            "name": reg.get("model-name"),
            "version": reg.get("version"),
            "alias": reg.get("alias") or None,
            "champion_version": reg.get("champion-version") or None,
        }
    return summary


def preflight(parameters: TrainingParameters, settings: RunSettings, stages_a_dataset: bool = True,
              maxima: dict | None = None, prebuilt: bool = False) -> None:
    """Everything ``pipectl run`` checks before it starts a service or writes a byte: configured
    endpoints answer (exit 3 otherwise), the dataset is usable (when the pipeline stages one) and
    within the lane's maximum (``maxima``: lane -> DatasetMax; ``prebuilt``: the pipeline takes
    shards a team already has), warm-cache has an Alluxio, GPUs asked for exist (exit 2 otherwise)."""
    if settings.s3_endpoint or settings.s3_access_key:
        probe_s3(settings)
    if settings.mlflow_uri:
        probe_mlflow(settings.mlflow_uri)
    if stages_a_dataset:
        validate_dataset(parameters, settings, maxima)
    elif prebuilt:
        validate_shards(parameters, settings, maxima)

    if parameters.warm_cache and not (settings.alluxio_proxy_url and settings.alluxio_job_master_url):
        raise ValidationFailed(
            "warm-cache=true but no Alluxio is configured",
            "set PIPECTL_ALLUXIO_PROXY_URL (http://proxy:39999) and PIPECTL_ALLUXIO_JOB_MASTER_URL "
            "(http://job-master:20002), or leave warm-cache false",
        )
    if parameters.gpus_per_worker and not gpu_count():
        raise ValidationFailed(
            f"gpus-per-worker={parameters.gpus_per_worker} but this machine has no NVIDIA GPU",
            "use -p gpus-per-worker=0 to train on CPU here, or submit to a cluster",
        )


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Hold ``<state_dir>/run.lock`` (an exclusive ``flock``) while a run uses the folder: one
    ``pipectl run`` per state folder (its MLflow database, its work folders). The kernel drops the
    lock when the process ends, however it ends: no stale lock after a crash.

    Raises :class:`ValidationFailed` (exit 2) naming the pid that holds it.
    """
    import fcntl

    path = state_dir / "run.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            raise ValidationFailed(f"another `pipectl run` (pid {holder}) is using the state folder {state_dir}",
                                   "wait for it to finish or stop it, or pass a different --state-dir") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield


S3_SNAPSHOT = "s3-snapshot"
"""Folder, in a run's folder, that keeps the embedded S3 server's objects of a run that did not succeed."""
EVALUATION_SETS = "evaluation-sets"
"""Snapshot (in the state folder) of the held-out splits of the runs the embedded S3 served: loaded
into the next run's server, so its evaluate finds the champion's evaluation set."""


def _store(settings: RunSettings) -> dict[str, str]:
    """Where a run keeps its data, as recorded for resume (no credentials: URLs are redacted)."""
    from pipectl.components.errors import redact_credentials

    embedded_s3 = settings.s3_endpoint is None and settings.s3_access_key is None
    return {
        "s3": "embedded" if embedded_s3 else redact_credentials(settings.s3_endpoint or "AWS S3"),
        "mlflow": "embedded" if settings.mlflow_uri is None else redact_credentials(settings.mlflow_uri),
        "bucket": settings.bucket,
    }


def resumable_run(state_dir: Path, name: str | None = None) -> RunRecord:
    """The run ``pipectl run --resume [NAME]`` continues: run ``name`` of ``state_dir``, or the most
    recently started one when ``name`` is None. It must not have Succeeded, and when it used the
    embedded S3 server its saved objects must be there.

    Raises :class:`ValidationFailed` (exit 2), with a hint, when there is nothing to resume: no
    state folder or no run in it, no run ``name``, the run Succeeded, or its embedded S3 objects
    were not saved (the process was killed with SIGKILL, or the machine stopped).
    """
    from pipectl.pipelines.backends.services import s3_snapshot_path

    runs = state_dir / "runs"
    records: list[RunRecord] = []
    for path in sorted(runs.glob(f"*/{RECORD_FILE}")) if runs.is_dir() else []:
        try:
            records.append(RunRecord.load(path))
        except (OSError, ValueError, TypeError):
            continue  # not a record of this version: nothing we can resume
    resumable = [r for r in sorted(records, key=lambda r: r.started_at, reverse=True) if r.phase != "Succeeded"]
    others = f"; resumable runs here: {', '.join(r.name for r in resumable[:5])} (--resume NAME)" if resumable else ""
    if name is None:
        if not records:
            raise ValidationFailed(f"nothing to resume: no run in the state folder {state_dir}",
                                   "start one with `pipectl run training` (pass --state-dir if it ran elsewhere)")
        record = max(records, key=lambda r: r.started_at)
    else:
        found = [r for r in records if r.name == name]
        if not found:
            raise ValidationFailed(f"nothing to resume: no run {name!r} in the state folder {state_dir}",
                                   "name a run of this folder (its runs/ subfolders)" + others)
        record = found[0]
    if record.phase == "Succeeded":
        raise ValidationFailed(f"nothing to resume: the {'last ' if name is None else ''}run, {record.name}, Succeeded",
                               "start a new run with `pipectl run training`" + others)
    done = [t for t, v in record.tasks.items() if v.get("phase") == "Succeeded"]
    if record.extra.get("store", {}).get("s3") == "embedded" and done and s3_snapshot_path(runs / record.name / S3_SNAPSHOT) is None:
        raise ValidationFailed(
            f"run {record.name} cannot be resumed: the embedded S3 server's objects were not saved when it stopped "
            "(killed with SIGKILL, or the machine stopped)",
            "start a new run; with --s3-endpoint (a persistent store such as Ceph RGW) a run is resumable after any crash",
        )
    return record


def _resume_parameters(record: RunRecord, given: TrainingParameters) -> TrainingParameters:
    """The interrupted run's parameters; exit 2 naming each parameter ``given`` explicitly set
    (``model_fields_set``: ``-p``/``--parameter-file``) to another value than the run had."""
    from pipectl.components.contracts import kebab

    now = given.as_arguments()
    changed = [kebab(f) for f in sorted(given.model_fields_set) if now[kebab(f)] != record.parameters.get(kebab(f))]
    if changed:
        raise ValidationFailed(
            f"run {record.name} ran with other parameters: "
            + ", ".join(f"{k}={record.parameters.get(k)} (asked: {now[k]})" for k in changed),
            "resume with the run's own parameters (omit -p), or start a new run with `pipectl run training`",
        )
    try:
        return type(given).from_overrides(dict(record.parameters))
    except ValueError as e:
        raise ValidationFailed(f"run {record.name}'s recorded parameters are not valid for this pipectl: {e}",
                               "start a new run with `pipectl run training`") from e


def _check_same_store(record: RunRecord, settings: RunSettings) -> None:
    """Exit 2 when ``settings`` point at another S3 store, bucket or MLflow server than ``record``'s run used."""
    was, now = record.extra.get("store", {}), _store(settings)
    changed = [k for k in ("s3", "bucket", "mlflow") if was.get(k) != now[k]]
    if changed:
        raise ValidationFailed(
            f"run {record.name} kept its data elsewhere: "
            + ", ".join(f"{k} {was.get(k)} (now {now[k]})" for k in changed),
            "resume with the same --s3-endpoint/--bucket/--mlflow-uri as the run (omit them if it used the embedded services)",
        )


def run_training_locally(
    parameters: TrainingParameters,
    settings: RunSettings,
    on_event: Callable[[str, str, NodeResult | None], None] | None = None,
    on_services: Callable[[dict[str, str]], None] | None = None,
    *,
    launcher: str | None = None,
    resume: str | bool = False,
    pipeline: Pipeline | None = None,
    progress_file: Path | None = None,
    lane_dataset_max: dict | None = None,
) -> dict[str, Any]:
    """Run the compiled workflow of ``pipeline`` (default: the built-in ``training``) on this
    machine; returns :func:`summarise`'s dict.

    ``launcher``: the gang launcher (None: the default, or the resumed run's).
    ``progress_file``: where the training appends its per-epoch progress (:mod:`pipectl.components.progress`).
    ``lane_dataset_max``: the site file's ``lane_dataset_max`` (lane -> DatasetMax; none: the lanes' own).
    ``resume``: False for a new run; True to resume the state folder's last run; a workflow name to
    resume that run (see :func:`resumable_run`). Parameters explicitly set in ``parameters`` must
    equal the resumed run's.

    Raises :class:`ValidationFailed` (bad dataset; nothing to resume; resume with other parameters,
    launcher or store), :class:`Unreachable` (configured endpoints down), :class:`PipectlError` (an
    embedded service failed to start).
    """
    from pipectl.pipelines.backends.services import (
        S3_ACCESS_KEY, S3_SECRET_KEY, EmbeddedServices, ServiceStartError, held_out_splits, load_s3_snapshot,
        remove_s3_snapshot, s3_snapshot_path, save_s3_snapshot,
    )
    from pipectl.pipelines.builtin import training
    from pipectl.pipelines.training import CompileConfig

    state_dir = Path(settings.state_dir).resolve()
    record: RunRecord | None = None
    with contextlib.ExitStack() as stack:
        if resume is not False:
            if not (state_dir / "runs").is_dir():
                raise ValidationFailed(f"nothing to resume: no run in the state folder {state_dir}",
                                       "start one with `pipectl run training` (pass --state-dir if it ran elsewhere)")
            stack.enter_context(state_lock(state_dir))  # before reading: the run may still be going
            record = resumable_run(state_dir, None if resume is True else str(resume))
            parameters = _resume_parameters(record, parameters)
            recorded_launcher = record.extra.get("launcher", DEFAULT_LAUNCHER)
            if launcher is not None and launcher != recorded_launcher:
                raise ValidationFailed(f"run {record.name} ran with --launcher {recorded_launcher}, not {launcher}",
                                       f"resume with --launcher {recorded_launcher} (or omit it)")
            launcher = recorded_launcher
            _check_same_store(record, settings)
        launcher = launcher or DEFAULT_LAUNCHER
        cfg = CompileConfig(bucket=settings.bucket, launcher=launcher, lane_dataset_max=lane_dataset_max or {})
        steps = {s.name for s in (pipeline or training).steps}
        preflight(parameters, settings, "stage" in steps, cfg.dataset_maxima(), prebuilt="shards" in steps)
        template = (pipeline or training).build(cfg).to_dict()
        if record is not None and record.template != template:
            raise ValidationFailed(f"run {record.name} ran another compiled workflow than this pipectl compiles",
                                   "resume it with the pipectl version that started it, or start a new run")
        if record is None:
            try:
                state_dir.mkdir(parents=True, exist_ok=True)
                probe = state_dir / ".write-test"
                probe.write_text("")
                probe.unlink()
            except OSError as e:
                raise ValidationFailed(f"state folder {state_dir} is not usable ({e.strerror or e})", "pass --state-dir a writable folder") from e
            stack.enter_context(state_lock(state_dir))
        embed_s3 = settings.s3_endpoint is None and settings.s3_access_key is None
        try:
            services = stack.enter_context(EmbeddedServices(state_dir, s3=embed_s3, mlflow=settings.mlflow_uri is None))
            update: dict[str, Any] = {}
            if services.s3_url:
                update.update(s3_endpoint=services.s3_url, s3_access_key=S3_ACCESS_KEY, s3_secret_key=S3_SECRET_KEY)
            if services.mlflow_url:
                update["mlflow_uri"] = services.mlflow_url
            effective = settings.model_copy(update=update)
            if services.s3_url and s3_snapshot_path(state_dir / EVALUATION_SETS):
                load_s3_snapshot(services.s3_url, state_dir / EVALUATION_SETS)
            if record is not None and services.s3_url and s3_snapshot_path(state_dir / "runs" / record.name / S3_SNAPSHOT):
                load_s3_snapshot(services.s3_url, state_dir / "runs" / record.name / S3_SNAPSHOT)
            if on_services:
                on_services({k: v for k, v in (("s3", effective.s3_endpoint), ("mlflow", effective.mlflow_uri)) if v})
            # Steps inherit this environment (as a pod inherits its image's), plus the store settings.
            env = {**os.environ, **effective.step_env(), **({PROGRESS_FILE_ENV: str(progress_file)} if progress_file else {})}
            runner = LocalRunner(template, parameters.as_arguments(), env, state_dir / "runs", on_event,
                                 resume=record, extra={"launcher": launcher, "store": _store(settings)})
            snapshot = runner.workdir / S3_SNAPSHOT
            try:
                result = runner.run()
            except BaseException:
                if services.s3_url:  # the run can be resumed: keep the embedded S3's objects
                    with contextlib.suppress(Exception):  # the interruption is what the caller must see
                        save_s3_snapshot(services.s3_url, snapshot)
                raise
            if services.s3_url:
                if result.phase == "Succeeded":
                    remove_s3_snapshot(snapshot)  # nothing left to resume
                    save_s3_snapshot(services.s3_url, state_dir / EVALUATION_SETS, select=held_out_splits)
                else:
                    save_s3_snapshot(services.s3_url, snapshot)
        except ServiceStartError as e:
            raise PipectlError(f"{e}", f"see {e.log_path}") from e
        except TemplateError as e:
            raise ValidationFailed(f"the compiled workflow cannot run locally: {e}") from e
    return summarise(result, parameters)
