"""evaluate against a real MLflow server and S3: a candidate is compared with the champion on the
champion's registered evaluation set, not on a held-out split of its submitter's choosing."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from pipectl.components.contracts import (
    EVALUATION_SET_DIGEST_TAG,
    EVALUATION_SET_TAG,
    Decision,
    EvaluateInput,
    PromotionMetric,
    RegisterInput,
    RunLayout,
    ShardIndex,
    TrainOutput,
)

pytestmark = pytest.mark.integration

SIZE = 8


@pytest.fixture()
def client(settings):
    import mlflow
    from mlflow import MlflowClient

    mlflow.set_tracking_uri(settings.mlflow_uri)
    mlflow.set_registry_uri(settings.mlflow_uri)
    return MlflowClient(tracking_uri=settings.mlflow_uri, registry_uri=settings.mlflow_uri)


def _rule(sign: float, constant: bool = False):
    """A two-class model of the images' mean brightness ``m``: logits ``[-sign*m, sign*m]`` (class 1
    for bright images when sign is 1, for dark ones when -1), or always class 1 (``constant``)."""
    import torch
    from torch import nn

    class Rule(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            m = x.mean(dim=(1, 2, 3))
            if constant:
                return torch.stack([m * 0.0, m * 0.0 + 1.0], dim=1)
            return torch.stack([-sign * m, sign * m], dim=1)

    return Rule().eval()


def _split(s3, uri: str, bright_is: int, labels: tuple[str, ...] = ("dark", "bright"), seed: int = 0) -> None:
    """A held-out split at ``uri`` (two shards): half bright images (mean +1), half dark (-1); the
    bright ones labelled ``bright_is``."""
    from pipectl.components.runtime import join_uri, write_json
    from pipectl.components.shards import put_npz

    rng = np.random.default_rng(seed)
    names = []
    for n in range(2):
        sign = np.repeat([1.0, -1.0], 8)
        images = (sign[:, None, None, None] + rng.normal(0, 0.1, (16, 3, SIZE, SIZE))).astype(np.float16)
        y = np.where(sign > 0, bright_is, 1 - bright_is).astype(np.int64)
        put_npz(s3, join_uri(uri, f"validation-{n}.npz"), images, y)
        names.append(join_uri(uri, f"validation-{n}.npz"))
    index = ShardIndex(labels=list(labels), image_size=SIZE, channels=3, mean=[0.0] * 3, std=[1.0] * 3, train=[],
                       validation=names, train_count=0, validation_count=32, validation_sizes=[16, 16])
    write_json(s3, join_uri(uri, "index.json"), index.model_dump(mode="json"))


def _run(s3, settings, client, model_name: str, model, bright_is: int, labels: tuple[str, ...] = ("dark", "bright")):
    """One pipeline run's evaluate then register: the model trained (logged to MLflow), its held-out
    split, evaluate's output and the version register created."""
    import mlflow
    import torch

    from pipectl.components.evaluate.core import evaluate
    from pipectl.components.models import log_model
    from pipectl.components.register.core import register
    from pipectl.components.runtime import write_json

    layout = RunLayout.for_workflow(settings.bucket, f"wf-{uuid.uuid4().hex[:8]}")
    _split(s3, layout.shards_uri, bright_is, labels)
    mlflow.set_experiment("evaluate-champion-tests")
    with mlflow.start_run() as run:
        uri = log_model(model, torch.randn(2, 3, SIZE, SIZE), "rule", len(labels), 3)
    write_json(s3, layout.train_output_uri, TrainOutput(mlflow_run_id=run.info.run_id, model_uri=uri, steps=1,
                                                        steps_this_attempt=1, resumed_from_step=0, world_size=1).model_dump())
    out = evaluate(EvaluateInput(shards_uri=layout.shards_uri, run_uri=layout.run_uri, model_name=model_name,
                                 promotion_metric=PromotionMetric.accuracy, promotion_threshold=0.4), s3, client)
    reg = register(RegisterInput(model_name=model_name, run_key=layout.run_uri, promotion_metric=PromotionMetric.accuracy,
                                 mlflow_run_id=out.mlflow_run_id, model_uri=out.model_uri, model_sha256=out.model_sha256,
                                 decision=out.decision, metric=out.metric, metric_name=out.metric_name,
                                 champion_version=out.champion_version or "", evaluation_set=out.evaluation_set,
                                 evaluation_set_sha256=out.evaluation_set_sha256), out, client)
    return out, reg, layout


def test_a_candidate_is_compared_on_the_champions_registered_evaluation_set(settings, s3, client):
    """The champion (always "bright", 0.5 on its own balanced set) registered with its held-out split
    and that split's digest. A candidate whose own split labels bright images "dark" scores 1.0 there
    and the champion 0.5 (compared there, it would take the alias), but on the champion's set it
    scores 0.0: kept. A candidate better on the champion's set (1.0) takes it."""
    from pipectl.components.models import classification_metrics
    from pipectl.components.runtime import join_uri
    from pipectl.components.shards import read_shard

    s3.create_bucket(Bucket=settings.bucket)
    name = f"eval-{uuid.uuid4().hex[:8]}"
    first, reg, champion_run = _run(s3, settings, client, name, _rule(1, constant=True), bright_is=1)
    assert (first.decision, reg.alias, first.metric) == (Decision.promote, "champion", 0.5)
    tags = client.get_model_version(name, reg.version).tags
    assert tags[EVALUATION_SET_TAG] == champion_run.shards_uri
    assert tags[EVALUATION_SET_DIGEST_TAG] == first.evaluation_set_sha256 and len(first.evaluation_set_sha256) == 64

    attack, reg_attack, attack_run = _run(s3, settings, client, name, _rule(-1), bright_is=0)
    # the premise: on the candidate's own split the champion scores 0.5 and the candidate 1.0
    images, labels = read_shard(s3, join_uri(attack_run.shards_uri, "validation-0.npz"))
    assert classification_metrics(np.tile([0.0, 1.0], (len(labels), 1)), labels, 2)["accuracy"] == 0.5
    assert attack.metric == 1.0
    assert (attack.compared_on, attack.champion_metric, attack.challenger_metric) == (champion_run.shards_uri, 0.5, 0.0)
    assert attack.decision is Decision.keep and reg_attack.alias is None and reg_attack.champion_version == reg.version

    better, reg_better, _ = _run(s3, settings, client, name, _rule(1), bright_is=1)
    assert (better.compared_on, better.champion_metric, better.challenger_metric) == (champion_run.shards_uri, 0.5, 1.0)
    assert better.decision is Decision.promote and reg_better.alias == "champion"


def test_a_candidate_that_cannot_be_compared_there_is_kept_not_promoted_on_its_threshold(settings, s3, client):
    """Other labels than the champion's evaluation set, or a set whose content changed in the store
    after it was registered: the candidate passes its threshold but is kept, with the reason."""
    from pipectl.components.runtime import join_uri
    from pipectl.components.shards import put_npz

    s3.create_bucket(Bucket=settings.bucket)
    name = f"eval-{uuid.uuid4().hex[:8]}"
    first, reg, champion_run = _run(s3, settings, client, name, _rule(1, constant=True), bright_is=1)
    assert reg.alias == "champion"

    other, reg_other, _ = _run(s3, settings, client, name, _rule(1), bright_is=1, labels=("night", "day"))
    assert other.metric == 1.0 and other.decision is Decision.keep and reg_other.alias is None
    assert "labels [dark, bright] (2), the candidate's [night, day] (2)" in other.decision_reason

    # the champion's set rewritten so that the champion scores 0: any change is refused
    put_npz(s3, join_uri(champion_run.shards_uri, "validation-0.npz"), np.full((16, 3, SIZE, SIZE), 1.0, np.float16),
            np.zeros(16, np.int64))
    changed, reg_changed, _ = _run(s3, settings, client, name, _rule(1), bright_is=1)
    assert changed.metric == 1.0 and changed.decision is Decision.keep and reg_changed.alias is None
    assert "is not the content registered with it" in changed.decision_reason
    assert client.get_model_version_by_alias(name, "champion").version == reg.version
