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
        return bool(self._ask({"expression": expression, "scope": scope})["result"])

    def resource_state(self, success: str, failure: str, obj: dict) -> str:
        """"succeeded", "failed" or "waiting": argoexec's verdict on ``obj`` for the conditions."""
        return self._ask({"success": success, "failure": failure, "object": obj})["state"]

    def substitute(self, template: dict, params: dict[str, str], strict: bool = False) -> dict:
        """``template`` (a Workflow template, as JSON) with ``params`` (``inputs.parameters.x`` ->
        value) substituted by the controller's own code (util/template.Replace); ``strict``: an
        unresolved tag raises ValueError, as when the controller computes a custom metric."""
        return self._ask({"template": template, "params": params, "strict": strict})["template"]

    def _ask(self, request: dict) -> dict:
        """One request line to the helper, its answer; ValueError with Argo's error if it has one."""
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        if answer.get("error"):
            raise ValueError(answer["error"])
        return answer

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
