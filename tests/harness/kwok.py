"""KWOK: fake nodes and the lifecycle of their pods, from the YAML files in manifests/.

Pod lifecycle on fake nodes (Stages in manifests/kwok-pod-stages.yaml):
  Pending -> Running (every container running) -> Succeeded (every container exit 0);
  a pod annotated ``pipectl.io/fail: MESSAGE`` goes Running -> Failed instead: its containers
  other than Argo's ``wait`` terminate with exit code ``pipectl.io/exit-code`` (default 1),
  reason Error and MESSAGE as the termination message. With ``pipectl.io/fail-reason: REASON``
  also set, the pod itself gets ``status.reason: REASON`` and ``status.message: MESSAGE`` (what a
  node shutdown or eviction looks like; Argo then shows MESSAGE as the step's message). Running
  time: ``pipectl.io/run-duration`` (a Go duration such as ``30s``; default 1s); Pending -> Running
  takes 200 ms after the pod is bound. Resource-template pods stay Running: the argoexec stand-in
  (argoexec.py) ends them. Fake nodes (manifests/fake-node.yaml): ``kwok-node-N``, label
  ``type=kwok``, each cpu 32, memory 256Gi, nvidia.com/gpu 8, pods 110, no taints.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from tests.harness.binaries import binary, load_yaml_docs, module_dir

MANIFESTS = Path(__file__).resolve().parent / "manifests"
CONFIG = MANIFESTS / "kwok-config.yaml"
STAGE_FILES = [MANIFESTS / "kwok-node-heartbeat.yaml", MANIFESTS / "kwok-pod-stages.yaml"]
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
POD_CIDR = "10.244.0.0/16"
NODE_IP = "10.255.0.1"


@functools.cache
def _fake_node_template() -> dict:
    return load_yaml_docs(MANIFESTS / "fake-node.yaml")[0]


NODE_CAPACITY: dict[str, str] = dict(_fake_node_template()["status"]["capacity"])


def fake_node(name: str, labels: dict | None = None, taints: list | None = None,
              capacity: dict | None = None) -> dict:
    """A Node for KWOK named ``name``: manifests/fake-node.yaml plus ``labels``, ``taints`` (default
    none) and ``capacity`` overrides (allocatable = capacity)."""
    node = copy.deepcopy(_fake_node_template())
    cap = dict(NODE_CAPACITY, **(capacity or {}))
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, **(labels or {})})
    node["spec"]["taints"] = taints or []
    node["status"] = {"capacity": cap, "allocatable": dict(cap)}
    return node


def stages(heartbeat_s: float | None = None) -> list[dict]:
    """Every Stage to create before KWOK starts: KWOK's own fast node initialisation (from its Go
    module), then ours (node heartbeat, pod lifecycle). ``heartbeat_s``: the nodes' status is
    renewed every ``heartbeat_s`` to 1.2 x ``heartbeat_s`` seconds instead of every 10-15 s (a
    cluster of a thousand fake nodes spends both cores of a small machine on 10 s heartbeats;
    stay under the node controller's 50 s grace period)."""
    docs = load_yaml_docs(module_dir("kwok") / "kustomize/stage/node/fast/node-initialize.yaml")
    for f in STAGE_FILES:
        docs += load_yaml_docs(f)
    if heartbeat_s is not None:
        beat = next(d for d in docs if d["metadata"]["name"] == "node-heartbeat")
        beat["spec"]["delay"] = {"durationMilliseconds": int(heartbeat_s * 1000),
                                 "jitterDurationMilliseconds": int(heartbeat_s * 1200)}
    return docs


def argv(kubeconfig: str) -> list[str]:
    """The kwok command line: only nodes annotated as fake, Stages from the API server."""
    return [str(binary("kwok")), "--kubeconfig", kubeconfig, "-c", str(CONFIG),
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION[0]}={FAKE_NODE_ANNOTATION[1]}",
            "--enable-crds=Stage", "--cidr", POD_CIDR, "--node-ip", NODE_IP]
