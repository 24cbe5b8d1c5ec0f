"""`pipectl doctor --from-pod`'s pod (pipelines/pipectl/pipelines/backends/probe.py): it runs as a
step runs, and its script, run here against a real HTTP server and a closed port, names what
answers and what does not; the step-train container's script imports what preprocess and train
import; the rows name each image's outcome from the pod's container statuses. The pod on a real node (image pulled or not, Ceph RGW and MLflow
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

    digest, train_digest = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    cfg = CompileConfig(namespace="ml-vision", registry="registry.example.com/ml",
                        images={"step-light": digest, "step-train": train_digest})
    pod = probe_pod(cfg, 90)
    spec = pod["spec"]
    container, train = spec["containers"]
    assert pod["metadata"]["namespace"] == "ml-vision"
    assert container["image"] == f"registry.example.com/ml/step-light@{digest}"
    assert train["image"] == f"registry.example.com/ml/step-train@{train_digest}"
    assert (spec["serviceAccountName"], spec["automountServiceAccountToken"]) == ("pipectl-workflow", False)
    assert (spec["restartPolicy"], spec["activeDeadlineSeconds"]) == ("Never", 90)
    assert container["envFrom"] == [{"configMapRef": {"name": "pipectl-store"}}] and "envFrom" not in train
    for c in (container, train):
        assert container_problems(c["securityContext"]) == []
    assert pod_problems(spec["securityContext"]) == []
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
    latency = answers.pop("store_latency_ms")  # a small request on a kept-alive connection, timed
    assert answers == {"PIPECTL_S3_ENDPOINT": "", "PIPECTL_MLFLOW_URI": ""}  # 403 counts: it answered
    assert isinstance(latency, float) and 0 < latency < 1000, latency

    answers = _probe({"PIPECTL_S3_ENDPOINT": server, "PIPECTL_MLFLOW_URI": "http://127.0.0.1:1"})
    assert answers["PIPECTL_S3_ENDPOINT"] == ""
    assert answers["PIPECTL_MLFLOW_URI"].startswith("http://127.0.0.1:1 did not answer ("), answers
    assert "refused" in answers["PIPECTL_MLFLOW_URI"].lower(), answers

    answers = _probe({"PIPECTL_S3_ENDPOINT": server})
    assert answers["PIPECTL_MLFLOW_URI"] == "not set in the ConfigMap pipectl-store"


def test_the_train_image_script_imports_the_training_steps_and_prints_versions():
    """The step-train container's script, run in this checkout's environment (torch and DALI installed)."""
    from pipectl.pipelines.backends.probe import TRAIN_SCRIPT

    r = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    versions = json.loads(r.stdout.splitlines()[-1])
    import nvidia.dali
    import torch

    assert versions == {"torch": torch.__version__, "DALI": nvidia.dali.__version__}


def _pod(phase: str, node: str, **states) -> "object":
    """A V1Pod of the probe's two containers; ``states``: container (probe, train_image) -> V1ContainerState."""
    from kubernetes import client

    names = {"probe": "probe", "train_image": "train-image"}
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="pipectl-doctor-x"),
        spec=client.V1PodSpec(node_name=node, containers=[client.V1Container(name=n) for n in names.values()]),
        status=client.V1PodStatus(phase=phase, container_statuses=[
            client.V1ContainerStatus(name=names[k], state=v, image="", image_id="", ready=False, restart_count=0)
            for k, v in states.items()]))


def _ended(code: int):
    from kubernetes import client

    return client.V1ContainerState(terminated=client.V1ContainerStateTerminated(exit_code=code, reason="Completed" if not code else "Error"))


def _waiting(reason: str, message: str = ""):
    from kubernetes import client

    return client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason=reason, message=message))


def test_each_image_gets_its_row_and_a_pull_failure_of_one_settles_the_pod(server):
    """The rows from the container statuses the kubelet reports and the lines each script printed
    (run here: the probe against a real HTTP server, the train image's imports in this environment)."""
    from pipectl.pipelines.backends.probe import TRAIN_SCRIPT, _rows, _settled
    from pipectl.pipelines.training import CompileConfig

    cfg = CompileConfig(namespace="ml-vision")
    probe_line = json.dumps(_probe({"PIPECTL_S3_ENDPOINT": server, "PIPECTL_MLFLOW_URI": server}))
    train_line = subprocess.run([sys.executable, "-c", TRAIN_SCRIPT], capture_output=True, text=True, timeout=120).stdout
    logs = {"probe": probe_line, "train-image": train_line}

    class Core:  # the two logs, by container, as the API server serves them
        def read_namespaced_pod_log(self, name, namespace, container):
            return logs[container]

    ok = _pod("Succeeded", "gpu-1", probe=_ended(0), train_image=_ended(0))
    rows = {r.check: r for r in _rows(Core(), cfg, ok, 180)}
    assert [r.status for r in rows.values()] == ["ok"] * 5, rows
    assert rows["object store latency (from a pod)"].detail.startswith("a small request takes "), rows
    assert rows["step-train image (from a pod)"].detail.startswith(f"{cfg.train_image} pulled and ran on gpu-1 (torch "), rows

    pull = _waiting("ImagePullBackOff", 'Back-off pulling image "x"')
    stuck = _pod("Pending", "gpu-1", probe=_ended(0), train_image=pull)
    assert _settled(stuck) and not _settled(_pod("Pending", "gpu-1", probe=_ended(0), train_image=_waiting("ContainerCreating")))
    rows = {r.check: r for r in _rows(Core(), cfg, stuck, 180)}
    train = rows["step-train image (from a pod)"]
    assert train.status == "fail" and train.detail == f'{cfg.train_image}: ImagePullBackOff: Back-off pulling image "x"', train
    assert rows["step-light image (from a pod)"].status == rows["MLflow (from a pod)"].status == "ok", rows

    logs["train-image"] = "Traceback (most recent call last):\nModuleNotFoundError: No module named 'nvidia'\n"
    rows = {r.check: r for r in _rows(Core(), cfg, _pod("Failed", "gpu-1", probe=_ended(0), train_image=_ended(1)), 180)}
    train = rows["step-train image (from a pod)"]
    assert train.status == "fail" and "exited 1" in train.detail and "No module named 'nvidia'" in train.detail, train
