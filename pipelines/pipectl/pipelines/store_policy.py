"""Each team's key reaches its own S3 prefix and nothing else: the bucket policy. Pure: no I/O.

A team's namespace holds the store's Secret with a key of the team's own (a Ceph RGW user, an AWS
IAM user or role: the team's ``s3_principal``). The bucket's owner (the platform's key) keeps every
right; the policy grants each team's identity, on its ``s3_prefix`` only: reading, writing and
deleting objects (multipart uploads included) and listing keys that start with the prefix. It
grants nothing else, so the store refuses the team's key anywhere outside its prefix: another
team's datasets, runs and logs, the shared ``datasets/`` and ``runs/`` of pipectl's own namespace.

pipectl owns the statements whose ``Sid`` starts with :data:`SID_PREFIX`; :func:`merged_policy`
replaces those and keeps every other statement of a bucket's policy as it was.

Example (a site with teams vision and speech on bucket ``pipectl``)::

    policies = bucket_policies(cfg.teams)          # {"pipectl": [statements...]}
    body = merged_policy(existing_policy_or_None, "pipectl", policies["pipectl"])
"""

from __future__ import annotations

from pipectl.components.runtime import parse_s3_uri
from pipectl.pipelines.tenancy import TeamSpec

SID_PREFIX = "pipectl-team-"
"""Statements pipectl writes into a bucket's policy (one pair per team) start their Sid with this."""
POLICY_VERSION = "2012-10-17"
OBJECT_ACTIONS = ("s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload",
                  "s3:ListMultipartUploadParts")
"""What a team's key may do with an object under its prefix (a multipart upload is PutObject)."""


def team_statements(team: TeamSpec) -> list[dict]:
    """The two statements granting ``team.s3_principal`` its prefix: its objects, and listing keys
    under it (``s3:prefix``). ValueError when the team names no ``s3_principal``."""
    if team.s3_principal is None:
        raise ValueError(f"team {team.name} has no s3_principal: name the store identity of its key "
                         "(Ceph RGW: arn:aws:iam:::user/<uid>) under the team in the site file")
    bucket, key = parse_s3_uri(team.s3_prefix)
    who = {"AWS": [team.s3_principal]}
    return [
        {"Sid": f"{SID_PREFIX}{team.name}-objects", "Effect": "Allow", "Principal": who,
         "Action": list(OBJECT_ACTIONS), "Resource": [f"arn:aws:s3:::{bucket}/{key}*"]},
        {"Sid": f"{SID_PREFIX}{team.name}-list", "Effect": "Allow", "Principal": who,
         "Action": ["s3:ListBucket"], "Resource": [f"arn:aws:s3:::{bucket}"],
         "Condition": {"StringLike": {"s3:prefix": [f"{key}*"]}}},
    ]


def bucket_policies(teams: tuple[TeamSpec, ...]) -> dict[str, list[dict]]:
    """Bucket -> pipectl's statements for the teams whose prefix is in it (every team's, in order)."""
    out: dict[str, list[dict]] = {}
    for team in teams:
        out.setdefault(parse_s3_uri(team.s3_prefix)[0], []).extend(team_statements(team))
    return out


def merged_policy(existing: dict | None, statements: list[dict]) -> dict:
    """``existing`` (a bucket's policy, or None) with pipectl's statements replaced by
    ``statements``; every statement pipectl does not own (:data:`SID_PREFIX`) kept, first."""
    kept = [s for s in (existing or {}).get("Statement", []) if not str(s.get("Sid", "")).startswith(SID_PREFIX)]
    return {"Version": (existing or {}).get("Version", POLICY_VERSION), "Statement": kept + statements}
