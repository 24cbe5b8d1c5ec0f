"""Alluxio in front of the object store: warm a staged dataset into its cache, read through it.

Assumes the layout an Alluxio admin sets up for an S3 store: each bucket mounted at ``/<bucket>``
(``alluxio fs mount /<bucket> s3://<bucket>/``), so Alluxio's S3 proxy serves the same bucket and
key names as the gateway (Ceph RGW) behind it, and a staged object ``s3://b/k`` is the Alluxio
file ``/b/k``. Endpoints (``StoreSettings``):

- ``alluxio_proxy_url`` (``http://proxy:39999``): the S3 API under ``/api/v1/s3`` (reads of
  ``preprocess`` and ``train`` go there when it is set) and the file-system REST API under
  ``/api/v1/paths`` (file status: ``inAlluxioPercentage``).
- ``alluxio_job_master_url`` (``http://job-master:20002``): the job service's REST API; a warm-up
  submits ``Load`` jobs in batches (``BatchedJobConfig``), as ``alluxio fs distributedLoad`` does.

Checked against Alluxio 2.9.4 (the last 2.x release on Maven Central) over Ceph 16.2 RGW; see
tests/alluxio/alluxio.py for the settings that mattered.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any

from pipectl.components.contracts import StoreSettings
from pipectl.components.runtime import StepError, s3_client

LOAD_CONFIG = "alluxio.job.plan.load.LoadConfig"
BATCHED_CONFIG = "alluxio.job.plan.BatchedJobConfig"


class AlluxioError(StepError):
    """Alluxio refused or failed an operation (not a connection error: those are transient)."""


def alluxio_s3_client(settings: StoreSettings, *, max_pool: int = 32) -> Any:
    """A boto3 S3 client for Alluxio's S3 proxy (``<alluxio_proxy_url>/api/v1/s3``), path-style.

    The proxy takes the access key as the Alluxio user name; the store's keys are reused.
    Raises ValueError when ``settings.alluxio_proxy_url`` is not set.
    """
    if not settings.alluxio_proxy_url:
        raise ValueError("settings.alluxio_proxy_url is not set")
    via = settings.model_copy(update={
        "s3_endpoint": settings.alluxio_proxy_url.rstrip("/") + "/api/v1/s3",
        "s3_access_key": settings.s3_access_key or "pipectl",
        "s3_secret_key": settings.s3_secret_key or "unused",
    })
    return s3_client(via, max_pool=max_pool)


def data_read_client(settings: StoreSettings, *, max_pool: int = 32) -> Any:
    """The client steps read staged data and shards with: Alluxio's S3 proxy when
    ``alluxio_proxy_url`` is configured, else the store itself. Writes always go to the store."""
    if settings.alluxio_proxy_url:
        return alluxio_s3_client(settings, max_pool=max_pool)
    return s3_client(settings, max_pool=max_pool)


class AlluxioClient:
    """The two REST APIs a warm-up needs. ``timeout_s``: per HTTP request, seconds.

    Connection failures raise StepError(transient=True) naming the URL (step exit 75; CLI exit 3).
    """

    def __init__(self, proxy_url: str, job_master_url: str, *, timeout_s: float = 60) -> None:
        self.proxy_url = proxy_url.rstrip("/")
        self.job_master_url = job_master_url.rstrip("/")
        self.timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: StoreSettings) -> AlluxioClient:
        if not settings.alluxio_proxy_url or not settings.alluxio_job_master_url:
            raise StepError(
                "no Alluxio configured: warming needs its proxy and job master URLs",
                "set PIPECTL_ALLUXIO_PROXY_URL (http://proxy:39999) and PIPECTL_ALLUXIO_JOB_MASTER_URL (http://job-master:20002)",
                cli_exit=2,
            )
        return cls(settings.alluxio_proxy_url, settings.alluxio_job_master_url)

    def _call(self, method: str, url: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            raise AlluxioError(f"Alluxio answered {e.code} to {method} {url}: {detail}",
                               "check that the bucket is mounted at /<bucket> in Alluxio and the path exists") from e
        except (urllib.error.URLError, OSError) as e:
            raise StepError(f"Alluxio unreachable at {url}: {getattr(e, 'reason', e)}",
                            "check the Alluxio endpoints and that the services run", transient=True, cli_exit=3) from e
        return json.loads(raw) if raw else None

    def list_status(self, path: str) -> list[dict]:
        """File statuses of the children of ``path`` (``name``, ``length`` bytes, ``folder``,
        ``inAlluxioPercentage`` 0-100)."""
        return self._call("POST", f"{self.proxy_url}/api/v1/paths/{path}/list-status", {})

    def submit_load(self, paths: list[str], replication: int = 1) -> int:
        """One job loading ``paths`` (files) into Alluxio workers; returns the job id."""
        body = {"@type": BATCHED_CONFIG, "jobType": "Load",
                "jobConfig": [{"@type": LOAD_CONFIG, "filePath": p, "replication": str(replication)} for p in paths]}
        return int(self._call("POST", f"{self.job_master_url}/api/v1/master/job/run", body))

    def job_status(self, job_id: int) -> dict:
        """``{"status": CREATED|RUNNING|COMPLETED|FAILED|CANCELED, "errorMessage": ..., ...}``."""
        return self._call("GET", f"{self.job_master_url}/api/v1/master/job/get_status?jobId={job_id}")

    def wait(self, job_ids: list[int], timeout_s: float, poll_s: float = 0.2) -> None:
        """Until every job COMPLETED. Raises AlluxioError (transient) on FAILED/CANCELED or timeout."""
        pending = set(job_ids)
        deadline = time.monotonic() + timeout_s
        while pending:
            for j in sorted(pending):
                st = self.job_status(j)
                if st["status"] == "COMPLETED":
                    pending.discard(j)
                elif st["status"] in ("FAILED", "CANCELED"):
                    raise AlluxioError(f"Alluxio load job {j} {st['status']}: {st.get('errorMessage', '')[:500]}",
                                       "see the Alluxio job master's log; rerun (loaded files are kept)", transient=True)
            if pending:
                if time.monotonic() > deadline:
                    raise AlluxioError(f"Alluxio load jobs {sorted(pending)} not done after {timeout_s:.0f}s",
                                       "raise timeout_s or add job workers", transient=True)
                time.sleep(poll_s)

    def cached_bytes(self, files: list[str]) -> tuple[int, int]:
        """(bytes of ``files`` held by Alluxio workers, total bytes), from one list-status per folder."""
        by_dir: dict[str, set[str]] = defaultdict(set)
        for f in files:
            d, name = f.rsplit("/", 1)
            by_dir[d].add(name)
        cached = total = 0
        for d, names in by_dir.items():
            for st in self.list_status(d):
                if st["name"] in names:
                    total += st["length"]
                    cached += st["length"] * st["inAlluxioPercentage"] // 100
        return cached, total
