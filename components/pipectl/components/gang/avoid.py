"""The ``gang-avoid`` step: after a train attempt Failed, was it the gang preflight's slow link?

The gang preflight (:mod:`pipectl.components.train.preflight`) ends a gang on a slow link with
exit 76 and the pod's termination message ``avoid nodes: <node>,...``; the gang job ends
(Volcano: ``TerminateJob``), so the train attempt Fails. This step runs then, as the launcher's
ServiceAccount: it reads the run's gang pods, and

- when one of them exited 76 naming nodes, and the run has a retry left: it adds those nodes to
  the ones the run already avoids (at most ``avoid_limit``; nodes named after that are logged and
  not added), deletes the failed gang job and waits until its pods are gone
  (:func:`~pipectl.components.gang.core.release`), and writes the next attempt's gang affinity: a
  *preferred* node anti-affinity against every avoided node, beside the site's placement of the
  gang in one network domain, which it keeps (:mod:`pipectl.pipelines.topology`);
- otherwise it fails, naming what the attempt's pods show: the attempt was not the preflight's
  (a code failure, a timeout) and is not retried here.

Why preferred, not required: a required anti-affinity can leave a gang Pending for its whole
attempt timeout on a cluster whose other nodes are too few or full (the scheduler cannot tell a
node that is merely busy from one that is excluded). Preferred puts the gang on other nodes
whenever they have room; when only an avoided node has room, the gang lands there, and a slow link
found again ends that attempt too, within the run's retries.

Where the record lives: the nodes travel as this step's output into the next attempt's input, in
the Workflow's own status (the controller's), and in the next job's pod template; nothing in the
object store, which every run of the namespace can write. Only the run's own gang pods write the
termination message read here, and a name that is not a node name is refused.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from pipectl.components.contracts import AVOID_NODES_MARK, NODE_NAME_PATTERN, AvoidInput, AvoidOutput, ExitCode, StoreSettings
from pipectl.components.gang.core import JobKind, gang_pod_selector, release
from pipectl.components.runtime import StepError

log = logging.getLogger(__name__)

NODE_NAME_FIELD = "metadata.name"
PREFERENCE_WEIGHT = 100
"""The preferred term's weight: the most the API allows, so it outweighs the scheduler's spreading
and packing scores."""
_NODE = re.compile(NODE_NAME_PATTERN)


def gang_affinity(nodes: list[str], placement: dict | None = None) -> str:
    """The gang pods' ``affinity`` (JSON, one line): ``placement`` (the site's pod affinity, from the
    first attempt's; kept as it is) and a preference for any node but ``nodes``; ``{}`` for neither."""
    affinity = dict(placement or {})
    if nodes:
        term = {"weight": PREFERENCE_WEIGHT, "preference": {"matchFields": [
            {"key": NODE_NAME_FIELD, "operator": "NotIn", "values": list(nodes)}]}}
        affinity["nodeAffinity"] = {"preferredDuringSchedulingIgnoredDuringExecution": [term]}
    return json.dumps(affinity, separators=(",", ":")) if affinity else "{}"


def _parsed(affinity: str) -> dict:
    """The affinity as a mapping of the two parts a gang affinity has; ValueError for anything else."""
    try:
        data = json.loads(affinity)
    except ValueError as e:
        raise ValueError(f"not a gang affinity pipectl writes: {affinity[:200]}") from e
    if not isinstance(data, dict) or set(data) - {"nodeAffinity", "podAffinity"} or not isinstance(data.get("podAffinity", {}), dict):
        raise ValueError(f"not a gang affinity pipectl writes: {affinity[:200]}")
    return data


def placement(affinity: str) -> dict:
    """The site's placement a gang affinity carries (``{"podAffinity": ...}``, the topology of
    :mod:`pipectl.pipelines.topology`), or ``{}``; ValueError for an affinity pipectl does not write."""
    data = _parsed(affinity)
    return {"podAffinity": data["podAffinity"]} if "podAffinity" in data else {}


def avoided_nodes(affinity: str) -> list[str]:
    """The nodes a gang affinity written by :func:`gang_affinity` avoids; ValueError for anything else."""
    data = _parsed(affinity)
    if "nodeAffinity" not in data:
        return []
    try:
        (term,) = data["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        (field,) = term["preference"]["matchFields"]
        nodes = field["values"] if (field["key"], field["operator"]) == (NODE_NAME_FIELD, "NotIn") else None
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"not a gang affinity pipectl writes: {affinity[:200]}") from e
    if not isinstance(nodes, list) or not all(isinstance(n, str) and _NODE.match(n) for n in nodes):
        raise ValueError(f"not a gang affinity pipectl writes: {affinity[:200]}")
    return nodes


def named_nodes(pods: list[Any]) -> list[str]:
    """The nodes the gang's pods that exited 76 name in their termination messages, in order, once
    each (pods as the API lists them, objects or dicts); names that are not node names are left out."""
    nodes: list[str] = []
    for pod in pods:
        for message in _exit_76_messages(pod):
            for line in message.splitlines():
                if line.startswith(AVOID_NODES_MARK):
                    nodes += [n for n in line[len(AVOID_NODES_MARK):].strip().split(",") if _NODE.match(n) and n not in nodes]
    return nodes


def _exit_76_messages(pod: Any) -> list[str]:
    statuses = (pod.get("status", {}).get("containerStatuses") if isinstance(pod, dict)
                else pod.status.container_statuses) or []
    found = []
    for status in statuses:
        state = status.get("state", {}) if isinstance(status, dict) else status.state
        term = state.get("terminated") if isinstance(state, dict) else state.terminated
        if not term:
            continue
        code, message = (term.get("exitCode"), term.get("message")) if isinstance(term, dict) else (term.exit_code, term.message)
        if code == int(ExitCode.AVOID_NODES) and message:
            found.append(message)
    return found


def next_avoided(avoided: list[str], named: list[str], limit: int) -> tuple[list[str], list[str]]:
    """(the nodes the next attempt avoids, the named ones left out because ``limit`` is reached)."""
    new = [n for n in named if n not in avoided]
    room = max(0, limit - len(avoided))
    return avoided + new[:room], new[room:]


def _pod_outcomes(pods: list[Any]) -> str:
    """What the attempt's gang pods show, for the failure message: ``pod: exit N (reason)``."""
    shown = []
    for pod in pods:
        for status in pod.status.container_statuses or []:
            term = status.state.terminated if status.state else None
            if term:
                shown.append(f"{pod.metadata.name}: exit {term.exit_code} ({term.reason or 'no reason'})")
    return "; ".join(shown) or "no gang pod ended"


def run(inp: AvoidInput, settings: StoreSettings) -> AvoidOutput:
    from kubernetes import client

    from pipectl.components.gang.step import _api_client

    api = _api_client()
    pods = client.CoreV1Api(api).list_namespaced_pod(inp.namespace, label_selector=gang_pod_selector(inp.workflow_name)).items
    named = named_nodes(pods)
    if not named:
        raise StepError(f"the train attempt of workflow {inp.workflow_name} failed, and not for a slow link the gang "
                        f"preflight named: not retried ({_pod_outcomes(pods)})",
                        f"pipectl status {inp.workflow_name}; pipectl logs {inp.workflow_name} --step train")
    if inp.retries >= inp.retry_limit:
        raise StepError(f"the gang preflight of workflow {inp.workflow_name} found a slow link on {', '.join(named)} again, "
                        f"and its {inp.retry_limit} retries are used up",
                        "check those nodes' network, or cordon them (kubectl cordon NODE), then retry the run")
    try:
        avoided, kept = avoided_nodes(inp.gang_affinity), placement(inp.gang_affinity)
    except ValueError as e:
        raise StepError(f"gang-avoid: {e}", "this input is written by the previous gang-avoid step only") from e
    nodes, left_out = next_avoided(avoided, named, inp.avoid_limit)
    print(f"gang preflight named {', '.join(named)}: the next attempt avoids {', '.join(nodes) or 'no node'} "
          f"(preferred, {len(nodes)} of at most {inp.avoid_limit})", flush=True)
    if left_out:
        print(f"not avoiding {', '.join(left_out)}: the run already avoids {inp.avoid_limit} nodes, its most; "
              "the scheduler may place the gang there", flush=True)
    try:
        deleted = release(api, inp.namespace, inp.workflow_name, [JobKind.parse(inp.job_kind)], timeout_s=inp.timeout_s)
    except TimeoutError as e:
        raise StepError(f"the failed gang of workflow {inp.workflow_name} is not gone after {inp.timeout_s:g} s: {e}",
                        "check the pods' nodes (a node that stopped reporting keeps its pods Terminating)", transient=True) from e
    print(f"deleted the failed gang job {', '.join(deleted) or '(none left)'}; retry {inp.retries + 1} of {inp.retry_limit}", flush=True)
    return AvoidOutput(gang_affinity=gang_affinity(nodes, kept))


if __name__ == "__main__":
    import sys

    from pipectl.components.runtime import step_main

    sys.exit(step_main(AvoidInput, run, prog="pipectl.components.gang.avoid"))
