"""A Volcano queue per team and lane: rendered from the site file's teams with the team's GPU share,
used by the gangs of a template rendered for the team's namespace, the only queues the
``pipectl-lanes`` policy admits there (what the API server does with it: tests/cluster/test_admission.py)."""

from __future__ import annotations

import pytest
import yaml

from pipectl.components.names import LANE_NAMES, team_queue_name
from pipectl.pipelines.launchers import LAUNCHERS
from pipectl.pipelines.lint import lint_objects
from pipectl.pipelines.manifests import cluster_manifests
from pipectl.pipelines.training import CompileConfig

TEAMS = [{"name": "vision", "namespace": "team-vision", "groups": ["vision-ml"], "max_gpus": 8, "lane_gpus": {"urgent": 4},
          "model_prefix": "vision", "s3_prefix": "s3://pipectl/teams/vision/"},
         {"name": "speech", "namespace": "team-speech", "groups": ["speech-ml"], "max_gpus": 32,
          "model_prefix": "speech", "s3_prefix": "s3://pipectl/teams/speech/"}]


def _queues(team: str) -> dict[str, dict]:
    files = cluster_manifests(CompileConfig(teams=TEAMS))
    return {o["metadata"]["name"]: o["spec"] for o in files[f"cluster/teams/{team}.yaml"] if o["kind"] == "Queue"}


def test_each_team_has_a_queue_per_lane_it_may_use_holding_its_gpu_share():
    vision, speech = _queues("vision"), _queues("speech")
    assert sorted(vision) == sorted(team_queue_name("vision", lane) for lane in LANE_NAMES)
    urgent, standard, batch = (vision[team_queue_name("vision", lane)] for lane in ("urgent", "standard", "batch"))
    assert (urgent["capability"], urgent["deserved"]["nvidia.com/gpu"]) == ({"nvidia.com/gpu": "4"}, "4")
    assert (standard["capability"], standard["deserved"]["nvidia.com/gpu"]) == ({"nvidia.com/gpu": "8"}, "8")
    assert (batch["capability"], batch["deserved"], batch["reclaimable"]) == ({"nvidia.com/gpu": "8"}, {"nvidia.com/gpu": "0"}, True)
    assert not urgent["reclaimable"] and not standard["reclaimable"]
    assert speech[team_queue_name("speech", "standard")]["capability"] == {"nvidia.com/gpu": "32"}
    assert team_queue_name("speech", "urgent") not in speech  # a preempting lane's queue only when granted


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_a_template_for_a_teams_namespace_puts_its_gangs_in_the_teams_queue(launcher):
    from pipectl.components.contracts import TrainingParameters
    from pipectl.pipelines.builtin import build_training
    from pipectl.pipelines.substitution import substitute

    values = {f"inputs.parameters.{k}": v for k, v in TrainingParameters(lane="batch").as_arguments().items()}
    values |= {"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r", "workflow.name": "w",
               "retries": "0", "inputs.parameters.gang-affinity": "{}"}
    for cfg, queue in ((CompileConfig(launcher=launcher, namespace="team-vision", team="vision"), "pipectl-team-vision-batch"),
                       (CompileConfig(launcher=launcher), "pipectl-batch")):
        wt = build_training(cfg).to_dict()
        train = next(t for t in wt["spec"]["templates"] if t["name"] == "train")
        job = yaml.safe_load(substitute(train["resource"]["manifest"], values, where="test"))
        assert LAUNCHERS[launcher].gang_fields(job)[1] == queue
        assert lint_objects([("test", wt)]) == []


def test_a_team_name_that_is_no_dns_label_is_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="team"):
        CompileConfig(team="Vision Team")


def test_the_lanes_policy_admits_a_teams_namespace_to_its_own_queues_only():
    from pipectl.pipelines.admission import TEAM_LABEL, lanes_policy

    policy = lanes_policy()[0]["spec"]
    rule = policy["validations"][-1]
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert TEAM_LABEL in variables["team"] and "pipectl-team-" in variables["teamQueues"]
    assert "variables.queue in variables.teamQueues" in rule["expression"]
    assert "belongs to team" in rule["messageExpression"]
    assert 'variables.queue.endsWith("-urgent") ? "urgent"' in variables["lane"]  # a team's urgent queue needs the grant


def test_a_teams_namespace_gets_no_retrain_schedule_it_would_be_refused():
    """Runs in a team's namespace must name their model and dataset (its prefixes); pipectl cannot
    choose them for a schedule, so argo/namespace rendered for a team has none (the team writes its own)."""
    from pipectl.pipelines.manifests import CRON_FILE, render_files

    assert CRON_FILE in cluster_manifests(CompileConfig())
    team = render_files(CompileConfig(namespace="ml-vision", team="vision"))
    assert CRON_FILE not in team and "cronworkflows" not in team["namespace/kustomization.yaml"]
