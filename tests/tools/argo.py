"""Upstream Argo code for tests: the controller's own retry-expression evaluation.

``argoexpr`` (tests/tools/argoexpr/main.go) is built from the argo-workflows v4 module through the
Go module proxy and cached under ~/.cache/pipectl/bin keyed by its sources, so the answers the
tests check are the ones a real workflow controller gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

SRC = Path(__file__).resolve().parent / "argoexpr"


def argoexpr_binary() -> Path:
    digest = hashlib.sha256(b"".join((SRC / f).read_bytes() for f in ("main.go", "go.mod", "go.sum"))).hexdigest()[:16]
    cache = Path(os.environ.get("PIPECTL_CACHE_DIR", Path.home() / ".cache" / "pipectl")) / "bin"
    binary = cache / f"argoexpr-{digest}"
    if binary.exists():
        return binary
    go = shutil.which("go") or "/usr/local/go/bin/go"
    cache.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_suffix(".tmp")
    subprocess.run([go, "build", "-o", str(tmp), "."], cwd=SRC, check=True, env={**os.environ, "CGO_ENABLED": "0"})
    tmp.replace(binary)
    return binary


class ArgoExpr:
    """Retry expressions (scope as the controller's buildRetryStrategyLocalScope) and resource conditions (as argoexec)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([str(argoexpr_binary())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def should_retry(self, expression: str, *, retries: int, status: str, exit_code: str, message: str, duration_s: float = 30.0) -> bool:
        scope = {
            "retries": str(retries),
            "lastRetry.exitCode": exit_code,
            "lastRetry.status": status,
            "lastRetry.duration": str(duration_s),
            "lastRetry.message": message,
        }
        self.proc.stdin.write(json.dumps({"expression": expression, "scope": scope}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if answer.get("error"):
            raise ValueError(answer["error"])
        return bool(answer["result"])

    def resource_state(self, success: str, failure: str, obj: dict) -> str:
        """"succeeded", "failed" or "waiting": argoexec's verdict on ``obj`` for the conditions."""
        self.proc.stdin.write(json.dumps({"success": success, "failure": failure, "object": obj}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if answer.get("error"):
            raise ValueError(answer["error"])
        return answer["state"]

    def substitute(self, template: dict, params: dict[str, str], strict: bool = False) -> dict:
        """``template`` (a Workflow template, as JSON) with ``params`` (``inputs.parameters.x`` ->
        value) substituted by the controller's own code (util/template.Replace); ``strict``: an
        unresolved tag raises ValueError, as when the controller computes a custom metric."""
        self.proc.stdin.write(json.dumps({"template": template, "params": params, "strict": strict}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if answer.get("error"):
            raise ValueError(answer["error"])
        return answer["template"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
