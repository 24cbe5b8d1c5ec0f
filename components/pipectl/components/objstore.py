"""obstore (Rust ``object_store``) clients on the S3 endpoint a boto3 client talks to: the steps'
bulk path (stage's PUTs, preprocess's GETs and shard PUTs). Requests are built, signed and
sent in Rust with the GIL released, so a thread pool overlaps them for a fraction of botocore's
CPU per request (the measurements: stage/transfer.py). With an :class:`Endpoint` (a URL and static
keys) obstore needs no boto3 client at all: a staging from local files then reads and writes its
manifest and lists what is there through it too (boto3's import and client cost ~0.15 s of CPU at
a step's start, and a client built beside the hashing threads held the GIL they wait for). boto3
stays for everything else (creating a bucket, copies, C14 stores, the other steps' listings and
HEADs, Alluxio's S3 proxy) and answers again whatever obstore could not."""

from __future__ import annotations

import os
import random
import re
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

_STATUS = re.compile(r"status code: (\d{3})")
ATTEMPTS = 5  # botocore's standard retry mode makes 5 attempts in all too
MiB = 1 << 20


class StoreUnavailable(ConnectionError):
    """A request that failed with a transient error (5xx, throttling, connection) on every attempt."""


def is_transient(exc: BaseException) -> bool:
    """An obstore error worth retrying: 5xx, 429/throttling, or no HTTP answer at all
    (connection refused or reset, timeout)."""
    text = str(exc)
    status = _STATUS.search(text)
    if status:
        code = int(status.group(1))
        return code >= 500 or code == 429 or "SlowDown" in text
    return "HTTP error" in text or "timed out" in text.lower() or "connection" in text.lower()


def headline(exc: BaseException) -> str:
    return str(exc).split("\n", 1)[0][:300]


@dataclass(frozen=True)
class Endpoint:
    """An S3 endpoint and static keys (a step's ``StoreSettings``): what obstore needs to talk to
    the store without a boto3 client (whose import and model loading cost ~0.15 s of CPU at a
    step's start)."""

    url: str
    region: str
    access_key: str
    secret_key: str

    @classmethod
    def of(cls, settings: Any) -> "Endpoint | None":
        """From ``StoreSettings``; None without an endpoint URL or keys (boto3's credential chain
        then: a web identity, an instance role)."""
        if not (settings.s3_endpoint and settings.s3_access_key and settings.s3_secret_key):
            return None
        return cls(settings.s3_endpoint, settings.s3_region or "us-east-1", settings.s3_access_key, settings.s3_secret_key)


def s3_store(s3: Any, bucket: str, *, retries: int, timeout: str) -> Any:
    """An obstore ``S3Store`` of ``bucket`` at the endpoint, region and credentials of ``s3`` (a
    boto3 client, or an :class:`Endpoint`), path-style, unsigned payloads, retrying ``retries``
    times with exponential backoff."""
    from obstore.store import S3Store

    if isinstance(s3, Endpoint):
        endpoint, region = s3.url, s3.region
        credentials: dict[str, Any] = {"access_key_id": s3.access_key, "secret_access_key": s3.secret_key}
    else:
        endpoint, region = s3.meta.endpoint_url, s3.meta.region_name or "us-east-1"
        credentials = {"credential_provider": BotoCredentials(s3)}
    client: dict[str, Any] = {"connect_timeout": "5s", "timeout": timeout, "allow_http": endpoint.startswith("http://")}
    ca = os.environ.get("AWS_CA_BUNDLE")  # boto3 trusts it; a private CA in front of RGW
    if ca and endpoint.startswith("https://") and Path(ca).is_file():
        client["root_certificate"] = Path(ca).read_text()
    return S3Store(
        bucket, endpoint=endpoint, region=region,
        virtual_hosted_style_request=False, unsigned_payload=True, client_options=client, **credentials,
        retry_config={"max_retries": retries, "retry_timeout": timedelta(minutes=5),
                      "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15), "base": 2}},
    )


class BotoCredentials:
    """obstore's credential callback, answered by the boto3 client's own credentials (static keys,
    or a refreshing chain such as a web identity: obstore asks again when they expire)."""

    def __init__(self, s3: Any) -> None:
        self._credentials = s3._request_signer._credentials  # botocore keeps them on the signer

    def __call__(self) -> dict[str, Any]:
        from datetime import datetime, timezone

        frozen = self._credentials.get_frozen_credentials()
        refreshing = hasattr(self._credentials, "refresh_needed")
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": datetime.now(timezone.utc) + timedelta(minutes=5) if refreshing else None}


class ObjectReader:
    """GETs of whole objects of one bucket (the caller's threads overlap them). A failure that
    outlives obstore's retries is :class:`StoreUnavailable` when transient (exit 75), else raised
    as obstore raises it (a missing object: ``FileNotFoundError``)."""

    def __init__(self, s3: Any, bucket: str) -> None:
        self.bucket = bucket
        self._store = s3_store(s3, bucket, retries=5, timeout="120s")

    def get(self, key: str) -> bytes:
        import obstore

        try:
            return bytes(obstore.get(self._store, key).bytes())
        except Exception as exc:
            if is_transient(exc):
                raise StoreUnavailable(f"read of s3://{self.bucket}/{key} failed: {headline(exc)}") from exc
            raise


def part_plan(size: int) -> tuple[int, int]:
    """(part size, parts in flight) for a multipart upload of ``size`` bytes: about 16 parts of
    8-64 MiB (at most 10,000 parts: the S3 limit), up to 8 in flight (8 MiB x 8 and 32 MiB x 4
    both reached ~640 MB/s to RGW here; 16 in flight was slower)."""
    part = min(64 * MiB, max(8 * MiB, -(-size // 16 // MiB) * MiB))
    part = max(part, -(-size // 10_000 // MiB) * MiB)  # > 640 GiB: larger parts, never > 10,000
    return part, max(1, min(8, -(-size // part)))


class ObjectWriter:
    """PUTs into one bucket of the S3 endpoint a boto3 client talks to (same endpoint, region,
    credentials and path-style addressing), or of an :class:`Endpoint` (``endpoint``; the boto3
    client ``s3`` is then used only to abort a failed multipart upload); and the few reads a
    writer needs (:meth:`read`, :meth:`listing`)."""

    def __init__(self, s3: Any, bucket: str, endpoint: Endpoint | None = None) -> None:
        self.bucket = bucket
        self.s3 = s3
        where = endpoint if endpoint is not None else s3
        self.endpoint = endpoint.url if endpoint is not None else s3.meta.endpoint_url
        self._single = self._store(where, retries=0, timeout="60s")  # retried (and counted) by put()
        self._parts = self._store(where, retries=5, timeout="600s")
        self._rng = random.Random()
        self._lock = threading.Lock()

    def _store(self, s3: Any, *, retries: int, timeout: str) -> Any:
        return s3_store(s3, self.bucket, retries=retries, timeout=timeout)

    def read(self, key: str) -> bytes | None:
        """``key``'s bytes, or None when absent (404). Any other answer is raised as obstore raises it."""
        import obstore

        try:
            return bytes(obstore.get(self._parts, key).bytes())
        except FileNotFoundError:  # obstore's NotFoundError
            return None

    def listing(self, prefix: str) -> list[tuple[str, int, str]]:
        """(key, size, ETag without quotes) of every object under ``prefix`` (1,000 a request)."""
        import obstore

        return [(meta["path"], meta["size"], (meta.get("e_tag") or "").strip('"'))
                for page in obstore.list(self._parts, prefix, chunk_size=1000) for meta in page]

    def put(self, key: str, body: bytes | memoryview, metadata: dict[str, str]) -> tuple[str, int]:
        """One PUT of ``body``; returns (ETag without quotes, retried attempts)."""
        import obstore

        for attempt in range(ATTEMPTS):
            try:
                result = obstore.put(self._single, key, body, attributes=metadata, use_multipart=False)
                return (result.get("e_tag") or "").strip('"'), attempt
            except Exception as exc:  # obstore raises its own classes; only transient ones retry
                if not is_transient(exc):
                    raise self._failed(key, exc, transient=False) from exc
                if attempt == ATTEMPTS - 1:
                    raise self._failed(key, exc, transient=True) from exc
                with self._lock:
                    jitter = self._rng.random()
                time.sleep(min(15.0, 0.1 * 2 ** attempt) * jitter)
        raise AssertionError("unreachable")

    def put_file(self, key: str, path: str | Path, size: int, metadata: dict[str, str]) -> None:
        """A multipart upload of the file at ``path`` (parts read and sent in Rust)."""
        import obstore

        part, in_flight = part_plan(size)
        try:
            obstore.put(self._parts, key, Path(path), attributes=metadata, use_multipart=True,
                        chunk_size=part, max_concurrency=in_flight)
        except Exception as exc:
            self._abort_uploads(key)
            raise self._failed(key, exc, transient=is_transient(exc)) from exc

    def stream(self, key: str, part_size: int, in_flight: int = 4) -> "Upload":
        """An :class:`Upload` of ``key``: bytes written in order, sent in parts of ``part_size``
        (at least 5 MiB: S3's smallest part) while later ones are still being produced."""
        return Upload(self, key, part_size, in_flight)

    def _abort_uploads(self, key: str) -> None:
        """Abort the unfinished multipart uploads of ``key`` (obstore leaves a failed one's parts
        on the store and does not tell its upload id). Best effort: the write has failed anyway."""
        try:
            listed = self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=key)
            for upload in listed.get("Uploads", []):
                if upload["Key"] == key:
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"])
        except Exception:  # the store is unreachable: the failure itself is what gets reported
            pass

    def _failed(self, key: str, exc: BaseException, *, transient: bool) -> Exception:
        where = f"s3://{self.bucket}/{key} at {self.endpoint}"
        if transient:
            return StoreUnavailable(f"write of {where} failed: {headline(exc)}")
        from pipectl.components.runtime import StepError

        return StepError(f"write of {where} refused: {headline(exc)}",
                         "check the bucket, the credentials and the store's permissions")


class Upload:
    """One object written as a stream through obstore's multipart writer: :meth:`write` the bytes
    in order (parts go out while later bytes are produced), :meth:`close` completes the object,
    :meth:`abort` drops it and its parts. A failed write or close aborts it and raises as
    :class:`ObjectWriter` does (transient: :class:`StoreUnavailable`)."""

    def __init__(self, owner: ObjectWriter, key: str, part_size: int, in_flight: int) -> None:
        import obstore

        self._owner, self.key, self._done = owner, key, False
        self._file = obstore.open_writer(owner._parts, key, buffer_size=max(5 * MiB, part_size), max_concurrency=in_flight)

    def write(self, data: bytes | memoryview) -> None:
        try:
            self._file.write(data)
        except Exception as exc:
            self.abort()
            raise self._owner._failed(self.key, exc, transient=is_transient(exc)) from exc

    def close(self) -> None:
        """Complete the object (sends what is buffered, then the multipart completion)."""
        self._done = True
        try:
            self._file.__exit__(None, None, None)
        except Exception as exc:
            self._owner._abort_uploads(self.key)
            raise self._owner._failed(self.key, exc, transient=is_transient(exc)) from exc

    def abort(self) -> None:
        """Drop the upload: no object, no parts left on the store (idempotent; best effort)."""
        if self._done:
            return
        self._done = True
        dropped = RuntimeError("upload dropped")
        try:  # obstore's writer aborts its multipart upload when its context exits with an error
            self._file.__exit__(RuntimeError, dropped, None)
        except Exception:
            self._owner._abort_uploads(self.key)
