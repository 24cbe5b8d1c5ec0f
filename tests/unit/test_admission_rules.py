"""The per-template parameter rules the submission policy reads (pure: rendering and the policy's
shape). What the API server does with them: tests/cluster/test_admission.py."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import Field

from pipectl.components.pipeline_parameters import ParameterSpec, Parameters, specs_from_class
from pipectl.pipelines.admission import (
    PARAMETER_RULES_CONFIGMAP,
    parameter_rules_configmap,
    parameter_rules_data,
    rules_field_manager,
    submission_policy,
    submitter_role,
)


class ShapesParameters(Parameters):
    weight_decay: float = Field(0.0005, ge=0, le=0.1, description="L2 penalty of the SGD optimiser.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Label smoothing.")
    random_flips: bool = Field(True, description="Random flips.")
    warmup_steps: int = Field(10, ge=0, le=1000, description="Warm-up steps.")
    optimiser: Literal["sgd", "adam w", "a.b"] = Field("sgd", description="The optimiser.")
    run_note: str = Field("baseline", pattern="[a-z0-9-]+", max_length=16, description="A note.")
    comment: str = Field("", description="Free text.")


def test_the_rules_of_a_templates_own_parameters_as_configmap_keys():
    data = parameter_rules_data("shapes-training-v1", specs_from_class(ShapesParameters))
    t = "shapes-training-v1."
    assert data == {
        t + "weight-decay.kind": "decimal", t + "weight-decay.ge": "0.0", t + "weight-decay.le": "0.1",
        t + "label-smoothing.kind": "decimal", t + "label-smoothing.ge": "0.0", t + "label-smoothing.lt": "1.0",
        t + "random-flips.kind": "boolean",
        t + "warmup-steps.kind": "integer", t + "warmup-steps.ge": "0", t + "warmup-steps.le": "1000",
        t + "optimiser.kind": "choice", t + "optimiser.pattern": r"^(?:sgd|adam\x{20}w|a\.b)$",
        t + "run-note.kind": "text", t + "run-note.max_length": "16", t + "run-note.pattern": "^(?:[a-z0-9-]+)$",
        t + "comment.kind": "text", t + "comment.max_length": "256",
    }
    assert parameter_rules_data("training-v1", ()) == {}


def test_integer_bounds_are_the_validate_steps_and_never_overflow_cel():
    spec = ParameterSpec(name="steps", kind="integer", default="5", description="d", ge=0.5, le=10**30)
    assert parameter_rules_data("t-v1", (spec,)) == {"t-v1.steps.kind": "integer", "t-v1.steps.ge": "0",
                                                    "t-v1.steps.le": str(10**18)}
    small = ParameterSpec(name="x", kind="decimal", default="0.00001", description="d", ge=1e-05)
    assert parameter_rules_data("t-v1", (small,))["t-v1.x.ge"] == "1e-05"


def test_keys_kubernetes_would_refuse_are_refused_here():
    spec = ParameterSpec(name="x", kind="boolean", default="true", description="d")
    with pytest.raises(ValueError, match="ConfigMap key"):
        parameter_rules_data("t" * 250, (spec,))


def test_the_policy_reads_the_configmap_of_the_submitted_objects_namespace():
    policy, binding = submission_policy()
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert binding["spec"]["paramRef"] == {"name": PARAMETER_RULES_CONFIGMAP, "parameterNotFoundAction": "Deny"}
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert "params.data" in variables["rules"] and "workflowTemplateRef.name" in variables["template"]
    assert "variables.rules" in variables["refused"]
    assert parameter_rules_configmap("team-a") == {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": PARAMETER_RULES_CONFIGMAP, "namespace": "team-a", "labels": {"app.kubernetes.io/part-of": "pipectl"}}}
    assert rules_field_manager("shapes-training-v1") == "pipectl-parameters-shapes-training-v1"
    assert len(rules_field_manager("x" * 300)) == 128


def test_pipectls_namespace_starts_with_an_empty_rules_configmap():
    from pipectl.pipelines.manifests import config_maps
    from pipectl.pipelines.training import CompileConfig

    rules = [c for c in config_maps(CompileConfig()) if c["metadata"]["name"] == PARAMETER_RULES_CONFIGMAP]
    assert len(rules) == 1 and "data" not in rules[0]


def test_a_submitter_cannot_write_the_rules():
    rules = submitter_role("pipectl")["rules"]
    write = {"create", "update", "patch", "delete", "deletecollection", "*"}
    for r in rules:
        assert "*" not in r["resources"] and "*" not in r["apiGroups"], r
        if "" in r["apiGroups"]:
            assert "configmaps" not in r["resources"] or not write & set(r["verbs"]), r


def _quotas() -> list[dict]:
    """The namespace's quotas as argo/cluster renders them (default site settings)."""
    from pipectl.pipelines.manifests import namespace_limits, preempting_lane_quota
    from pipectl.pipelines.training import CompileConfig

    cfg = CompileConfig()
    return [o for o in [*preempting_lane_quota(cfg), *namespace_limits(cfg)] if o["kind"] == "ResourceQuota"]


@pytest.mark.parametrize("lane, workers, gpus, refused", [
    ("batch", 8, 8, None),                                 # 64 GPUs: the namespace's whole quota
    ("batch", 9, 8, "needs 72 GPUs at once (9 workers x 8 GPUs); ResourceQuota pipectl-namespace-gpus"),
    ("standard", 128, 8, "needs 1024 GPUs"),
    ("urgent", 2, 8, None),                                # 16 GPUs: the preempting lanes' quota
    ("urgent", 3, 8, "ResourceQuota pipectl-preempting-lanes of namespace pipectl allows 16 for lane urgent"),
    ("urgent", 33, 0, "needs 33 pods at once"),
    ("batch", 33, 0, None),                                # the pods quota is the preempting lanes' only
])
def test_a_gang_the_namespaces_quotas_can_never_admit_is_named_with_the_numbers(lane, workers, gpus, refused):
    from pipectl.pipelines.admission import quota_refusal

    why = quota_refusal(_quotas(), lane, workers, gpus)
    assert (why is None) if refused is None else (refused in why), why


def test_quotas_with_other_scopes_or_counts_it_cannot_read_are_not_judged():
    from pipectl.pipelines.admission import quota_refusal

    other = [{"metadata": {"name": "q"}, "spec": {"scopes": ["BestEffort"], "hard": {"pods": "1"}}},
             {"metadata": {"name": "r"}, "spec": {"hard": {"requests.nvidia.com/gpu": "8Ki"}}},
             {"metadata": {"name": "s"}, "spec": {"hard": {"requests.nvidia.com/gpu": "1k"}}}]
    assert quota_refusal(other, "batch", 100, 8) is None   # 800 <= 1k; 8Ki is not a plain count
    assert "allows 1000" in quota_refusal(other, "batch", 126, 8)


@pytest.mark.parametrize("team, lane, workers, setting", [
    (False, "batch", 9, "(site setting namespace_max_gpus)"),
    (False, "urgent", 3, "(site setting preempting_max_gpus, preempting_max_pods)"),
    (True, "batch", 5, "(site setting teams[vision].max_gpus)"),
    (True, "urgent", 2, "(site setting teams[vision].lane_gpus.urgent)"),
])
def test_a_refused_gang_names_the_site_setting_of_the_quota_that_refuses_it(team, lane, workers, setting):
    """A team's namespace's quotas are set by its entry under teams:, not by namespace_max_gpus."""
    from pipectl.pipelines.admission import quota_refusal
    from pipectl.pipelines.manifests import cluster_manifests
    from pipectl.pipelines.training import CompileConfig

    vision = {"name": "vision", "namespace": "team-vision", "groups": ["vision-ml"], "max_gpus": 32, "lane_gpus": {"urgent": 8},
              "model_prefix": "vision", "s3_prefix": "s3://pipectl/teams/vision/"}
    files = cluster_manifests(CompileConfig(teams=[vision]))
    objects = files["cluster/teams/vision.yaml"] if team else files["cluster/namespace.yaml"]
    why = quota_refusal([o for o in objects if o["kind"] == "ResourceQuota"], lane, workers, 8)
    assert why and setting in why, why
    assert "namespace_max_gpus" not in why or not team
