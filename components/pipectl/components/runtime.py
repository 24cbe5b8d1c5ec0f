"""What every step's ``__main__`` shares: argv -> Input, clients, outputs, exit codes.

A step module calls :func:`step_main` with its Input model and its ``run`` function. ``run``
gets the validated input and the clients it needs (injected, so tests pass their own).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import urlparse

from pydantic import BaseModel, ValidationError

from pipectl.components.contracts import OUTPUTS_DIR, ExitCode, StoreSettings, kebab
from pipectl.components.errors import PipectlError

log = logging.getLogger("pipectl.step")

I = TypeVar("I", bound=BaseModel)
O = TypeVar("O", bound=BaseModel)


class StepError(PipectlError):
    """A step failure with a headline and a hint.

    In a step, ``transient=True`` exits 75 (EX_TEMPFAIL, retried by the workflow), otherwise 1.
    """

    def __init__(self, headline: str, hint: str = "", *, transient: bool = False, cli_exit: int | None = None) -> None:
        super().__init__(headline, hint, cli_exit=cli_exit)
        self.transient = transient

    @property
    def step_exit(self) -> ExitCode:
        return ExitCode.TEMPFAIL if self.transient else ExitCode.FAILED


# ---------------------------------------------------------------- CPUs


def available_cpus(cgroup_root: Path = Path("/sys/fs/cgroup")) -> int:
    """CPUs this process may really use (>= 1): its affinity mask, capped by a cgroup CPU quota.

    ``os.cpu_count()`` counts the node's cores: a pod limited to 4 CPUs on a 64-core node (a CFS
    quota, Kubernetes ``resources.limits.cpu``) or pinned to a cpuset would start 64 threads and
    thrash. Quota: cgroup v2 ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``), else
    cgroup v1 ``cpu/cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1 = none); rounded up
    (Linux kernel docs, "Control Group v2", CPU interface files; "CFS Bandwidth Control").
    """
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota: float | None = None
    try:
        text = (cgroup_root / "cpu.max").read_text().split()
        if text and text[0] != "max":
            quota = int(text[0]) / int(text[1])
    except (OSError, ValueError, IndexError):
        try:
            q = int((cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text())
            period = int((cgroup_root / "cpu" / "cpu.cfs_period_us").read_text())
            if q > 0 and period > 0:
                quota = q / period
        except (OSError, ValueError):
            pass
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


# ---------------------------------------------------------------- S3


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``. Raises ``ValueError`` for anything else."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"not an s3:// URI: {uri!r}")
    return parsed.netloc, parsed.path.lstrip("/")


def join_uri(base: str, *parts: str) -> str:
    """Join URI parts with single slashes: ``join_uri("s3://b/x/", "y")`` -> ``s3://b/x/y``."""
    out = base.rstrip("/")
    for p in parts:
        out += "/" + p.strip("/")
    return out


def s3_client(settings: StoreSettings, *, max_pool: int = 32) -> Any:
    """A boto3 S3 client for ``settings``.

    Path-style addressing and ``when_required`` checksums: Ceph RGW (Pacific) rejects the
    checksum headers boto3 >= 1.36 sends by default (botocore's ``request_checksum_calculation``
    and ``response_checksum_validation`` set to ``when_required``). Retries use botocore's
    ``standard`` mode (exponential backoff on throttling, 5xx and connection errors).
    """
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path"},
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=5,
        read_timeout=60,
        max_pool_connections=max_pool,
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    return boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint,
        aws_access_key_id=settings.s3_access_key,
        aws_secret_access_key=settings.s3_secret_key,
        region_name=settings.s3_region,
        config=config,
    )


class Deferred:
    """A value built in a background thread (``background``), or on first use; the first attribute
    read waits for it (and raises what building it raised). Lets a step build its S3 client (~0.1 s
    of botocore's model loading) while it scans and hashes files, which need no client, or only
    where it needs one at all. (Built in the background, the client's Python holds the GIL the
    hashing threads want: with another way to the store, on first use is faster.)"""

    def __init__(self, build: Callable[[], Any], *, background: bool = True) -> None:
        import threading

        self._value: Any = None
        self._error: BaseException | None = None
        self._build = build
        self._lock = threading.Lock()
        self._built = False
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._run, name="deferred", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._build()
        except BaseException as e:  # re-raised where the value is first used
            self._error = e
        self._built = True

    def get(self) -> Any:
        if self._thread is not None:
            self._thread.join()
        else:
            with self._lock:
                if not self._built:
                    self._run()
        if self._error is not None:
            raise self._error
        return self._value

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


def list_objects(s3: Any, bucket: str, prefix: str = "") -> Iterator[dict]:
    """Every object under ``prefix`` (``list_objects_v2``, 1,000 a request). A plain loop over
    continuation tokens: botocore's paginator loads its JSON model first (~40 ms)."""
    kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        page = s3.list_objects_v2(**kwargs)
        yield from page.get("Contents", [])
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return
        kwargs["ContinuationToken"] = token


def read_json(s3: Any, uri: str) -> Any:
    bucket, key = parse_s3_uri(uri)
    return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())


def write_json(s3: Any, uri: str, obj: Any) -> None:
    """PUT ``obj`` as JSON at ``uri`` (one PUT: atomic on S3)."""
    bucket, key = parse_s3_uri(uri)
    body = json.dumps(obj, indent=2, sort_keys=True, default=str).encode()
    s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")


def object_exists(s3: Any, bucket: str, key: str) -> dict | None:
    """HEAD ``key``: its response dict, or None when absent (404).

    A store answers 403, not 404, for a missing object to credentials that may not list the whole
    bucket (S3's rule, Ceph RGW's too): a team's key, listed only under its prefix
    (:mod:`pipectl.pipelines.store_policy`). Then a listing of ``key`` decides: absent is None, and
    a 403 for an object that is there (or a listing refused too) is raised as it came; a listing
    that fails otherwise raises its own error (a HEAD has no body to say "wrong key")."""
    from botocore.exceptions import ClientError

    try:
        return s3.head_object(Bucket=bucket, Key=key)
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code in ("404", "NoSuchKey", "NotFound"):
            return None
        if code not in DENIED_CODES:
            raise
        try:
            listed = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("Contents", [])
        except ClientError as listing:
            if listing.response.get("Error", {}).get("Code") in DENIED_CODES:
                raise e from None
            raise  # the listing names what the HEAD could not (a wrong key: InvalidAccessKeyId)
        if not listed or listed[0]["Key"] != key:
            return None
        raise


DENIED_CODES = frozenset({"403", "AccessDenied", "Forbidden", "AllAccessDisabled"})
"""S3 error codes of a request the store refused to these credentials (boto3's ``Error.Code``;
a HEAD has no body, so its code is the status)."""


def ensure_bucket(s3: Any, bucket: str) -> None:
    """Create ``bucket`` if it does not exist ("already owned" is success). A bucket these
    credentials may not look at (403) exists: a team's key may use only a prefix of it, and its
    reads and writes there say whether it may."""
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=bucket)
        return
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code")
        if code in DENIED_CODES:
            return
        if code not in ("404", "NoSuchBucket", "NotFound"):
            raise
    try:
        s3.create_bucket(Bucket=bucket)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
            raise


# ---------------------------------------------------------------- argv and outputs


def _flag(name: str) -> str:
    return "--" + kebab(name)


def build_parser(model: type[BaseModel], prog: str) -> argparse.ArgumentParser:
    """One ``--kebab-name`` option per Input field, plus ``--outputs-dir``."""
    parser = argparse.ArgumentParser(prog=prog)
    for name, field in model.model_fields.items():
        parser.add_argument(_flag(name), dest=name, default=None, help=field.description)
    parser.add_argument(
        "--outputs-dir",
        default=OUTPUTS_DIR,
        help="Folder for output parameters, one file per field (Argo reads them via valueFrom.path).",
    )
    return parser


def write_outputs(output: BaseModel, outputs_dir: Path) -> None:
    """Write each field to ``outputs_dir/<kebab-name>`` and the whole output to ``output.json``."""
    outputs_dir.mkdir(parents=True, exist_ok=True)
    data = output.model_dump(mode="json")
    for name, value in data.items():
        text = value if isinstance(value, str) else json.dumps(value)
        if value is None:
            text = ""
        (outputs_dir / kebab(name)).write_text(text)
    (outputs_dir / "output.json").write_text(json.dumps(data, indent=2, sort_keys=True))


def record_for_torchelastic(exc: BaseException) -> None:
    """Under torchrun, write the exception to the worker's error file (``TORCHELASTIC_ERROR_FILE``)
    in torchelastic's format, as its ``@record`` does: the launcher reads the failure's class from
    it (components/pipectl/components/train/faults.py). Outside torchrun: nothing."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}
    with contextlib.suppress(OSError):
        Path(path).write_text(json.dumps(data))


def classify_exception(exc: BaseException) -> ExitCode:
    """Map an exception to a step exit code: connection/5xx/throttling -> 75, else 1."""
    if isinstance(exc, StepError):
        return exc.step_exit
    try:
        from botocore.exceptions import ClientError, ConnectionError as BotoConnectionError
        from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

        if isinstance(exc, (EndpointConnectionError, BotoConnectionError, ReadTimeoutError)):
            return ExitCode.TEMPFAIL
        if isinstance(exc, ClientError):
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            code = exc.response.get("Error", {}).get("Code", "")
            if status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                return ExitCode.TEMPFAIL
    except ImportError:  # pragma: no cover - botocore is a dependency
        pass
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return ExitCode.TEMPFAIL
    return ExitCode.FAILED


def describe_validation_error(e: ValidationError) -> str:
    """One line per invalid field, named as the parameter/flag (kebab-case), with the value given
    (repr, cut at 60 characters: a hostile value stays readable and on one line)::

        parameter model-name: Value error, model name must be ... (got 'x\\n  securityContext: ...')
    """
    lines = []
    for err in e.errors():
        name = kebab(str(err["loc"][0])) if err.get("loc") else "(input)"
        got = repr(err.get("input"))
        got = got if len(got) <= 60 else got[:57] + "..."
        lines.append(f"parameter {name}: {err['msg']} (got {got})")
    return "\n".join(lines)


GC_GEN0_THRESHOLD = 20_000
"""Allocations between two collections of the youngest generation in a step (Python's default: 700)."""


def settle_gc() -> None:
    """Once the imports are done: keep what they made out of every later collection
    (``gc.freeze``) and collect the youngest generation every :data:`GC_GEN0_THRESHOLD`
    allocations. A step allocates short-lived containers by the thousand (a staging: a few per
    file), and the collector walked the import's objects each time and found nothing; staging
    2,000 small files, the collections cost 6% of the client's CPU and 4% of the wall time.
    Garbage in reference cycles still goes, a little later."""
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, older, oldest)


def step_main(
    input_model: type[I],
    run: Callable[[I, StoreSettings], O],
    argv: list[str] | None = None,
    prog: str = "pipectl-step",
) -> int:
    """Parse argv into ``input_model``, read settings from env, call ``run``, write outputs.

    Returns the exit code (0, 1 or 75; see :class:`ExitCode`); never raises.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    args = build_parser(input_model, prog).parse_args(argv)
    raw = {k: v for k, v in vars(args).items() if k != "outputs_dir" and v is not None}
    try:
        inp = input_model.model_validate(raw)
    except ValidationError as e:
        print(f"error: invalid input for {prog}:\n{describe_validation_error(e)}", file=sys.stderr)
        return ExitCode.FAILED
    settings = StoreSettings()
    settle_gc()
    try:
        output = run(inp, settings)
    except Exception as exc:  # the one boundary where a step's errors become exit codes
        code = classify_exception(exc)
        headline = getattr(exc, "headline", None) or f"{type(exc).__name__}: {exc}"
        hint = getattr(exc, "hint", "")
        print(f"error: {prog}: {headline}", file=sys.stderr)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        if code == ExitCode.FAILED and not isinstance(exc, StepError):
            log.exception("unexpected failure")
        record_for_torchelastic(exc)
        return code
    if os.environ.get("RANK", "0") != "0":
        return ExitCode.OK  # under torchrun only rank 0 reports outputs
    write_outputs(output, Path(args.outputs_dir))
    print(json.dumps(output.model_dump(mode="json"), sort_keys=True))
    return ExitCode.OK


# ---------------------------------------------------------------- the user's code, by reference

def _pipectl_or_import_frame(filename: str) -> bool:
    """A frame of pipectl's own code (a loaded ``pipectl.*`` module) or of Python's import machinery."""
    import importlib

    if filename.startswith("<frozen importlib"):
        return True
    path = os.path.realpath(filename)
    if os.path.dirname(path) == os.path.dirname(os.path.realpath(importlib.__file__)):
        return True
    return any(os.path.realpath(m.__file__) == path for n, m in list(sys.modules.items())
               if (n == "pipectl" or n.startswith("pipectl.")) and getattr(m, "__file__", None))


def user_traceback(exc: BaseException) -> str:
    """``exc`` as Python prints it, chained exceptions included, with only the user's frames: the
    import machinery's and pipectl's own are left out, so the first frame shown is the user's
    module and the last the line that raised."""
    shown = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    pending = [shown]
    while pending:
        te = pending.pop()
        if id(te) in seen:
            continue
        seen.add(id(te))
        te.stack = traceback.StackSummary.from_list([f for f in te.stack if not _pipectl_or_import_frame(f.filename)])
        pending += [c for c in (te.__cause__, te.__context__) if c is not None]
    return "".join(shown.format())


def resolve_callable(ref: str, what: str, arity: int, example: str) -> Callable[..., Any]:
    """The function ``module.path:name`` (``ref``: imported from the step's image, or the run's
    code path locally) that takes ``arity`` positional arguments. StepError naming what is wrong
    (``what``: e.g. "train function"; ``example``: its expected signature): the module does not
    import (its traceback is logged), no such name, not a function of that many arguments."""
    import importlib
    import inspect

    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # the user's module: its own traceback, then a failure of the code
        log.error("importing %s failed:\n%s", module_name, user_traceback(e))
        raise StepError(f"{what} {ref}: importing {module_name} failed: {type(e).__name__}: {e}",
                        "install your package in the step's image (FROM pipectl's step image); "
                        "locally, run from the pipeline file's folder") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise StepError(f"{what} {ref}: {module_name} has no {attr!r}", f"define {example} in {module_name}")
    try:
        inspect.signature(fn).bind(*([object()] * arity))
    except (TypeError, ValueError):
        raise StepError(f"{what} {ref}: must take {arity} argument{'s' if arity > 1 else ''} (it is {type(fn).__name__} "
                        f"{attr})", example) from None
    return fn

