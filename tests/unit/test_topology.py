"""The site's topology placement: the gang's pods in one network domain, from the site file to every
gang pod (through Argo's own substitution), kept by ``gang-avoid``, checked by ``pipectl lint``."""

from __future__ import annotations

import json

import pytest
import yaml

from pipectl.pipelines.builtin import build_training
from pipectl.pipelines.lint import lint_objects
from pipectl.pipelines.training import CompileConfig

RACK = "topology.k8s.aws/network-node-layer-3"


@pytest.fixture(scope="module")
def argo():
    from tests.tools.argo import ArgoExpr

    evaluator = ArgoExpr()
    yield evaluator
    evaluator.close()


def _templates(cfg: CompileConfig) -> tuple[dict, dict[str, dict]]:
    wt = build_training(cfg).to_dict()
    return wt, {t["name"]: t for t in wt["spec"]["templates"]}


def _default(template: dict) -> str:
    return next(p["default"] for p in template["inputs"]["parameters"] if p["name"] == "gang-affinity")


def _submitted_job(argo, train: dict, workflow: str) -> dict:
    """The gang job of ``train`` as the controller substitutes it: globals first (the run's name, in
    the inputs too), then the inputs (their defaults), with Argo's own template.Replace."""
    from pipectl.components.contracts import TrainingParameters

    first = argo.substitute(train, {"workflow.name": workflow})
    values = {f"inputs.parameters.{k}": v for k, v in TrainingParameters().as_arguments().items()}
    values |= {f"inputs.parameters.{p['name']}": p.get("default", "x") for p in first["inputs"]["parameters"]
               if "default" in p} | {"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r",
                                     "workflow.name": workflow, "retries": "0"}
    return yaml.safe_load(argo.substitute(first, values)["resource"]["manifest"])


@pytest.mark.parametrize(("launcher", "mode"), [("volcano", "preferred"), ("pytorchjob", "required")])
def test_every_gang_pod_of_a_run_is_drawn_to_that_runs_gang_on_the_sites_topology_label(argo, launcher, mode):
    from pipectl.pipelines.launchers import LAUNCHERS
    from tests.unit.test_training_template import _pods

    wt, templates = _templates(CompileConfig(launcher=launcher, topology={"key": RACK, "mode": mode}))
    assert _default(templates["train"]) == _default(templates["train-retry"])  # the first attempt's, either way in
    job = _submitted_job(argo, templates["train"], "training-abcde")
    term = {"labelSelector": {"matchLabels": {"workflows.argoproj.io/workflow": "training-abcde", "pipectl.io/step": "train"}},
            "topologyKey": RACK}
    want = ({"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]} if mode == "preferred"
            else {"requiredDuringSchedulingIgnoredDuringExecution": [term]})
    groups = LAUNCHERS[launcher].replica_groups(job)
    assert groups and all(g.pod_spec["affinity"] == {"podAffinity": want} for g in groups)
    assert all(pod["metadata"]["labels"] == term["labelSelector"]["matchLabels"] for pod in _pods(job))  # they match it
    assert lint_objects([("test", wt)]) == []


def test_without_a_topology_the_gang_has_no_placement():
    _, templates = _templates(CompileConfig())
    assert _default(templates["train"]) == _default(templates["train-retry"]) == "{}"


def test_gang_avoid_keeps_the_placement_of_the_first_attempt(argo):
    from pipectl.components.gang.avoid import avoided_nodes, gang_affinity, placement

    _, templates = _templates(CompileConfig(topology={"key": RACK}))
    first = argo.substitute(templates["train-retry"], {"workflow.name": "training-abcde"})
    affinity = _default(first)
    nxt = json.loads(gang_affinity(["gpu-3"], placement(affinity)))
    assert nxt["podAffinity"] == json.loads(affinity)["podAffinity"] and avoided_nodes(json.dumps(nxt)) == ["gpu-3"]


def test_lint_checks_the_placement_against_the_gang_jobs_schema():
    """A placement the API server would refuse (no topologyKey) or prune is a lint finding."""
    wt, templates = _templates(CompileConfig(topology={"key": RACK}))
    train = templates["train"]
    param = next(p for p in train["inputs"]["parameters"] if p["name"] == "gang-affinity")
    placed = json.loads(param["default"])
    term = placed["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    del term["topologyKey"]
    term["topologyKeys"] = [RACK]
    param["default"] = json.dumps(placed)
    found = [str(f) for f in lint_objects([("test", wt)])]
    assert any("'topologyKey' is a required property" in f and "affinity.podAffinity" in f for f in found), found
    assert any("unknown field 'topologyKeys'" in f for f in found), found


@pytest.mark.parametrize(("topology", "expected"), [
    ({"key": "kubernetes.io/hostname"}, "would put every gang pod on one node"),
    ({"key": "rack name"}, "String should match pattern"),
    ({"key": RACK, "mode": "strict"}, "Input should be 'preferred' or 'required'"),
    ({"key": RACK, "weight": 5}, "Extra inputs are not permitted"),
])
def test_a_bad_topology_is_refused_naming_the_key(topology, expected):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=expected):
        CompileConfig(topology=topology)


def test_doctor_says_whether_the_nodes_carry_the_topology_label():
    from types import SimpleNamespace

    from pipectl.pipelines.backends.doctor import topology_row
    from pipectl.pipelines.topology import Topology

    def node(labels, gpus="8"):
        return SimpleNamespace(metadata=SimpleNamespace(labels=labels), status=SimpleNamespace(allocatable={"nvidia.com/gpu": gpus}))

    racks = [node({RACK: "r1"}), node({RACK: "r1"}), node({RACK: "r2"}), node({}, gpus="0")]
    row = topology_row(racks, Topology(key=RACK, mode="required"))
    assert (row.status, row.detail) == ("ok", "3 of 3 GPU nodes carry it, 2 domains")
    row = topology_row(racks[1:3] + [node({})], Topology(key=RACK, mode="required"))
    assert row.status == "warn" and "gang pods never land on the others" in row.detail and f"kubectl label nodes NODE {RACK}=" in row.fix
    assert topology_row(racks[1:3] + [node({})], Topology(key=RACK)).status == "ok"  # preferred: the others still serve
    assert topology_row([node({})], Topology(key=RACK)).status == "warn"
    row = topology_row([node({})], Topology(key=RACK, mode="required"))
    assert row.status == "fail" and row.detail == "0 of 1 GPU nodes carry it, 0 domains: no gang pod can be placed"
