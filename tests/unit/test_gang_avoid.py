"""The gang preflight's slow link ends the gang's job, and the next attempt avoids the nodes it named:
the exit code through the launcher, the Volcano policy, what ``gang-avoid`` reads and writes, and
the gang job's manifest with the affinity it receives. On the control plane:
tests/cluster/test_gang_restarts.py::test_a_gang_the_preflight_ended_is_retried_away_from_the_named_node."""

from __future__ import annotations

import json

import pytest
import yaml

from pipectl.components.contracts import ExitCode, TrainingParameters
from pipectl.components.gang.avoid import avoided_nodes, gang_affinity, named_nodes, next_avoided, placement


def _pod(exit_code: int, message: str) -> dict:
    return {"status": {"containerStatuses": [{"name": "pytorch", "state": {"terminated": {"exitCode": exit_code, "message": message}}}]}}


def test_the_preflights_verdict_exits_76_and_names_its_nodes_in_the_termination_message():
    from pipectl.components.runtime import classify_exception
    from pipectl.components.train.launch import container_exit_code
    from pipectl.components.train.preflight import SlowLinkError

    error = SlowLinkError("gang preflight: a slow link in the gang's ring: rank 2 on node gpu-7 (502 ms)", "hint", ["gpu-7", "gpu-8"])
    assert classify_exception(error) == ExitCode.AVOID_NODES == 76
    assert container_exit_code(76) == 76 and container_exit_code(75) == 75 and container_exit_code(2) == 1
    assert named_nodes([_pod(76, error.termination_message())]) == ["gpu-7", "gpu-8"]


def test_only_pods_that_exited_76_name_nodes_and_only_node_names_count():
    pods = [_pod(1, "avoid nodes: code-failure-node"), _pod(76, "x\navoid nodes: gpu-1,Bad_Name,gpu-2"),
            _pod(76, "avoid nodes: gpu-2,gpu-3"), {"status": {}}]
    assert named_nodes(pods) == ["gpu-1", "gpu-2", "gpu-3"]
    assert named_nodes([_pod(1, "Traceback: ZeroDivisionError")]) == []


def test_the_affinity_prefers_every_node_but_the_avoided_ones_and_reads_back():
    assert gang_affinity([]) == "{}" and avoided_nodes("{}") == []
    affinity = json.loads(gang_affinity(["gpu-1", "gpu-2"]))
    assert affinity == {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": {
        "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gpu-1", "gpu-2"]}]}}]}}
    assert avoided_nodes(gang_affinity(["gpu-1", "gpu-2"])) == ["gpu-1", "gpu-2"]
    for forged in ('{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}',
                   gang_affinity(["gpu-1"]).replace("gpu-1", "gpu-1: {x}"), "[]"):
        with pytest.raises(ValueError, match="not a gang affinity"):
            avoided_nodes(forged)


def test_the_sites_placement_is_kept_beside_the_avoided_nodes():
    """A gang affinity that starts as the site's topology placement (a pod affinity) keeps it when
    nodes are avoided; only the two parts pipectl writes are read."""
    site = {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
        "labelSelector": {"matchLabels": {"pipectl.io/step": "train"}}, "topologyKey": "example.com/rack"}}]}}
    first = json.dumps(site)
    assert avoided_nodes(first) == [] and placement(first) == site and placement("{}") == {}
    nxt = gang_affinity(["gpu-1"], placement(first))
    assert json.loads(nxt)["podAffinity"] == site["podAffinity"] and avoided_nodes(nxt) == ["gpu-1"]
    assert placement(gang_affinity(["gpu-1", "gpu-2"], placement(nxt))) == site
    assert gang_affinity([], site) == json.dumps(site, separators=(",", ":"))
    for forged in ('{"podAntiAffinity": {}}', '{"podAffinity": []}', "null"):
        with pytest.raises(ValueError, match="not a gang affinity"):
            placement(forged)


def test_at_most_the_limit_of_nodes_is_avoided_and_the_rest_is_reported():
    assert next_avoided([], ["a", "b"], 4) == (["a", "b"], [])
    assert next_avoided(["a", "b"], ["b", "c", "d", "e"], 4) == (["a", "b", "c", "d"], ["e"])
    assert next_avoided(["a"], ["b"], 0) == (["a"], ["b"])


@pytest.mark.parametrize("launcher", ["volcano", "pytorchjob"])
def test_every_gang_pod_gets_the_affinity_gang_avoid_wrote(launcher):
    from pipectl.pipelines.launchers import LAUNCHERS
    from pipectl.pipelines.substitution import substitute
    from pipectl.pipelines.training import CompileConfig

    lau = LAUNCHERS[launcher]
    values = {f"inputs.parameters.{k}": v for k, v in TrainingParameters().as_arguments().items()}
    values |= {"inputs.parameters.shards-uri": "s3://b/runs/w/shards/", "inputs.parameters.run-uri": "s3://b/runs/w",
               "workflow.name": "w", "retries": "0"}
    manifest = lau.manifest(CompileConfig(launcher=launcher).gang())
    for affinity in ("{}", gang_affinity(["kwok-node-1", "kwok-node-2"])):
        job = yaml.safe_load(substitute(manifest, {**values, "inputs.parameters.gang-affinity": affinity}, where="test"))
        assert [g.pod_spec["affinity"] for g in lau.replica_groups(job)] and all(
            g.pod_spec["affinity"] == json.loads(affinity) for g in lau.replica_groups(job))


def test_volcano_ends_the_job_on_76_instead_of_restarting_it_in_place():
    from pipectl.pipelines.launchers.volcano import VOLCANO_POLICIES

    first = next(p for p in VOLCANO_POLICIES if p.get("exitCode") == 76 or p.get("event") == "PodFailed")
    assert first == {"exitCode": 76, "action": "TerminateJob"}


def test_gang_avoid_runs_as_the_launcher_with_the_policys_limits_and_no_store_credentials():
    from pipectl.pipelines.builtin import build_training
    from pipectl.pipelines.policy import RetryPolicy

    templates = {t["name"]: t for t in build_training().to_dict()["spec"]["templates"]}
    avoid = templates["gang-avoid"]
    args = avoid["container"]["args"]
    assert args[args.index("--retry-limit") + 1] == str(RetryPolicy().infra_limit)
    assert args[args.index("--avoid-limit") + 1] == str(RetryPolicy().avoid_nodes_limit)
    assert avoid["serviceAccountName"] == "pipectl-launcher" and avoid["automountServiceAccountToken"] is True
    assert "envFrom" not in avoid["container"]
    # its verdict is final (its message quotes the pods: no infrastructure pattern may retry it)
    assert avoid["retryStrategy"]["expression"] == 'lastRetry.status == "Error" || lastRetry.exitCode == "75"'
    assert [o["name"] for o in avoid["outputs"]["parameters"]] == ["gang-affinity"]
    nxt = next(t for t in templates["train-reroute"]["dag"]["tasks"] if t["name"] == "next")
    assert {p["name"]: p["value"] for p in nxt["arguments"]["parameters"]}["gang-affinity"] == \
        "{{tasks.avoid.outputs.parameters.gang-affinity}}"
