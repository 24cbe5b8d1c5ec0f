"""The Argo UI, used as people use it: a headless Chromium (Debian's `chromium`, driven by
Playwright through its executable path: Playwright never downloads a browser) against the test
cluster's `argo server`, which serves the real UI built from the argo-workflows module's `ui/`
(tests/cluster/build.sh). Same session cluster as test_control_plane.py (KWOK nodes, the real
controller, Volcano): pods do not run, so logs and the MLflow run itself are checked on real pods
(test_real_pods.py); here the MLflow link is followed and its target URL checked.

Each stage is saved as a screenshot under ``$PIPECTL_TEST_LOGS/ui`` (default
``.pipectl/test-logs/ui``; tests/cluster/browser.py)."""

from __future__ import annotations

import json
import re
import time
import urllib.parse

import pytest

from pipectl.components.names import WORKFLOW_LABEL
from pipectl.pipelines.manifests import MLFLOW_URI
from tests.cluster.browser import UI, launch_chromium
from tests.cluster.test_control_plane import (  # noqa: F401 - fixtures shared with the control-plane tests
    TRAINING_STEP_OUTPUTS,
    _argo_server,
    _custom,
    _pipectl,
    _wait_phase,
    project_applied,
    train_pod_annotations,
    training_outputs_supplied,
)

pytestmark = pytest.mark.cluster

@pytest.fixture(scope="module")
def browser():
    with launch_chromium() as b:
        yield b


@pytest.fixture()
def ui(browser, test_cluster, request):
    u = UI(browser, test_cluster.argo_server_url, request.node.name.removeprefix("test_")[:40])
    yield u
    u.close()
    print(f"[ui] screenshots: {[str(p) for p in u.shots]}")


def _template_params(test_cluster) -> dict[str, dict]:
    status, tmpl = _argo_server(test_cluster, "GET", "/api/v1/workflow-templates/pipectl/training-v1")
    assert status == 200, tmpl
    return {p["name"]: p for p in tmpl["spec"]["arguments"]["parameters"]}


def _hover_until_shown(page, icon, tip, attempts: int = 3) -> None:
    """Hover ``icon`` until ``tip`` is visible: on a busy machine a tooltip once stayed hidden after
    the hover for 5 s (seen in a full `make test`: attached to the page, not shown; the cause was not
    found); the mouse leaves and comes back, up to ``attempts`` times, 5 s each."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(attempts):
        icon.hover()
        try:
            tip.first.wait_for(state="visible", timeout=5000)
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise
            page.mouse.move(0, 0)


def test_ui_template_parameters_submit_urgent_dag_succeeds_and_mlflow_link(
        project_applied, training_outputs_supplied, test_cluster, k8s_api, ui):
    """WorkflowTemplates list -> training-v1 -> Submit: every parameter is shown with its
    description (the ? tooltip), each parameter with an enum (lane, promotion-metric, ...) is a
    drop-down of exactly its values, lane=urgent is chosen there, Submit opens the workflow, its DAG
    reaches Succeeded, and the workflow's "MLflow run" link opens its MLflow run (#/runs/<run id>)."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    t0 = time.monotonic()
    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    params = _template_params(test_cluster)
    enums = {n for n, p in params.items() if p.get("enum")}
    assert {"lane", "promotion-metric"} <= enums, enums
    page = ui.page

    ui.open("/workflow-templates/pipectl")
    # workflows.argoproj.io/title of training-v1 (the namespace may hold other teams' templates)
    row = page.get_by_text(re.compile(r"^Training pipeline"))
    row.wait_for()
    ui.shot("templates-list")
    row.click()
    page.wait_for_url("**/workflow-templates/pipectl/training-v1")
    page.get_by_role("button", name="Submit").first.click()
    panel = page.locator(".sliding-panel__body")
    panel.get_by_text("Submit Workflow").wait_for()
    ui.shot("submit-panel")

    shown = panel.locator("label + i.fa-question-circle").evaluate_all(
        "els => els.map(e => e.previousElementSibling.textContent)")
    labels = [n for n in panel.locator("label").all_inner_texts() if n in params]
    assert labels == list(params), (labels, list(params))  # every parameter, in the template's order
    assert shown == list(params), f"parameters without a description in the UI: {set(params) - set(shown)}"
    for name, p in params.items():
        field = panel.locator("div", has=page.locator(f"label:text-is('{name}')")).last
        if name in ("lane", "dataset-uri", "promotion-metric"):  # hover a few: the tooltip is the description
            _hover_until_shown(page, field.locator("i.fa-question-circle"),
                               page.locator(".tippy-popper, [data-tippy-root]").filter(has_text=p["description"]))
            if name == "lane":
                ui.shot("lane-description")
            page.mouse.move(0, 0)
        if name in enums:
            options = field.locator(".select__option").all_text_contents()  # hidden until opened
            assert [o.strip() for o in options] == p["enum"], (name, options)
            assert not field.locator("textarea").count()
        else:
            assert field.locator("textarea").count() == 1 and not field.locator(".select").count(), name

    lane = panel.locator("div", has=page.locator("label:text-is('lane')")).last
    lane.locator(".select__value").click()
    lane.locator(".select__option", has_text="urgent").click()
    assert lane.locator(".select__value").inner_text().strip() == "urgent"
    ui.shot("lane-urgent")
    panel.get_by_role("button", name="Submit").click()
    page.wait_for_url("**/workflows/pipectl/training-v1-*", timeout=30000)
    name = page.url.rstrip("/").rsplit("/", 1)[1].split("?")[0]
    wf = _custom(k8s_api).get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", name)
    got = {p["name"]: p.get("value") for p in wf["spec"]["arguments"]["parameters"]}
    assert got["lane"] == "urgent", got

    assert ui.wait_node_phase(name, {"Succeeded", "Failed", "Error"}, timeout_s=150) == "Succeeded", \
        _wait_phase(k8s_api, "pipectl", name, {"Succeeded", "Failed", "Error"}, 5)["status"].get("message")
    graph = ui.graph()
    steps = ("validate(0)", "stage(0)", "preprocess(0)", "train(0)", "evaluate(0)", "register(0)")
    assert all(graph.get(s) == "Succeeded" for s in steps), graph
    ui.shot("dag-succeeded")
    done = _wait_phase(k8s_api, "pipectl", name, {"Succeeded"}, 10)
    pods = {n["displayName"]: n for n in done["status"]["nodes"].values() if n["type"] == "Pod"}
    assert {"validate(0)", "stage(0)", "preprocess(0)", "train(0)", "evaluate(0)", "register(0)"} <= set(pods), sorted(pods)

    # The workflow's link to its MLflow run (controller configuration `links`, rendered by
    # manifests.controller_config). No MLflow on this cluster: the request is answered by the test.
    opened: list[str] = []
    mlflow_host = urllib.parse.urlsplit(MLFLOW_URI)

    def answer(route):
        opened.append(route.request.url)
        route.fulfill(status=200, content_type="text/html", body="<title>MLflow</title><p>MLflow (stand-in)</p>")
    ui.ctx.route(f"{mlflow_host.scheme}://{mlflow_host.netloc}/**", answer)
    page.get_by_role("button", name="MLflow run").click()
    deadline = time.monotonic() + 10
    landed = []
    while not landed and time.monotonic() < deadline:
        page.wait_for_timeout(200)
        landed = [pg.url for pg in ui.ctx.pages if pg.url.startswith(MLFLOW_URI)]  # this tab or a new one
    assert opened and landed, f"clicking 'MLflow run' opened nothing: requests {opened}, pages {[pg.url for pg in ui.ctx.pages]}"
    # the run id: the workflow's output mlflow-run-id (exported by evaluate, whose output the
    # test supplied); MLflow's UI routes in the fragment, which the browser never sends
    outputs = {p["name"]: p.get("value") for p in done["status"].get("outputs", {}).get("parameters", [])}
    assert outputs.get("mlflow-run-id") == TRAINING_STEP_OUTPUTS["evaluate"]["mlflow-run-id"], done["status"].get("outputs")
    assert landed[0] == f"{MLFLOW_URI}/#/runs/{outputs['mlflow-run-id']}", landed
    assert not ui.errors, ui.errors
    print(f"[timing] UI template -> submit -> Succeeded -> MLflow link: {time.monotonic() - t0:.1f}s")


def test_ui_retry_of_a_failed_workflow_succeeds_with_no_manual_step(
        project_applied, train_pod_annotations, test_cluster, k8s_api, ui):
    """A workflow whose train gang failed (a gang pod exited 1) is retried from the UI's RETRY
    button, after the "fix": the failed run's gang job was deleted by its exit handler, the failed
    train step runs again and creates the run's one gang job anew, the steps before it are kept,
    and the workflow Succeeds. Nothing is deleted by hand (a failed job left in place would be
    re-applied by the retried step, which would fail at once)."""
    if not test_cluster.volcano_ok:
        pytest.skip(f"Volcano did not start: {test_cluster.errors}")
    t0 = time.monotonic()
    assert _pipectl(test_cluster, "templates", "apply").returncode == 0
    train_pod_annotations({"pipectl.io/fail": "Traceback: KeyError", "pipectl.io/exit-code": "1"})
    status, wf = _argo_server(test_cluster, "POST", "/api/v1/workflows/pipectl/submit", {
        "resourceKind": "WorkflowTemplate", "resourceName": "training-v1",
        "submitOptions": {"parameters": ["workers=2", "gpus-per-worker=1", "processes-per-worker=1"]}})
    assert status == 200, wf
    name = wf["metadata"]["name"]
    page = ui.page
    ui.open(f"/workflows/pipectl/{name}")
    assert ui.wait_node_phase(name, {"Succeeded", "Failed", "Error"}, timeout_s=150) == "Failed"
    ui.shot("failed")
    _wait_phase(k8s_api, "pipectl", name, {"Failed"}, 60)  # the UI shows Failed before the exit handler has run
    custom = _custom(k8s_api)
    selector = f"{WORKFLOW_LABEL}={name}"  # on every gang job (launchers/base.py job_labels)
    jobs_before = {j["metadata"]["name"] for j in custom.list_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", "pipectl", "jobs", label_selector=selector)["items"]}
    assert jobs_before == set(), jobs_before  # the failed run's gang was released by its exit handler

    train_pod_annotations({})  # the "fix"
    page.get_by_role("button", name="Retry").first.click()
    retry_panel = page.locator(".sliding-panel__body")
    retry_panel.get_by_text("Retry Workflow").wait_for()
    ui.shot("retry-panel")
    retry_panel.get_by_role("button", name="Retry").click()
    phase = ui.wait_node_phase(name, {"Running", "Pending"}, timeout_s=30)
    phase = ui.wait_node_phase(name, {"Succeeded", "Failed", "Error"}, timeout_s=150)
    ui.shot("retried")
    done = _wait_phase(k8s_api, "pipectl", name, {"Succeeded", "Failed", "Error"}, 10)
    jobs = custom.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "pipectl", "jobs",
                                                label_selector=selector)["items"]
    states = {j["metadata"]["name"]: j.get("status", {}).get("state", {}).get("phase") for j in jobs}
    assert phase == "Succeeded", (done["status"].get("message"), states)
    assert list(states.values()) == ["Completed"], states  # the run's one job, created again by the retried step
    pods = sorted(n["displayName"] for n in done["status"]["nodes"].values() if n["type"] == "Pod")
    assert pods.count("stage(0)") == 1 and pods.count("preprocess(0)") == 1, pods  # kept, not re-run
    assert not ui.errors, ui.errors
    print(f"[timing] UI retry of a failed workflow: {time.monotonic() - t0:.1f}s; jobs {json.dumps(states)}")
