"""Command-line conventions from `argo`/`kubectl` against the real API server and Argo
controller of the test cluster (tests/cluster/conftest.py): -o, the kubeconfig context's
namespace, stop vs terminate (exit handlers), delete, logs -f, and cron-triggered runs in
`pipectl list`. The cluster-free parts: tests/unit/test_cli_conventions.py."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tests.cluster.test_control_plane import PIPECTL, _custom, _tiny_workflow, _wait_phase

pytestmark = pytest.mark.cluster

NS = "cli-conventions"


def _pipectl(kubeconfig, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PIPECTL_NAMESPACE"}
    return subprocess.run([str(PIPECTL), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**env, "KUBECONFIG": str(kubeconfig)})


@pytest.fixture(scope="module")
def ns_kubeconfig(test_cluster, k8s_api, tmp_path_factory):
    """The cluster's kubeconfig with namespace NS on its current context (what `kubectl config
    set-context --current --namespace` writes), and NS created."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": NS}})
    test_cluster.wait_for("default ServiceAccount in " + NS, lambda: core.read_namespaced_service_account("default", NS))
    cfg = yaml.safe_load(test_cluster.kubeconfig.read_text())
    current = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    current["context"]["namespace"] = NS
    path = tmp_path_factory.mktemp("kubeconfig") / "config"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def training_template(test_cluster, k8s_api):
    """Namespace pipectl and the training-v1 WorkflowTemplate, applied by `pipectl templates apply`
    (only what these tests need: not every manifest of argo/)."""
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    try:
        core.create_namespace({"metadata": {"name": "pipectl"}})
    except client.ApiException as e:
        if e.status != 409:  # 409: there already (test_control_plane's project_applied)
            raise
    test_cluster.wait_for("default ServiceAccount in pipectl", lambda: core.read_namespaced_service_account("default", "pipectl"))
    r = _pipectl(test_cluster.kubeconfig, "templates", "apply")
    assert r.returncode == 0, r.stderr


def _with_exit_handler(prefix: str, run_duration: str, steps: int = 1) -> dict:
    """A workflow of ``steps`` sequential pods, each running ``run_duration`` on KWOK, and an exit handler."""
    wf = _tiny_workflow(NS, prefix)
    main = wf["spec"]["templates"][0]
    main["metadata"] = {"annotations": {"pipectl.io/run-duration": run_duration}}
    wf["spec"]["templates"] = [
        {"name": "steps", "steps": [[{"name": f"s{i}", "template": "main"}] for i in range(steps)]},
        main,
        {"name": "on-exit", "container": {**main["container"], "command": ["sh", "-c", "echo exit handler"]}},
    ]
    wf["spec"]["entrypoint"] = "steps"
    wf["spec"]["onExit"] = "on-exit"
    wf["metadata"]["labels"] = {"app.kubernetes.io/part-of": "pipectl"}  # what `pipectl list` shows
    return wf


def _exit_handler_nodes(wf: dict) -> list[dict]:
    return [n for n in (wf.get("status", {}).get("nodes") or {}).values() if n.get("displayName", "").endswith(".onExit")]


def _wait_running_pod(k8s_api, name: str, timeout_s: float = 60) -> None:
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
        if any(p.status.phase == "Running" for p in pods):
            return
        time.sleep(0.3)
    raise AssertionError(f"no pod of {name} Running within {timeout_s}s")


def test_stop_runs_the_exit_handler_terminate_does_not_and_delete_removes(ns_kubeconfig, k8s_api):
    custom = _custom(k8s_api)
    a = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", _with_exit_handler("stop-", "120s"))["metadata"]["name"]
    b = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", _with_exit_handler("term-", "120s"))["metadata"]["name"]
    _wait_running_pod(k8s_api, a)
    _wait_running_pod(k8s_api, b)

    # no -n: the kubeconfig context's namespace (NS); `pipectl` alone would look in `pipectl`
    r = _pipectl(ns_kubeconfig, "stop", a)
    assert r.returncode == 0 and r.stdout.split() == [a], r.stderr
    r = _pipectl(ns_kubeconfig, "terminate", b)
    assert r.returncode == 0 and r.stdout.split() == [b], r.stderr
    stopped = _wait_phase(k8s_api, NS, a, {"Failed", "Error", "Succeeded"}, timeout_s=90)
    terminated = _wait_phase(k8s_api, NS, b, {"Failed", "Error", "Succeeded"}, timeout_s=90)
    assert stopped["spec"]["shutdown"] == "Stop" and terminated["spec"]["shutdown"] == "Terminate"
    assert stopped["status"]["phase"] == terminated["status"]["phase"] == "Failed"
    # Argo's semantics: Stop runs the exit handler, Terminate does not
    assert [n["phase"] for n in _exit_handler_nodes(stopped)] == ["Succeeded"], stopped["status"]["nodes"]
    assert _exit_handler_nodes(terminated) == [], terminated["status"]["nodes"]

    r = _pipectl(ns_kubeconfig, "stop", a)  # already ended
    assert r.returncode == 2 and f"workflow {a} has already ended (Failed)" in r.stderr, r.stderr
    r = _pipectl(ns_kubeconfig, "list", "-o", "name")
    assert r.returncode == 0 and set(r.stdout.split()) == {a, b}, r.stderr  # the context's namespace, no -n
    r = _pipectl(ns_kubeconfig, "delete", a, b)
    assert r.returncode == 0 and r.stdout.split() == [a, b], r.stderr
    r = _pipectl(ns_kubeconfig, "status", a)
    assert r.returncode == 1 and "not found" in r.stderr, r.stderr
    r = _pipectl(ns_kubeconfig, "delete", a)
    assert r.returncode == 1 and "not found" in r.stderr, r.stderr


def test_logs_follow_waits_for_every_step_and_returns_when_the_workflow_ends(ns_kubeconfig, k8s_api):
    """KWOK pods have no kubelet, so no log text: what is checked is that -f picks up each pod as it
    starts (three steps one after the other) and returns once the workflow has ended. The log text
    itself is followed on a real node: tests/cluster/test_real_pods.py."""
    custom = _custom(k8s_api)
    name = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows",
                                                  _with_exit_handler("follow-", "3s", steps=3))["metadata"]["name"]
    t0 = time.monotonic()
    r = _pipectl(ns_kubeconfig, "logs", "-f", name, timeout=180)
    took = time.monotonic() - t0
    print(f"[timing] logs -f of a 3-step workflow: {took:.1f} s")
    assert r.returncode == 0, r.stderr
    assert f"workflow {name}: Succeeded" in r.stderr
    pods = {line.split(":", 1)[0] for line in r.stdout.splitlines()}
    wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
    assert wf["status"]["phase"] == "Succeeded"
    assert len(pods) == 4 and all(p.startswith(name) for p in pods), r.stdout  # 3 steps + the exit handler
    assert took >= 9, took  # three 3-second steps: it followed them, not a snapshot
    custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)


def test_o_formats_of_submit_list_and_status(training_template, ns_kubeconfig, k8s_api):
    custom = _custom(k8s_api)
    r = _pipectl(ns_kubeconfig, "submit", "training", "-n", "pipectl", "-p", "epochs=2", "-o", "yaml")
    assert r.returncode == 0, r.stderr
    submitted = yaml.safe_load(r.stdout)
    name = submitted["name"]
    try:
        assert submitted == {"name": name, "namespace": "pipectl", "lane": "standard", "priority": 50}
        r = _pipectl(ns_kubeconfig, "list", "-n", "pipectl", "-o", "name")
        assert r.returncode == 0 and name in r.stdout.split(), r.stderr
        r = _pipectl(ns_kubeconfig, "list", "-n", "pipectl", "-o", "json")
        row = next(w for w in json.loads(r.stdout) if w["name"] == name)
        assert row["template"] == "training-v1" and row["priority"] == 50 and row["cron"] is None
        # tables as kubectl prints them: headers, whole values (a pipe is not 80 columns wide)
        r = _pipectl(ns_kubeconfig, "list", "-n", "pipectl", "-o", "wide")
        assert r.returncode == 0, r.stderr
        header, *lines = r.stdout.splitlines()
        assert header.split() == ["NAME", "PHASE", "LANE", "STARTED", "FINISHED", "CRON", "TEMPLATE", "PRIORITY", "MESSAGE"], header
        assert any(ln.split()[0] == name and "training-v1" in ln.split() and "50" in ln.split() for ln in lines), r.stdout
        r = _pipectl(ns_kubeconfig, "list", "-n", "pipectl")
        assert r.returncode == 0 and r.stdout.splitlines()[0].split() == ["NAME", "PHASE", "LANE", "STARTED"], r.stdout
        assert any(ln.split()[:1] == [name] for ln in r.stdout.splitlines()), r.stdout
        r = _pipectl(ns_kubeconfig, "status", name, "-n", "pipectl", "-o", "name")
        assert r.stdout.split() == [name], r.stdout
        r = _pipectl(ns_kubeconfig, "status", name, "-n", "pipectl", "-o", "yaml")
        assert isinstance(yaml.safe_load(r.stdout), list), r.stdout
    finally:
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", name)


def test_list_shows_the_runs_the_controller_starts_from_cron_workflows(training_template, test_cluster, k8s_api):
    """Two CronWorkflows of the training template fire on the next minute (the real controller's
    cron scheduler): the rendered one (workflowMetadata labels its runs as pipectl's) and one
    applied without workflowMetadata. `pipectl list` shows both runs."""
    custom = _custom(k8s_api)
    r = _pipectl(test_cluster.kubeconfig, "cron", "apply", "--dry-run")
    assert r.returncode == 0, r.stderr
    rendered = yaml.safe_load(r.stdout)
    crons = []
    assert rendered["spec"]["workflowSpec"]["workflowMetadata"]["labels"] == {"app.kubernetes.io/part-of": "pipectl"}
    for name, keep_metadata in (("every-minute", True), ("every-minute-old", False)):
        cron = json.loads(json.dumps(rendered))
        cron["metadata"]["name"] = name
        cron["spec"].update(schedules=["* * * * *"], timezone="UTC")
        cron["spec"].pop("when", None)
        if not keep_metadata:
            del cron["spec"]["workflowSpec"]["workflowMetadata"]
        crons.append(custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "cronworkflows", cron))
    t0 = time.monotonic()
    try:
        runs: dict = {}
        while time.monotonic() - t0 < 150 and len(runs) < 2:  # the next minute, plus a loaded controller
            items = custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                                         label_selector="workflows.argoproj.io/cron-workflow")["items"]
            runs = {w["metadata"]["labels"]["workflows.argoproj.io/cron-workflow"]: w for w in items
                    if w["metadata"]["labels"]["workflows.argoproj.io/cron-workflow"].startswith("every-minute")}
            time.sleep(1)
        print(f"[timing] first cron runs after {time.monotonic() - t0:.1f} s")
        assert set(runs) == {"every-minute", "every-minute-old"}, (runs.keys(), [
            (c["metadata"]["name"], custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "cronworkflows",
                                                                      c["metadata"]["name"]).get("status")) for c in crons])
        # spec.workflowMetadata: the controller labels the run when it first reconciles it
        labels = {}
        for _ in range(120):
            labels = {c: custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                                             w["metadata"]["name"])["metadata"]["labels"] for c, w in runs.items()}
            if labels["every-minute"].get("app.kubernetes.io/part-of"):
                break
            time.sleep(0.5)
        assert labels["every-minute"].get("app.kubernetes.io/part-of") == "pipectl", labels
        assert "app.kubernetes.io/part-of" not in labels["every-minute-old"], labels
        r = _pipectl(test_cluster.kubeconfig, "list", "-n", "pipectl", "-o", "json")
        assert r.returncode == 0, r.stderr
        listed = {w["name"]: w for w in json.loads(r.stdout)}
        for cron, wf in runs.items():
            assert listed[wf["metadata"]["name"]]["cron"] == cron, listed
    finally:
        for c in crons:
            custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "cronworkflows", c["metadata"]["name"])
        for w in custom.list_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows",
                                                      label_selector="workflows.argoproj.io/cron-workflow")["items"]:
            if w["metadata"]["labels"]["workflows.argoproj.io/cron-workflow"].startswith("every-minute"):
                try:  # the garbage collector may already be deleting it: its CronWorkflow owned it
                    custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", w["metadata"]["name"])
                except ApiException as e:
                    if e.status != 404:
                        raise


def test_wait_follows_a_workflow_to_its_end_and_exits_by_its_phase(ns_kubeconfig, k8s_api):
    """`pipectl wait NAME`: a watch from the first read; every step's phase as it changes (three
    3-second steps and the exit handler), the final phase on stdout, exit 0 when it Succeeded; a
    workflow that fails exits 1; with --timeout shorter than the run, exit 1 naming its phase."""
    custom = _custom(k8s_api)
    create = lambda wf: custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf)["metadata"]["name"]
    ok = create(_with_exit_handler("wait-ok-", "3s", steps=3))
    t0 = time.monotonic()
    r = _pipectl(ns_kubeconfig, "wait", ok, "-o", "json", timeout=180)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["phase"] == "Succeeded" and took >= 9, (r.stdout, took)
    for step in ("s0", "s1", "s2"):
        assert f"{step} Succeeded" in r.stderr, r.stderr

    bad = _tiny_workflow(NS, "wait-fail-", {"pipectl.io/fail": "boom", "pipectl.io/exit-code": "1"})
    r = _pipectl(ns_kubeconfig, "wait", create(bad), timeout=120)
    assert r.returncode == 1 and r.stdout.split()[-1] in ("Failed", "Error"), (r.stdout, r.stderr)

    slow = create(_with_exit_handler("wait-slow-", "60s"))
    r = _pipectl(ns_kubeconfig, "wait", slow, "--timeout", "3", timeout=60)
    assert r.returncode == 1 and "after 3 s" in r.stderr and f"pipectl stop {slow}" in r.stderr, r.stderr
    for name in (ok, slow):
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)


def test_list_filters_templates_and_cron_get_and_delete_and_submit_name_and_labels(training_template, ns_kubeconfig, test_cluster, k8s_api):
    """kubectl/argo habits: `list -s/-l/--since/-A`, `templates list|get|delete`, `cron get|delete`,
    `submit --name --labels` (bad ones exit 2, nothing sent)."""
    kc = test_cluster.kubeconfig
    custom = _custom(k8s_api)
    r = _pipectl(kc, "submit", "training", "-n", "pipectl", "--name", "named-run", "--labels", "team=vision,ticket=ml-142",
                 "-o", "json")
    assert r.returncode == 0, r.stderr
    wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", "named-run")
    assert wf["metadata"]["labels"]["team"] == "vision" and wf["metadata"]["labels"]["ticket"] == "ml-142"
    for bad in (["--name", "Not_A_Name"], ["--labels", "team"], ["--labels", "pipectl.io/lane=urgent"]):
        r = _pipectl(kc, "submit", "training", "-n", "pipectl", *bad)
        assert r.returncode == 2, (bad, r.stderr)
    try:
        r = _pipectl(kc, "list", "-n", "pipectl", "-l", "team=vision", "-o", "name")
        assert r.returncode == 0 and r.stdout.split() == ["named-run"], (r.stdout, r.stderr)
        assert _pipectl(kc, "list", "-n", "pipectl", "-l", "team=audio", "-o", "name").stdout.split() == []
        assert "named-run" in _pipectl(kc, "list", "-n", "pipectl", "--since", "10m", "-o", "name").stdout.split()
        r = _pipectl(kc, "list", "-n", "pipectl", "-s", "Succeeded", "-s", "Failed", "-o", "json")
        assert all(w["phase"] in ("Succeeded", "Failed") for w in json.loads(r.stdout)), r.stdout
        assert _pipectl(kc, "list", "--since", "soon").returncode == 2
        r = _pipectl(kc, "list", "-A", "-l", "team=vision")
        assert r.returncode == 0 and r.stdout.split()[:2] == ["NAMESPACE", "NAME"] and "pipectl" in r.stdout, r.stdout
    finally:
        custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflows", "named-run")

    r = _pipectl(kc, "templates", "list", "-n", "pipectl", "-o", "json")
    listed = {t["name"]: t for t in json.loads(r.stdout)}
    assert listed["training-v1"]["title"] == "Training pipeline" and listed["training-v1"]["parameters"] >= 20, listed
    r = _pipectl(kc, "templates", "get", "training-v1", "-n", "pipectl", "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["spec"]["entrypoint"] == "training", r.stderr
    assert _pipectl(kc, "templates", "get", "no-such", "-n", "pipectl").returncode == 1

    assert _pipectl(kc, "cron", "apply", "-n", "pipectl").returncode == 0
    r = _pipectl(kc, "cron", "get", "retrain", "-n", "pipectl", "-o", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["spec"]["timezone"] == "Europe/Berlin", r.stderr
    r = _pipectl(kc, "cron", "delete", "retrain", "-n", "pipectl")
    assert r.returncode == 0 and r.stdout.split() == ["retrain"], r.stderr
    assert _pipectl(kc, "cron", "get", "retrain", "-n", "pipectl").returncode == 1

    copy = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", "pipectl", "workflowtemplates", "training-v1")
    r = _pipectl(kc, "templates", "delete", "training-v1", "-n", "pipectl")
    assert r.returncode == 0 and r.stdout.split() == ["training-v1"], r.stderr
    assert "training-v1" not in _pipectl(kc, "templates", "list", "-n", "pipectl", "-o", "name").stdout.split()
    assert _pipectl(kc, "templates", "apply", "-n", "pipectl").returncode == 0  # as it was
    assert copy["metadata"]["name"] in _pipectl(kc, "templates", "list", "-n", "pipectl", "-o", "name").stdout.split()


def test_logs_of_one_step(ns_kubeconfig, k8s_api):
    """`logs -f NAME --step s1` follows only that step's pod (KWOK pods serve no log text: each
    followed pod shows one `(log unavailable ...)` line, which names the pods followed)."""
    custom = _custom(k8s_api)
    name = custom.create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows",
                                                  _with_exit_handler("step-logs-", "1s", steps=3))["metadata"]["name"]
    r = _pipectl(ns_kubeconfig, "logs", "-f", name, "--step", "s1", "--tail", "20", timeout=180)
    assert r.returncode == 0, r.stderr
    pods = {line.split(":", 1)[0] for line in r.stdout.splitlines()}
    wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
    from kubernetes import client

    s1 = [p.metadata.name for p in client.CoreV1Api(k8s_api).list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
          if p.metadata.annotations.get("workflows.argoproj.io/node-name", "").endswith(".s1")]
    assert len(s1) == 1 and pods == set(s1), (pods, s1, r.stdout)
    assert _pipectl(ns_kubeconfig, "logs", name, "--since", "soon").returncode == 2
    custom.delete_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)


def test_templates_and_cron_apply_are_server_side_applies_that_leave_the_rendered_spec(ns_kubeconfig, test_cluster, k8s_api):
    """`templates apply` and `cron apply` apply server-side as field manager pipectl. Over a
    template kubectl applied from an earlier rendering (a parameter value since changed, a key of a
    mapping and a key of the spec since dropped) the spec ends exactly as rendered, a label another
    tool added stays, and applying again changes nothing; a suspended schedule stays suspended."""
    import copy

    kc, custom = test_cluster.kubeconfig, _custom(k8s_api)
    r = _pipectl(kc, "templates", "apply", "--dry-run", "-n", NS)
    assert r.returncode == 0, r.stderr
    rendered = next(d for d in yaml.safe_load_all(r.stdout) if d)
    earlier = copy.deepcopy(rendered)
    earlier["spec"]["arguments"]["parameters"][0]["value"] = "s3://old-bucket/digits"
    earlier["spec"]["ttlStrategy"]["secondsAfterCompletion"] = 600
    earlier["spec"]["parallelism"] = 2
    assert earlier["spec"] != rendered["spec"]
    args = ("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1")
    custom.patch_namespaced_custom_object(*args, earlier, field_manager="kubectl", _content_type="application/apply-patch+yaml")
    custom.patch_namespaced_custom_object(*args, {"metadata": {"labels": {"team": "vision"}}}, field_manager="team-tool",
                                          _content_type="application/merge-patch+json")

    r = _pipectl(kc, "templates", "apply", "-n", NS)
    assert r.returncode == 0, r.stderr
    live = custom.get_namespaced_custom_object(*args)
    assert live["spec"] == rendered["spec"], {k: live["spec"].get(k) for k in ("parallelism", "ttlStrategy")}
    assert live["metadata"]["labels"] == {**rendered["metadata"]["labels"], "team": "vision"}
    assert any(m["manager"] == "pipectl" and m["operation"] == "Apply" for m in live["metadata"]["managedFields"])
    assert _pipectl(kc, "templates", "apply", "-n", NS).returncode == 0
    assert custom.get_namespaced_custom_object(*args)["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]

    try:
        for command in (["cron", "apply"], ["cron", "suspend", "retrain"], ["cron", "apply"]):
            r = _pipectl(kc, *command, "-n", NS)
            assert r.returncode == 0, (command, r.stderr)
        cron = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "cronworkflows", "retrain")
        assert cron["spec"]["suspend"] is True and cron["spec"]["timezone"] == "Europe/Berlin", cron["spec"]
    finally:
        assert _pipectl(kc, "cron", "delete", "retrain", "-n", NS).returncode == 0
        assert _pipectl(kc, "templates", "delete", "training-v1", "-n", NS).returncode == 0
