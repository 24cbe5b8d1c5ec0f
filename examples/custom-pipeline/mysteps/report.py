"""A step of the team's own: read what the train step wrote to the run's folder in the store,
write a short Markdown report beside it, and output the report's URI.

Reads the store settings pipectl gives every step with store access (PIPECTL_S3_ENDPOINT,
PIPECTL_S3_ACCESS_KEY, PIPECTL_S3_SECRET_KEY, PIPECTL_S3_REGION); outputs go to /tmp/outputs/<name>.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import boto3


def _split(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key.rstrip("/")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--run-uri", required=True)
    ap.add_argument("--model-name", required=True)
    ap.add_argument("--outputs-dir", default=os.environ.get("PIPECTL_OUTPUTS_DIR", "/tmp/outputs"))
    a = ap.parse_args()
    s3 = boto3.client("s3", endpoint_url=os.environ.get("PIPECTL_S3_ENDPOINT"),
                      aws_access_key_id=os.environ.get("PIPECTL_S3_ACCESS_KEY"),
                      aws_secret_access_key=os.environ.get("PIPECTL_S3_SECRET_KEY"),
                      region_name=os.environ.get("PIPECTL_S3_REGION", "us-east-1"))
    bucket, prefix = _split(a.run_uri)
    trained = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}/train-output.json")["Body"].read())
    lines = [f"# {a.model_name}", "", "| field | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(trained.items()) if not isinstance(v, (dict, list))]
    key = f"{prefix}/report.md"
    s3.put_object(Bucket=bucket, Key=key, Body="\n".join(lines).encode() + b"\n")
    out = Path(a.outputs_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report-uri").write_text(f"s3://{bucket}/{key}")
    print(f"report: s3://{bucket}/{key} ({len(lines) - 4} fields)")


if __name__ == "__main__":
    main()
