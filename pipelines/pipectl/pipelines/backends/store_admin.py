"""The bucket policies that hold each team's key to its prefix, applied to the store
(``pipectl teams store-policy --apply``) as the bucket's owner.

:mod:`~pipectl.pipelines.store_policy` says what each bucket's policy holds for the teams; here the
policy in force is read (``GetBucketPolicy``), pipectl's statements in it replaced and every other
statement kept (:func:`~pipectl.pipelines.store_policy.merged_policy`), and the result written
(``PutBucketPolicy``: one request per bucket, which the store applies whole or not at all).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipectl.components.errors import Unreachable
from pipectl.components.runtime import DENIED_CODES
from pipectl.pipelines.store_policy import merged_policy


@dataclass(frozen=True)
class Applied:
    """One bucket's outcome: pipectl's statements written, the others kept as they were."""

    bucket: str
    statements: int
    kept: int


def policy_in_force(s3: Any, bucket: str) -> dict | None:
    """The bucket's policy, or None when it has none."""
    from botocore.exceptions import ClientError

    try:
        return json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "NoSuchBucketPolicy":
            return None
        raise


def apply_policies(s3: Any, policies: dict[str, list[dict]]) -> list[Applied]:
    """Write ``policies`` (bucket -> pipectl's statements) into each bucket's policy. A bucket that
    does not exist is created first (as the stage step would). Unreachable (exit 3) naming the
    bucket when the store refuses these credentials or cannot be reached: the buckets before it
    are done, the rest untouched (running it again finishes the job)."""
    from botocore.exceptions import BotoCoreError, ClientError

    from pipectl.components.runtime import ensure_bucket

    done = []
    for bucket, statements in sorted(policies.items()):
        try:
            ensure_bucket(s3, bucket)
            policy = merged_policy(policy_in_force(s3, bucket), statements)
            s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            hint = ("use the bucket owner's key (PIPECTL_S3_ACCESS_KEY/PIPECTL_S3_SECRET_KEY): only it may set the "
                    "bucket's policy" if code in DENIED_CODES else "check the bucket and the store's S3 API")
            raise Unreachable(f"the store refused the policy of bucket {bucket} ({e.operation_name}: {code})"
                              + _progress(done), hint) from e
        except BotoCoreError as e:
            raise Unreachable(f"cannot reach the store for bucket {bucket}: {e}" + _progress(done),
                              "set PIPECTL_S3_ENDPOINT to the store's S3 endpoint as this machine reaches it") from e
        done.append(Applied(bucket, len(statements), len(policy["Statement"]) - len(statements)))
    return done


def _progress(done: list[Applied]) -> str:
    return f" (done before it: {', '.join(a.bucket for a in done)})" if done else ""

