"""`submit --wait` / `wait` follow a workflow with a Kubernetes watch (ArgoCluster.wait), and no
phase change and no terminal state is missed: not between the first read and the watch, not when
the API server ends a watch, not when the version watched from has expired (410 Gone). A scripted
watch stands in for the API server's; the whole command against the real API server and Argo
controller: tests/cluster/test_cli_conventions.py::test_wait_follows_a_workflow_to_its_end_and_exits_by_its_phase."""

from __future__ import annotations

import pytest


def _wf(version: int, phase: str, **nodes: str) -> dict:
    return {"metadata": {"name": "training-x", "resourceVersion": str(version)},
            "status": {"phase": phase, "nodes": {n: {"displayName": n, "phase": p} for n, p in nodes.items()}}}


class _ScriptedWatch:
    """``kubernetes.watch.Watch`` whose streams play ``windows`` in turn: each a list of events (an
    event dict, or an exception raised at that point); an empty list is a watch the API server
    ended with no event. Records the resourceVersion each stream was started from."""

    windows: list[list] = []
    started_from: list[str] = []

    def stream(self, func, *args, **kwargs):
        _ScriptedWatch.started_from.append(kwargs["resource_version"])
        assert kwargs["field_selector"] == "metadata.name=training-x" and kwargs["timeout_seconds"] >= 1
        for event in _ScriptedWatch.windows.pop(0):
            if isinstance(event, Exception):
                raise event
            yield event


@pytest.fixture()
def cluster(monkeypatch):
    """An ArgoCluster without a kubeconfig: GETs answered from ``cluster.gets`` (in turn), the watch
    scripted (``_ScriptedWatch.windows``)."""
    import kubernetes.watch

    from pipectl.pipelines.backends.kube import ArgoCluster

    monkeypatch.setattr(kubernetes.watch, "Watch", _ScriptedWatch)
    _ScriptedWatch.windows, _ScriptedWatch.started_from = [], []
    c = ArgoCluster.__new__(ArgoCluster)
    c.namespace, c.gets = "team-a", []
    c.api = type("Api", (), {"list_namespaced_custom_object": lambda self, *a, **k: None})()
    c.get = lambda plural, name: c.gets.pop(0)
    return c


def _follow(cluster, timeout_s=None) -> tuple[dict, list[tuple[str, dict]]]:
    changes = []
    wf = cluster.wait("training-x", lambda w: changes.append((w["status"]["phase"], dict(
        (k, n["phase"]) for k, n in w["status"]["nodes"].items()))), timeout_s=timeout_s)
    return wf, changes


def test_every_phase_change_is_seen_and_a_watch_the_server_ended_resumes_from_the_last_version(cluster):
    cluster.gets = [_wf(10, "Running", stage="Running")]
    _ScriptedWatch.windows = [
        [{"type": "MODIFIED", "object": _wf(11, "Running", stage="Succeeded", train="Pending")}],
        [{"type": "MODIFIED", "object": _wf(12, "Running", stage="Succeeded", train="Running")}],
        [],  # the API server ended this watch (its timeout): nothing came, resume from 12
        [{"type": "MODIFIED", "object": _wf(13, "Running", stage="Succeeded", train="Running")},  # no node changed
         ],
        [{"type": "MODIFIED", "object": _wf(14, "Succeeded", stage="Succeeded", train="Succeeded")}],
    ]
    wf, changes = _follow(cluster)
    assert wf["status"]["phase"] == "Succeeded" and wf["metadata"]["resourceVersion"] == "14"
    assert _ScriptedWatch.started_from == ["10", "11", "12", "12", "13"]
    assert [c[1] for c in changes] == [{"stage": "Running"}, {"stage": "Succeeded", "train": "Pending"},
                                       {"stage": "Succeeded", "train": "Running"},
                                       {"stage": "Succeeded", "train": "Succeeded"}]
    assert _ScriptedWatch.windows == [] and cluster.gets == []


def test_a_workflow_that_ended_before_the_watch_is_returned_without_one(cluster):
    cluster.gets = [_wf(7, "Failed", train="Failed")]
    wf, changes = _follow(cluster)
    assert wf["status"]["phase"] == "Failed" and changes == [("Failed", {"train": "Failed"})]
    assert _ScriptedWatch.started_from == []


def test_an_expired_version_reads_the_workflow_again_and_its_end_is_not_missed(cluster):
    """410 Gone: the version watched from is older than the API server keeps (a long wait, a
    compaction). The workflow ended meanwhile: the fresh GET has it, and wait returns it."""
    from kubernetes.client.exceptions import ApiException

    cluster.gets = [_wf(5, "Running", train="Running"), _wf(90, "Error", train="Error")]
    _ScriptedWatch.windows = [[ApiException(status=410, reason="Expired: too old resource version: 5 (80)")]]
    wf, changes = _follow(cluster)
    assert wf["status"]["phase"] == "Error" and changes[-1] == ("Error", {"train": "Error"})
    assert _ScriptedWatch.started_from == ["5"] and cluster.gets == []


def test_a_deleted_workflow_or_another_api_error_ends_the_wait_with_an_error(cluster):
    from kubernetes.client.exceptions import ApiException

    from pipectl.components.errors import PipectlError

    cluster.gets = [_wf(5, "Running", train="Running")]
    _ScriptedWatch.windows = [[{"type": "DELETED", "object": _wf(6, "Running", train="Running")}]]
    with pytest.raises(PipectlError, match="workflow training-x was deleted before it ended"):
        _follow(cluster)
    cluster.gets = [_wf(5, "Running", train="Running")]
    _ScriptedWatch.windows = [[ApiException(status=500, reason="boom")]]
    with pytest.raises(ApiException):  # not mistaken for an expired version
        _follow(cluster)


def test_a_timeout_names_the_phase_and_what_to_do(cluster, monkeypatch):
    from pipectl.components.errors import PipectlError
    from pipectl.pipelines.backends import kube

    clock = iter([0.0, 0.0, 5.0])
    monkeypatch.setattr(kube.time, "monotonic", lambda: next(clock))
    cluster.gets = [_wf(5, "Running", train="Running")]
    _ScriptedWatch.windows = [[]]
    with pytest.raises(PipectlError, match="still Running after 3 s") as e:
        _follow(cluster, timeout_s=3)
    assert "pipectl stop training-x" in e.value.hint


def test_only_a_run_failed_at_once_for_want_of_its_own_template_counts_as_the_controllers_stale_cache():
    from pipectl.pipelines.backends.kube import _age_s, _missing_template

    message = 'workflowtemplates.argoproj.io "training-v1" not found'
    assert _missing_template({"status": {"phase": "Error", "message": message}}, "training-v1")
    assert not _missing_template({"status": {"phase": "Error", "message": message}}, "training-v2")
    assert not _missing_template({"status": {"phase": "Error", "message": message, "nodes": {"a": {}}}}, "training-v1")
    assert not _missing_template({"status": {"phase": "Running"}}, "training-v1")
    assert not _missing_template({}, "training-v1")
    at = lambda t: {"metadata": {"creationTimestamp": t}}  # noqa: E731
    assert _age_s(at("2026-12-05T10:00:00Z"), at("2026-12-05T10:01:05Z")) == 65
