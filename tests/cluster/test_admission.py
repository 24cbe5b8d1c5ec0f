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
import yaml

from pipectl.pipelines.admission import PARAMETER_RULES_CONFIGMAP, TEAM_LABEL
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


def _submitter_binding(name: str = "team-a-submits", kind: str = "Group", subject: str = SUBMITTER[1]) -> dict:
    """A RoleBinding of the ``pipectl-submitter`` Role to ``subject`` (team-a's group by default)."""
    return {"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pipectl-submitter"},
            "subjects": [{"kind": kind, "name": subject, "apiGroup": "rbac.authorization.k8s.io"}]}


def _past_rbac(test_cluster, who: str, write):
    """The ApiException ``write`` ends with once the API server's RBAC knows a RoleBinding just
    created: its authorizer's cache lags the write, so a 403 from RBAC itself (before admission)
    is tried again, up to 30 s. A write that is admitted fails the wait, naming ``who``."""
    from kubernetes import client

    def attempt():
        try:
            write()
        except client.ApiException as e:
            return None if e.status == 403 and "ValidatingAdmissionPolicy" not in e.body else e
        raise AssertionError(f"{who}: the write was admitted")

    return test_cluster.wait_for(f"{who}: an answer past RBAC", attempt, timeout_s=30)


@pytest.fixture(scope="module")
def submitter(test_cluster, k8s_api):
    """A CustomObjectsApi acting as a member of team-a, bound to ``pipectl-submitter``; waits until
    the submission policy refuses a workflow with its own templates (policies load asynchronously)."""
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(k8s_api)
    rbac.create_namespaced_role_binding(NS, _submitter_binding())
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
    (lambda s: s.update(podSpecPatch='{"containers":[{"name":"main","envFrom":[{"secretRef":{"name":"pipectl-mlflow-credentials"}}]}]}'),
     "podSpecPatch"),
    (lambda s: s.update(templates=[{"name": "x", "container": {"image": "busybox"}}]), "templates"),
    (lambda s: s.update(podPriorityClassName="pipectl-urgent"), "podPriorityClassName"),
    (lambda s: s.update(volumes=[{"name": "host", "hostPath": {"path": "/"}}]), "volumes"),
    (lambda s: s.update(securityContext={"runAsUser": 0}), "securityContext"),
    (lambda s: s.update(hostNetwork=True), "hostNetwork"),
    (lambda s: s.update(entrypoint="train-retry"), "entrypoint train-retry is not the template's"),
    (lambda s: s.update(workflowTemplateRef={"name": "training-v1", "clusterScope": True}), "WorkflowTemplate of its namespace"),
    (lambda s: s.update(priority=1000), "spec.priority must be the lane's"),
    (lambda s: s["arguments"]["parameters"].append({"name": "run-uri", "value": "s3://pipectl/runs/other"}), "undeclared arguments: run-uri"),
    (lambda s: s["arguments"]["parameters"].append({"name": "epochs", "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}),
     "a name and a value only"),
    (lambda s: s["arguments"].update(artifacts=[{"name": "a", "s3": {"key": "x"}}]), "may not pass artifacts"),
], ids=["other-service-account", "secret-via-podSpecPatch", "mlflow-user-via-podSpecPatch", "own-templates", "priority-class", "hostPath", "root",
        "host-network", "later-entrypoint", "cluster-template", "argo-priority", "undeclared-argument", "valueFrom", "artifacts"])
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
        "edit a WorkflowTemplate": lambda: client.CustomObjectsApi(api).patch_namespaced_custom_object(
            "argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1", {"spec": {"serviceAccountName": "pipectl-launcher"}}),
        "create a CronWorkflow": lambda: client.CustomObjectsApi(api).create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", NS, "cronworkflows", {"apiVersion": "argoproj.io/v1alpha1", "kind": "CronWorkflow",
                                                              "metadata": {"name": "mine"}, "spec": {}}, dry_run="All"),
        "read the store's Secret": lambda: client.CoreV1Api(api).read_namespaced_secret("pipectl-s3-credentials", NS),
        "create a pod": lambda: client.CoreV1Api(api).create_namespaced_pod(NS, _small_pod("p", "pipectl-standard"), dry_run="All"),
        "create a gang job": lambda: client.CustomObjectsApi(api).create_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", NS, "jobs", {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
                                                         "metadata": {"name": "j"}, "spec": {}}, dry_run="All"),
        "edit the config": lambda: client.CoreV1Api(api).patch_namespaced_config_map("pipectl-store", NS, {"data": {"x": "y"}}),
        "label its namespace": lambda: client.CoreV1Api(api).patch_namespace(NS, {"metadata": {"labels": {"lanes.pipectl.io/urgent": "true"}}}),
        "claim another team's queues": lambda: client.CoreV1Api(api).patch_namespace(NS, {"metadata": {"labels": {TEAM_LABEL: "other"}}}),
        "edit the parameter rules": lambda: client.CoreV1Api(api).patch_namespaced_config_map(
            PARAMETER_RULES_CONFIGMAP, NS, {"data": {"training-v1.run-uri.kind": "text"}}),
        "apply parameter rules": lambda: client.CoreV1Api(api).patch_namespaced_config_map(
            PARAMETER_RULES_CONFIGMAP, NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": PARAMETER_RULES_CONFIGMAP},
                                            "data": {"training-v1.run-uri.kind": "text"}},
            field_manager="alice", force=True, _content_type="application/apply-patch+yaml"),
        "delete the parameter rules": lambda: client.CoreV1Api(api).delete_namespaced_config_map(PARAMETER_RULES_CONFIGMAP, NS),
    }
    for what, attempt in attempts.items():
        with pytest.raises(client.ApiException) as e:
            attempt()
        assert e.value.status == 403, f"a submitter could {what}: {e.value.status} {e.value.body}"


def test_a_submitter_watches_suspends_stops_deletes_and_reads_what_a_run_needs(test_cluster, k8s_api, submitter):
    """What docs/security.md says a submitter can do besides submitting, as the submitter: list,
    get and watch workflows, suspend and resume one, stop it and delete it; read the namespace's
    templates, cron schedules, quotas, pods and events; and (the API server's own authorizer, as
    ``kubectl auth can-i``) read pod logs."""
    from kubernetes import client, watch

    api = _api(test_cluster, *SUBMITTER)
    core = client.CoreV1Api(api)
    wf = _legit(epochs="1")
    wf["spec"]["suspend"] = True
    name = submitter.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf)["metadata"]["name"]
    args = ("argoproj.io", "v1alpha1", NS, "workflows")
    try:
        assert name in {w["metadata"]["name"] for w in submitter.list_namespaced_custom_object(*args)["items"]}
        assert submitter.get_namespaced_custom_object(*args, name)["spec"]["suspend"] is True
        seen = [e["object"]["metadata"]["name"] for e in watch.Watch().stream(
            submitter.list_namespaced_custom_object, *args, field_selector=f"metadata.name={name}", timeout_seconds=2)]
        assert name in seen
        submitter.patch_namespaced_custom_object(*args, name, {"spec": {"suspend": None}})   # argo resume
        submitter.patch_namespaced_custom_object(*args, name, {"spec": {"suspend": True}})   # argo suspend
        submitter.patch_namespaced_custom_object(*args, name, {"spec": {"shutdown": "Stop"}})  # argo stop
        custom = client.CustomObjectsApi(api)
        assert custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1")
        custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "cronworkflows")
        assert core.list_namespaced_resource_quota(NS).items
        core.list_namespaced_pod(NS)
        core.list_namespaced_event(NS)
        review = {"spec": {"resourceAttributes": {"namespace": NS, "verb": "get", "resource": "pods", "subresource": "log"}}}
        assert client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed
    finally:
        submitter.delete_namespaced_custom_object(*args, name)

    def gone() -> bool:
        try:
            client.CustomObjectsApi(k8s_api).get_namespaced_custom_object(*args, name)
        except client.ApiException as e:
            return e.status == 404
        return False

    test_cluster.wait_for(f"workflow {name} deleted", gone)


def test_only_the_argo_controllers_own_identity_is_exempt(test_cluster, k8s_api, submitter):
    """The submission policy exempts ``system:serviceaccount:argo:argo`` (Argo's controller in Argo's
    install): given the same right to create workflows, it may create one with a ``podSpecPatch``;
    another ServiceAccount of Argo's namespace may not."""
    from kubernetes import client

    from pipectl.pipelines.admission import ARGO_CONTROLLER_SA

    rbac = client.RbacAuthorizationV1Api(k8s_api)
    others = "system:serviceaccount:argo:argo-server"
    rbac.create_namespaced_role(NS, {"metadata": {"name": "workflow-writer"}, "rules": [
        {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create"]}]})
    rbac.create_namespaced_role_binding(NS, {"metadata": {"name": "workflow-writer"},
                                             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "workflow-writer"},
                                             "subjects": [{"kind": "User", "name": u, "apiGroup": "rbac.authorization.k8s.io"}
                                                          for u in (ARGO_CONTROLLER_SA, others)]})
    wf = _legit()
    wf["spec"]["podSpecPatch"] = "{}"
    try:
        controller = client.CustomObjectsApi(_api(test_cluster, ARGO_CONTROLLER_SA, "system:serviceaccounts"))
        test_cluster.wait_for("the controller's right to create workflows", lambda: _submit(controller, wf) or True)
        assert "podSpecPatch" in _refusal(client.CustomObjectsApi(_api(test_cluster, others, "system:serviceaccounts")), wf)
    finally:
        rbac.delete_namespaced_role_binding("workflow-writer", NS)
        rbac.delete_namespaced_role("workflow-writer", NS)


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



def test_a_submitter_cannot_write_what_the_controller_runs_into_a_workflows_status(test_cluster, k8s_api, submitter):
    """The Workflow CRD has no status subresource: whoever may patch a workflow may patch its status.
    The controller runs ``status.storedWorkflowTemplateSpec`` once stored, and later steps take
    their inputs from ``status.nodes`` outputs (register takes evaluate's decision and digest
    there). A submitter may not create a workflow with a status, change the stored spec, forge a
    step's outputs or a Succeeded step; what a retry writes (a message, a step set to run again,
    the stored spec's shutdown) still passes."""
    from kubernetes import client

    admin = client.CustomObjectsApi(k8s_api)
    forged = {"templates": [{"name": "training", "container": {"image": "busybox", "command": ["sh", "-c", "id"]}}],
              "entrypoint": "training", "serviceAccountName": "pipectl-launcher"}
    with_status = _legit(epochs="1")
    with_status["status"] = {"storedWorkflowTemplateSpec": forged}
    assert "may not carry a status" in _refusal(submitter, with_status)

    wf = _legit(epochs="1")
    wf["spec"]["suspend"] = True
    name = submitter.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf)["metadata"]["name"]

    def status_patch(status: dict) -> None:
        submitter.patch_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name, {"status": status})

    def refused(status: dict) -> str:
        with pytest.raises(client.ApiException) as e:
            status_patch(status)
        assert e.value.status in (403, 422) and "pipectl-submission" in e.value.body, e.value.body
        return json.loads(e.value.body)["message"]

    try:
        stored = test_cluster.wait_for("the controller stores the template's spec", lambda: (admin.get_namespaced_custom_object(
            "argoproj.io", "v1alpha1", NS, "workflows", name).get("status") or {}).get("storedWorkflowTemplateSpec"))
        assert "storedWorkflowTemplateSpec" in refused({"storedWorkflowTemplateSpec": {"serviceAccountName": "pipectl-launcher"}})
        assert "storedWorkflowTemplateSpec" in refused({"storedWorkflowTemplateSpec": {"templates": forged["templates"]}})
        node = {"id": f"{name}-forged", "name": f"{name}.evaluate", "displayName": "evaluate", "type": "Pod",
                "templateName": "evaluate", "phase": "Succeeded",
                "outputs": {"parameters": [{"name": "decision", "value": "promote"}]}}
        assert "status.nodes" in refused({"nodes": {node["id"]: node}})
        assert "status.nodes" in refused({"nodes": {node["id"]: {**node, "outputs": None}}})
        status_patch({"message": "retried by hand"})  # what a retry writes passes
        status_patch({"storedWorkflowTemplateSpec": {"shutdown": ""}})
        after = admin.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)["status"]
        assert after["storedWorkflowTemplateSpec"]["templates"] == stored["templates"]
        assert node["id"] not in (after.get("nodes") or {})
    finally:
        admin.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)


def _submit_once_the_controller_has_the_template(test_cluster, submitter, admin, run: dict) -> str:
    """Submit ``run`` as ``submitter``; its name. The controller reads a run's WorkflowTemplate from
    its informer's cache, so a run created right after its template can end in Error
    ('workflowtemplates.argoproj.io "..." not found') before the cache has the template: that run
    is deleted and the submission made again."""
    args = ("argoproj.io", "v1alpha1", NS, "workflows")

    def attempt() -> str | None:
        name = submitter.create_namespaced_custom_object(*args, run)["metadata"]["name"]

        def phase() -> dict | None:
            status = admin.get_namespaced_custom_object(*args, name).get("status") or {}
            return status if status.get("phase") else None

        status = test_cluster.wait_for(f"the controller's first pass over {name}", phase)
        if status["phase"] == "Error" and "not found" in (status.get("message") or ""):
            admin.delete_namespaced_custom_object(*args, name)
            return None
        return name

    return test_cluster.wait_for("a run whose template the controller has", attempt)


def test_a_submitter_cannot_resume_a_suspend_step(test_cluster, k8s_api, submitter):
    """Resuming a ``suspend`` step (``argo resume``, the Argo UI's RESUME) marks its node Succeeded
    in the workflow's status: a submitter may not (the run stays suspended); an admin may. What a
    retry writes still passes: the step set to run again, or removed. The template with the step is
    the namespace owner's (here an admin's); the run is the submitter's."""
    from kubernetes import client

    admin = client.CustomObjectsApi(k8s_api)
    args = ("argoproj.io", "v1alpha1", NS, "workflows")
    template = {"apiVersion": "argoproj.io/v1alpha1", "kind": "WorkflowTemplate", "metadata": {"name": "approval-v1"},
                "spec": {"entrypoint": "approval", "templates": [{"name": "approval", "suspend": {}}]}}
    admin.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", template)
    name = None
    try:
        run = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"generateName": "approval-"},
               "spec": {"workflowTemplateRef": {"name": "approval-v1"}}}
        name = _submit_once_the_controller_has_the_template(test_cluster, submitter, admin, run)

        def suspended() -> dict | None:
            nodes = (admin.get_namespaced_custom_object(*args, name).get("status") or {}).get("nodes") or {}
            return next((n for n in nodes.values() if n.get("type") == "Suspend" and n.get("phase") == "Running"), None)

        try:
            node = test_cluster.wait_for("the suspend step waiting", suspended)
        except TimeoutError as e:
            status = admin.get_namespaced_custom_object(*args, name).get("status") or {}
            raise TimeoutError(f"{e}; the run: {status.get('phase')} {status.get('message')!r}, nodes {status.get('nodes')}") from e
        succeeded = {"phase": "Succeeded", "finishedAt": "2026-01-01T00:00:00Z"}
        with pytest.raises(client.ApiException) as e:
            submitter.patch_namespaced_custom_object(*args, name, {"status": {"nodes": {node["id"]: succeeded}}})
        assert e.value.status in (403, 422) and "status.nodes" in e.value.body, e.value.body
        assert suspended() is not None
        # what Argo's retry writes passes: a step set to run again, a step removed (the controller runs it again)
        submitter.patch_namespaced_custom_object(*args, name, {"status": {"nodes": {node["id"]: {"phase": "Running", "message": "again"}}}})
        submitter.patch_namespaced_custom_object(*args, name, {"status": {"nodes": {node["id"]: None}}})
        node = test_cluster.wait_for("the suspend step run again", suspended)
        admin.patch_namespaced_custom_object(*args, name, {"status": {"nodes": {node["id"]: succeeded}}})
        assert suspended() is None
    finally:
        if name:
            admin.delete_namespaced_custom_object(*args, name)
        admin.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "approval-v1")


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
        # the binding just created reaches the API server's RBAC cache a moment later
        test_cluster.wait_for("bob's right to create cron schedules", lambda: editor.create_namespaced_custom_object(
            "argoproj.io", "v1alpha1", NS, "cronworkflows", cron, dry_run="All") or True, timeout_s=30)
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
        implicit = _legit(model_name="team-a-resnet")  # the template's default name is not the team's: named explicitly
        implicit["spec"]["arguments"]["parameters"] = [p for p in implicit["spec"]["arguments"]["parameters"] if p["name"] != "model-name"]
        assert "model-name  is not this namespace's" in _refusal(submitter, implicit)
    finally:
        core.patch_namespace(NS, {"metadata": {"labels": {"pipectl.io/model-prefix": None}}})
    test_cluster.wait_for("no model prefix", lambda: accepted(_legit(model_name="team-b-resnet")) or None)


def test_only_a_platform_admin_sets_pipectls_labels_on_a_namespace(test_cluster, k8s_api):
    """``pipectl-namespaces``, as argo/ installs it: a user RBAC allows to create and label
    Namespaces (``dana``, a ClusterRole bound to her group) is refused by the API server, naming the
    key, when he creates a Namespace claiming a team (``pipectl.io/team``) or a preempting lane, or
    adds, changes or removes the team label, a lane grant, the model prefix, the submission policy
    or the data-prefix annotation of one, or the Pod Security labels of a namespace pipectl's policies
    hold; her other labels pass, and so does a write that leaves them as they were. ``system:masters`` sets them; with the site's ``admin_groups`` rendered in,
    so does a member of that group (``carol``), and dana still cannot."""
    from kubernetes import client

    from pipectl.pipelines.admission import DATA_PREFIX_ANNOTATION, MODEL_PREFIX_LABEL, SUBMISSION_LABEL, admission_policies

    rbac, core = client.RbacAuthorizationV1Api(k8s_api), client.CoreV1Api(k8s_api)
    role = {"metadata": {"name": "namespace-makers"},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["create", "get", "list", "patch", "update", "delete"]}]}
    binding = {"metadata": {"name": "namespace-makers"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "namespace-makers"},
               "subjects": [{"kind": "Group", "name": g, "apiGroup": "rbac.authorization.k8s.io"} for g in ("ns-makers", "platform-admins")]}
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    dana = client.CoreV1Api(_api(test_cluster, "dana", "ns-makers"))
    carol = client.CoreV1Api(_api(test_cluster, "carol", "platform-admins"))
    mine = "danas-namespace"

    def refusal(write) -> str | None:
        try:
            write()
        except client.ApiException as e:
            return f"{e.status} {json.loads(e.body)['message']}"
        return None

    def create(api, labels: dict, name: str = "claims-a-team"):
        return lambda: api.create_namespace({"metadata": {"name": name, "labels": labels}}, dry_run="All")

    def patch(api, labels: dict | None = None, annotations: dict | None = None):
        meta = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v is not None}
        return lambda: api.patch_namespace(mine, {"metadata": meta})

    installed = [d for d in admission_policies() if d["metadata"]["name"] == "pipectl-namespaces"]
    try:
        claim = create(dana, {TEAM_LABEL: "vision"})
        test_cluster.wait_for("the namespaces policy in force", lambda: "pipectl-namespaces" in (refusal(claim) or "") or None)
        why = refusal(claim)
        assert why.startswith("403 ") and "only a platform admin (group system:masters)" in why and TEAM_LABEL in why, why
        why = refusal(create(dana, {"lanes.pipectl.io/urgent": "true"}))
        assert why and "lanes.pipectl.io/urgent" in why, why
        assert refusal(create(dana, {"app": "mine"})) is None
        dana.create_namespace({"metadata": {"name": mine, "labels": {"app": "mine"}}})
        for labels, annotations, key in (({TEAM_LABEL: "vision"}, None, TEAM_LABEL),
                                         ({"lanes.pipectl.io/urgent": "true"}, None, "lanes.pipectl.io/urgent"),
                                         ({MODEL_PREFIX_LABEL: "vision"}, None, MODEL_PREFIX_LABEL),
                                         ({SUBMISSION_LABEL: "enforce"}, None, SUBMISSION_LABEL),
                                         (None, {DATA_PREFIX_ANNOTATION: "s3://pipectl/teams/vision/"}, DATA_PREFIX_ANNOTATION)):
            why = refusal(patch(dana, labels, annotations))
            assert why and why.startswith("403 ") and key in why and "pipectl-namespaces" in why, (key, why)
        assert refusal(patch(dana, {"app": "still-mine"})) is None
        assert refusal(patch(dana, {"pod-security.kubernetes.io/enforce": "baseline"})) is None  # not pipectl's namespace

        core.patch_namespace(mine, {"metadata": {"labels": {TEAM_LABEL: "vision", SUBMISSION_LABEL: "enforce"},
                                                 "annotations": {DATA_PREFIX_ANNOTATION: "s3://pipectl/teams/vision/"}}})
        assert refusal(patch(dana, {"app": "mine-again"})) is None  # pipectl's keys left as they were
        for labels, annotations, key in (({TEAM_LABEL: "speech"}, None, TEAM_LABEL), ({TEAM_LABEL: None}, None, TEAM_LABEL),
                                         ({SUBMISSION_LABEL: None}, None, SUBMISSION_LABEL),
                                         (None, {DATA_PREFIX_ANNOTATION: "s3://pipectl/"}, DATA_PREFIX_ANNOTATION),
                                         (None, {DATA_PREFIX_ANNOTATION: None}, DATA_PREFIX_ANNOTATION),
                                         # pipectl's policies hold it now: its Pod Security too
                                         ({"pod-security.kubernetes.io/enforce": "privileged"}, None, "pod-security.kubernetes.io/enforce"),
                                         ({"pod-security.kubernetes.io/enforce": None}, None, "pod-security.kubernetes.io/enforce")):
            why = refusal(patch(dana, labels, annotations))
            assert why and why.startswith("403 ") and key in why, (labels, annotations, why)
        assert dana.read_namespace(mine).metadata.labels[TEAM_LABEL] == "vision"

        assert "pipectl-namespaces" in (refusal(create(carol, {TEAM_LABEL: "vision"})) or "")  # not an admin yet
        site_admins = [d for d in admission_policies(admin_groups=("platform-admins",)) if d["metadata"]["name"] == "pipectl-namespaces"]
        test_cluster.apply(site_admins, field_manager="pipectl-tests")
        test_cluster.wait_for("the site's admin group in force", lambda: refusal(create(carol, {TEAM_LABEL: "vision"})) is None or None)
        assert refusal(patch(carol, {TEAM_LABEL: "speech"})) is None
        why = refusal(claim)
        assert why and "only a platform admin (group system:masters, platform-admins)" in why, why
    finally:
        test_cluster.apply(installed, field_manager="pipectl-tests")
        for delete in (lambda: core.delete_namespace(mine), lambda: rbac.delete_cluster_role_binding("namespace-makers"),
                       lambda: rbac.delete_cluster_role("namespace-makers")):
            try:
                delete()
            except client.ApiException as e:
                if e.status != 404:
                    raise


TEAMS = [{"name": "vision", "namespace": "team-vision", "groups": ["vision-ml"], "max_gpus": 8, "lane_gpus": {"urgent": 4},
          "model_prefix": "vision", "s3_prefix": "s3://pipectl/teams/vision/"},
         {"name": "speech", "namespace": "team-speech", "groups": ["speech-ml"], "max_gpus": 32,
          "model_prefix": "speech", "s3_prefix": "s3://pipectl/teams/speech/"}]


def test_two_teams_share_the_cluster_and_neither_reaches_the_other(test_cluster, k8s_api):
    """The site's two teams applied as argo/cluster/teams/ renders them: vision's submitter cannot
    submit into speech's namespace, nor train speech's models or read speech's data in its own;
    vision's quota does not limit speech; the urgent lane is vision's only."""
    from kubernetes import client

    from pipectl.pipelines.manifests import cluster_manifests
    from pipectl.pipelines.training import CompileConfig

    files = cluster_manifests(CompileConfig(teams=TEAMS))
    test_cluster.apply([d for t in TEAMS for d in files[f"cluster/teams/{t['name']}.yaml"]], field_manager="pipectl-tests")
    core = client.CoreV1Api(k8s_api)
    ann = client.CustomObjectsApi(_api(test_cluster, "ann", "vision-ml"))
    vision, speech = "team-vision", "team-speech"

    def wf(ns: str, **params: str) -> dict:
        from pipectl.components.contracts import TrainingParameters
        from pipectl.pipelines.workflows import workflow_for

        params = {"model_name": "vision-cnn", "dataset_uri": "s3://pipectl/teams/vision/digits/", **params}
        return workflow_for("training-v1", ns, TrainingParameters.model_validate(params))

    def refusal(ns: str, workflow: dict) -> str | None:
        try:
            ann.create_namespaced_custom_object("argoproj.io", "v1alpha1", ns, "workflows", workflow, dry_run="All")
        except client.ApiException as e:
            return f"{e.status} {json.loads(e.body)['message']}"
        return None

    try:
        outside = wf(vision, dataset_uri="s3://pipectl/teams/speech/digits/")
        test_cluster.wait_for("the team's data prefix in force", lambda: "data prefix" in (refusal(vision, outside) or "") or None)
        assert refusal(vision, wf(vision)) is None
        assert "is not under this namespace's data prefix s3://pipectl/teams/vision/" in refusal(vision, outside)
        implicit = wf(vision)  # the template's default dataset is not the team's: named explicitly
        implicit["spec"]["arguments"]["parameters"] = [p for p in implicit["spec"]["arguments"]["parameters"] if p["name"] != "dataset-uri"]
        assert "dataset-uri  is not under this namespace's data prefix" in (refusal(vision, implicit) or ""), refusal(vision, implicit)
        assert "model-name speech-cnn is not this namespace's" in refusal(vision, wf(vision, model_name="speech-cnn"))
        into_speech = refusal(speech, wf(speech, model_name="speech-cnn", dataset_uri="s3://pipectl/teams/speech/digits/"))
        assert into_speech.startswith("403 ") and 'User "ann" cannot create resource "workflows"' in into_speech, into_speech
        for ns in (vision, speech):
            test_cluster.wait_for("default ServiceAccount in " + ns, lambda: core.read_namespaced_service_account("default", ns))
        with pytest.raises(client.ApiException) as exceeded:  # vision's quota: 8 GPUs
            core.create_namespaced_pod(vision, _small_pod("big", "pipectl-batch", gpus=16), dry_run="All")
        assert exceeded.value.status == 403 and "exceeded quota: pipectl-namespace-gpus" in exceeded.value.body
        core.create_namespaced_pod(speech, _small_pod("big", "pipectl-batch", gpus=16), dry_run="All")  # not speech's
        with pytest.raises(client.ApiException) as urgent:  # vision's urgent lane quota: 4 GPUs
            core.create_namespaced_pod(vision, _small_pod("urgent", "pipectl-urgent", gpus=5), dry_run="All")
        assert "exceeded quota: pipectl-lane-urgent" in urgent.value.body
        core.create_namespaced_pod(vision, _small_pod("urgent", "pipectl-urgent", gpus=4), dry_run="All")
        with pytest.raises(client.ApiException) as not_granted:
            core.create_namespaced_pod(speech, _small_pod("urgent", "pipectl-urgent", gpus=1), dry_run="All")
        assert "lanes.pipectl.io/urgent=true" in not_granted.value.body
    finally:
        for ns in (vision, speech):
            core.delete_namespace(ns)


def test_the_api_server_refuses_a_gang_job_holding_a_value_validate_refuses(k8s_api):
    """The gang job as the training template renders it, with a value that bypassed ``validate``
    (an exempt identity, a retry with overridden parameters where no policy is installed): the job's
    parameters label holds a sentence naming the parameter, which the API server refuses (quoting
    it), so no gang job exists; with the canonical value the same job is admitted."""
    from kubernetes import client

    from pipectl.components.contracts import TrainingParameters
    from pipectl.pipelines.launchers import LAUNCHERS
    from pipectl.pipelines.substitution import substitute
    from pipectl.pipelines.training import CompileConfig

    def job(**over: str) -> dict:
        params = {**TrainingParameters().as_arguments(), "gang-affinity": "{}", "run-uri": "s3://pipectl/runs/typed/",
                  "shards-uri": "s3://pipectl/runs/typed/shards/", **over}
        values = {"workflow.name": "typed", **{f"inputs.parameters.{k}": v for k, v in params.items()}}
        return yaml.safe_load(substitute(LAUNCHERS["volcano"].manifest(CompileConfig().gang()), values, where="gang"))

    custom = client.CustomObjectsApi(k8s_api)
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job(workers="10"), dry_run="All")
    for name, value in (("workers", "010"), ("checkpoint-every-steps", "10000000"), ("gang-preflight", "True")):
        with pytest.raises(client.ApiException) as refused:
            custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job(**{name: value}), dry_run="All")
        message = json.loads(refused.value.body)["message"]
        assert refused.value.status == 422 and f"parameter {name}: {value} is refused" in message, message
    with pytest.raises(client.ApiException) as refused:  # validate's rule across two parameters
        custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                               job(**{"gpus-per-worker": "8", "processes-per-worker": "1"}), dry_run="All")
    message = json.loads(refused.value.body)["message"]
    assert refused.value.status == 422 and "parameter processes-per-worker: 1 is refused" in message, message


QUEUE_TEAMS = [{"name": "maps", "namespace": "team-maps", "groups": ["maps-ml"], "max_gpus": 8, "lane_gpus": {"urgent": 4},
                "model_prefix": "maps", "s3_prefix": "s3://pipectl/teams/maps/"},
               {"name": "radar", "namespace": "team-radar", "groups": ["radar-ml"], "max_gpus": 16,
                "model_prefix": "radar", "s3_prefix": "s3://pipectl/teams/radar/"}]


def test_a_teams_gangs_use_its_own_queues_only(test_cluster, k8s_api):
    """Each team's Volcano queues as argo/cluster/teams/ renders them (its GPU share per lane): in
    its own namespace a team's gang job is admitted to its own queue, and refused — naming its
    queues — in the other team's queue, in a lane's shared queue or with no queue; so is a PodGroup
    (what Volcano's and the training operator's controllers create for a gang). A team's queue of
    the urgent lane is the urgent lane's: refused where the lane is not granted. A namespace of no
    team may use no team's queue. Whoever creates them: the API server's ``pipectl-lanes``."""
    from kubernetes import client

    from pipectl.components.names import team_queue_name
    from pipectl.pipelines.manifests import cluster_manifests
    from pipectl.pipelines.training import CompileConfig

    files = cluster_manifests(CompileConfig(teams=QUEUE_TEAMS))
    test_cluster.apply([d for t in QUEUE_TEAMS for d in files[f"cluster/teams/{t['name']}.yaml"]], field_manager="pipectl-tests")
    core, custom = client.CoreV1Api(k8s_api), client.CustomObjectsApi(k8s_api)
    maps, radar = "team-maps", "team-radar"

    def job(queue: str | None) -> dict:
        spec = {"minAvailable": 1, "schedulerName": "volcano",
                "tasks": [{"name": "w", "replicas": 1, "template": _small_pod("w", "pipectl-standard")}]}
        return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "gang"},
                "spec": spec | ({"queue": queue} if queue else {})}

    def refusal(ns: str, obj: dict, plural: str = "jobs") -> str | None:
        group, version = obj["apiVersion"].split("/")
        try:
            custom.create_namespaced_custom_object(group, version, ns, plural, obj, dry_run="All")
        except client.ApiException as e:
            return f"{e.status} {json.loads(e.body)['message']}"
        return None

    own, theirs = team_queue_name("maps", "batch"), team_queue_name("radar", "batch")
    try:
        queues = {q["metadata"]["name"]: q["spec"] for q in custom.list_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues")["items"]}
        assert queues[team_queue_name("maps", "urgent")]["capability"] == {"nvidia.com/gpu": "4"}
        assert queues[team_queue_name("radar", "standard")]["capability"] == {"nvidia.com/gpu": "16"}
        test_cluster.wait_for("the team's queues in force", lambda: "belongs to team maps" in (refusal(maps, job(theirs)) or "") or None)
        test_cluster.wait_for("its own queue open", lambda: refusal(maps, job(own)) is None or None)
        assert refusal(radar, job(theirs)) is None
        for queue in (theirs, "pipectl-batch", None):
            why = refusal(maps, job(queue))
            assert why and why.startswith("403 ") and "belongs to team maps" in why and own in why, (queue, why)
        group = {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": "gang"},
                 "spec": {"minMember": 1, "queue": theirs}}
        assert "belongs to team maps" in (refusal(maps, group, "podgroups") or "")
        assert refusal(maps, {**group, "spec": {"minMember": 1, "queue": own}}, "podgroups") is None
        urgent = refusal(radar, job(team_queue_name("radar", "urgent")))  # radar is not granted the urgent lane
        assert urgent and "urgent lane" in urgent and "lanes.pipectl.io/urgent=true" in urgent, urgent
        outside = refusal(NS, job(own))
        assert outside and "is a team share" in outside and "belongs to no team" in outside, outside
        assert refusal(NS, job("pipectl-batch")) is None
    finally:
        for ns in (maps, radar):
            core.delete_namespace(ns)


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


# -- a pipeline's own parameters: per-template rules in the namespace's ConfigMap ------------------

OWN_PIPELINES = '''
from typing import Literal

from pydantic import Field

from pipectl.sdk import Parameters, Pipeline, evaluate, preprocess, register, stage, train


class ShapesParameters(Parameters):  # the image-classifier example's, and one of each other kind
    weight_decay: float = Field(0.0005, ge=0, le=0.1, description="L2 penalty of the SGD optimiser.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Share of each label's probability spread.")
    random_flips: bool = Field(True, description="Flip half of each batch horizontally.")
    warmup_steps: int = Field(10, ge=0, le=1000, description="Steps of linear warm-up.")
    optimiser: Literal["sgd", "adam w"] = Field("sgd", description="The optimiser.")
    run_note: str = Field("baseline", pattern="[a-z0-9-]+", max_length=16, description="A note on the run.")


class OtherParameters(Parameters):
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout before the classifier.")


STEPS = [stage(), preprocess(), train(), evaluate(), register()]
shapes = Pipeline("shapes-training", STEPS, parameters=ShapesParameters)
other = Pipeline("other-training", STEPS, parameters=OtherParameters)
'''


def _rules(k8s_api) -> dict:
    from kubernetes import client

    return client.CoreV1Api(k8s_api).read_namespaced_config_map(PARAMETER_RULES_CONFIGMAP, NS).data or {}


@pytest.fixture(scope="module")
def own_templates(test_cluster, k8s_api, submitter, tmp_path_factory):
    """``shapes-training-v1`` and ``other-training-v1`` applied with `pipectl templates apply` (their
    own parameters' keys in the namespace's ConfigMap); waits until the policy reads them."""
    from tests.cluster.test_control_plane import _pipectl

    path = tmp_path_factory.mktemp("own") / "pipelines.py"
    path.write_text(OWN_PIPELINES)
    for ref in ("shapes", "other"):
        r = _pipectl(test_cluster, "templates", "apply", f"{path}:{ref}")
        assert r.returncode == 0, r.stdout + r.stderr
    test_cluster.wait_for("the shapes template's rules in force",
                          lambda: _accepted(submitter, _own("shapes-training-v1", **{"weight-decay": "0.001"})) or None)
    yield path
    # the shared cluster's later tests find the namespace as they expect it (templates and keys gone)
    r = _pipectl(test_cluster, "templates", "delete", "shapes-training-v1", "other-training-v1")
    assert r.returncode == 0, r.stdout + r.stderr


def _own(template: str, **args: str) -> dict:
    from pipectl.components.contracts import TrainingParameters
    from pipectl.pipelines.workflows import workflow_for

    return _with_args(workflow_for(template, NS, TrainingParameters()), **args)


def _accepted(custom, wf: dict) -> bool:
    from kubernetes import client

    try:
        _submit(custom, wf)
        return True
    except client.ApiException:
        return False


def test_templates_apply_writes_each_templates_own_rules(k8s_api, own_templates):
    rules = _rules(k8s_api)
    assert rules["shapes-training-v1.weight-decay.kind"] == "decimal" and rules["shapes-training-v1.weight-decay.le"] == "0.1"
    assert rules["shapes-training-v1.random-flips.kind"] == "boolean"
    assert rules["other-training-v1.dropout.kind"] == "decimal"
    assert not [k for k in rules if k.startswith("training-v1.")]  # pipectl's own parameters stay in the policy


def test_a_templates_own_parameters_are_admitted_by_its_rules(test_cluster, submitter, own_templates):
    _submit(submitter, _own("shapes-training-v1", **{"weight-decay": "0.001", "label-smoothing": "0.5", "random-flips": "false",
                                                      "warmup-steps": "1000", "optimiser": "adam w", "run-note": "try-2"}))
    _submit(submitter, _own("shapes-training-v1", **{"weight-decay": "0", "warmup-steps": "0", "optimiser": "sgd"}))
    _submit(submitter, _own("other-training-v1", dropout="0.25", epochs="3"))
    import yaml

    from tests.cluster.test_control_plane import _pipectl

    # what `pipectl submit` sends for the pipeline: every argument, the template's defaults included
    r = _pipectl(test_cluster, "submit", f"{own_templates}:shapes", "-p", "weight-decay=0.001", "--dry-run")
    assert r.returncode == 0, r.stderr
    wf = yaml.safe_load(r.stdout)
    assert {"weight-decay", "run-note", "optimiser"} <= {p["name"] for p in wf["spec"]["arguments"]["parameters"]}
    _submit(submitter, wf)


@pytest.mark.parametrize("name, value", [
    ("weight-decay", "1e-3"), ("weight-decay", "0.5"), ("weight-decay", "-0.001"), ("weight-decay", ".5"),
    ("label-smoothing", "1"), ("random-flips", "yes"), ("random-flips", "True"),
    ("warmup-steps", "1001"), ("warmup-steps", "010"), ("warmup-steps", "99999999999999999999"), ("warmup-steps", "1.0"),
    ("optimiser", "adam"), ("optimiser", "adam wx"), ("optimiser", "sgd|adam w"),
    ("run-note", "Try"), ("run-note", "a-b'c"), ("run-note", 'a"b'), ("run-note", "a\\b"), ("run-note", "x" * 17),
    ("run-note", "{{workflow.name}}"),
])
def test_a_templates_own_parameters_are_held_to_its_rules(submitter, own_templates, name, value):
    assert f"arguments refused: {name}" in _refusal(submitter, _own("shapes-training-v1", **{name: value}))


def test_an_argument_only_another_template_declares_is_refused(submitter, own_templates):
    message = _refusal(submitter, _own("shapes-training-v1", dropout="0.2"))
    assert "undeclared arguments: dropout" in message and PARAMETER_RULES_CONFIGMAP in message, message
    assert "undeclared arguments: weight-decay" in _refusal(submitter, _own("other-training-v1", **{"weight-decay": "0.001"}))
    assert "undeclared arguments: weight-decay" in _refusal(submitter, _with_args(_legit(), **{"weight-decay": "0.001"}))


def test_reapplying_or_deleting_a_template_changes_only_its_own_keys(test_cluster, k8s_api, submitter, own_templates):
    """Each template's keys are its own field manager's: a re-apply without a parameter removes
    that parameter's keys, a delete removes the template's, another template's keys stay."""
    from tests.cluster.test_control_plane import _pipectl

    path = own_templates.parent / "scratch.py"
    path.write_text(OWN_PIPELINES + "\nscratch = Pipeline('scratch-training', STEPS, parameters=ShapesParameters)\n")
    assert _pipectl(test_cluster, "templates", "apply", f"{path}:scratch").returncode == 0
    assert "scratch-training-v1.random-flips.kind" in _rules(k8s_api)
    path.write_text(OWN_PIPELINES.replace("    random_flips: bool", "    # random_flips: bool")
                    + "\nscratch = Pipeline('scratch-training', STEPS, parameters=ShapesParameters)\n")
    r = _pipectl(test_cluster, "templates", "apply", f"{path}:scratch")
    assert r.returncode == 0, r.stderr
    rules = _rules(k8s_api)
    assert "scratch-training-v1.random-flips.kind" not in rules and "scratch-training-v1.weight-decay.kind" in rules
    assert "shapes-training-v1.random-flips.kind" in rules
    r = _pipectl(test_cluster, "templates", "delete", "scratch-training-v1")
    assert r.returncode == 0, r.stderr
    rules = _rules(k8s_api)
    assert not [k for k in rules if k.startswith("scratch-training-v1.")]
    assert "shapes-training-v1.weight-decay.kind" in rules and "other-training-v1.dropout.kind" in rules


def test_a_namespace_without_the_rules_configmap_refuses_submissions(test_cluster, k8s_api):
    """The binding looks the ConfigMap up in the submitted object's own namespace and denies when
    it is missing; creating it (empty: pipectl's own parameters only) lets submissions in."""
    from kubernetes import client

    from pipectl.pipelines.admission import SUBMISSION_LABEL, parameter_rules_configmap, submitter_role
    from tests.cluster.test_control_plane import _pipectl

    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    other = "no-parameter-rules"
    core.create_namespace({"metadata": {"name": other, "labels": {SUBMISSION_LABEL: "enforce"}}})
    try:
        rbac.create_namespaced_role(other, submitter_role(other))
        rbac.create_namespaced_role_binding(other, _submitter_binding())
        custom = client.CustomObjectsApi(_api(test_cluster, *SUBMITTER))
        wf = _legit()
        wf["metadata"]["namespace"] = other

        def refusal() -> str | None:
            try:
                custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", other, "workflows", wf, dry_run="All")
            except client.ApiException as e:
                return json.loads(e.body)["message"] if e.status in (403, 422) and "pipectl-submission" in e.body else None
            return None

        message = test_cluster.wait_for("the submission policy in force in " + other, refusal)
        print("refusal without the ConfigMap:", message)
        assert "no params found" in message, message
        # the binding's lookup comes before the policy's match conditions: the exempt identities are
        # refused too (the break-glass group, the Argo controller's account), CronWorkflows as well
        from pipectl.pipelines.admission import ARGO_CONTROLLER_SA
        from pipectl.pipelines.manifests import retrain_cron
        from pipectl.pipelines.training import CompileConfig

        rbac.create_namespaced_role_binding(other, _submitter_binding("controller-submits", "User", ARGO_CONTROLLER_SA))
        cron = retrain_cron(CompileConfig()).to_dict()
        cron["metadata"]["namespace"] = other
        writes = {"system:masters, a workflow": lambda: client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
                      "argoproj.io", "v1alpha1", other, "workflows", wf, dry_run="All"),
                  "system:masters, a cron schedule": lambda: client.CustomObjectsApi(k8s_api).create_namespaced_custom_object(
                      "argoproj.io", "v1alpha1", other, "cronworkflows", cron, dry_run="All"),
                  "the Argo controller": lambda: client.CustomObjectsApi(_api(test_cluster, ARGO_CONTROLLER_SA, "system:serviceaccounts"))
                      .create_namespaced_custom_object("argoproj.io", "v1alpha1", other, "workflows", wf, dry_run="All")}
        for who, write in writes.items():
            e = _past_rbac(test_cluster, who, write)
            assert e.status in (403, 422) and "no params found" in e.body, (who, e.status, e.body)
        r = _pipectl(test_cluster, "submit", "training", "-n", other)  # the CLI names the fix
        assert r.returncode == 2 and PARAMETER_RULES_CONFIGMAP in r.stderr and "pipectl templates apply" in r.stderr, r.stderr
        core.create_namespaced_config_map(other, parameter_rules_configmap(other))
        test_cluster.wait_for("admitted once the ConfigMap exists", lambda: refusal() is None or None)
    finally:
        core.delete_namespace(other)


def test_the_submission_policy_holds_the_namespaces_labelled_for_it(test_cluster, k8s_api):
    """The policy applies where the namespace carries ``pipectl.io/submission-policy=enforce``
    (pipectl's and each team's do; only a platform admin sets it: ``pipectl-namespaces``): in a
    namespace without the label, a user the Role lets submit is not held to it; once the admin
    labels it, the same workflow is refused."""
    from kubernetes import client

    from pipectl.pipelines.admission import SUBMISSION_LABEL, parameter_rules_configmap, submitter_role

    core, rbac = client.CoreV1Api(k8s_api), client.RbacAuthorizationV1Api(k8s_api)
    other = "not-labelled-for-the-policy"
    core.create_namespace({"metadata": {"name": other}})
    try:
        rbac.create_namespaced_role(other, submitter_role(other))
        rbac.create_namespaced_role_binding(other, _submitter_binding())
        core.create_namespaced_config_map(other, parameter_rules_configmap(other))
        custom = client.CustomObjectsApi(_api(test_cluster, *SUBMITTER))
        wf = _legit()
        wf["metadata"]["namespace"] = other
        wf["spec"]["podSpecPatch"] = "{}"

        def refusal() -> str | None:
            try:
                custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", other, "workflows", wf, dry_run="All")
            except client.ApiException as e:
                return f"{e.status} {json.loads(e.body)['message']}"
            return None

        assert test_cluster.wait_for("the submitter's Role bound", lambda: refusal() is None or None)
        core.patch_namespace(other, {"metadata": {"labels": {SUBMISSION_LABEL: "enforce"}}})
        why = test_cluster.wait_for("the submission policy in force once labelled", refusal)
        assert "pipectl-submission" in why and "podSpecPatch" in why, why
    finally:
        core.delete_namespace(other)


def test_a_namespace_holds_its_gpu_share_and_no_pod_of_it_is_best_effort(k8s_api):
    """Beside other teams: all pods of the namespace together, every lane, request at most its GPU
    quota; a container that requests nothing gets the steps' requests (no BestEffort pod)."""
    from kubernetes import client

    from pipectl.pipelines.manifests import cpu_quantity, memory_quantity
    from pipectl.pipelines.training import CompileConfig

    core = client.CoreV1Api(k8s_api)
    cfg = CompileConfig()
    hard = core.read_namespaced_resource_quota("pipectl-namespace-gpus", NS).spec.hard
    assert hard == {"requests.nvidia.com/gpu": str(cfg.namespace_max_gpus)}
    with pytest.raises(client.ApiException) as exceeded:
        core.create_namespaced_pod(NS, _small_pod("too-many", "pipectl-batch", gpus=cfg.namespace_max_gpus + 1), dry_run="All")
    assert exceeded.value.status == 403 and "exceeded quota: pipectl-namespace-gpus" in exceeded.value.body
    bare = _small_pod("bare", "pipectl-batch")
    del bare["spec"]["containers"][0]["resources"]
    created = core.create_namespaced_pod(NS, bare, dry_run="All")
    assert created.spec.containers[0].resources.requests == {"cpu": "250m", "memory": "1Gi"} == {
        "cpu": cpu_quantity(cfg.step_cpu), "memory": memory_quantity(cfg.step_memory_gib)}
    assert not created.spec.containers[0].resources.limits  # no default limit: steps may burst
    assert created.status.qos_class == "Burstable"


def test_submit_refuses_a_gang_the_namespaces_quotas_can_never_admit_and_sends_nothing(test_cluster, k8s_api, submitter):
    """Within the namespace's GPU quota (64) or beyond it; in a preempting lane beyond its own quota
    (16 GPUs): exit 2 with the numbers, no workflow created. A submitter may read the quotas."""
    from kubernetes import client

    from tests.cluster.test_control_plane import _pipectl

    custom = client.CustomObjectsApi(k8s_api)

    def workflows() -> set[str]:
        return {w["metadata"]["name"] for w in custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows")["items"]}

    before = workflows()
    for args, words in ((["-p", "workers=9", "-p", "gpus-per-worker=8", "-p", "processes-per-worker=8"], "needs 72 GPUs at once (9 workers x 8 GPUs); "
                         "ResourceQuota pipectl-namespace-gpus of namespace pipectl allows 64 (site setting namespace_max_gpus)"),
                        (["--lane", "urgent", "-p", "workers=3", "-p", "gpus-per-worker=8", "-p", "processes-per-worker=8"],
                         "ResourceQuota pipectl-preempting-lanes of namespace pipectl allows 16 for lane urgent "
                         "(site setting preempting_max_gpus, preempting_max_pods)")):
        r = _pipectl(test_cluster, "submit", "training", *args)
        said = " ".join(r.stderr.split())  # as one line, however the terminal wrapped it
        assert r.returncode == 2 and words in said and "the site setting named above" in said, (r.returncode, r.stderr)
    assert workflows() == before
    assert client.CoreV1Api(_api(test_cluster, *SUBMITTER)).list_namespaced_resource_quota(NS).items


def test_a_gang_job_beyond_the_quota_says_why_it_has_no_pods(test_cluster, k8s_api, monkeypatch):
    """The same gang sent another way (the Argo UI, the API): the pods beyond the quota are never
    created, so there is no pod event to ask why; `pipectl status` reads the gang job's warnings."""
    from kubernetes import client

    from pipectl.pipelines.backends.kube import ArgoCluster
    from tests.cluster.test_control_plane import _lane_gang

    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    custom = client.CustomObjectsApi(k8s_api)
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", _lane_gang("over-quota-train", "batch", 9, 8, "1h"))
    try:
        monkeypatch.setenv("KUBECONFIG", str(test_cluster.kubeconfig))
        cluster = ArgoCluster(NS)
        why = test_cluster.wait_for("the job controller's warning", lambda: [
            w for w in cluster.gang_creation_failures("over-quota") if "exceeded quota: pipectl-namespace-gpus" in w], timeout_s=90)
        assert why[0].startswith("gang job over-quota-train: "), why
    finally:
        custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", "over-quota-train")
