"""``pipectl doctor``'s store key row: does the key in the namespace's store Secret work where the
runs write?

The store credentials row says the Secret holds a key; this one asks the store with it: one signed
ListObjectsV2 of at most one key under the namespace's store root (the site's bucket, or a team's
``s3_prefix``: the only place a team's key may list). A key the store does not know, a secret that
does not match it, a key refused the prefix and a missing bucket each fail with their fix; a store
that does not answer from this machine (a cluster-internal name) is a warning, as for the store's
own row.

Example::

    finding = key_row("http://rgw.example:8080", {"PIPECTL_S3_ACCESS_KEY": "...", ...}, "s3://ml/teams/vision/")
"""

from __future__ import annotations

from pipectl.components.names import STORE_SECRET
from pipectl.pipelines.backends.doctor_mlflow import Finding, decoded

CHECK = "store key"
UNKNOWN_KEY = ("InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "AuthorizationHeaderMalformed")
REFUSED = ("AccessDenied", "Forbidden", "403", "AllAccessDisabled")


def key_row(endpoint: str, secret: dict[str, str], root_uri: str, timeout: float = 5.0) -> Finding | None:
    """The row for the store key in ``secret`` (the Secret's ``data``, base64 as the API gives it)
    at ``endpoint``, listing under ``root_uri`` (``s3://bucket/prefix/``); None when the Secret holds
    no key (the store credentials row says so)."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    access, secret_key = decoded(secret, "PIPECTL_S3_ACCESS_KEY"), decoded(secret, "PIPECTL_S3_SECRET_KEY")
    if not access or not secret_key:
        return None
    bucket, _, prefix = root_uri.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret_key,
                      region_name="us-east-1",
                      config=Config(s3={"addressing_style": "path"}, connect_timeout=timeout, read_timeout=timeout,
                                    retries={"mode": "standard", "max_attempts": 1}))
    where = f"s3://{bucket}/{prefix}"
    try:
        s3.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        if code in UNKNOWN_KEY:
            return Finding("fail", f"the store at {endpoint} does not accept the key in Secret {STORE_SECRET} ({code})",
                           f"put the store's access key and secret key for this namespace in Secret {STORE_SECRET} "
                           "(PIPECTL_S3_ACCESS_KEY, PIPECTL_S3_SECRET_KEY)")
        if code in REFUSED:
            return Finding("fail", f"the key in Secret {STORE_SECRET} may not list {where} ({code}): every run writes there",
                           "grant the key the prefix (a team's key: pipectl teams store-policy --apply), or point the "
                           "site file's bucket / the team's s3_prefix where the key may write")
        if code == "NoSuchBucket":
            return Finding("fail", f"bucket {bucket} does not exist at {endpoint}",
                           f"create it (s3cmd mb s3://{bucket}, or your store's console), or name an existing one "
                           "in the site file (bucket)")
        return Finding("warn", f"the store answered the listing of {where} with {code or e}: not checked")
    except (BotoCoreError, OSError) as e:
        return Finding("warn", f"{endpoint} did not answer from this machine ({e}): the key was not checked",
                       "a cluster-internal name does not resolve outside the cluster: the steps' own first request "
                       "will say; pipectl doctor --from-pod asks the store from a pod")
    return Finding("ok", f"the key in Secret {STORE_SECRET} lists {where}")
