"""The compiled training WorkflowTemplate: structure, parameters, gang manifest (C03, C04, C06)."""

import json

import pytest
import yaml

from pipectl.components.contracts import TrainingParameters
from pipectl.pipelines.substitution import expand_k8s_vars, substitute
from pipectl.pipelines.builtin import build_training
from pipectl.pipelines.training import CompileConfig


@pytest.fixture(scope="module")
def wt():
    return build_training().to_dict()


@pytest.fixture(scope="module")
def argo():
    from tests.tools.argo import ArgoExpr

    evaluator = ArgoExpr()
    yield evaluator
    evaluator.close()


@pytest.fixture(scope="module")
def wt_pytorchjob():
    return build_training(CompileConfig(launcher="pytorchjob")).to_dict()


def _templates(wt):
    return {t["name"]: t for t in wt["spec"]["templates"]}


def _job(wt, **params):
    """The Volcano Job as the API server would receive it after Argo's substitution."""
    values = {f"inputs.parameters.{k}": v for k, v in TrainingParameters().as_arguments().items()}
    values.update({f"inputs.parameters.{k}": v for k, v in params.items()})
    values.update({"inputs.parameters.shards-uri": "s3://b/s/", "inputs.parameters.run-uri": "s3://b/r", "workflow.name": "training-abcde", "retries": "0", "inputs.parameters.gang-affinity": "{}"})
    return yaml.safe_load(substitute(_templates(wt)["train"]["resource"]["manifest"], values, where="test"))


def test_dag_order_is_validate_stage_warm_preprocess_train_evaluate_register(wt):
    dag = _templates(wt)["training"]["dag"]["tasks"]
    assert [t["name"] for t in dag] == ["validate", "stage", "warm", "preprocess", "train", "evaluate", "register"]
    assert [t.get("dependencies") for t in dag] == [None, ["validate"], ["stage"], ["stage", "warm"], ["preprocess"], ["train"], ["evaluate"]]
    # warm runs only when asked; a skipped task still satisfies preprocess's dependencies (Argo)
    assert dag[2]["when"] == "{{workflow.parameters.warm-cache}} == true"
    params = {p["name"]: p for p in wt["spec"]["arguments"]["parameters"]}
    assert params["warm-cache"]["enum"] == ["false", "true"] and params["warm-cache"]["value"] == "false"


@pytest.mark.parametrize(("expr", "expected"), [("false == true", False), ("true == true", True),
                                                ("'a' != \"b\"", True), ("x != x", False)])
def test_local_backend_evaluates_when_like_argo(expr, expected):
    from pipectl.pipelines.substitution import evaluate_when

    assert evaluate_when(expr, "t") is expected


def test_local_backend_refuses_a_when_it_cannot_evaluate():
    from pipectl.pipelines.substitution import TemplateError as LocalBackendError, evaluate_when

    with pytest.raises(LocalBackendError, match="not supported locally"):
        evaluate_when("{{x}} > 3 && y", "t")


def test_every_parameter_is_typed_described_and_defaulted(wt):
    params = {p["name"]: p for p in wt["spec"]["arguments"]["parameters"]}
    assert set(params) == {k.replace("_", "-") for k in TrainingParameters.model_fields}
    for p in params.values():
        assert p.get("description"), p["name"]
        assert "value" in p, p["name"]
    assert params["lane"]["enum"] == ["urgent", "standard", "batch"]
    assert params["promotion-metric"]["enum"] == ["accuracy", "f1_macro"]


def test_containers_set_command_and_read_store_settings_from_configmap_and_secret(wt):
    for name in ("stage", "preprocess", "evaluate", "register"):
        c = _templates(wt)[name]["container"]
        assert c["command"][:2] == ["python", "-m"], name
        refs = [next(iter(e)) for e in c["envFrom"]]
        # evaluate and register: the team's MLflow user too (test_only_pods_that_talk_to_mlflow_get_the_teams_mlflow_user)
        assert refs == ["configMapRef", "secretRef"] + (["secretRef"] if name in ("evaluate", "register") else []), name
        assert not any("SECRET" in str(e.get("value", "")) for e in c.get("env", []))


def test_C03_replicas_and_min_available_are_integers_after_substitution(wt, wt_pytorchjob):
    job = _job(wt, workers="4")
    assert job["spec"]["minAvailable"] == 4
    assert job["spec"]["tasks"][0]["replicas"] == 4
    assert job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 0
    ptj = _job(wt_pytorchjob, workers="4", **{"gpus-per-worker": "8"})
    specs = ptj["spec"]["pytorchReplicaSpecs"]
    assert (specs["Master"]["replicas"], specs["Worker"]["replicas"]) == (1, 3)  # 1 master + 3 workers
    assert ptj["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"] == 4
    assert specs["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_C04_torchrun_counts_processes_not_pods(wt, wt_pytorchjob):
    job = _job(wt, workers="2", **{"processes-per-worker": "4"})
    pod = job["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    cmd = pod["command"]
    assert cmd[:3] == ["python", "-m", "pipectl.components.train.launch"]  # torchrun, exit code kept
    assert "--nnodes=2" in cmd and "--nproc-per-node=4" in cmd  # torchrun: WORLD_SIZE = 2 x 4 = 8
    assert "--node-rank=$(VC_TASK_INDEX)" in cmd  # RANK = node_rank x 4 + local_rank
    # MASTER_ADDR: the rank-0 pod of this job, every pod; the job's name (one per run) comes
    # from the job-name label Volcano puts on its pods, expanded by Kubernetes ($(VAR) of an earlier var)
    name = job["metadata"]["name"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["env"]}
    assert env["PIPECTL_GANG_JOB"] == {"fieldRef": {"fieldPath": "metadata.labels['volcano.sh/job-name']"}}
    assert expand_k8s_vars(env["MASTER_ADDR"], {"PIPECTL_GANG_JOB": name}) == f"{name}-worker-0.{name}"
    ptj = _job(wt_pytorchjob, workers="2", **{"processes-per-worker": "4"})
    for group in ("Master", "Worker"):
        cmd = ptj["spec"]["pytorchReplicaSpecs"][group]["template"]["spec"]["containers"][0]["command"]
        assert "--nnodes=2" in cmd and "--nproc-per-node=4" in cmd and "--node-rank=$(RANK)" in cmd


def test_one_gang_job_per_run_every_attempt_applies_the_same_name(wt, wt_pytorchjob):
    """Every attempt of the train step (retried in place, after a backoff, or after an in-place
    retry of the workflow) applies ONE name per run, so a retried attempt adopts the gang still
    training instead of starting a second one; nothing random, no attempt counter in it."""
    for template in (wt, wt_pytorchjob):
        manifest = _templates(template)["train"]["resource"]["manifest"]
        assert "randAlphaNum" not in manifest and "{{retries}}" not in manifest, manifest
        names = {_job(template)["metadata"]["name"] for _ in range(3)}
        assert names == {"training-abcde-train"}, names


def test_a_run_that_does_not_succeed_releases_its_gang_on_exit(wt, wt_pytorchjob):
    """The exit handler `gang-release` gets the run's name and phase and the launcher's job kind,
    runs as the launcher's ServiceAccount, with no store credentials."""
    for template, kind in ((wt, "batch.volcano.sh/v1alpha1/jobs"), (wt_pytorchjob, "kubeflow.org/v1/pytorchjobs")):
        release = _templates(template)[template["spec"]["onExit"]]
        args = dict(zip(release["container"]["args"][::2], release["container"]["args"][1::2]))
        assert release["container"]["command"] == ["python", "-m", "pipectl.components.gang"]
        assert args == {"--workflow-name": "{{workflow.name}}", "--workflow-status": "{{workflow.status}}",
                        "--namespace": "{{workflow.namespace}}", "--job-kind": kind, "--outputs-dir": "/tmp/outputs"}
        assert release["serviceAccountName"] == "pipectl-launcher" and "envFrom" not in release["container"]


def test_the_release_step_leaves_a_succeeded_run_alone(monkeypatch):
    """A Succeeded run's gang completed: the step returns without calling the API server."""
    from pipectl.components.contracts import ReleaseInput, StoreSettings
    from pipectl.components.gang import step

    called = []
    monkeypatch.setattr(step, "_api_client", lambda: called.append(1))  # a Succeeded run never reaches the API
    inp = ReleaseInput(workflow_name="t-1", workflow_status="Succeeded", namespace="pipectl", job_kind="batch.volcano.sh/v1alpha1/jobs")
    step.run(inp, StoreSettings())
    assert called == []


def test_the_launcher_pod_lives_as_long_as_the_training(wt):
    """The train step's own pod (argoexec applying the job, then waiting) is kept from voluntary
    disruption and runs at its lane's priority with its lane's toleration, as the gang does."""
    train = _templates(wt)["train"]
    assert train["metadata"]["annotations"] == {"karpenter.sh/do-not-disrupt": "true",
                                                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert train["priorityClassName"] == "pipectl-{{inputs.parameters.lane}}"
    assert train["tolerations"] == [{"key": "pipectl.io/lane", "operator": "Equal", "value": "{{inputs.parameters.lane}}",
                                     "effect": "NoSchedule"}]


def test_C06_training_and_preprocess_pods_mount_memory_backed_shm(wt):
    pod = _job(wt)["spec"]["tasks"][0]["template"]["spec"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pod["containers"][0]["volumeMounts"]
    assert {v["name"]: v for v in pod["volumes"]}["dshm"]["emptyDir"]["medium"] == "Memory"
    pre = _templates(wt)["preprocess"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in pre["container"]["volumeMounts"]
    assert {v["name"]: v for v in pre["volumes"]}["dshm"]["emptyDir"]["medium"] == "Memory"


def test_gang_job_is_owned_labelled_and_not_evictable_by_the_autoscaler(wt):
    res = _templates(wt)["train"]["resource"]
    assert res["setOwnerReference"] is True
    assert res["action"] == "apply"  # idempotent: argoexec's transient-error retry must not hit AlreadyExists
    job = _job(wt, lane="urgent")
    assert job["spec"]["queue"] == "pipectl-urgent"
    assert job["spec"]["schedulerName"] == "volcano"
    meta = job["spec"]["tasks"][0]["template"]["metadata"]
    assert meta["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    assert meta["labels"]["workflows.argoproj.io/workflow"] == "training-abcde"


def test_C02_conditions_match_terminal_states_only(wt):
    res = _templates(wt)["train"]["resource"]
    assert res["successCondition"] == "status.state.phase == Completed"
    for transient in ("Pending", "Running", "Restarting", "Completing"):
        assert transient not in res["failureCondition"]


def _volcano_action(job: dict, event: str, exit_code: int | None) -> str:
    """Volcano v1.10's applyPolicies (pkg/controllers/job/job_controller_util.go) for job-level
    policies: the first policy whose event list holds the event, or whose exitCode equals the
    pod's, decides; none -> SyncJob."""
    for policy in job["spec"].get("policies", []):
        events = policy.get("events", []) + ([policy["event"]] if "event" in policy else [])
        if event in events or "*" in events:
            return policy["action"]
        if policy.get("exitCode") is not None and policy["exitCode"] == exit_code:
            return policy["action"]
    return "SyncJob"


@pytest.mark.parametrize(("event", "exit_code", "action"), [
    ("PodEvicted", None, "RestartJob"),     # preempted, drained, scaled down, node deleted (pod deleted)
    ("PodFailed", 75, "RestartJob"),        # EX_TEMPFAIL kept by the launcher
    ("PodFailed", 143, "RestartJob"),       # SIGTERM from the kubelet (node shutdown)
    # C07: the kubelet's node-pressure eviction leaves the pod Failed (not deleted), its
    # container SIGKILLed (137) or with no terminated state (Volcano reads exit code 0); a preemption
    # past its grace period the same (137); an admission rejection after a node restart: no exit code
    ("PodFailed", 137, "RestartJob"),
    ("PodFailed", 0, "RestartJob"),
    ("PodFailed", 1, "TerminateJob"),       # the code (the launcher maps every code failure to 1, an OOM kill too)
    ("PodFailed", 127, "TerminateJob"),     # the image cannot run the command
])
def test_gang_restarts_whole_for_infrastructure_and_ends_for_code(wt, event, exit_code, action):
    job = _job(wt)
    assert _volcano_action(job, event, exit_code) == action
    assert job["spec"]["maxRetry"] == CompileConfig().retry.infra_limit + 1  # Volcano counts runs (C17)


def _pods(job: dict) -> list[dict]:
    if job["kind"] == "Job":
        return [t["template"] for t in job["spec"]["tasks"]]
    return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]


def test_C07_gang_pods_are_guaranteed_qos_never_best_effort(wt, wt_pytorchjob):
    """Every gang pod requests CPU and memory, equal to its limits (Guaranteed QoS: the kubelet
    evicts BestEffort first, then Burstable), from typed parameters; GPUs stay limits."""
    for tmpl, launcher in ((wt, "volcano"), (wt_pytorchjob, "pytorchjob")):
        for params, (cpu, mem) in (({}, ("2.0", "8Gi")), ({"cpu-per-worker": "0.5", "memory-gib-per-worker": "3"}, ("0.5", "3Gi"))):
            for pod in _pods(_job(tmpl, workers="2", **params)):
                res = pod["spec"]["containers"][0]["resources"]
                assert res["requests"] == {"cpu": cpu, "memory": mem}, (launcher, res)
                assert {k: res["limits"][k] for k in ("cpu", "memory")} == res["requests"], (launcher, res)
                assert res["limits"]["nvidia.com/gpu"] == 0


def test_gang_pods_are_told_to_stop_through_a_process_that_is_not_pid_1(wt, wt_pytorchjob):
    """Gang pods share their pod's PID namespace (the launcher is not PID 1, which would drop a
    SIGTERM that comes before it has a handler) and give the gang its grace period to checkpoint."""
    from pipectl.components.train.preemption import GRACE_PERIOD_S

    for tmpl in (wt, wt_pytorchjob):
        for pod in _pods(_job(tmpl, workers="2")):
            assert pod["spec"]["shareProcessNamespace"] is True
            assert pod["spec"]["terminationGracePeriodSeconds"] == GRACE_PERIOD_S
            env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in pod["spec"]["containers"][0]["env"]}
            # the verdicts name a slow rank's node and pod
            assert (env["PIPECTL_NODE_NAME"], env["PIPECTL_POD_NAME"]) == ("spec.nodeName", "metadata.name")


def test_C07_step_and_executor_containers_request_cpu_and_memory(wt):
    """No pod the pipeline creates is BestEffort: step containers request CPU and memory, and the
    controller configuration gives Argo's executor containers (init, wait, resource pods) requests."""
    from pipectl.pipelines.manifests import controller_config
    from pipectl.pipelines.training import CompileConfig

    for t in wt["spec"]["templates"]:
        if "container" in t:
            assert set(t["container"]["resources"]["requests"]) == {"cpu", "memory"}, t["name"]
    cm = controller_config(CompileConfig())[0]
    assert set(yaml.safe_load(cm["data"]["executor"])["resources"]["requests"]) == {"cpu", "memory"}


def test_service_accounts_least_privilege(wt, wt_pytorchjob):
    """Step pods, the train step's resource pod and the gang's pods each run as their own
    ServiceAccount; the launcher's Role names only the gang job kind in use; no wildcard; the gang's
    pods mount no token."""
    from pipectl.pipelines.manifests import rbac
    from pipectl.pipelines.training import CompileConfig

    for tmpl, launcher, kind in ((wt, "volcano", ("batch.volcano.sh", "jobs")), (wt_pytorchjob, "pytorchjob", ("kubeflow.org", "pytorchjobs"))):
        cfg = CompileConfig(launcher=launcher)
        objs = rbac(cfg)
        roles = {o["metadata"]["name"]: o["rules"] for o in objs if o["kind"] == "Role"}
        assert roles[cfg.service_account] == [{"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]}]
        assert roles[cfg.launcher_service_account][1:] == [
            {"apiGroups": [kind[0]], "resources": [kind[1]], "verbs": ["create", "get", "patch", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
        assert cfg.training_service_account not in roles
        assert "*" not in yaml.safe_dump(roles)
        train = _templates(tmpl)["train"]
        assert train["serviceAccountName"] == cfg.launcher_service_account
        assert tmpl["spec"]["serviceAccountName"] == cfg.service_account
        for pod in _pods(_job(tmpl, workers="2")):
            assert pod["spec"]["serviceAccountName"] == cfg.training_service_account
            assert pod["spec"]["automountServiceAccountToken"] is False


def test_every_pod_meets_the_restricted_pod_security_standard(wt, wt_pytorchjob):
    """The fields the "restricted" Pod Security Standard checks, for step pods (workflow
    securityContext + each container), the gang's pods (both launchers), Argo's executor containers
    (controller configuration), and the namespace enforcing it. The API server's PodSecurity
    admission checks the same on the test clusters (the whole pipeline runs under enforcement)."""
    from pipectl.pipelines.manifests import controller_config, namespace
    from pipectl.pipelines.training import CompileConfig

    def restricted_container(sc):
        assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"], sc
        assert sc.get("privileged") in (None, False)

    pod_sc = wt["spec"]["securityContext"]
    assert pod_sc["runAsNonRoot"] is True and pod_sc["seccompProfile"]["type"] == "RuntimeDefault"
    for t in wt["spec"]["templates"]:
        if "container" in t:
            restricted_container(t["container"]["securityContext"])
            assert t["container"]["securityContext"]["readOnlyRootFilesystem"] is True
            assert {"name": "tmp", "mountPath": "/tmp"} in t["container"]["volumeMounts"]
    for tmpl in (wt, wt_pytorchjob):
        for pod in _pods(_job(tmpl, workers="2")):
            spec = pod["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
            assert not {"hostNetwork", "hostPID", "hostIPC"} & set(spec)
            for c in spec["containers"]:
                restricted_container(c["securityContext"])
            assert all(set(v) - {"name"} <= {"emptyDir", "configMap", "secret", "projected"} for v in spec["volumes"])
    restricted_container(yaml.safe_load(controller_config(CompileConfig())[0]["data"]["executor"])["securityContext"])
    assert namespace(CompileConfig())[0]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_images_from_a_registry_by_digest_or_content_tag():
    """Step images from a configurable registry, pinned per image by digest or content
    tag, in the step templates AND inside the gang manifest (a string kustomize cannot rewrite)."""
    import subprocess
    import sys
    from pathlib import Path

    digest = "sha256:" + "ab" * 32
    pipectl = str(Path(sys.executable).parent / "pipectl")
    r = subprocess.run([pipectl, "render", "training", "--registry", "registry.example.com/ml", "--image", f"step-light={digest}",
                        "--image", "step-train=c-0123456789abcdef"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    wt = yaml.safe_load(r.stdout)
    images = {t["name"]: t["container"]["image"] for t in wt["spec"]["templates"] if "container" in t}
    assert images["stage"] == f"registry.example.com/ml/step-light@{digest}"
    assert images["preprocess"] == "registry.example.com/ml/step-train:c-0123456789abcdef"
    train = next(t for t in wt["spec"]["templates"] if t["name"] == "train")
    assert "image: registry.example.com/ml/step-train:c-0123456789abcdef" in train["resource"]["manifest"]
    for bad in ("step-light=latest", "step-gpu=c-1", "step-train"):
        r = subprocess.run([pipectl, "render", "training", "--image", bad], capture_output=True, text=True)
        assert r.returncode == 2 and r.stdout == "", (bad, r.stderr)


def test_the_argo_ui_link_opens_the_workflows_mlflow_run(wt):
    """The controller config's link reads the run id from the workflow's outputs: evaluate exports
    mlflow-run-id (globalName), and it is the workflow's only output (the link takes the first)."""
    from pipectl.pipelines.manifests import MLFLOW_URI, controller_config
    from pipectl.pipelines.training import CompileConfig

    exported = [(t["name"], p["globalName"]) for t in wt["spec"]["templates"]
                for p in (t.get("outputs") or {}).get("parameters", []) if p.get("globalName")]
    assert exported == [("evaluate", "mlflow-run-id")], exported
    links = yaml.safe_load(controller_config(CompileConfig())[0]["data"]["links"])
    assert links == [{"name": "MLflow run", "scope": "workflow", "url": MLFLOW_URI + "/#/runs/${workflow.status.outputs.parameters.0.value}"}]


def test_shared_settings_change_nothing_per_workflow_for_other_tenants(wt):
    """Pod GC and TTL are the WorkflowTemplate's own (a user pipeline's too), the workflow
    parallelism a label of pipectl's own namespace: the Argo controller's ConfigMap, which every
    tenant's workflows read, holds only the keys that have no per-workflow or per-namespace form,
    and none of its workflow defaults or namespace-wide limits."""
    from pipectl.pipelines.manifests import ARGO_PARALLELISM_LABEL, controller_config, namespace
    from pipectl.pipelines.training import CompileConfig
    from pipectl.sdk import Pipeline, evaluate, preprocess, register, stage, train

    user = Pipeline("mine", [stage(), preprocess(), train(), evaluate(), register()]).build().to_dict()
    for tmpl in (wt, user):
        assert tmpl["spec"]["podGC"] == {"strategy": "OnPodSuccess", "deleteDelayDuration": "10m"}
        assert tmpl["spec"]["ttlStrategy"] == {"secondsAfterSuccess": 86400, "secondsAfterFailure": 604800}
    data = controller_config(CompileConfig())[0]["data"]
    assert set(data) == {"metricsConfig", "executor", "links"}, sorted(data)
    ns = next(o for o in namespace(CompileConfig()) if o["kind"] == "Namespace")
    assert ns["metadata"]["labels"][ARGO_PARALLELISM_LABEL] == "50"


def test_C10_the_lane_slot_is_held_per_attempt_and_the_backoff_is_outside_it(wt, argo):
    """C10: Argo keeps a template's locks under its retry node through every backoff (argo-workflows
    #9875), so the semaphore and the backoff sit on separate templates: the train task runs the
    DAG ``train-retry``: the resource template ``train`` (lane semaphore, timeout, in-place retries
    without backoff) and, after an Error, ``train-backoff``: a ``train-wait`` suspend of the
    policy's delay, then ``train-retry`` again with ``retries`` + 1, until ``infra_limit``. Every
    step input is passed through; ``{{retries}}`` in the job name is ``train``'s own. The delay and
    counter expressions are evaluated with Argo's own code for each retry."""
    from pipectl.pipelines.launchers.base import TRAIN_STEP_INPUTS
    from pipectl.pipelines.policy import RetryPolicy

    t = _templates(wt)
    task = next(x for x in t["training"]["dag"]["tasks"] if x["name"] == "train")
    assert task["template"] == "train-retry"
    step, backoff, inner = t["train-retry"], t["train-backoff"], t["train"]
    assert not any("retryStrategy" in x or "synchronization" in x for x in (step, backoff, t["train-wait"]))
    attempt, retry, reroute = step["dag"]["tasks"]
    assert (attempt["template"], attempt["continueOn"], retry["template"], retry["dependencies"]) == (
        "train", {"error": True, "failed": True}, "train-backoff", ["train"])
    # a Failed attempt: gang-avoid (the one leaf: it depends on retry, so the DAG's phase is its branch's)
    assert (reroute["template"], reroute["dependencies"], reroute["when"]) == ("train-reroute", ["retry"], "{{tasks.train.status}} == Failed")
    names = {n.replace("_", "-") for n in TRAIN_STEP_INPUTS} | {"gang-affinity"}
    passed = {p["name"]: p["value"] for p in attempt["arguments"]["parameters"]}
    assert passed == {n: "{{inputs.parameters.%s}}" % n for n in names}
    assert {p["name"] for p in inner["inputs"]["parameters"]} == names
    assert inner["synchronization"]["semaphores"][0]["configMapKeyRef"]["key"] == "{{inputs.parameters.lane}}"
    assert "backoff" not in inner["retryStrategy"] and inner["timeout"]
    assert t["train-wait"]["suspend"]["duration"] == "{{inputs.parameters.delay}}"
    wait, nxt = backoff["dag"]["tasks"]
    assert nxt["template"] == "train-retry" and nxt["dependencies"] == ["wait"]
    delays, seen = RetryPolicy().delays_s(), []
    for r in range(len(delays)):
        counters = [p for p in nxt["arguments"]["parameters"] if p["name"] in ("retries", "retry-on")]
        args = argo.substitute({"w": wait["arguments"]["parameters"], "n": counters}, {"inputs.parameters.retries": str(r)}, strict=True)
        nxt_args = {p["name"]: p["value"] for p in args["n"]}
        seen.append((int(args["w"][0]["value"]), nxt_args["retries"], nxt_args["retry-on"]))
    assert seen == [(d, str(r + 1), "Error" if r + 1 < len(delays) else "none") for r, d in enumerate(delays)]


def test_C10_lint_refuses_a_semaphore_held_through_a_backoff(wt):
    """The shape before C10 (semaphore and backoff on one template) is a lint finding; the register
    step's per-model mutex with its backoff (C08) is not."""
    import copy

    from pipectl.pipelines.lint import lint_objects
    from pipectl.pipelines.policy import RetryPolicy

    assert not [f for f in lint_objects([("test", wt)]) if "backoff" in f.message]
    assert "mutexes" in _templates(wt)["register"]["synchronization"] and _templates(wt)["register"]["retryStrategy"]["backoff"]
    before = copy.deepcopy(wt)
    _templates(before)["train"]["retryStrategy"] = RetryPolicy().build().model_dump(by_alias=True, exclude_none=True, mode="json")
    (finding,) = [f for f in lint_objects([("test", before)]) if "backoff" in f.message]
    assert "'train' holds a semaphore through its retry backoff" in finding.message


def test_only_steps_that_use_the_store_get_its_credentials(wt):
    """The store's Secret (and settings) reach the pods of the steps that read or write the store;
    validate (parameters only) and gang-release (the Kubernetes API only) get neither."""
    from pipectl.components.names import STORE_SECRET

    with_secret = {t["name"] for t in wt["spec"]["templates"]
                   if any(e.get("secretRef", {}).get("name") == STORE_SECRET for e in t.get("container", {}).get("envFrom", []))}
    assert with_secret == {"stage", "warm", "preprocess", "evaluate", "register"}, with_secret
    containers = {t["name"] for t in wt["spec"]["templates"] if "container" in t}
    assert {"validate", "gang-release"} <= containers - with_secret


def _env_from_secrets(node) -> list[list[str]]:
    """The Secret names of every ``envFrom`` list in ``node`` (a manifest), one list per container."""
    if isinstance(node, dict):
        found = [[e["secretRef"]["name"] for e in node["envFrom"] if "secretRef" in e]] if "envFrom" in node else []
        return found + [x for v in node.values() for x in _env_from_secrets(v)]
    return [x for v in node for x in _env_from_secrets(v)] if isinstance(node, list) else []


@pytest.mark.parametrize("launcher", ["volcano", "pytorchjob"])
def test_only_pods_that_talk_to_mlflow_get_the_teams_mlflow_user(launcher):
    """The team's MLflow credentials (Secret pipectl-mlflow-credentials, optional: an MLflow without
    auth needs none) reach evaluate, register and every gang pod (rank 0 logs the run), as the
    user MLflow's client reads from MLFLOW_TRACKING_USERNAME/PASSWORD; no other step gets them."""
    from pipectl.components.names import MLFLOW_SECRET

    wt = build_training(CompileConfig(launcher=launcher)).to_dict()
    with_user = {t["name"] for t in wt["spec"]["templates"]
                 if any(e.get("secretRef", {}).get("name") == MLFLOW_SECRET for e in t.get("container", {}).get("envFrom", []))}
    assert with_user == {"evaluate", "register"}, with_user
    for t in wt["spec"]["templates"]:
        for e in t.get("container", {}).get("envFrom", []):
            if e.get("secretRef", {}).get("name") == MLFLOW_SECRET:
                assert e["secretRef"]["optional"] is True
    gang = _env_from_secrets(_job(wt))
    assert gang and all(names == ["pipectl-s3-credentials", MLFLOW_SECRET] for names in gang), gang


def test_pipectls_runner_goes_in_front_of_the_users_own_torchrun_code():
    """The launcher's torchrun arguments for a user's target: the same gang and port, the target
    run by pipectl's runner in each process (it times the ring when the run asks for it and ends
    the process cleanly) — whatever the gang's size; unchanged for pipectl's own train function
    (it does both itself) and for a target that is not Python (``--no-python``)."""
    from pipectl.components.train.launch import with_runner

    gang = ["--nnodes=2", "--node-rank=1", "--nproc-per-node=2", "--master-addr=10.0.0.5", "--master-port=29500"]
    pre = ["-m", "pipectl.components.train.runner"]
    assert with_runner([*gang, "-m", "mypkg.train", "--lr", "0.1"]) == [*gang, *pre, "-m", "mypkg.train", "--lr", "0.1"]
    assert with_runner([*gang, "--module", "mypkg.train"]) == [*gang, *pre, "-m", "mypkg.train"]
    assert with_runner(["--master-port", "29500", "--nnodes", "3", "train.py", "-x"]) == [
        "--master-port", "29500", "--nnodes", "3", *pre, "train.py", "-x"]
    assert with_runner(["--standalone", "--nproc-per-node=4", "train.py"]) == ["--standalone", "--nproc-per-node=4", *pre, "train.py"]
    assert with_runner(["--nnodes=1", "--nproc-per-node=1", "train.py"]) == ["--nnodes=1", "--nproc-per-node=1", *pre, "train.py"]
    own = [*gang, "-m", "pipectl.components.train", "--epochs", "1"]
    assert with_runner(own) == own
    wrapped = [*gang, *pre, "train.py"]
    assert with_runner(wrapped) == wrapped
    assert with_runner([*gang, "--no-python", "./train.sh"]) == [*gang, "--no-python", "./train.sh"]


def test_every_pod_writes_to_disk_within_a_size_limit(wt):
    """Every emptyDir of the compiled template (the steps' /tmp, the gang's /tmp and /dev/shm) has a
    sizeLimit: a step that writes more is evicted, the node's other tenants keep their disk."""
    import re

    from pipectl.pipelines.training import CompileConfig

    text = json.dumps(wt)
    dirs = re.findall(r'\\?"emptyDir\\?": (\{[^}]*\})', text)
    assert dirs and all("sizeLimit" in d for d in dirs), dirs
    assert f'"sizeLimit": "{CompileConfig().step_tmp_gib}Gi"' in text
    manifest = next(t for t in wt["spec"]["templates"] if t["name"] == "train")["resource"]["manifest"]
    assert manifest.count("sizeLimit") >= 2  # /dev/shm and /tmp of the gang's pods
