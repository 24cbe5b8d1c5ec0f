"""Single PUTs of many small local files from several processes (past the GIL).

Profiling ``stage`` on 2 cores (tests/bench/bench_storage.py): for small files the time is
botocore's per-request CPU (~1.2 ms of Python per PUT: serialising, signing, urllib3), which the
GIL holds to one core however many threads wait on the network. With ``upload_processes`` > 1
(opt-in: on 2 busy cores it measured slower than threads, README) and above ``MIN_FILES``
files, the PUTs are spread over ``processes`` spawned workers, each with its own client and
``threads`` threads, in batches of ``BATCH`` files; each PUT is verified exactly as in
:class:`~pipectl.components.stage.targets.S3Target` (it is that code). Workers die with the
stage process (``PR_SET_PDEATHSIG``), so a SIGKILL of stage stops the uploads too.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from typing import Any

MIN_FILES = 2000
BATCH = 250


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux/glibc: workers still end when their queue closes
        pass


_TARGET: Any = None
_THREADS = 1


def _init(settings_json: str, bucket: str, threads: int) -> None:
    global _TARGET, _THREADS
    _die_with_parent()
    from pipectl.components.contracts import StoreSettings
    from pipectl.components.runtime import s3_client
    from pipectl.components.stage.targets import S3Target

    settings = StoreSettings.model_validate_json(settings_json)
    _TARGET = S3Target(s3_client(settings, max_pool=threads), bucket, skip_100_continue=True)
    _THREADS = threads


def _put_batch(items: list[tuple[str, str, str, str]]) -> tuple[int, str | None, bool]:
    """items: (key, local path, ManifestEntry JSON, md5). Returns (retries, error, transient)."""
    from concurrent.futures import ThreadPoolExecutor

    from pipectl.components.contracts import ManifestEntry
    from pipectl.components.runtime import classify_exception
    from pipectl.components.stage.targets import SourceFile

    def one(item: tuple[str, str, str, str]) -> int:
        key, path, entry_json, md5 = item
        entry = ManifestEntry.model_validate_json(entry_json)
        src = SourceFile(key=entry.key, label=entry.label, size=entry.size, open=lambda: open(path, "rb"), path=path)
        return _TARGET.put(key, src, entry, md5)

    try:
        with ThreadPoolExecutor(max_workers=_THREADS) as pool:
            return sum(pool.map(one, items)), None, False
    except Exception as exc:  # exceptions cross the process boundary as text + transient flag
        from pipectl.components.contracts import ExitCode

        msg = getattr(exc, "headline", None) or f"{type(exc).__name__}: {exc}"
        return 0, msg, classify_exception(exc) == ExitCode.TEMPFAIL


def put_in_processes(settings: Any, bucket: str, items: list[tuple[str, str, str, str]], processes: int, threads: int) -> int:
    """PUT ``items`` (see :func:`_put_batch`) from ``processes`` spawned workers; returns the
    retried requests. Raises StepError (transient when the failure was) on the first failed batch."""
    import multiprocessing

    from pipectl.components.runtime import StepError

    batches = [items[i:i + BATCH] for i in range(0, len(items), BATCH)]
    ctx = multiprocessing.get_context("spawn")  # no fork of a threaded process with live clients
    retries = 0
    with ProcessPoolExecutor(max_workers=processes, mp_context=ctx, initializer=_init,
                             initargs=(settings.model_dump_json(), bucket, threads)) as pool:
        for n, error, transient in pool.map(_put_batch, batches):
            if error is not None:
                raise StepError(f"upload failed: {error}", "rerun: objects already written and verified are skipped",
                                transient=transient)
            retries += n
    return retries


def default_processes() -> int:
    """One worker per CPU this process may use (:func:`~pipectl.components.runtime.available_cpus`:
    affinity mask capped by the cgroup CPU quota), at most 8."""
    from pipectl.components.runtime import available_cpus

    return min(available_cpus(), 8)
