"""Field case C08 on the control plane: two workflows of the same model whose register steps would
overlap run them one after the other (the register template's Argo mutex, one per model name:
pipelines/pipectl/pipelines/training.py REGISTER_MUTEX), on the real Argo v4.0.5 controller.
Which model then holds `champion` is the register step's own compare-and-verify, shown on the real
MLflow server (tests/integration/test_register.py test_C08_...); here: the controller never lets
two promotions of one model run at once, and a third workflow of ANOTHER model is not held back.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.cluster.test_control_plane import (  # noqa: F401 - fixtures
    _custom,
    _pipectl,
    _wait_phase,
    project_applied,
    training_outputs_supplied,
)

NS = "pipectl"
REGISTER_S = 6  # how long KWOK keeps each register pod running


def _register_pods(wf: dict) -> list[dict]:
    return [n for n in wf["status"].get("nodes", {}).values() if n["type"] == "Pod" and n.get("templateName") == "register"]


def _holder(mutex: str) -> dict:
    """A workflow that takes the register mutex of a model and keeps it (a suspended step, until the
    workflow is terminated): every promotion of that model submitted meanwhile must wait."""
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": "lock-holder-", "namespace": NS},
        "spec": {"entrypoint": "main", "templates": [{"name": "main", "suspend": {}, "synchronization": {"mutexes": [{"name": mutex}]}}]},
    }


def test_C08_two_workflows_of_one_model_promote_one_at_a_time(project_applied, training_outputs_supplied, test_cluster, k8s_api):
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    custom = _custom(k8s_api)
    original = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1")
    slow = json.loads(json.dumps(original))
    register = next(t for t in slow["spec"]["templates"] if t["name"] == "register")
    register.setdefault("metadata", {}).setdefault("annotations", {})["pipectl.io/run-duration"] = f"{REGISTER_S}s"
    custom.replace_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1", slow)
    mutex = "pipectl-register-digits-cnn"
    holder = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", _holder(mutex))["metadata"]["name"]
    try:
        _wait_holding(custom, holder)
        names = []
        for model in ("digits-cnn", "digits-cnn", "other-model"):
            r = _pipectl(test_cluster, "submit", "training", "-p", "workers=1", "-p", "gpus-per-worker=1",
                         "-p", "processes-per-worker=1", "-p", f"model-name={model}", "--output", "json")
            assert r.returncode == 0, r.stderr
            names.append(json.loads(r.stdout)["name"])
        # Both promotions of digits-cnn are held back on its mutex; the other model's is not.
        waited = _follow(custom, names, until=lambda waited, done: set(names[:2]) <= set(waited) and names[2] in done)
        assert all(mutex in waited[n] for n in names[:2]), waited
        custom.patch_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", holder, {"spec": {"shutdown": "Terminate"}})
        done = _follow(custom, names, until=lambda waited, done: len(done) == len(names), waited=waited, result="done")
        for name, wf in done.items():
            assert wf["status"]["phase"] == "Succeeded", (name, wf["status"].get("message"))
        a, b, other = ([(p["startedAt"], p["finishedAt"]) for p in _register_pods(done[n])] for n in names)
        assert len(a) == len(b) == len(other) == 1, (a, b, other)
        (a0, a1), (b0, b1) = a[0], b[0]
        print(f"register of one model: {a[0]} and {b[0]}; lock waits seen: {waited}")
        assert a1 <= b0 or b1 <= a0, f"the two promotions of digits-cnn overlapped: {a[0]} {b[0]}"
        assert names[2] not in waited, "a promotion of another model must not wait for digits-cnn's lock"
    finally:
        current = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1")
        original["metadata"] = {"name": "training-v1", "namespace": NS, "resourceVersion": current["metadata"]["resourceVersion"],
                                "labels": original["metadata"].get("labels", {}),
                                "annotations": original["metadata"].get("annotations", {})}
        custom.replace_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1", original)
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", holder)


def _wait_holding(custom, name: str, timeout_s: float = 120) -> None:
    """Wait until the holder's suspended step runs: it holds the mutex."""
    deadline, wf = time.monotonic() + timeout_s, {}
    while time.monotonic() < deadline:
        wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        if any(n["type"] == "Suspend" and n.get("phase") == "Running" for n in (wf.get("status") or {}).get("nodes", {}).values()):
            return
        time.sleep(0.5)
    raise AssertionError(f"the lock holder {name} did not start within {timeout_s}s: {wf.get('status')}")


def _follow(custom, names: list[str], until, waited: dict | None = None, result: str = "waited", timeout_s: float = 240) -> dict:
    """Read the workflows until ``until(waited, done)``: ``waited`` maps a workflow to its register
    node's "Waiting for" message, ``done`` an ended workflow to its object. Returns one of them."""
    waited, done = ({} if waited is None else waited), {}
    deadline = time.monotonic() + timeout_s
    while not until(waited, done):
        assert time.monotonic() < deadline, f"not reached within {timeout_s}s: waited {waited}, ended {sorted(done)}"
        for name in names:
            wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
            status = wf.get("status") or {}  # a workflow the controller has not seen yet has none
            for n in status.get("nodes", {}).values():
                if n.get("templateName") == "register" and "Waiting for" in (n.get("message") or ""):
                    waited[name] = n["message"]
            if status.get("phase") in ("Succeeded", "Failed", "Error"):
                done[name] = wf
        time.sleep(0.5)
    return waited if result == "waited" else done
