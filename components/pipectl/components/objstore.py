"""obstore (Rust ``object_store``) clients on the S3 endpoint a boto3 client talks to: the steps'
bulk path for many small objects (stage's PUTs, preprocess's GETs). Requests are built, signed and
sent in Rust with the GIL released, so a thread pool overlaps them for a fraction of botocore's
CPU per request (the measurements: stage/transfer.py). boto3 stays for everything else (listings,
HEADs, copies, Alluxio's S3 proxy)."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

_STATUS = re.compile(r"status code: (\d{3})")


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


def s3_store(s3: Any, bucket: str, *, retries: int, timeout: str) -> Any:
    """An obstore ``S3Store`` of ``bucket`` at ``s3``'s endpoint, region and credentials
    (path-style, unsigned payloads), retrying ``retries`` times with exponential backoff."""
    from obstore.store import S3Store

    endpoint = s3.meta.endpoint_url
    client: dict[str, Any] = {"connect_timeout": "5s", "timeout": timeout, "allow_http": endpoint.startswith("http://")}
    ca = os.environ.get("AWS_CA_BUNDLE")  # boto3 trusts it; a private CA in front of RGW
    if ca and endpoint.startswith("https://") and Path(ca).is_file():
        client["root_certificate"] = Path(ca).read_text()
    return S3Store(
        bucket, endpoint=endpoint, region=s3.meta.region_name or "us-east-1",
        virtual_hosted_style_request=False, unsigned_payload=True,
        credential_provider=BotoCredentials(s3), client_options=client,
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
