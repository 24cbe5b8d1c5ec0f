"""The trust boundary on the real API server: argo/cluster/admission/policies.yaml (two
ValidatingAdmissionPolicies) and the ``pipectl-submitter`` Role, applied as a user applies argo/.

A submitter is an impersonated identity (user ``alice``, group ``team-a``) bound to
``pipectl-submitter`` in the ``pipectl`` namespace. Workflows are created with a server-side dry
run (admission runs in full, nothing is stored, nothing runs) except the retry case, which needs a
workflow to change.
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from tests.cluster.test_control_plane import _small_pod, project_applied, training_outputs_supplied  # noqa: F401 - fixtures

NS = "pipectl"
SUBMITTER = ("alice", "team-a")
pytestmark = pytest.mark.usefixtures("project_applied")


def _api(test_cluster, user: str | None = None, group: str | None = None):
    from kubernetes import client

    api = test_cluster.api_client()
    if user:
        api.set_default_header("Impersonate-User", user)
        api.set_default_header("Impersonate-Group", group)
    return api


@pytest.fixture(scope="module")
def submitter(test_cluster, k8s_api):
    """A CustomObjectsApi acting as a member of team-a, bound to ``pipectl-submitter``; waits until
    the submission policy refuses a workflow with its own templates (policies load asynchronously)."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(k8s_api)
    binding = {"metadata": {"name": "team-a-submits"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pipectl-submitter"},
               "subjects": [{"kind": "Group", "name": SUBMITTER[1], "apiGroup": "rbac.authorization.k8s.io"}]}
    rbac.create_namespaced_role_binding(NS, binding)
    custom = client.CustomObjectsApi(_api(test_cluster, *SUBMITTER))
    own = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"generateName": "own-"},
           "spec": {"entrypoint": "main", "templates": [{"name": "main", "container": {"image": "busybox", "command": ["true"]}}]}}

    def refused() -> bool:
        try:
            custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", own, dry_run="All")
        except client.ApiException as e:
            return e.status in (403, 422) and "pipectl-submission" in e.body
        return False

    test_cluster.wait_for("the submission policy in force", lambda: refused() or None)
    yield custom
    rbac.delete_namespaced_role_binding("team-a-submits", NS)


def _legit(**params: str) -> dict:
    from pipectl.components.contracts import TrainingParameters
    from pipectl.pipelines.workflows import workflow_for

    return workflow_for("training-v1", NS, TrainingParameters.model_validate(params))


def _submit(custom, wf: dict) -> None:
    custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf, dry_run="All")


def _refusal(custom, wf: dict) -> str:
    """The API server's message refusing ``wf`` (fails when it is accepted)."""
    from kubernetes import client

    with pytest.raises(client.ApiException) as e:
        _submit(custom, wf)
    assert e.value.status in (403, 422), e.value.body
    message = json.loads(e.value.body)["message"]
    assert "pipectl-submission" in message, message
    return message


def _with_args(wf: dict, **args: str) -> dict:
    wf = copy.deepcopy(wf)
    params = wf["spec"]["arguments"]["parameters"]
    for name, value in args.items():
        found = [p for p in params if p["name"] == name]
        if found:
            found[0]["value"] = value
        else:
            params.append({"name": name, "value": value})
    return wf


def test_a_submitter_submits_as_the_cli_the_argo_ui_and_a_cron_do(submitter):
    from pipectl.pipelines.manifests import retrain_cron
    from pipectl.pipelines.training import CompileConfig
    from pipectl.pipelines.workflows import cron_trigger_workflow

    _submit(submitter, _legit())                                     # pipectl submit
    _submit(submitter, _legit(lane="urgent", workers="2", epochs="3", learning_rate="0.01"))
    ui = _legit()
    ui["spec"]["entrypoint"] = "training"                              # the Argo UI's SUBMIT sends the entrypoint
    ui["metadata"]["labels"]["submit-from-ui"] = "true"
    _submit(submitter, ui)
    _submit(submitter, cron_trigger_workflow(retrain_cron(CompileConfig()).to_dict()))  # pipectl cron trigger


@pytest.mark.parametrize("change, words", [
    (lambda s: s.update(serviceAccountName="pipectl-launcher"), "serviceAccountName"),
    (lambda s: s.update(podSpecPatch='{"containers":[{"name":"main","envFrom":[{"secretRef":{"name":"pipectl-s3-credentials"}}]}]}'),
     "podSpecPatch"),
    (lambda s: s.update(templates=[{"name": "x", "container": {"image": "busybox"}}]), "templates"),
    (lambda s: s.update(podPriorityClassName="pipectl-urgent"), "podPriorityClassName"),
    (lambda s: s.update(volumes=[{"name": "host", "hostPath": {"path": "/"}}]), "volumes"),
    (lambda s: s.update(securityContext={"runAsUser": 0}), "securityContext"),
    (lambda s: s.update(entrypoint="train-retry"), "entrypoint train-retry is not the template's"),
    (lambda s: s.update(workflowTemplateRef={"name": "training-v1", "clusterScope": True}), "WorkflowTemplate of its namespace"),
    (lambda s: s.update(priority=1000), "spec.priority must be the lane's"),
    (lambda s: s["arguments"]["parameters"].append({"name": "run-uri", "value": "s3://pipectl/runs/other"}), "undeclared arguments: run-uri"),
    (lambda s: s["arguments"]["parameters"].append({"name": "epochs", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}),
     "a name and a value only"),
    (lambda s: s["arguments"].update(artifacts=[{"name": "a", "s3": {"key": "x"}}]), "may not pass artifacts"),
], ids=["other-service-account", "secret-via-podSpecPatch", "own-templates", "priority-class", "hostPath", "root",
        "later-entrypoint", "cluster-template", "argo-priority", "undeclared-argument", "valueFrom", "artifacts"])
def test_a_submitter_cannot_change_what_the_template_runs(submitter, change, words):
    wf = _legit()
    change(wf["spec"])
    assert words in _refusal(submitter, wf)


@pytest.mark.parametrize("name, value", [
    ("workers", "010"), ("warm-cache", "True"), ("epochs", "1_0"), ("memory-gib-per-worker", "+4"), ("cpu-per-worker", "1e1"),
    ("seed", "-0"), ("learning-rate", "5e-324"), ("checkpoint-every-steps", "99999999999999999999"), ("epochs", "0"),
    ("dataset-uri", "s3://pipectl/{{workflow.parameters.run-uri}}"), ("model-name", "other\nteam"), ("lane", "vip"),
    ("dataset-uri", " s3://pipectl/x"), ("dataset-uri", "s3://x\u2028y"),
])
def test_every_value_is_held_to_the_spelling_validate_accepts(submitter, name, value):
    assert f"arguments refused: {name}" in _refusal(submitter, _with_args(_legit(), **{name: value}))


def test_a_submitter_holds_no_rights_beyond_submitting(test_cluster, submitter):
    from kubernetes import client

    api = _api(test_cluster, *SUBMITTER)
    template = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate", "metadata": {"name": "mine"},
                "spec": {"entrypoint": "training", "templates": [{"name": "training", "container": {"image": "busybox"}}]}}
    attempts = {
        "create a WorkflowTemplate": lambda: client.CustomObjectsApi(api).create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", NS, "workflowtemplates", template, dry_run="All"),
        "read the store's Secret": lambda: client.CoreV1Api(api).read_namespaced_secret("pipectl-s3-credentials", NS),
        "create a pod": lambda: client.CoreV1Api(api).create_namespaced_pod(NS, _small_pod("p", "pipectl-standard"), dry_run="All"),
        "create a gang job": lambda: client.CustomObjectsApi(api).create_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", NS, "jobs", {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                                         "metadata": {"name": "j"}, "spec": {}}, dry_run="All"),
        "edit the config": lambda: client.CoreV1Api(api).patch_namespaced_config_map("pipectl-store", NS, {"data": {"x": "y"}}),
        "label its namespace": lambda: client.CoreV1Api(api).patch_namespace(NS, {"metadata": {"labels": {"lanes.pipectl.io/urgent": "true"}}}),
    }
    for what, attempt in attempts.items():
        with pytest.raises(client.ApiException) as e:
            attempt()
        assert e.value.status == 403, f"a submitter could {what}: {e.value.status} {e.value.body}"


def test_a_retry_with_overridden_values_is_held_to_the_same_rules(test_cluster, k8s_api, submitter):
    """A workflow held before its first step (``suspend``); the submitter changes its arguments as
    Argo's retry with "Override Parameters" does: a bad value is refused, a good one and a stop pass."""
    from kubernetes import client

    admin = client.CustomObjectsApi(k8s_api)
    wf = _legit(epochs="1")
    wf["spec"]["suspend"] = True
    name = submitter.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf)["metadata"]["name"]
    try:
        def patch(spec: dict) -> None:
            submitter.patch_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name, {"spec": spec})

        current = admin.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        bad = _with_args(current, workers="010")["spec"]["arguments"]
        with pytest.raises(client.ApiException) as e:
            patch({"arguments": bad})
        assert e.value.status in (403, 422) and "arguments refused: workers" in e.value.body, e.value.body
        with pytest.raises(client.ApiException) as e:
            patch({"podSpecPatch": "{}"})
        assert "podSpecPatch" in e.value.body
        patch({"arguments": _with_args(current, workers="2")["spec"]["arguments"]})
        patch({"shutdown": "Terminate"})
        after = admin.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        assert {p["name"]: p.get("value") for p in after["spec"]["arguments"]["parameters"]}["workers"] == "2"
    finally:
        admin.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)


def test_a_cron_schedule_is_held_to_the_same_rules(test_cluster, k8s_api, submitter):
    """Whoever may write CronWorkflows (here a namespace editor) cannot schedule a run of their own
    templates: the controller would start it as its own identity."""
    from kubernetes import client

    from pipectl.pipelines.manifests import retrain_cron
    from pipectl.pipelines.training import CompileConfig

    rbac = client.RbacAuthorizationV1Api(k8s_api)
    rbac.create_namespaced_role(NS, {"metadata": {"name": "cron-editor"}, "rules": [
        {"apiGroups": ["argoproj.io"], "resources": ["cronworkflows"], "verbs": ["create"]}]})
    rbac.create_namespaced_role_binding(NS, {"metadata": {"name": "cron-editor"},
                                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cron-editor"},
                                             "subjects": [{"kind": "User", "name": "bob", "apiGroup": "rbac.authorization.k8s.io"}]})
    try:
        editor = client.CustomObjectsApi(_api(test_cluster, "bob", "team-a-owners"))
        cron = retrain_cron(CompileConfig()).to_dict()
        cron["metadata"]["name"] = "retrain-b"
        editor.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "cronworkflows", cron, dry_run="All")
        cron["spec"]["workflowSpec"]["podSpecPatch"] = "{}"
        with pytest.raises(client.ApiException) as e:
            editor.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "cronworkflows", cron, dry_run="All")
        assert "podSpecPatch" in e.value.body, e.value.body
    finally:
        rbac.delete_namespaced_role_binding("cron-editor", NS)
        rbac.delete_namespaced_role("cron-editor", NS)


def test_only_namespaces_granted_a_preempting_lane_may_use_it(test_cluster, k8s_api, submitter):
    """``pipectl-lanes``: an urgent pod, or a Volcano job in the urgent queue, is refused in a
    namespace the admin did not label ``lanes.pipectl.io/urgent=true`` — whoever creates it;
    other lanes are open; in pipectl's namespace the quota still caps the lane."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    custom = client.CustomObjectsApi(k8s_api)
    other = "no-urgent-lane"
    core.create_namespace({"metadata": {"name": other}})
    test_cluster.wait_for("default ServiceAccount in " + other, lambda: core.read_namespaced_service_account("default", other))
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "urgent-gang"},
           "spec": {"queue": "pipectl-urgent", "minAvailable": 1, "schedulerName": "volcano",
                    "tasks": [{"name": "w", "replicas": 1, "template": _small_pod("w", "pipectl-standard")}]}}
    try:
        for create in (lambda: core.create_namespaced_pod(other, _small_pod("urgent", "pipectl-urgent"), dry_run="All"),
                       lambda: custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", other, "jobs", job, dry_run="All")):
            with pytest.raises(client.ApiException) as refused:
                create()
            assert refused.value.status == 403 and "urgent lane" in refused.value.body and "lanes.pipectl.io/urgent=true" in refused.value.body
        core.create_namespaced_pod(other, _small_pod("standard", "pipectl-standard"), dry_run="All")

        core.create_namespaced_pod(NS, _small_pod("urgent-ok", "pipectl-urgent"), dry_run="All")
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job, dry_run="All")
        gpus = int(core.read_namespaced_resource_quota("pipectl-preempting-lanes", NS).spec.hard["requests.nvidia.com/gpu"])
        with pytest.raises(client.ApiException) as exceeded:
            core.create_namespaced_pod(NS, _small_pod("too-many-gpus", "pipectl-urgent", gpus=gpus + 1), dry_run="All")
        assert exceeded.value.status == 403 and "exceeded quota: pipectl-preempting-lanes" in exceeded.value.body
    finally:
        core.delete_namespace(other)


def test_the_break_glass_group_is_not_held(k8s_api, submitter):
    """A cluster admin (system:masters) may still create any workflow (what the policy exempts)."""
    from kubernetes import client

    wf = _legit()
    wf["spec"]["podSpecPatch"] = "{}"
    client.CustomObjectsApi(k8s_api).create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf, dry_run="All")


def test_a_namespace_with_a_model_prefix_trains_only_its_own_models(test_cluster, k8s_api, submitter):
    """Teams sharing one MLflow registry: with ``pipectl.io/model-prefix=team-a`` on the namespace,
    a run may only name (and so promote) ``team-a-...`` models."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    def accepted(wf: dict) -> bool:
        try:
            _submit(submitter, wf)
            return True
        except client.ApiException:
            return False

    core.patch_namespace(NS, {"metadata": {"labels": {"pipectl.io/model-prefix": "team-a"}}})
    try:  # the API server reads namespace labels from its cache: a moment after the patch
        test_cluster.wait_for("the model prefix in force", lambda: not accepted(_legit(model_name="digits-cnn")) or None)
        _submit(submitter, _legit(model_name="team-a-resnet"))
        for other in ("digits-cnn", "team-b-resnet", "team-ab"):
            assert f"model-name {other} is not this namespace's" in _refusal(submitter, _legit(model_name=other))
    finally:
        core.patch_namespace(NS, {"metadata": {"labels": {"pipectl.io/model-prefix": None}}})
    test_cluster.wait_for("no model prefix", lambda: accepted(_legit(model_name="team-b-resnet")) or None)


def test_step_code_holds_no_kubernetes_token(test_cluster, k8s_api, training_outputs_supplied):
    """Every pod of a run, as the real controller builds it: the steps' own containers mount no
    service-account token (only Argo's executor containers do, the executor account's); the one
    exception is the exit handler that deletes the gang jobs."""
    from kubernetes import client

    from tests.cluster.test_control_plane import _last_json, _pipectl

    r = _pipectl(test_cluster, "submit", "training", "-p", "workers=1", "-p", "gpus-per-worker=1", "-p", "processes-per-worker=1",
                 "--wait", "--output", "json")
    assert r.returncode == 0, r.stdout + r.stderr
    name = _last_json(r.stdout)["name"]
    token_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    pods = client.CoreV1Api(k8s_api).list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
    steps = {p.metadata.annotations.get("workflows.argoproj.io/node-name", p.metadata.name).split(".")[-1].split("(")[0]: p for p in pods}
    assert {"validate", "stage", "preprocess", "train", "evaluate", "register"} <= set(steps), sorted(steps)
    for step, pod in steps.items():
        volumes = {v.name: v for v in pod.spec.volumes or []}
        for c in pod.spec.containers + (pod.spec.init_containers or []):
            mounts = [m for m in c.volume_mounts or [] if m.mount_path == token_path]
            if c.name in ("init", "wait") or (step == "train" and c.name == "main"):  # argoexec
                assert mounts and volumes[mounts[0].name].secret is not None, (step, c.name, mounts)
                assert volumes[mounts[0].name].secret.secret_name.endswith(".service-account-token")
            elif step == "onExit" or "gang-release" in step:
                continue
            else:
                assert not mounts and pod.spec.automount_service_account_token is False, (step, c.name, mounts)
