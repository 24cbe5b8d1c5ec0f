"""Real pods: the loopback control plane (cluster.py) plus one real node (node.py: containerd, runc,
CNI, kubelet), the real Argo executor, Ceph RGW and an MLflow server on the host.

What runs for real here: every container (pause, argoexec init/wait, the step images), the CNI
network, pod DNS (CoreDNS), in-cluster API access of the executor, Volcano's gang of two training
pods talking to each other (torchrun rendezvous, gloo), S3 traffic to Ceph RGW and MLflow calls
from pods. Nothing is stood in for.

Needs root, Debian's containerd/runc/CNI/docker.io, the node binaries (tests/cluster/build.sh) and
the step images (scripts/images.sh). Without them the tests are skipped naming what is missing;
PIPECTL_REQUIRE_CLUSTER=1 (make test) makes that a failure.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster import cluster as cl
from tests.cluster import node as nd

# Cold, the first test's fixture imports ~7.7 GB of images into containerd (minutes on 2 shared cores).
# Opt-in (`make test-node` sets PIPECTL_NODE_TESTS=1 after building the images): with a cold image
# cache the step images take ~12 min to build and ~9 min to load, which `make test` does not pay.
pytestmark = [
    pytest.mark.cluster,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(os.environ.get("PIPECTL_NODE_TESTS") != "1",
                       reason="real-pod tests are opt-in: run `make test-node` (builds the step images, then runs them)"),
]

REPO = Path(__file__).resolve().parents[2]
PIPECTL = REPO / ".venv" / "bin" / "pipectl"
NS = "pipectl"
KIND_ORDER = {"Namespace": 0, "PriorityClass": 1, "ServiceAccount": 2, "Role": 3,
              "RoleBinding": 4, "ConfigMap": 5, "Queue": 6, "WorkflowTemplate": 7}
BASE_IMAGE_REPO = "pipectl/debian-base"
# A 2-pod gang that fits the one 2-core node beside a step pod (Guaranteed: requests = limits).
ONE_NODE_GANG = ("-p", "cpu-per-worker=0.6", "-p", "memory-gib-per-worker=3")
# Workflows a test ran and later tests look at (the Argo UI test opens the training run's).
RUNS: dict[str, str] = {}


def _require_or_skip(what: str) -> None:
    if os.environ.get("PIPECTL_REQUIRE_CLUSTER") == "1":
        pytest.fail(what)
    pytest.skip(what)


def _timings_line(name: str, d: dict) -> None:
    print(f"[timing] {name}: {json.dumps(d)}", file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory):
    """(TestCluster with no fake nodes, RealNode) — module scope: one node for these tests."""
    try:
        cl.ensure_available(volcano=True)
    except cl.ClusterNotAvailable as e:
        _require_or_skip(str(e))
    m = nd.missing()
    if m:
        _require_or_skip("real node cannot come up: missing " + "; ".join(m))
    run = tmp_path_factory.mktemp("real")
    t0 = time.monotonic()
    with cl.TestCluster(run / "k8s", nodes=0) as c:
        with nd.RealNode.for_cluster(c, run / "node") as node:
            _timings_line("cluster+node start (s)", {
                "cluster": c.startup_s, "node": node.startup_s,
                "total": round(time.monotonic() - t0, 1), "node_steps": node.timings,
                "image_import_s": node.image_import_s})
            yield c, node


@pytest.fixture(scope="module")
def core(real_cluster):
    from kubernetes import client

    api = nd._api(real_cluster[0].kubeconfig)
    yield client.CoreV1Api(api)
    api.close()


def _base_image() -> str:
    out = subprocess.run([nd.DOCKER, "images", "--format", "{{.Repository}}:{{.Tag}}", BASE_IMAGE_REPO],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out, "no pipectl/debian-base image (scripts/images.sh builds it)"
    return sorted(out)[-1]


def _wait_pod(core, ns: str, name: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        p = core.read_namespaced_pod(name, ns)
        if p.status.phase in ("Succeeded", "Failed"):
            return p
        if time.monotonic() > deadline:
            raise AssertionError(f"pod {ns}/{name} still {p.status.phase}: {p.status}")
        time.sleep(0.5)


def test_plain_pod_runs_on_the_real_node(real_cluster, core):
    """A pod runs in a real container: its own network namespace, cluster DNS, the API server at
    the kubernetes Service address, its log readable through the API server (kubelet)."""
    c, node = real_cluster
    c.wait_for("default ServiceAccount", lambda: core.read_namespaced_service_account("default", "default"))
    script = ("echo hello from $(hostname); "
              "getent hosts kubernetes.default.svc.cluster.local; "
              "python3 -c 'import socket; socket.create_connection((\"10.96.0.1\", 443), 3); print(\"api reachable\")'")
    image = _base_image()
    t0 = time.monotonic()
    core.create_namespaced_pod("default", {
        "metadata": {"name": "hello"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "c", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", script]}]}})
    p = _wait_pod(core, "default", "hello")
    took = time.monotonic() - t0
    log = core.read_namespaced_pod_log("hello", "default")
    print(f"pod hello: {p.status.phase} in {took:.1f}s on {p.spec.node_name} ({p.status.pod_ip}):\n{log}")
    assert p.status.phase == "Succeeded", p.status
    assert p.spec.node_name == nd.NODE_NAME
    assert p.status.pod_ip.startswith("10.244.255.")
    assert "hello from hello" in log
    assert "10.96.0.1" in log and "kubernetes.default.svc.cluster.local" in log
    assert "api reachable" in log


def _apply_project(c) -> None:
    """argo/ as the two roles would apply it, except the WorkflowTemplate: that one the namespace
    owner deploys with the build's content-tagged images, through `pipectl templates apply`."""
    docs = []
    for f in sorted((REPO / "argo").rglob("*.yaml")):
        rel = f.relative_to(REPO / "argo")
        # autoscaling/: not in the top-level kustomization (needs Karpenter's CRDs; the autoscaler tests apply it)
        if set(rel.parts) & {"controller", "monitoring", "kube-apiserver", "workflowtemplates", "autoscaling"} or f.name == "kustomization.yaml":
            continue
        # the gang reaper's Deployment names the release tag of the light image, which no build
        # creates; its tests run on the KWOK control plane (tests/cluster/test_gang_reaper.py)
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d and d["kind"] != "Deployment"]
    c.apply(sorted(docs, key=lambda d: KIND_ORDER.get(d["kind"], 99)), field_manager="pipectl-tests")
    args = nd.image_args()
    assert args, "no image build recorded: run scripts/images.sh"
    r = subprocess.run([str(REPO / ".venv" / "bin" / "pipectl"), "templates", "apply", "-n", "pipectl", *args],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "KUBECONFIG": str(c.kubeconfig)})
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def project(real_cluster, core):
    c, _ = real_cluster
    _apply_project(c)
    c.wait_for("ServiceAccount pipectl-workflow",
               lambda: core.read_namespaced_service_account("pipectl-workflow", NS))
    return c


def _last_json(text: str):
    """The last JSON document `pipectl … -o json` printed (pretty-printed, as kubectl -o json)."""
    dec, i, last = json.JSONDecoder(), 0, None
    while (j := text.find("{", i)) >= 0:
        last, i = dec.raw_decode(text, j)
    return last


def _custom(c):
    from kubernetes import client

    return client.CustomObjectsApi(nd._api(c.kubeconfig))


def _gang_job(c, workflow: str) -> str:
    """The workflow's one Volcano Job (one per run: launchers/base.py JOB_NAME)."""
    jobs = _custom(c).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                    label_selector=f"workflows.argoproj.io/workflow={workflow}")["items"]
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    return jobs[0]["metadata"]["name"]


def _wait_workflow(c, name: str, timeout_s: float) -> dict:
    custom = _custom(c)
    deadline = time.monotonic() + timeout_s
    while True:
        wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        if wf.get("status", {}).get("phase") in ("Succeeded", "Failed", "Error"):
            return wf
        if time.monotonic() > deadline:
            raise AssertionError(f"workflow {name} not done in {timeout_s}s: {wf.get('status')}")
        time.sleep(1)


def test_argo_step_with_the_real_executor(services, project, core):
    """argoexec (init, wait, emissary) from the argo-workflows module runs a container step,
    reports its output parameter to the controller through the API server and archives its log
    in the artifact repository (Ceph RGW, set up by ``services``)."""
    from pipectl.pipelines.security import restricted_container_security_context, restricted_pod_security_context

    c = project
    # the namespace enforces the restricted Pod Security Standard: comply as the product's pods do
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
          "metadata": {"generateName": "one-step-", "namespace": NS},
          "spec": {"entrypoint": "main", "serviceAccountName": "pipectl-workflow",
                   "securityContext": restricted_pod_security_context(), "templates": [{
              "name": "main",
              "container": {"image": _base_image(), "command": ["sh", "-c",
                            "echo step runs; mkdir -p /tmp/o; echo 42 > /tmp/o/answer"],
                            "securityContext": restricted_container_security_context(read_only_root=False)},
              "outputs": {"parameters": [{"name": "answer", "valueFrom": {"path": "/tmp/o/answer"}}]}}]}}
    t0 = time.monotonic()
    created = _custom(c).create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", wf)
    done = _wait_workflow(c, created["metadata"]["name"], 180)
    print(f"one-step workflow {done['status']['phase']} in {time.monotonic() - t0:.1f}s")
    assert done["status"]["phase"] == "Succeeded", done["status"]
    node = next(n for n in done["status"]["nodes"].values() if n["type"] == "Pod")
    assert node["outputs"]["parameters"][0]["value"] == "42"
    pod = core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={created['metadata']['name']}").items[0]
    assert "step runs" in core.read_namespaced_pod_log(pod.metadata.name, NS, container="main")
    key = f"{created['metadata']['name']}/{pod.metadata.name}/main.log"
    log = services["ceph"].s3_client().get_object(Bucket="pipectl-artifacts", Key=key)["Body"].read().decode()
    assert "step runs" in log, log


# -- the training pipeline on real pods ------------------------------------------------------


@pytest.fixture(scope="module")
def services(project, real_cluster, tmp_path_factory):
    """Ceph RGW and an MLflow server on the host, published to pods on the bridge gateway; the
    pipectl-store ConfigMap, the S3 credentials Secret and Argo's artifact repository point at them."""
    from kubernetes import client

    from pipectl.pipelines.backends.services import start_mlflow
    from tests.ceph.ceph import CephCluster, missing_packages

    if missing_packages():
        _require_or_skip("Ceph packages missing: " + ", ".join(missing_packages()))
    c, node = real_cluster
    run = tmp_path_factory.mktemp("svc")
    with CephCluster(run / "ceph") as ceph:
        mlflow = start_mlflow(run / "mlflow")
        try:
            rgw = node.expose(ceph.rgw_port)
            mlf = node.expose(int(mlflow.url.rsplit(":", 1)[1]))
            s3_in_pods = f"http://{rgw}"
            ceph.s3_client().create_bucket(Bucket="pipectl-artifacts")
            api = nd._api(c.kubeconfig)
            core = client.CoreV1Api(api)
            core.patch_namespaced_config_map("pipectl-store", NS, {"data": {
                "PIPECTL_S3_ENDPOINT": s3_in_pods, "PIPECTL_MLFLOW_URI": f"http://{mlf}"}})
            repo = yaml.safe_load(core.read_namespaced_config_map("artifact-repositories", NS).data["ceph-rgw"])
            repo["s3"]["endpoint"] = rgw
            core.patch_namespaced_config_map("artifact-repositories", NS, {"data": {"ceph-rgw": yaml.safe_dump(repo)}})
            secret = {"metadata": {"name": "pipectl-s3-credentials", "namespace": NS},
                      "stringData": {"PIPECTL_S3_ACCESS_KEY": ceph.access_key,
                                     "PIPECTL_S3_SECRET_KEY": ceph.secret_key}}
            try:
                core.create_namespaced_secret(NS, secret)
            except client.ApiException as e:
                if e.status != 409:
                    raise
                core.replace_namespaced_secret("pipectl-s3-credentials", NS, secret)
            yield {"ceph": ceph, "mlflow_url": mlflow.url, "s3_in_pods": s3_in_pods}
        finally:
            mlflow.stop()


def _pipectl(c, *args: str, timeout_s: float = 1800, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "KUBECONFIG": str(c.kubeconfig), **(env or {})}
    return subprocess.run([str(PIPECTL), *args], capture_output=True, text=True, timeout=timeout_s,
                          cwd=REPO, env=env, check=False)


def _apply_templates_for_one_node(c, pipeline: str = "training", template: str = "training-v1",
                                  env: dict[str, str] | None = None) -> None:
    """`pipectl templates apply [PIPELINE]` with the build's content-tagged images (with the release
    tag the node ran a stale image it had cached under that tag — seen here after a rebuild: an old
    evaluate exited 2 on the new arguments), then drop ``retryStrategy.affinity`` (nodeAntiAffinity:
    a retry avoids the node the attempt failed on) from every template: this cluster has one node,
    where such a retry would stay Pending for ever. Production clusters keep it."""
    ap = _pipectl(c, "templates", "apply", *([pipeline] if pipeline != "training" else []), *nd.image_args(),
                  timeout_s=300, env=env)
    assert ap.returncode == 0, ap.stdout + ap.stderr
    custom = _custom(c)
    wft = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", template)
    for t in wft["spec"]["templates"]:
        (t.get("retryStrategy") or {}).pop("affinity", None)
    custom.replace_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", template, wft)


def test_doctor_from_a_pod_pulls_the_step_image_and_reaches_the_store_and_mlflow(services, project, core, tmp_path):
    """`pipectl doctor --from-pod`: a pod of the namespace, run as a step runs with the build's
    step-light image, reaches Ceph RGW and MLflow at the store ConfigMap's addresses (those the
    steps use), and the build's step-train image starts and imports the training steps; images no
    registry serves fail both image rows with the kubelet's reason; no probe pod is left either way."""
    built = dict(a.split("=", 1) for a in nd.image_args() if a != "--image")
    site = tmp_path / "site.yaml"

    def doctor(**settings) -> tuple[int, dict[str, dict]]:
        site.write_text(yaml.safe_dump({"images": {k: built[k] for k in ("step-light", "step-train")}, **settings}))
        r = _pipectl(project, "--site", str(site), "doctor", "-n", NS, "--from-pod", "--pod-timeout", "120", "-o", "json",
                     timeout_s=300)
        assert r.returncode in (0, 1), r.stderr
        return r.returncode, {row["check"]: row for row in json.loads(r.stdout)}

    def no_probe_pod_left() -> bool:
        return not core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component=doctor").items

    _, rows = doctor()
    assert rows["step-light image (from a pod)"]["status"] == "ok", rows
    assert rows["step-light image (from a pod)"]["detail"] == f"pipectl/step-light:{built['step-light']} pulled and ran on {nd.NODE_NAME}"
    train = rows["step-train image (from a pod)"]
    assert train["status"] == "ok", rows
    assert train["detail"].startswith(f"pipectl/step-train:{built['step-train']} pulled and ran on {nd.NODE_NAME} (torch "), train
    for check in ("object store (from a pod)", "MLflow (from a pod)"):
        assert rows[check] == {"check": check, "status": "ok", "detail": f"answers in namespace {NS}", "fix": ""}, rows
    project.wait_for("no probe pod left", no_probe_pod_left)

    code, rows = doctor(registry="127.0.0.1:1/nowhere")  # a registry that refuses every connection
    for kind in ("step-light", "step-train"):
        row = rows[f"{kind} image (from a pod)"]
        assert code == 1 and row["status"] == "fail", rows
        assert row["detail"].startswith(f"127.0.0.1:1/nowhere/{kind}:{built[kind]}: "), row
        assert "ErrImagePull" in row["detail"] or "ImagePullBackOff" in row["detail"], row
    assert "object store (from a pod)" not in rows, rows
    project.wait_for("no probe pod left", no_probe_pod_left)


def test_training_pipeline_on_real_pods(services, project, core):
    """`pipectl submit training --wait` with a 2-worker Volcano gang: stage -> preprocess -> train ->
    evaluate -> register in real containers, ends Succeeded with a model version in MLflow, and
    `pipectl logs` shows every step's log."""
    c = project
    _apply_templates_for_one_node(c)
    t0 = time.monotonic()
    sub = _pipectl(c, "submit", "training", "--wait", "-p", "workers=2", "-p", "processes-per-worker=1", *ONE_NODE_GANG,
                   "-p", "epochs=3", "--output", "json")
    wall = time.monotonic() - t0
    print(sub.stdout[-5000:], sub.stderr[-5000:])
    result = _last_json(sub.stdout)
    name = result["name"]
    _timings_line("e2e training run (s)", {"workflow": name, "wall_s": round(wall, 1),
                                          "phase": result["phase"]})
    wf = _custom(c).get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
    steps = {n["displayName"]: (n["phase"], n.get("message")) for n in wf["status"]["nodes"].values()}
    print("steps:", json.dumps(steps, indent=1))
    assert sub.returncode == 0 and result["phase"] == "Succeeded", steps
    for step in ("stage", "preprocess", "train", "evaluate", "register"):
        assert steps.get(step, ("missing",))[0] == "Succeeded", (step, steps)
    RUNS["training"] = name

    # the gang: two pods of one Volcano Job, both ran on the real node and completed
    gang = core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name},pipectl.io/step=train").items
    gang = [p for p in gang if p.metadata.name.startswith(f"{name}-train-")]
    assert len(gang) == 2, [p.metadata.name for p in gang]
    assert all(p.status.phase == "Succeeded" and p.spec.node_name == nd.NODE_NAME for p in gang)

    # a model version in MLflow, tagged with this workflow
    from mlflow import MlflowClient

    versions = MlflowClient(tracking_uri=services["mlflow_url"]).search_model_versions("name='digits-cnn'")
    print("model versions:", [(v.version, v.run_id, v.tags) for v in versions])
    assert versions, "no model version registered"

    # the training's step anatomy, from the evaluate step's outputs
    status = _pipectl(c, "status", name, timeout_s=120)
    assert status.returncode == 0, status.stderr
    assert re.search(r"training step time \(last epoch\): data \d+%, compute \d+%, sync \d+%", status.stderr), status.stderr

    logs = _pipectl(c, "logs", name, timeout_s=120)
    assert logs.returncode == 0, logs.stderr
    print(logs.stdout[-6000:])
    for step in ("stage", "preprocess", "evaluate", "register"):
        assert any(step in line for line in logs.stdout.splitlines()), f"no {step} log in pipectl logs"
    for p in gang:
        assert p.metadata.name in logs.stdout

    # Argo's artifact repository on Ceph RGW (argo/namespace/configmaps.yaml: archiveLogs): the real argoexec
    # saved every step pod's main log to s3://pipectl-artifacts/<workflow>/<pod>/main.log
    s3 = services["ceph"].s3_client()
    archived = _listing(s3, "pipectl-artifacts", f"{name}/")
    print("artifact repository:", json.dumps(sorted(archived), indent=1))
    # (the train step's resource pod does not archive: its template sets archiveLogs false)
    argo_pods = [p.metadata.name for p in core.list_namespaced_pod(
        NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
        if ".train(" not in (p.metadata.annotations or {}).get("workflows.argoproj.io/node-name", ".train(")]
    assert len(argo_pods) >= 4, argo_pods  # stage, preprocess, evaluate, register
    for pod in argo_pods:
        assert f"{name}/{pod}/main.log" in archived, (pod, sorted(archived))
    stage_pod = next(p for p in argo_pods if "-stage-" in p)
    stage_log = s3.get_object(Bucket="pipectl-artifacts", Key=f"{name}/{stage_pod}/main.log")["Body"].read().decode()
    lines = [ln.strip() for ln in stage_log.splitlines() if ln.strip()]
    assert lines and any(ln in logs.stdout for ln in lines), stage_log[-2000:]  # the same log pipectl showed


def test_argo_ui_shows_a_step_log_archived_on_ceph_and_links_to_the_mlflow_run(services, project, core, tmp_path):
    """The Argo UI (the real UI in `argo server`, tests/cluster/build.sh) on the training run of
    test_training_pipeline_on_real_pods, in headless Chromium: the DAG is Succeeded; the stage
    step's pod is deleted (as pod GC does) and its LOGS still show the log argoexec archived on Ceph
    RGW (the UI fetches it through the server's artifact route); the workflow's "MLflow run" link
    opens that run in the real MLflow UI (run id, the pipectl.workflow tag)."""
    import urllib.request

    from kubernetes import client

    from pipectl.pipelines.backends.processes import free_port, spawn, stop, wait_until
    from pipectl.pipelines.manifests import MLFLOW_URI
    from tests.cluster.browser import UI, launch_chromium

    name = RUNS.get("training")
    assert name, "needs the workflow of test_training_pipeline_on_real_pods (it failed or did not run)"
    c = project
    t0 = time.monotonic()
    # `argo server` reads its links once at start: one with the product's controller config, its
    # MLflow link pointed at the MLflow server on this host (the product: mlflow.mlflow.svc)
    conf = core.read_namespaced_config_map("workflow-controller-configmap", "argo").data
    conf = {**conf, "links": conf["links"].replace(MLFLOW_URI, services["mlflow_url"])}
    assert services["mlflow_url"] in conf["links"], conf["links"]
    try:
        core.delete_namespaced_config_map("pipectl-ui-test", "argo")
    except client.ApiException:
        pass
    core.create_namespaced_config_map("argo", {"metadata": {"name": "pipectl-ui-test"}, "data": conf})
    port = free_port()
    log = tmp_path / "argo-server.log"
    server = spawn([str(cl.binary("argo")), "server", "--kubeconfig", str(c.kubeconfig), "--namespace", "argo",
                    "--configmap", "pipectl-ui-test", "--auth-mode", "server", "--secure=false", "--port", str(port)], log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until("argo server", lambda: urllib.request.urlopen(base + "/api/v1/version", timeout=2).status == 200,
                   60, procs=[("argo server", server, log)])
        wf = _custom(c).get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        stage = next(n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n["displayName"] == "stage(0)")
        stage_pod = next(p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
                         if (p.metadata.annotations or {}).get("workflows.argoproj.io/node-id") == stage["id"])
        archived = services["ceph"].s3_client().get_object(Bucket="pipectl-artifacts", Key=f"{name}/{stage_pod}/main.log")["Body"].read().decode()
        expected = [ln.strip() for ln in archived.splitlines() if ln.strip()][-1]
        core.delete_namespaced_pod(stage_pod, NS, grace_period_seconds=0)  # only Ceph has its log now
        c.wait_for("stage pod gone", lambda: not [p for p in core.list_namespaced_pod(NS).items if p.metadata.name == stage_pod])

        with launch_chromium() as browser:
            ui = UI(browser, base, "real_pods")
            page = ui.page
            log_requests: list[tuple[str, int]] = []
            page.on("response", lambda r: log_requests.append((r.url, r.status)) if "main-logs" in r.url else None)
            ui.open(f"/workflows/{NS}/{name}")
            assert ui.wait_node_phase(name, {"Succeeded", "Failed", "Error"}, timeout_s=60) == "Succeeded"
            graph = ui.graph()
            assert all(graph.get(f"{s}(0)") == "Succeeded" for s in ("stage", "preprocess", "train", "evaluate", "register")), graph
            ui.shot("dag-succeeded")
            ui.click_node("stage(0)")
            page.locator(".workflow-details__step-info").get_by_role("button", name="Logs").click()  # the step's
            # the viewer (xterm) wraps long lines into rows of ~50 characters and draws spaces as
            # no-break spaces: compare the first 30 characters, spaces normalised
            fragment = expected[:30]
            deadline = time.monotonic() + 30
            while fragment not in (shown := page.inner_text("body").replace("\xa0", " ")) and time.monotonic() < deadline:
                page.wait_for_timeout(500)
            ui.shot("stage-log-from-ceph")
            assert fragment in shown, (fragment, log_requests, shown[-3000:])
            assert any(status == 200 for _, status in log_requests), log_requests
            page.keyboard.press("Escape")
            ui.open(f"/workflows/{NS}/{name}")
            page.get_by_role("button", name="MLflow run").click()
            run_id = next(p["value"] for p in wf["status"]["outputs"]["parameters"] if p["name"] == "mlflow-run-id")
            deadline = time.monotonic() + 20
            while not [pg for pg in ui.ctx.pages if pg.url.startswith(services["mlflow_url"])] and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            mlflow_page = next(pg for pg in ui.ctx.pages if pg.url.startswith(services["mlflow_url"]))
            assert mlflow_page.url == f"{services['mlflow_url']}/#/runs/{run_id}", mlflow_page.url
            mlflow_page.get_by_text(name).first.wait_for(timeout=30000)  # the run's pipectl.workflow tag
            mlflow_page.get_by_text(run_id).first.wait_for(timeout=10000)
            ui.page = mlflow_page
            ui.shot("mlflow-run")
            print(f"[ui] screenshots: {[str(p) for p in ui.shots]}; main-logs requests: {log_requests}")
            ui.close()
    finally:
        stop(server, grace_s=5)
        core.delete_namespaced_config_map("pipectl-ui-test", "argo")
    _timings_line("Argo UI on real pods (s)", {"wall_s": round(time.monotonic() - t0, 1)})


def _gang_job_writes(c, job: str) -> list[tuple[str, int, str]]:
    """(verb, response code, user) of every write to the gang job ``job``, from the API server's
    audit log (tests/cluster/audit-policy.yaml)."""
    return [(e["verb"], e["responseStatus"]["code"], e["user"]["username"])
            for e in c.audit_events(job) if e.get("stage") == "ResponseComplete"]


def test_gang_pod_lost_mid_training_restarts_the_gang_from_its_checkpoint(services, project, real_cluster, core):
    """One training pod is lost mid-epoch as a failed node looks (pod force-deleted, its processes
    SIGKILLed): Volcano restarts the whole gang (PodEvicted -> RestartJob, pipelines/pipectl/pipelines/launchers/volcano.py), the
    workers resume from the last checkpoint, Argo does not retry the step, the workflow Succeeds.
    Prints the optimiser steps lost (trained before the loss, after the checkpoint resumed from).

    C16: the run also goes through the re-send that failed it on a fresh machine — pods
    reach the API server through a proxy that commits the first write of the gang job and answers
    it with a ServerTimeout 500 + Retry-After, so the train step's kubectl sends it again; the
    audit log must show the job created once and re-applied once, and the step must attach to it.
    The image revision the node ran is printed and checked against this checkout's build."""
    c, node = real_cluster
    with node.api_through_fault_proxy(c, fail=lambda m, p: m in ("POST", "PATCH") and "/batch.volcano.sh/" in p and "/jobs" in p) as px:
        name = _lose_a_gang_pod_mid_training(services, c, core)
        writes = px.writes()
    job = _gang_job(c, name)
    gang_writes = [(m, up, ans) for m, path, up, ans in writes if f"/jobs/{job}" in path or path.split("?")[0].endswith("/jobs")]
    audit = [a for a in _gang_job_writes(c, job) if a[2] == "system:serviceaccount:pipectl:pipectl-launcher"]
    print("gang job writes through the proxy:", gang_writes, "audit:", audit)
    # every user's writes of the job, to tell who created it when the launcher's first write was not the create
    everyone = [(e["verb"], e["responseStatus"]["code"], e["user"]["username"], e.get("userAgent"), e.get("sourceIPs"),
                 e.get("requestReceivedTimestamp")) for e in c.audit_events(job) if e.get("stage") == "ResponseComplete"]
    # only the train step's own account writes the job (the harness's argoexec stand-in, acting for
    # KWOK nodes as the cluster admin, must leave the real node's pods to their own argoexec)
    assert {e[2] for e in everyone} == {"system:serviceaccount:pipectl:pipectl-launcher"}, everyone
    assert gang_writes[:2] == [("PATCH", 201, 500), ("PATCH", 200, 200)], (gang_writes, everyone)
    assert [a[:2] for a in audit] == [("patch", 201), ("patch", 200)], (audit, everyone)  # created once, re-applied once
    revisions = [node.image_revision(ref) for ref in nd.step_images()]
    _timings_line("image revision on the node", {"images": revisions})
    for r in revisions:
        assert r["node_docker_id"] == r["docker_id"], r


def _lose_a_gang_pod_mid_training(services, c, core) -> str:
    """Submit training (2 workers), lose one gang pod past checkpoint step 40, check the gang
    restarted from its checkpoint and the workflow Succeeded; returns the workflow name."""
    s3 = services["ceph"].s3_client()
    _apply_templates_for_one_node(c)
    every = 10
    sub = _pipectl(c, "submit", "training", "-p", "workers=2", "-p", "processes-per-worker=1", *ONE_NODE_GANG, "-p", "epochs=40",
                   "-p", f"checkpoint-every-steps={every}", "--output", "json", timeout_s=120)
    assert sub.returncode == 0, sub.stderr
    name = _last_json(sub.stdout)["name"]
    latest_key = f"runs/{name}/checkpoints/latest.json"

    def checkpointed():
        try:
            return json.loads(s3.get_object(Bucket="pipectl", Key=latest_key)["Body"].read())
        except (s3.exceptions.NoSuchKey, s3.exceptions.NoSuchBucket):  # the stage step makes the bucket
            return None

    deadline = time.monotonic() + 900
    # mid-training, past the first epoch (23 steps of 920 with digits, 2 workers, batch 32)
    while (ck := checkpointed()) is None or ck["step"] < 4 * every:
        assert time.monotonic() < deadline, f"no checkpoint at step >= {4 * every} in 900 s"
        wf = _custom(c).get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        assert wf.get("status", {}).get("phase") not in ("Succeeded", "Failed", "Error"), wf["status"]
        time.sleep(0.2)
    gang = sorted((p for p in core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name},pipectl.io/step=train").items
                   if p.metadata.name.startswith(f"{name}-train-") and p.status.phase == "Running"),
                  key=lambda p: p.metadata.name)
    assert len(gang) == 2, [(p.metadata.name, p.status.phase) for p in gang]
    rank0_log = core.read_namespaced_pod_log(gang[0].metadata.name, NS)
    victim = gang[-1]
    core.delete_namespaced_pod(victim.metadata.name, NS, grace_period_seconds=0)
    n_killed = _kill_pod_processes(victim.metadata.uid)
    at_kill = checkpointed()
    epoch_steps = [int(line.split(": step ")[1].split()[0]) for line in rank0_log.splitlines() if " done: step " in line]
    print(f"lost pod {victim.metadata.name} (SIGKILLed {n_killed} processes); latest checkpoint step "
          f"{at_kill['step']}, last epoch logged at step {max(epoch_steps, default=0)}")

    wf = _wait_workflow(c, name, 1200)
    nodes = wf["status"]["nodes"].values()
    train_attempts = [n for n in nodes if n["type"] == "Pod" and n["displayName"].startswith("train(")]
    print("workflow", wf["status"]["phase"], "train attempts:", [(n["displayName"], n["phase"], n.get("message")) for n in train_attempts])
    assert wf["status"]["phase"] == "Succeeded", wf["status"].get("message")
    assert len(train_attempts) == 1, "the gang restarts inside its Volcano Job; Argo must not retry the step"
    job = _custom(c).get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", _gang_job(c, name))
    print("volcano job status:", json.dumps({k: job["status"].get(k) for k in ("state", "retryCount", "version")}))
    assert job["status"].get("retryCount", 0) >= 1, job["status"]
    after = core.read_namespaced_pod_log(gang[0].metadata.name, NS)
    resumed = [line for line in after.splitlines() if "resuming from checkpoint" in line]
    assert resumed, after[-3000:]
    r = int(resumed[-1].split("(step ")[1].split()[0])
    assert r >= at_kill["step"] >= ck["step"], (r, at_kill, ck)
    done_before = max([at_kill["step"], *epoch_steps])
    total = int(resumed[-1].split(" of ")[1].split(")")[0])
    print(f"steps lost: {max(0, done_before - r)} to {max(0, done_before - r) + every} of {total} "
          f"(resumed at step {r}; checkpoint every {every} steps)")
    _timings_line("gang pod lost mid-training", {"workflow": name, "resumed_from_step": r, "total_steps": total,
                                                  "checkpoint_every": every, "volcano_retry_count": job["status"].get("retryCount")})
    return name


def _gang_job_of_run(c, run: str, new: str) -> dict:
    """The product's gang job exactly as the train step of workflow ``run`` created it (the cluster's
    training-v1 manifest, that node's input parameters), for a fresh run named ``new``: same
    shards, its own run prefix (so training starts at step 0), no workflow owner."""
    from tests.tools.gang import gang_job, template_defaults

    custom = _custom(c)
    wft = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflowtemplates", "training-v1")
    resource = next(t for t in wft["spec"]["templates"] if "resource" in t)
    manifest = resource["resource"]["manifest"]
    wf = custom.get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", run)
    # the attempt's pod node: it has every input of the resource template (the DAG and skipped
    # retry nodes around it need not)
    node = next(n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName") == resource["name"])
    params = {p["name"]: p["value"].replace(run, new) if p["name"] == "run-uri" else p["value"]
              for p in node["inputs"]["parameters"]}
    return gang_job(manifest, workflow=new, inputs=params, namespace=NS, workflow_parameters=template_defaults(wf))


def _node_memory_available(c) -> int:
    """The kubelet's own memory.available signal (bytes): the summary API's node.memory.availableBytes."""
    from kubernetes import client

    api = nd._api(c.kubeconfig)
    try:
        r = client.CoreV1Api(api).connect_get_node_proxy_with_path(nd.NODE_NAME, "stats/summary", _preload_content=False)
        return int(json.loads(r.data)["node"]["memory"]["availableBytes"])
    finally:
        api.close()


def test_C07_node_pressure_eviction_by_the_real_kubelet_restarts_the_gang_from_its_checkpoint(services, project, real_cluster, core):
    """C07 on the real node: the kubelet itself evicts a training pod under memory
    pressure. The product's gang job (as the training run's train step created it) trains; the
    kubelet is restarted with a memory.available threshold 1 GiB below what it measures now, and a
    process on the host (outside Kubernetes) growing to 5 GiB crosses it: the kubelet evicts a gang pod — the
    pod stays, phase Failed, reason Evicted; printed as the kubelet wrote it —, Volcano restarts the
    whole gang (PodFailed is not PodEvicted: a PodFailed -> TerminateJob policy would end
    the job), the hog goes, the kubelet gets its usual threshold back, and the restarted workers
    resume from the checkpoint and complete."""
    c, node = real_cluster
    run = RUNS.get("training")
    if run is None:
        pytest.skip("needs the training run of test_training_pipeline_on_real_pods (its shards)")
    s3 = services["ceph"].s3_client()
    name = f"evict-{int(time.time()) % 100000}"
    job = _gang_job_of_run(c, run, name)
    job_name = job["metadata"]["name"]
    every = 10
    cmd = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"]
    for flag, value in (("--epochs", "40"), ("--checkpoint-every-steps", str(every))):
        cmd[cmd.index(flag) + 1] = value
    custom = _custom(c)
    custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job)
    hog = None
    latest_key = f"runs/{name}/checkpoints/latest.json"

    def checkpointed():
        try:
            return json.loads(s3.get_object(Bucket="pipectl", Key=latest_key)["Body"].read())
        except s3.exceptions.NoSuchKey:
            return None
    try:
        c.wait_for("a checkpoint at step >= 20", lambda: (ck := checkpointed()) and ck["step"] >= 2 * every, timeout_s=900)
        gang = {p.metadata.uid for p in core.list_namespaced_pod(NS, label_selector=f"volcano.sh/job-name={job_name}").items}
        available = _node_memory_available(c)
        threshold_mi = (available >> 20) - 1024
        default_hard = yaml.safe_load(nd.KUBELET_CONFIG.read_text())["evictionHard"]
        node.restart_kubelet(evictionHard={**default_hard, "memory.available": f"{threshold_mi}Mi"},
                             evictionPressureTransitionPeriod="5s")
        # grows by 256 MiB every 0.5 s up to 5 GiB: crosses the threshold even if other processes
        # free memory meanwhile (a fixed 2 GiB did not once, on a loaded machine)
        hog = subprocess.Popen([sys.executable, "-c", "import time\nx = []\nfor _ in range(20):\n"
                                "    x.append(b'\\x01' * (256 << 20))\n    time.sleep(0.5)\ntime.sleep(900)"])
        t0 = time.monotonic()
        # a watch, not polling: Volcano's restart deletes the evicted pod within a second, and a
        # poll on a loaded machine missed the Failed/Evicted status twice in .ci/run
        from kubernetes import watch

        victim = None
        w = watch.Watch()
        for ev in w.stream(core.list_namespaced_pod, NS, label_selector=f"volcano.sh/job-name={job_name}", timeout_seconds=180):
            p = ev["object"]
            if p.metadata.uid in gang and p.status.reason == "Evicted":
                victim = p
                w.stop()
        assert victim is not None, "the kubelet evicted no gang pod within 180 s"
        at_eviction = checkpointed()
        hog.kill()
        hog.wait()
        hog = None
        node.restart_kubelet()  # the usual threshold back
        st = victim.status
        seen = {"phase": st.phase, "reason": st.reason, "message": st.message,
                "conditions": [(x.type, x.status, x.reason) for x in st.conditions or []],
                "containers": [{"name": cs.name, "terminated": cs.state.terminated and
                                {"exitCode": cs.state.terminated.exit_code, "reason": cs.state.terminated.reason},
                                "waiting": cs.state.waiting and cs.state.waiting.reason} for cs in st.container_statuses or []]}
        _timings_line("kubelet eviction", {"after_s": round(time.monotonic() - t0, 1), "threshold_mi": threshold_mi,
                                           "pod_status_as_written": seen, "checkpoint_step": at_eviction["step"]})
        assert st.phase == "Failed" and st.reason == "Evicted", seen
        assert "low on resource: memory" in (st.message or ""), seen

        def ended():
            j = custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job_name)
            return j if j.get("status", {}).get("state", {}).get("phase") in ("Completed", "Failed", "Terminated", "Aborted") else None
        done = c.wait_for("the gang job to end", ended, timeout_s=1200, interval_s=2)
        print("volcano job status:", json.dumps({k: done["status"].get(k) for k in ("state", "retryCount")}))
        assert done["status"]["state"]["phase"] == "Completed" and done["status"].get("retryCount", 0) >= 1, done["status"]
        pods = core.list_namespaced_pod(NS, label_selector=f"volcano.sh/job-name={job_name}").items
        assert not gang & {p.metadata.uid for p in pods}, "every pod of the first generation must be replaced"
        rank0 = next(p for p in pods if p.metadata.name.endswith("-worker-0"))
        resumed = [ln for ln in core.read_namespaced_pod_log(rank0.metadata.name, NS).splitlines() if "resuming from checkpoint" in ln]
        assert resumed, "the restarted gang did not resume from its checkpoint"
        step = int(resumed[-1].split("(step ")[1].split()[0])
        assert step >= at_eviction["step"], (step, at_eviction)
        _timings_line("eviction restart", {"resumed_from_step": step, "volcano_retry_count": done["status"].get("retryCount")})
    finally:
        if hog is not None:
            hog.kill()
        if node.kubelet_overrides:
            node.restart_kubelet()
        custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs", job_name)


# -- faults on real pods -------------------------------------------------------------------------


def _listing(s3, bucket: str, prefix: str) -> dict[str, tuple[int, str]]:
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = (o["Size"], o["ETag"])
    return out


def _kill_pod_processes(uid: str) -> int:
    """SIGKILL every process on this host whose cgroup belongs to pod ``uid`` (kubelet's
    cgroupfs layout: .../kubepods/<qos>/pod<uid>/<container>)."""
    import signal

    n = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"pod{uid}" in (d / "cgroup").read_text():
                os.kill(int(d.name), signal.SIGKILL)
                n += 1
        except (OSError, ProcessLookupError):
            continue
    return n


class _PodWatch:
    """What the API server says about the pods of ``selector`` while a test acts: each pod's
    deletion and disappearance (seconds since :attr:`t0`) and its containers' last exit codes, from
    a watch in a thread; and each Running pod's log, followed in a thread of its own, so what the
    processes printed as they were stopped survives the pod's deletion."""

    def __init__(self, core, selector: str) -> None:
        import threading

        from kubernetes import watch

        self.core, self.t0 = core, time.monotonic()
        self.deleting: dict[str, float] = {}
        self.gone: dict[str, float] = {}
        self.exit_codes: dict[str, dict[str, int]] = {}
        self.logs: dict[str, list[str]] = {}
        self.error: Exception | None = None
        self._stopping = False
        self._watch = watch.Watch()
        self._threads = [threading.Thread(target=self._pods, args=(selector,), daemon=True)]
        self._threads[0].start()

    def _pods(self, selector: str) -> None:
        try:
            for ev in self._watch.stream(self.core.list_namespaced_pod, NS, label_selector=selector, timeout_seconds=900):
                self._event(ev)
        except Exception as e:  # the watch's connection closed under it: expected once stopped
            if not self._stopping:
                self.error = e

    def _event(self, ev: dict) -> None:
        import threading

        p, now = ev["object"], time.monotonic() - self.t0
        name = p.metadata.name
        if p.status.phase == "Running" and name not in self.logs:
            self.logs[name] = []
            t = threading.Thread(target=self._log, args=(name,), daemon=True)
            t.start()
            self._threads.append(t)
        if p.metadata.deletion_timestamp and name not in self.deleting:
            self.deleting[name] = now
        for cs in p.status.container_statuses or []:
            if cs.state and cs.state.terminated:
                self.exit_codes.setdefault(name, {})[cs.name] = cs.state.terminated.exit_code
        if ev["type"] == "DELETED":
            self.gone[name] = now

    def _log(self, name: str) -> None:
        try:
            stream = self.core.read_namespaced_pod_log(name, NS, follow=True, _preload_content=False)
            for line in stream:
                self.logs[name].append(line.decode(errors="replace").rstrip())
        except Exception as e:  # the pod went while the log was read: keep what came
            self.logs[name].append(f"[log ended: {type(e).__name__}]")

    def stop(self) -> None:
        assert self.error is None, f"the pod watch ended early: {self.error!r}"
        self._stopping = True
        self._watch.stop()


def test_a_stopped_run_releases_its_training_gang(services, project, real_cluster, core):
    """`pipectl stop` while the gang starts and trains on the real node: the exit handler
    (gang-release, a real pod of the light image, the launcher's ServiceAccount and Role) deletes
    the run's gang job and waits for its pods. Every training process ends on its SIGTERM (the
    launcher 143; torchrun never had to SIGKILL a worker that ignored it, which it does after 30 s,
    and the kubelet never had to at the end of the 60 s grace period: 137). Measured and printed:
    seconds from the stop to the exit handler's start and end, each pod's deletion and its end, and
    to no gang job or pod left. Field case C19 (a stopped run holds no GPUs)."""
    from pipectl.components.train.preemption import GRACE_PERIOD_S

    c, _ = real_cluster
    _apply_templates_for_one_node(c)
    sub = _pipectl(c, "submit", "training", "-p", "workers=2", "-p", "processes-per-worker=1", *ONE_NODE_GANG,
                   "-p", "epochs=40", "--output", "json", timeout_s=120)
    assert sub.returncode == 0, sub.stderr
    name = _last_json(sub.stdout)["name"]
    selector = f"workflows.argoproj.io/workflow={name},pipectl.io/step=train"
    pods = _PodWatch(core, selector)

    def gang_running():
        listed = core.list_namespaced_pod(NS, label_selector=selector).items
        return len(listed) == 2 and all(p.status.phase == "Running" for p in listed)

    deadline = time.monotonic() + 600
    while not gang_running():
        assert time.monotonic() < deadline, "the gang never ran"
        time.sleep(0.5)
    t0 = time.monotonic()
    pods.t0 = t0
    stop = _pipectl(c, "stop", name, timeout_s=60)
    assert stop.returncode == 0, stop.stderr
    stop_s = time.monotonic() - t0

    def left():
        jobs = _custom(c).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs",
                                                        label_selector=f"workflows.argoproj.io/workflow={name}")["items"]
        return [j["metadata"]["name"] for j in jobs], [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=selector).items]

    # a liveness bound, not a speed goal: past the pods' grace period the kubelet SIGKILLs them
    while left() != ([], []):
        assert time.monotonic() - t0 < GRACE_PERIOD_S + 60, left()
        time.sleep(0.5)
    gone_s = time.monotonic() - t0
    wf = _wait_workflow(c, name, 120)
    pods.stop()
    release = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName") == "gang-release"]
    stopped_at = time.time() - (time.monotonic() - t0)
    timeline = {"workflow": name, "phase": wf["status"]["phase"], "stop_cli_s": round(stop_s, 1),
                "release_started_s": [round(_ts(n["startedAt"]) - stopped_at, 1) for n in release if n.get("startedAt")],
                "release_finished_s": [round(_ts(n["finishedAt"]) - stopped_at, 1) for n in release if n.get("finishedAt")],
                "pod_deleting_s": {k: round(v, 1) for k, v in pods.deleting.items()},
                "pod_gone_s": {k: round(v, 1) for k, v in pods.gone.items()},
                "exit_codes": pods.exit_codes, "seconds": round(gone_s, 1)}
    _timings_line("stopped run: gang gone", timeline)
    logs = "\n".join(f"[{pod}] {line}" for pod, lines in pods.logs.items() for line in lines[-40:])
    assert [n["phase"] for n in release] == ["Succeeded"], release
    assert any(not line.startswith("[log ended") for lines in pods.logs.values() for line in lines), \
        f"no gang pod's log was read: {timeline}\n{logs}"
    assert "Unable to shutdown process" not in logs, f"a worker ignored its SIGTERM until torchrun killed it\n{logs}"
    codes = [code for per_pod in pods.exit_codes.values() for code in per_pod.values()]
    assert codes, f"no gang pod's end was seen: {timeline}"
    assert 137 not in codes, f"a gang pod was killed at the end of its grace period: {timeline}\n{logs}"
    print(f"stopped run: {json.dumps(timeline)}")


def _ts(text: str) -> float:
    """Seconds since the epoch of a Kubernetes/Argo timestamp (2026-12-02T03:00:00Z)."""
    import datetime

    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def test_step_exit_1_is_not_retried(services, project, core):
    """A step that exits 1 (stage: the dataset does not exist) runs once, its step ends Failed
    within 15 s of the pod's end (not after the infrastructure backoff), the workflow ends Failed,
    `pipectl submit --wait` exits 1, and no training job is left behind."""
    c = project
    sub = _pipectl(c, "submit", "training", "--wait", "-p", "dataset-uri=s3://pipectl/no-such-dataset/",
                   "--output", "json", timeout_s=600)
    print(sub.stdout[-3000:], sub.stderr[-3000:])
    result = _last_json(sub.stdout)
    assert sub.returncode == 1 and result["phase"] == "Failed", result
    wf = _custom(c).get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", result["name"])
    attempts = [n for n in wf["status"]["nodes"].values()
                if n["type"] == "Pod" and n["displayName"].startswith("stage")]
    print("stage attempts:", [(n["displayName"], n["phase"], n.get("message"), n.get("outputs", {}).get("exitCode"))
                              for n in attempts])
    assert len(attempts) == 1, "a code failure (exit 1) must not be retried"
    assert attempts[0]["phase"] == "Failed" and attempts[0]["outputs"]["exitCode"] == "1"
    # ...and ends its step within seconds: Argo waits out the first backoff delay (5 s) before it
    # reads the retry expression, not the 40 s it used to be
    retry = next(n for n in wf["status"]["nodes"].values() if n["type"] == "Retry" and n["displayName"] == "stage")
    seconds = (_ts(retry["finishedAt"]) - _ts(attempts[0]["finishedAt"]))
    print(f"stage exit 1 -> its step Failed after {seconds:.0f} s")
    assert retry["phase"] == "Failed" and seconds <= 15, (retry, attempts[0]["finishedAt"])
    pods = core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={result['name']}").items
    steps = sorted(p.metadata.annotations.get("workflows.argoproj.io/node-name", "").split(".")[-1] for p in pods)
    assert steps == ["onExit(0)", "stage(0)", "validate(0)"], steps  # nothing after stage ran; the exit handler did
    release = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod" and n.get("templateName") == "gang-release"]
    assert [n["phase"] for n in release] == ["Succeeded"], release  # real pod, launcher's account: nothing to release
    jobs = _custom(c).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs")["items"]
    assert not [j for j in jobs if j["metadata"]["name"].startswith(result["name"])]


def test_C15_hostile_parameter_from_the_api_fails_in_validate_before_any_job(services, project, core):
    """C15 on real pods: a Workflow created through the API (as the Argo UI and `kubectl create` do,
    bypassing pipectl's own checks) from the installed WorkflowTemplate, with a model-name that
    breaks out of the gang manifest's quoting to add a privileged securityContext. The validate
    step (its own container, the light image) refuses it: the workflow is Failed, the validate
    node's message names the parameter, no other step ran and no gang job exists."""
    c = project
    hostile = "x'\n          securityContext:\n            privileged: true\n          args:\n          - '"
    wf = _custom(c).create_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
        "metadata": {"generateName": "c15-"},
        "spec": {"workflowTemplateRef": {"name": "training-v1"},
                 "arguments": {"parameters": [{"name": "model-name", "value": hostile}]}}})
    name = wf["metadata"]["name"]
    wf = _wait_workflow(c, name, 600)
    nodes = [n for n in wf["status"]["nodes"].values() if n["type"] == "Pod"]
    print("C15:", wf["status"]["phase"], [(n["displayName"], n["phase"], n.get("message")) for n in nodes])
    assert wf["status"]["phase"] == "Failed"
    assert sorted(n["templateName"] for n in nodes) == ["gang-release", "validate"], nodes  # one attempt: not retried
    validate = next(n for n in nodes if n["displayName"] == "validate(0)")
    assert "parameter model-name:" in validate.get("message", ""), validate
    jobs = _custom(c).list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", NS, "jobs")["items"]
    assert not [j for j in jobs if j["metadata"]["name"].startswith(name)]


def test_stage_killed_mid_copy_is_retried_and_the_bucket_is_identical(services, project, core):
    """Delete the stage pod while it copies: Argo retries it (infrastructure failure: pod deleted),
    the retry completes the copy, and the dataset in the bucket is byte-identical (keys, sizes,
    MD5 ETags) to the clean copy of the end-to-end run above: nothing missing, nothing extra."""
    c = project
    s3 = services["ceph"].s3_client()
    clean = _listing(s3, "pipectl", "datasets/")
    assert clean, "needs the clean staging of test_training_pipeline_on_real_pods (run the module in order)"
    for chunk in [list(clean)[i:i + 500] for i in range(0, len(clean), 500)]:
        s3.delete_objects(Bucket="pipectl", Delete={"Objects": [{"Key": k} for k in chunk]})
    assert not _listing(s3, "pipectl", "datasets/")
    # The stage's retryStrategy avoids the failed node (affinity.nodeAntiAffinity); this cluster has
    # one node, so the retry must be allowed on the same node.
    custom = _custom(c)
    _apply_templates_for_one_node(c)
    sub = _pipectl(c, "submit", "training", "--output", "json", timeout_s=120)
    assert sub.returncode == 0, sub.stderr
    name = _last_json(sub.stdout)["name"]
    try:
        _kill_stage_mid_copy_and_check(c, core, s3, name, clean)
    finally:
        custom.patch_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name,
                                              {"spec": {"shutdown": "Terminate"}})


def _kill_stage_mid_copy_and_check(c, core, s3, name: str, clean: dict) -> None:
    killed = None
    deadline = time.monotonic() + 300
    victim = None
    while killed is None:
        assert time.monotonic() < deadline, "stage never started copying"
        if victim is None:  # the stage pod, found before it copies anything
            pods = [p for p in core.list_namespaced_pod(
                NS, label_selector=f"workflows.argoproj.io/workflow={name}").items if "-stage-" in p.metadata.name]
            victim = pods[0] if pods else None
        now = _listing(s3, "pipectl", "datasets/")
        assert not any(k.endswith("manifest.json") for k in now), \
            f"stage finished ({len(now)} objects) before it could be killed"
        if victim is not None and now:
            # As a lost node looks: the pod object goes (force delete) and its processes die at
            # once (SIGKILL on the node; a graceful stop would let the fast copy finish).
            core.delete_namespaced_pod(victim.metadata.name, NS, grace_period_seconds=0)
            n_killed = _kill_pod_processes(victim.metadata.uid)
            killed = len(now)
            time.sleep(1)
            print(f"deleted pod {victim.metadata.name}, SIGKILLed {n_killed} of its processes; "
                  f"objects: {killed} when killed, {len(_listing(s3, 'pipectl', 'datasets/'))} 1 s later")
        time.sleep(0.05)
    print(f"stage pod deleted after {killed} of {len(clean)} objects were written")

    def stage_done():
        wf = _custom(c).get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
        nodes = wf.get("status", {}).get("nodes", {}).values()
        stage = [n for n in nodes if n["displayName"] == "stage"]
        assert wf.get("status", {}).get("phase") not in ("Failed", "Error"), wf["status"]
        return stage and stage[0]["phase"] == "Succeeded" and wf
    wf = c.wait_for("stage retried and Succeeded", stage_done, timeout_s=600, interval_s=1)
    attempts = sorted((n["displayName"], n["phase"], n.get("message")) for n in wf["status"]["nodes"].values()
                      if n["type"] == "Pod" and n["displayName"].startswith("stage("))
    print("stage attempts:", attempts)
    # Argo v4 shows a retry either as stage(1) or, for a deleted pod, as stage(0) with a new pod:
    # either way the pod that succeeded is not the one killed.
    pods = [p for p in core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
            if "-stage-" in p.metadata.name]
    print("stage pods now:", [(p.metadata.name, p.metadata.uid, p.status.phase) for p in pods])
    assert pods and all(p.metadata.uid != victim.metadata.uid for p in pods), "the stage did not run again"
    assert any(p.status.phase == "Succeeded" for p in pods)
    after = _listing(s3, "pipectl", "datasets/")
    assert after == clean, (f"{len(set(after) - set(clean))} extra, {len(set(clean) - set(after))} missing, "
                            f"{sum(1 for k in clean if k in after and after[k] != clean[k])} different")



# -- a team's own image --------------------------------------------------------------------------

EXAMPLE = REPO / "examples" / "image-classifier"


def _ran(pod, container: str | None = None) -> tuple[str, str]:
    """(image in the pod spec, imageID the container ran) of ``container`` (default: the first)."""
    spec = next(x for x in pod.spec.containers if container in (None, x.name))
    status = next(x for x in pod.status.container_statuses or [] if x.name == spec.name)
    return spec.image, status.image_id


def test_the_image_classifier_example_trains_in_its_own_image_on_real_pods(services, project, core, tmp_path):
    """examples/image-classifier deployed as its README tells a team: its image, built FROM this
    build's step-train image with the example's own Dockerfile (scripts/images.sh), named by
    SHAPES_IMAGE at `pipectl templates apply pipeline.py:pipeline`; its generated images pushed
    with `pipectl data push`; `pipectl submit pipeline.py:pipeline --wait` with a 2-worker gang and
    2 epochs. The workflow Succeeds; the gang's pods and the evaluate pod ran that image (the pod
    spec, and the container's imageID is this build's Docker image id); the team's train function
    and metric ran; one version of shapes-classifier is in MLflow, from this workflow's run.
    Last in the module: the stage test compares every dataset in the bucket with its own run's."""
    c = project
    image = nd.example_images().get("image-classifier")
    assert image, "no example image recorded in example-images.txt: run scripts/images.sh"
    image_id = subprocess.run([nd.DOCKER, "image", "inspect", "-f", "{{.Id}}", image],
                              capture_output=True, text=True, check=True).stdout.strip()
    data = tmp_path / "shapes-data"
    gen = subprocess.run([sys.executable, "-m", "shapes.generate", str(data), "--per-class", "20"],
                         capture_output=True, text=True, timeout=120, cwd=EXAMPLE)
    assert gen.returncode == 0, gen.stderr
    ceph = services["ceph"]
    push = _pipectl(c, "data", "push", str(data), timeout_s=300, env={
        "PIPECTL_S3_ENDPOINT": ceph.s3_endpoint, "PIPECTL_S3_ACCESS_KEY": ceph.access_key,
        "PIPECTL_S3_SECRET_KEY": ceph.secret_key})
    assert push.returncode == 0, push.stderr
    dataset = push.stdout.split()[-1]
    ref = f"{EXAMPLE / 'pipeline.py'}:pipeline"
    _apply_templates_for_one_node(c, ref, "shapes-training-v1", env={"SHAPES_IMAGE": image})
    t0 = time.monotonic()
    sub = _pipectl(c, "submit", ref, "--wait", "-p", f"dataset-uri={dataset}", "-p", "workers=2",
                   "-p", "processes-per-worker=1", *ONE_NODE_GANG, "-p", "epochs=2", "-p", "promotion-threshold=0",
                   "--output", "json", timeout_s=1200)
    wall = time.monotonic() - t0
    print(sub.stdout[-3000:], sub.stderr[-3000:])
    result = _last_json(sub.stdout)
    name = result["name"]
    _timings_line("example image run (s)", {"workflow": name, "image": image, "wall_s": round(wall, 1),
                                           "phase": result["phase"]})
    wf = _custom(c).get_namespaced_custom_object("argoproj.io", "v1alpha1", NS, "workflows", name)
    steps = {n["displayName"]: n["phase"] for n in wf["status"]["nodes"].values()}
    assert sub.returncode == 0 and result["phase"] == "Succeeded", steps
    assert wf["spec"]["workflowTemplateRef"] == {"name": "shapes-training-v1"}
    assert all(steps.get(s) == "Succeeded" for s in ("stage", "preprocess", "train", "evaluate", "register")), steps

    pods = core.list_namespaced_pod(NS, label_selector=f"workflows.argoproj.io/workflow={name}").items
    gang = sorted((p for p in pods if p.metadata.name.startswith(f"{name}-train-")
                   and (p.metadata.labels or {}).get("pipectl.io/step") == "train"), key=lambda p: p.metadata.name)
    evaluate = [p for p in pods if (p.metadata.annotations or {}).get("workflows.argoproj.io/node-name", "").endswith(".evaluate(0)")]
    ran = {p.metadata.name: _ran(p) for p in gang} | {p.metadata.name: _ran(p, "main") for p in evaluate}
    print("images the pods ran:", json.dumps(ran, indent=1), "this build:", image, image_id)
    assert len(gang) == 2 and len(evaluate) == 1, sorted(ran)
    assert all(p.status.phase == "Succeeded" and p.spec.node_name == nd.NODE_NAME for p in gang + evaluate)
    assert set(ran.values()) == {(image, image_id)}, ran

    rank0 = core.read_namespaced_pod_log(gang[0].metadata.name, NS)
    assert "train function shapes.train:train, its own model" in rank0, rank0[-3000:]
    assert "shapes: weight decay 0.0005, label smoothing 0.1, random flips True" in rank0, rank0[-3000:]
    scored = core.read_namespaced_pod_log(evaluate[0].metadata.name, NS, container="main")
    assert "candidate balanced_accuracy=" in scored, scored[-3000:]  # the team's metric decided

    from mlflow import MlflowClient

    mlflow = MlflowClient(tracking_uri=services["mlflow_url"])
    versions = mlflow.search_model_versions("name='shapes-classifier'")
    print("model versions:", [(v.version, v.run_id) for v in versions])
    assert len(versions) == 1, versions
    assert mlflow.get_run(versions[0].run_id).data.tags.get("pipectl.workflow") == name
