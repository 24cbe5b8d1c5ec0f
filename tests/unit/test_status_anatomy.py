"""``pipectl status`` shows the training's step anatomy and verdicts: of a finished training from the
evaluate step's outputs (what the train step handed on), of a running one from the MLflow run's
tags its rank 0 sets at each epoch's end. The command runs in-process against a stand-in cluster
that returns the workflow as the API server does; reading the tags from a real MLflow while a real
gang trains is tests/integration/test_train.py::test_the_anatomy_of_a_running_training_is_read_while_it_trains."""

from __future__ import annotations

import json

import pytest

from pipectl.components.contracts import EvaluateOutput
from pipectl.components.names import kebab

STEP_TIME = ("data 4%, compute 61%, sync 31%, optimizer 3%, checkpoint 1%; 812 images/s (per rank: 0: 430, 1: 301); "
             "GPU memory 2210 MiB (peak 2890 MiB)")
VERDICTS = ["straggler: rank 1 on node gpu-b (pod training-x7k2p-train-0-worker-1) takes 104 ms of its own per step "
            "over the epoch, 1.4x the other ranks' median (rule: >= 1.2x over >= 20 steps, each rank's median step)",
            "fabric-bound: 31% of the step waits for gradient sync (rule: > 15%; > 30%: more nodes will not pay); "
            "adding nodes will not pay: check InfiniBand/RoCE and NCCL_IB_DISABLE / NCCL_SOCKET_IFNAME"]


def _node(name: str, phase: str, started: str, outputs: dict[str, str] | None = None) -> dict:
    node = {"id": f"training-x7k2p-{name}", "displayName": name, "type": "Pod", "phase": phase, "startedAt": started}
    if outputs is not None:
        node["outputs"] = {"parameters": [{"name": k, "value": v} for k, v in outputs.items()]}
    return node


class _Cluster:
    def __init__(self, phase: str, nodes: list[dict]) -> None:
        self.wf = {"metadata": {"name": "training-x7k2p"}, "status": {"phase": phase, "nodes": {n["id"]: n for n in nodes}}}

    def get(self, kind: str, name: str) -> dict:
        assert (kind, name) == ("workflows", "training-x7k2p")
        return self.wf


@pytest.fixture()
def status(monkeypatch):
    from click.testing import CliRunner

    from pipectl.cli import cluster_cmds
    from pipectl.cli.main import main

    for var in ("PIPECTL_SITE", "KUBECONFIG", "PIPECTL_NAMESPACE", "ARGO_SERVER"):
        monkeypatch.delenv(var, raising=False)

    def invoke(cluster: _Cluster, env: dict[str, str] | None = None):
        monkeypatch.setattr(cluster_cmds, "_cluster", lambda namespace, context: cluster)
        return CliRunner().invoke(main, ["status", "training-x7k2p", "-n", "team-a"], env=env or {})
    return invoke


def test_status_of_a_finished_training_shows_its_last_epochs_anatomy_and_every_verdict(status):
    fields = EvaluateOutput.model_fields
    assert {"training_step_time", "training_verdicts"} <= set(fields)  # the outputs the status reads
    evaluate = {kebab("training_step_time"): STEP_TIME, kebab("training_verdicts"): json.dumps(VERDICTS),
                kebab("training_sync_share"): "0.31"}
    r = status(_Cluster("Succeeded", [_node("train", "Succeeded", "2026-12-04T01:00:00Z"),
                                      _node("evaluate", "Succeeded", "2026-12-04T01:20:00Z", evaluate)]))
    assert r.exit_code == 0, r.output
    lines = [" ".join(line.split()) for line in r.output.splitlines()]
    assert f"training step time (last epoch): {STEP_TIME}" in lines, r.output
    for v in VERDICTS:
        assert f"verdict: {v}" in lines, (v, r.output)
    assert lines[-1] == "workflow training-x7k2p: Succeeded"


def test_status_of_a_running_training_shows_the_latest_epoch_from_mlflow(status, monkeypatch, tmp_path):
    from pipectl.components.train import live

    asked = []
    latest = ["training step time (epoch 3 of 15, the latest): " + STEP_TIME, "verdict: " + VERDICTS[0]]
    monkeypatch.setattr(live, "read", lambda uri, workflow: asked.append((uri, workflow)) or (latest, ""))
    site = tmp_path / "site.yaml"
    site.write_text("mlflow_uri: http://mlflow.example:5000\n")
    running = _Cluster("Running", [_node("train", "Running", "2026-12-04T01:00:00Z")])
    r = status(running, env={"PIPECTL_SITE": str(site)})
    assert r.exit_code == 0, r.output
    assert asked == [("http://mlflow.example:5000", "training-x7k2p")]
    lines = [" ".join(line.split()) for line in r.output.splitlines()]
    assert latest[0] in lines and latest[1] in lines, r.output
    # MLflow out of reach: one line says so, the status itself is not a failure
    monkeypatch.setattr(live, "read", lambda uri, workflow: ([], "the training's step anatomy could not be read from MLflow"))
    r = status(running, env={"PIPECTL_SITE": str(site)})
    assert r.exit_code == 0 and "could not be read from MLflow" in r.output, r.output
