"""The gang reaper as rendered (argo/namespace/gang-reaper.yaml) and what decides a release.

Its behaviour against the real API server, Argo and Volcano: tests/cluster/test_gang_reaper.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipectl.components.gang.reaper import parser, wants_release
from pipectl.pipelines.gang_reaper import GANG_REAPER, gang_reaper, gang_reaper_command
from pipectl.pipelines.launchers import LAUNCHERS
from pipectl.pipelines.lint import lint_objects
from pipectl.pipelines.manifests import cluster_manifests, priority_classes
from pipectl.pipelines.training import CompileConfig


def _objects(cfg: CompileConfig) -> dict[str, dict]:
    return {o["kind"]: o for o in gang_reaper(cfg)}


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_the_reapers_role_holds_only_what_it_does(launcher):
    cfg = CompileConfig(launcher=launcher)
    lau = LAUNCHERS[launcher]
    objs = _objects(cfg)
    assert objs["Role"]["rules"] == [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [lau.api_group], "resources": [lau.resource], "verbs": ["list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]
    binding = objs["RoleBinding"]
    assert binding["roleRef"]["name"] == GANG_REAPER
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": GANG_REAPER, "namespace": cfg.namespace}]
    assert objs["Deployment"]["spec"]["template"]["spec"]["serviceAccountName"] == GANG_REAPER
    assert f"{lau.api_group}/{lau.version}/{lau.resource}" in gang_reaper_command(cfg)


def test_the_reapers_pod_is_restricted_small_and_runs_the_light_image():
    cfg = CompileConfig(namespace="team-a")
    deployment = _objects(cfg)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1 and deployment["metadata"]["namespace"] == "team-a"
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
                                      "seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                            "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                                            "readOnlyRootFilesystem": True}
    assert container["resources"] == {"requests": {"cpu": "10m", "memory": "96Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}
    assert container["image"] == cfg.light_image
    assert pod["automountServiceAccountToken"] is True
    assert pod["priorityClassName"] in {p["metadata"]["name"] for p in priority_classes()}
    assert container["command"] + container["args"] == gang_reaper_command(cfg)
    assert "--namespace" in container["args"] and container["args"][container["args"].index("--namespace") + 1] == "team-a"


def test_the_rendered_command_is_the_reapers_own():
    """The container's arguments parse with the reaper's own parser (what `python -m
    pipectl.components.gang reap` reads), the namespace and the launcher's kind as rendered."""
    cfg = CompileConfig()
    command = gang_reaper_command(cfg)
    assert command[:4] == ["python", "-m", "pipectl.components.gang", "reap"]
    args = parser().parse_args(command[4:])
    lau = LAUNCHERS[cfg.launcher]
    assert args.namespace == cfg.namespace
    assert [(k.group, k.version, k.plural) for k in args.job_kind] == [(lau.api_group, lau.version, lau.resource)]


def test_a_bad_job_kind_exits_2_naming_it():
    r = subprocess.run([sys.executable, "-m", "pipectl.components.gang", "reap", "--namespace", "pipectl",
                        "--job-kind", "jobs"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "'jobs' is not group/version/plural" in r.stderr


def test_the_reaper_is_installed_by_the_namespace_owner_and_lint_clean():
    manifests = cluster_manifests()
    assert [o["kind"] for o in manifests["namespace/gang-reaper.yaml"]] == ["ServiceAccount", "Role", "RoleBinding", "Deployment"]
    assert lint_objects([("gang-reaper.yaml", o) for o in manifests["namespace/gang-reaper.yaml"]]) == []


def test_lint_holds_a_deployments_pod_to_the_restricted_standard():
    deployment = _objects(CompileConfig())["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    pod["securityContext"]["runAsNonRoot"] = False
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["containers"][0]["image"] = "registry.example.com/step-light:latest"
    found = [f.message for f in lint_objects([("test", deployment)])]
    assert "runAsNonRoot must be true (restricted Pod Security Standard)" in found
    assert "privileged containers are not allowed" in found
    assert any("is not pinned" in m for m in found), found


def _wf(phase: str | None = None, shutdown: str | None = None, deleting: bool = False) -> dict:
    meta = {"name": "r", "uid": "u1", **({"deletionTimestamp": "2026-12-03T00:00:00Z"} if deleting else {})}
    return {"metadata": meta, "spec": {"shutdown": shutdown} if shutdown else {}, "status": {"phase": phase} if phase else {}}


@pytest.mark.parametrize("workflow, release", [
    (None, True),                                   # gone: nothing owns the gang any more
    (_wf("Running", deleting=True), True),          # being deleted
    (_wf("Running", "Terminate"), True),            # TERMINATE in the Argo UI, argo terminate
    (_wf("Running", "Stop"), True),                 # STOP (the exit handler releases it too)
    (_wf("Failed"), True),
    (_wf("Error"), True),
    (_wf("Failed", "Terminate"), True),
    (_wf("Running"), False),                        # training, or retried after a failure
    (_wf("Pending"), False),
    (_wf(), False),                                 # just created: no status yet
    (_wf("Succeeded"), False),                      # its completed job holds no GPU; its pods keep their logs
    (_wf("Succeeded", "Stop"), False),
])
def test_a_gang_is_released_by_what_its_workflow_is_now(workflow, release):
    assert wants_release(workflow) is release
