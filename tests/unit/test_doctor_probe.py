"""`pipectl doctor --from-pod`'s pod (pipelines/pipectl/pipelines/backends/probe.py): it runs as a
step runs, and its script, run here against a real HTTP server and a closed port, names what
answers and what does not. The pod on a real node (image pulled or not, Ceph RGW and MLflow
reached): tests/cluster/test_real_pods.py."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest


def test_the_probe_pod_runs_as_a_step_does():
    from pipectl.pipelines.backends.probe import probe_pod
    from pipectl.pipelines.lint import lint_objects
    from pipectl.pipelines.security import container_problems, pod_problems, pod_spec_problems
    from pipectl.pipelines.training import CompileConfig

    digest = "sha256:" + "a" * 64
    cfg = CompileConfig(namespace="ml-vision", registry="registry.example.com/ml", images={"step-light": digest})
    pod = probe_pod(cfg, 90)
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert pod["metadata"]["namespace"] == "ml-vision"
    assert container["image"] == f"registry.example.com/ml/step-light@{digest}"
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == ("pipectl-workflow", False)
    assert (spec["restartPolicy"], spec["activeDeadlineSeconds"]) == ("Never", 90)
    assert container["envFrom"] == [{"configMapRef": {"name": "pipectl-store"}}]
    assert pod_problems(spec["securityContext"]) == [] and container_problems(container["securityContext"]) == []
    assert pod_spec_problems(spec) == [] and lint_objects([("doctor", pod)]) == []


class _Answers(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint's anonymous answer (403) to / and MLflow's 200 to /health."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/health" else 403)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _probe(env: dict[str, str]) -> dict:
    from pipectl.pipelines.backends.probe import PROBE_SCRIPT

    base = {k: v for k, v in os.environ.items() if not k.startswith("PIPECTL_") and "proxy" not in k.lower()}
    r = subprocess.run([sys.executable, "-c", PROBE_SCRIPT], env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


def test_the_probe_names_what_answers_and_what_does_not(server):
    answers = _probe({"PIPECTL_S3_ENDPOINT": server, "PIPECTL_MLFLOW_URI": server + "/"})
    assert answers == {"PIPECTL_S3_ENDPOINT": "", "PIPECTL_MLFLOW_URI": ""}  # 403 counts: it answered

    answers = _probe({"PIPECTL_S3_ENDPOINT": server, "PIPECTL_MLFLOW_URI": "http://127.0.0.1:1"})
    assert answers["PIPECTL_S3_ENDPOINT"] == ""
    assert answers["PIPECTL_MLFLOW_URI"].startswith("http://127.0.0.1:1 did not answer ("), answers
    assert "refused" in answers["PIPECTL_MLFLOW_URI"].lower(), answers

    answers = _probe({"PIPECTL_S3_ENDPOINT": server})
    assert answers["PIPECTL_MLFLOW_URI"] == "not set in the ConfigMap pipectl-store"
