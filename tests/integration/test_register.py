"""register against a real MLflow server: one version per pipeline run, one champion (C05)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from pipectl.components.contracts import Decision, EvaluateOutput, PromotionMetric, RegisterInput
from pipectl.components.register.core import _ensure_registered_model, register

pytestmark = pytest.mark.integration


@pytest.fixture()
def client(settings):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(settings.mlflow_uri)
    mlflow.set_registry_uri(settings.mlflow_uri)
    return MlflowClient(tracking_uri=settings.mlflow_uri, registry_uri=settings.mlflow_uri)


def _candidate(metric: float, decision: Decision = Decision.promote, champion: str | None = None) -> EvaluateOutput:
    """A real logged model in a real MLflow run, evaluated at ``metric``."""
    import mlflow

    from pipectl.components.models import SmallCNN

    mlflow.set_experiment("register-tests")
    with mlflow.start_run() as run:
        info = mlflow.pytorch.log_model(SmallCNN(num_classes=10, width=4), name="model", serialization_format="pickle",
                                        pip_requirements=["torch"])
    return EvaluateOutput(mlflow_run_id=run.info.run_id, model_uri=info.model_uri, metrics={"accuracy": metric},
                          metric=metric, champion_version=champion, champion_metric=None, decision=decision)


def _versions(client, name):
    return sorted(int(mv.version) for mv in client.search_model_versions(f"name = '{name}'"))


def _inp(name, key):
    return RegisterInput(model_name=name, run_key=key, promotion_metric=PromotionMetric.accuracy, mlflow_run_id="r",
                         model_uri="runs:/r/model", model_sha256="0" * 64, decision="keep", metric=0.5)


def test_C05d_a_retried_register_step_finds_its_own_version(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    ev = _candidate(0.97)
    first = register(_inp(name, "wf-uid-1"), ev, client)
    again = register(_inp(name, "wf-uid-1"), ev, client)
    assert (first.version, first.created, first.alias) == ("1", True, "champion")
    assert (again.version, again.created, again.alias) == ("1", False, "champion")
    assert _versions(client, name) == [1]


def test_C05c_already_exists_is_success(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    errors = []

    def create():
        try:
            _ensure_registered_model(client, name)
        except Exception as e:  # noqa: BLE001 - the test reports any failure
            errors.append(e)

    threads = [threading.Thread(target=create) for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == []
    assert client.get_registered_model(name).name == name


def test_C05b_two_promotions_end_with_one_champion_the_better_one(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    # Both runs evaluated while there was no champion; the weaker one finishes last.
    strong, weak = _candidate(0.99), _candidate(0.96)
    a = register(_inp(name, "wf-a"), strong, client)
    b = register(_inp(name, "wf-b"), weak, client)
    assert (a.alias, b.alias) == ("champion", None)
    assert b.champion_version == a.version
    assert client.get_model_version_by_alias(name, "champion").version == a.version
    assert _versions(client, name) == [1, 2]


class _RaceBothWrites:
    """The client of one register step, for the worst interleaving of C08: both steps have checked
    "no champion" before either writes the alias (a barrier holds the first write of each), then
    the weaker one writes last: once ``after`` is set (the other step has finished)."""

    def __init__(self, client, barrier: threading.Barrier, after: threading.Event | None = None) -> None:
        self._client, self._barrier, self._after, self._first = client, barrier, after, True

    def set_registered_model_alias(self, *args):
        if self._first:
            self._first = False
            self._barrier.wait(timeout=60)
            if self._after is not None:
                self._after.wait(timeout=60)
        return self._client.set_registered_model_alias(*args)

    def __getattr__(self, attr):
        return getattr(self._client, attr)


def test_C08_concurrent_promotions_end_with_the_better_one_as_champion(client):
    """C08 on the real MLflow server, two register steps at once, both having seen no champion:
    A (0.99) and B (0.96) both pass the compare-and-set and both write the alias, B last. Verify
    after writing moves it back: A is champion, B reports no alias, one version each."""
    name = f"m-{uuid.uuid4().hex[:8]}"
    strong, weak = _candidate(0.99), _candidate(0.96)
    _ensure_registered_model(client, name)
    barrier, a_done = threading.Barrier(2), threading.Event()
    results: dict[str, object] = {}

    def step_a():
        try:
            results["wf-a"] = register(_inp(name, "wf-a"), strong, _RaceBothWrites(client, barrier))
        finally:
            a_done.set()

    def step_b():
        results["wf-b"] = register(_inp(name, "wf-b"), weak, _RaceBothWrites(client, barrier, after=a_done))

    threads = [threading.Thread(target=step_a), threading.Thread(target=step_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    a, b = results["wf-a"], results["wf-b"]
    assert client.get_model_version_by_alias(name, "champion").version == a.version
    assert (a.alias, b.alias) == ("champion", None)
    assert b.champion_version == a.version
    assert _versions(client, name) == [1, 2]


def test_an_operators_rollback_is_not_undone_by_a_later_promotion(client, monkeypatch):
    """v2 once promoted over v1; an operator rolls the alias back to v1; later v3 (0.96) is promoted
    over v1. v2's old promotion is not part of v3's round: v3 becomes champion, not v2."""
    import pipectl.components.register.core as core

    monkeypatch.setattr(core, "ROUND_WINDOW_S", 1.0)
    name = f"m-{uuid.uuid4().hex[:8]}"
    v1 = register(_inp(name, "wf-1"), _candidate(0.95), client)
    v2 = register(_inp(name, "wf-2"), _candidate(0.97, champion=v1.version), client)
    assert v2.alias == "champion"
    client.set_registered_model_alias(name, "champion", v1.version)  # the operator's rollback
    time.sleep(2.5)  # a delay, not a wait: v3 must be created more than ROUND_WINDOW_S (1 s) after v2
    v3 = register(_inp(name, "wf-3"), _candidate(0.96, champion=v1.version), client)
    assert (v3.version, v3.alias, v3.champion_version) == ("3", "champion", "3")


def test_keep_registers_without_moving_the_alias(client):
    name = f"m-{uuid.uuid4().hex[:8]}"
    first = register(_inp(name, "wf-1"), _candidate(0.97), client)
    kept = register(_inp(name, "wf-2"), _candidate(0.90, Decision.keep, champion=first.version), client)
    assert (kept.version, kept.alias, kept.champion_version) == ("2", None, "1")


class _Payload:
    """What a hostile model file carries: unpickling it runs code (here: creates a file)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_evaluate_scores_two_architectures_from_onnx_without_unpickling_anything(client, tmp_path, monkeypatch):
    """The champion (a small CNN) and a candidate of another architecture (ResNet-18) are logged as
    ONNX graphs; evaluate's scorer gives the logits torch gives, with every way to unpickle
    disabled while it loads and scores; the champion is found through its model version."""
    import pickle

    import mlflow
    import numpy as np
    import torch

    from pipectl.components.evaluate.core import champion_model
    from pipectl.components.models import build_model, load_scorer, log_model

    mlflow.set_experiment("onnx-tests")
    torch.manual_seed(0)
    images = torch.randn(5, 3, 32, 32)
    logged = {}
    for arch in ("small-cnn", "resnet18"):
        model = build_model(arch, num_classes=4, channels=3).eval()
        with mlflow.start_run() as run:
            logged[arch] = (log_model(model, images[:2], arch, 4, 3), run.info.run_id, model(images).detach().numpy())
    name = f"onnx-{uuid.uuid4().hex[:8]}"
    mv = mlflow.register_model(logged["small-cnn"][0], name)  # as the register step does
    client.set_registered_model_alias(name, "champion", mv.version)
    assert champion_model(client, name)[1] == logged["small-cnn"][1]

    def refuse(*a, **k):
        raise AssertionError("scoring an ONNX model unpickled something")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    for arch, uri_run in (("small-cnn", champion_model(client, name)), ("resnet18", logged["resnet18"][:2])):
        score = load_scorer(uri_run[0], uri_run[1], tmp_path / arch)
        assert np.allclose(score(images.numpy()), logged[arch][2], atol=1e-4), arch


def test_a_model_that_cannot_be_exported_names_its_layer():
    import torch
    from torch import nn

    from pipectl.components.models import ExportError, export_onnx

    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x * 3  # a branch on the data: no static graph

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(nn.ReLU(), Branchy()), nn.Flatten())
    with pytest.raises(ExportError, match=r"layer '1\.1' \(Branchy\)") as e:
        export_onnx(model, torch.randn(2, 3, 8, 8))
    assert e.value.layer == "1.1"


def test_a_champion_logged_before_onnx_is_scored_from_its_weights_and_a_pickle_payload_never_runs(client, tmp_path):
    """A run that logged only weights (tensors + architecture name) is scored from them, loaded
    with ``weights_only=True``: weights replaced by a pickle with a payload are refused."""
    import mlflow
    import numpy as np
    import torch

    from pipectl.components.models import SmallCNN, load_scorer
    from pipectl.components.models.portable import WEIGHTS_ARTIFACT

    mlflow.set_experiment("weights-tests")
    model = SmallCNN(num_classes=10, channels=3).eval()
    images = torch.randn(3, 3, 16, 16)
    marker = tmp_path / "payload-ran"
    runs = {}
    for kind, weights in (("good", model.state_dict()), ("bad", {"features.0.weight": _Payload(str(marker))})):
        d = tmp_path / kind
        d.mkdir()
        torch.save(weights, d / "state_dict.pt")
        (d / "model.json").write_text('{"architecture": "SmallCNN", "num_classes": 10, "channels": 3}')
        with mlflow.start_run() as run:
            mlflow.log_artifacts(str(d), artifact_path=WEIGHTS_ARTIFACT)
            info = mlflow.pytorch.log_model(model, name="model", serialization_format="pickle", pip_requirements=["torch"])
        runs[kind] = (info.model_uri, run.info.run_id)
    score = load_scorer(*runs["good"], tmp_path / "score-good")
    assert np.allclose(score(images.numpy()), model(images).detach().numpy(), atol=1e-5)
    with pytest.raises(Exception, match="(?i)weights_only|unpickl|global"):
        load_scorer(*runs["bad"], tmp_path / "score-bad")
    assert not marker.exists(), "the model file ran code"


def test_register_registers_only_the_model_evaluate_scored(client, settings, tmp_path):
    """Register takes evaluate's decision and the digest of the model it scored as its inputs (the
    evaluate step's output parameters, not an object in the store) and downloads the model again:
    the same files register it, tagged with the digest; a file added to the logged model after
    evaluation (anyone with the store's keys could) refuses the step and registers nothing."""
    from pipectl.components.models import download_model, model_sha256
    from pipectl.components.register.core import MODEL_DIGEST_TAG, run
    from pipectl.components.runtime import StepError

    ev = _candidate(0.97)
    download_model(ev.model_uri, tmp_path / "evaluate")
    scored = model_sha256(tmp_path / "evaluate" / "model")

    def inp(name: str) -> RegisterInput:
        return RegisterInput(model_name=name, run_key="wf-uid", promotion_metric=PromotionMetric.accuracy,
                             mlflow_run_id=ev.mlflow_run_id, model_uri=ev.model_uri, model_sha256=scored,
                             decision=Decision.promote, metric=ev.metric, metric_name="accuracy")

    name = f"m-{uuid.uuid4().hex[:8]}"
    out = run(inp(name), settings)
    assert (out.version, out.alias) == ("1", "champion")
    assert client.get_model_version(name, "1").tags[MODEL_DIGEST_TAG] == scored

    extra = tmp_path / "extra.py"
    extra.write_text("print('not what evaluate scored')\n")
    model_id = ev.model_uri.removeprefix("models:/")
    client.log_model_artifact(model_id, str(extra))
    assert "extra.py" in {f.path for f in client.list_logged_model_artifacts(model_id)}
    other = f"m-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StepError, match="not the one evaluate scored"):
        run(inp(other), settings)
    assert client.search_model_versions(f"name = '{other}'") == []
