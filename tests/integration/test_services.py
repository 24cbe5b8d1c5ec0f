"""The embedded services of `pipectl run` (moto's S3, MLflow) on loopback ports."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request

import pytest

from pipectl.pipelines.backends import services

pytestmark = pytest.mark.integration


class _NotFound(http.server.BaseHTTPRequestHandler):
    """Another program's server: every path is 404 (as Go's default mux answers)."""

    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b"404 page not found\n")

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("start", [services.start_s3, services.start_mlflow], ids=["s3", "mlflow"])
def test_a_port_another_server_took_first_is_left_to_it(tmp_path, monkeypatch, start):
    """Another process can take the port picked for an embedded service before the service binds
    it (seen: a run's steps got "404 page not found" from a Go server on MLflow's port, because
    that server answered the readiness check). The start notices that the answer comes from a
    process it did not start and starts the service on a new port."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    taken = other.server_address[1]
    threading.Thread(target=other.serve_forever, daemon=True).start()
    picks = iter([taken])
    real = services.free_port
    monkeypatch.setattr(services, "free_port", lambda: next(picks, None) or real())
    svc = start(tmp_path)
    try:
        assert svc.url != f"http://127.0.0.1:{taken}"
        if start is services.start_mlflow:
            with urllib.request.urlopen(svc.url + "/api/2.0/mlflow/experiments/search?max_results=1") as r:
                assert "experiments" in json.loads(r.read())
        else:
            with urllib.request.urlopen(svc.url + "/moto-api/") as r:
                assert r.status == 200
    finally:
        svc.stop()
        other.shutdown()
