"""The local backend on small compiled workflows whose steps are real processes."""


import pytest

from pipectl.pipelines.backends.runner import LocalBackendError, LocalRunner
from pipectl.pipelines.substitution import TemplateError, expand_k8s_vars, substitute


def test_substitute_and_unknown_tags():
    assert substitute("a-{{x}}-{{ y }}", {"x": "1", "y": "2"}, where="t") == "a-1-2"
    with pytest.raises(TemplateError, match=r"cannot resolve \{\{z\}\}"):
        substitute("{{z}}", {}, where="t")


def test_kubernetes_var_expansion():
    env = {"A": "1"}
    assert expand_k8s_vars("--x=$(A) $(B) $$(A)", env) == "--x=1 $(B) $(A)"


def _wf(tasks, templates, params=None):
    return {
        "metadata": {"name": "demo-v1"},
        "spec": {
            "entrypoint": "main",
            "arguments": {"parameters": params or []},
            "templates": [{"name": "main", "dag": {"tasks": tasks}}, *templates],
        },
    }


ECHO = {
    "name": "echo",
    "inputs": {"parameters": [{"name": "text"}]},
    "container": {
        "image": "x",
        "command": ["python", "-c"],
        "args": ["import sys, os; os.makedirs(sys.argv[2], exist_ok=True); "
                 "open(sys.argv[2] + '/out', 'w').write(sys.argv[1].upper())",
                 "{{inputs.parameters.text}}", "/tmp/outputs"],
    },
    "outputs": {"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/outputs/out"}}]},
}


def test_outputs_flow_between_tasks_in_dependency_order(tmp_path):
    wf = _wf(
        [
            {"name": "b", "template": "echo", "dependencies": ["a"], "arguments": {"parameters": [{"name": "text", "value": "{{tasks.a.outputs.parameters.out}}-b"}]}},
            {"name": "a", "template": "echo", "arguments": {"parameters": [{"name": "text", "value": "{{workflow.parameters.greeting}}"}]}},
        ],
        [ECHO],
        [{"name": "greeting", "value": "hi"}],
    )
    result = LocalRunner(wf, {"greeting": "hey"}, {}, tmp_path / "runs").run()
    assert result.phase == "Succeeded"
    assert [n.task for n in result.nodes] == ["a", "b"]
    assert result.node("b").outputs["out"] == "HEY-B"


def test_a_failing_step_stops_the_workflow(tmp_path):
    fail = {"name": "fail", "container": {"image": "x", "command": ["python", "-c", "raise SystemExit(75)"]}}
    wf = _wf([{"name": "a", "template": "fail"}, {"name": "b", "template": "fail", "dependencies": ["a"]}], [fail])
    result = LocalRunner(wf, {}, {}, tmp_path).run()
    assert result.phase == "Failed"
    assert [(n.task, n.exit_code) for n in result.nodes] == [("a", 75)]


def test_unknown_parameter_and_enum_violation_are_refused(tmp_path):
    wf = _wf([], [], [{"name": "lane", "value": "standard", "enum": ["urgent", "standard", "batch"]}])
    with pytest.raises(LocalBackendError, match="unknown workflow parameters: nope"):
        LocalRunner(wf, {"nope": "1"}, {}, tmp_path)
    with pytest.raises(LocalBackendError, match="not in"):
        LocalRunner(wf, {"lane": "superurgent"}, {}, tmp_path)


def test_dependency_cycle_is_an_error(tmp_path):
    wf = _wf(
        [{"name": "a", "template": "x", "dependencies": ["b"]}, {"name": "b", "template": "x", "dependencies": ["a"]}],
        [{"name": "x", "container": {"command": ["true"]}}],
    )
    with pytest.raises(LocalBackendError, match="cycle"):
        LocalRunner(wf, {}, {}, tmp_path).run()


def test_volcano_job_runs_every_pod_with_its_task_index(tmp_path):
    manifest = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: "{{workflow.name}}-j"}
spec:
  minAvailable: {{inputs.parameters.n}}
  tasks:
  - name: worker
    replicas: {{inputs.parameters.n}}
    template:
      spec:
        containers:
        - name: c
          command: [python, -c, "import os,sys; open(sys.argv[1] + '/pod-' + os.environ['VC_TASK_INDEX'], 'w').write(os.environ['MASTER_ADDR'])", "%s"]
          env:
          - {name: MASTER_ADDR, value: "{{workflow.name}}-j-worker-0.{{workflow.name}}-j"}
""" % tmp_path
    tmpl = {"name": "gang", "inputs": {"parameters": [{"name": "n"}]}, "resource": {"action": "create", "manifest": manifest}}
    wf = _wf([{"name": "g", "template": "gang", "arguments": {"parameters": [{"name": "n", "value": "3"}]}}], [tmpl])
    result = LocalRunner(wf, {}, {}, tmp_path / "runs").run()
    assert result.phase == "Succeeded", result.node("g").log_path.read_text()
    assert sorted(p.name for p in tmp_path.glob("pod-*")) == ["pod-0", "pod-1", "pod-2"]
    assert (tmp_path / "pod-2").read_text() == "127.0.0.1"


def test_declared_transient_failure_is_retried_within_the_limit(tmp_path):
    marker = tmp_path / "first-attempt-done"
    flaky = {
        "name": "flaky",
        "retryStrategy": {"limit": 2},
        "container": {"command": ["python", "-c", f"import os, sys; p = {str(marker)!r}; "
                                  "sys.exit(0) if os.path.exists(p) else (open(p, 'w').close(), sys.exit(75))"]},
    }
    code_bug = {"name": "bug", "retryStrategy": {"limit": 2}, "container": {"command": ["python", "-c", "raise SystemExit(1)"]}}
    ok = LocalRunner(_wf([{"name": "a", "template": "flaky"}], [flaky]), {}, {}, tmp_path / "r1").run()
    assert ok.phase == "Succeeded" and ok.node("a").attempts == 2
    bad = LocalRunner(_wf([{"name": "a", "template": "bug"}], [code_bug]), {}, {}, tmp_path / "r2").run()
    assert bad.phase == "Failed" and bad.node("a").attempts == 1  # exit 1 is a code failure: never retried


def test_pytorchjob_runs_master_and_workers_with_operator_env(tmp_path):
    manifest = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: "{{workflow.name}}-t-{{retries}}"}
spec:
  runPolicy: {schedulingPolicy: {minAvailable: {{inputs.parameters.n}}}}
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      template: {spec: {containers: [{name: c, command: [python, -c, "%(code)s", "%(dir)s"]}]}}
    Worker:
      replicas: {{=asInt(inputs.parameters.n) - 1}}
      template: {spec: {containers: [{name: c, command: [python, -c, "%(code)s", "%(dir)s"]}]}}
""" % {"code": "import os,sys; open(sys.argv[1] + '/rank-' + os.environ['RANK'], 'w').write(os.environ['WORLD_SIZE'] + ' ' + os.environ['MASTER_ADDR'])",
       "dir": tmp_path}
    tmpl = {"name": "gang", "inputs": {"parameters": [{"name": "n"}]}, "resource": {"action": "create", "manifest": manifest}}
    wf = _wf([{"name": "g", "template": "gang", "arguments": {"parameters": [{"name": "n", "value": "3"}]}}], [tmpl])
    result = LocalRunner(wf, {}, {}, tmp_path / "runs").run()
    assert result.phase == "Succeeded", result.node("g").log_path.read_text()
    assert sorted(p.name for p in tmp_path.glob("rank-*")) == ["rank-0", "rank-1", "rank-2"]
    assert (tmp_path / "rank-2").read_text() == "3 127.0.0.1"
    assert result.node("g").message.startswith("PyTorchJob ") and result.node("g").message.endswith("(3 pods)")


def test_expression_tags_and_their_limits():
    assert substitute("{{=asInt(inputs.parameters.n) - 1}}", {"inputs.parameters.n": "4"}, where="t") == "3"
    assert substitute("{{=asInt(a) * 2 + 1}}", {"a": "4"}, where="t") == "9"
    with pytest.raises(TemplateError, match="beyond what the local backend evaluates"):
        substitute("{{=sprig.upper(a)}}", {"a": "x"}, where="t")


# ---------------------------------------------------------------- resume

COUNT = {
    "name": "count",
    "inputs": {"parameters": [{"name": "text"}, {"name": "log"}]},
    "container": {
        "image": "x",
        "command": ["python", "-c"],
        "args": ["import sys, os; open(sys.argv[2], 'a').write('ran\\n'); os.makedirs(sys.argv[3], exist_ok=True); "
                 "open(sys.argv[3] + '/out', 'w').write(sys.argv[1] + '+')",
                 "{{inputs.parameters.text}}", "{{inputs.parameters.log}}", "/tmp/outputs"],
    },
    "outputs": {"parameters": [{"name": "out", "valueFrom": {"path": "/tmp/outputs/out"}}]},
}


def _chain(tmp_path, flaky_marker):
    """a -> b -> c; b fails (exit 1) while ``flaky_marker`` is missing; each task appends to <task>.log."""
    flaky = {**COUNT, "name": "flaky", "container": {**COUNT["container"], "args": [
        f"import os, sys; os.path.exists({str(flaky_marker)!r}) or sys.exit(1); " + COUNT["container"]["args"][0], *COUNT["container"]["args"][1:]]}}

    def task(name, template, text, deps=()):
        return {"name": name, "template": template, "dependencies": list(deps), "arguments": {"parameters": [
            {"name": "text", "value": text}, {"name": "log", "value": str(tmp_path / f"{name}.log")}]}}

    return _wf([task("a", "count", "{{workflow.parameters.greeting}}"),
                task("b", "flaky", "{{tasks.a.outputs.parameters.out}}", ["a"]),
                task("c", "count", "{{tasks.b.outputs.parameters.out}}", ["b"])],
               [COUNT, flaky], [{"name": "greeting", "value": "hi"}])


def test_a_resumed_run_skips_succeeded_tasks_and_feeds_their_recorded_outputs(tmp_path):
    """The record (run.json) keeps each finished task's outputs; resuming runs only what
    did not succeed, under the same workflow name and uid, and c sees a's output through b."""
    from pipectl.pipelines.backends.runner import RunRecord

    marker = tmp_path / "fixed"
    wf = _chain(tmp_path, marker)
    first = LocalRunner(wf, {"greeting": "yo"}, {}, tmp_path / "runs").run()
    assert first.phase == "Failed" and [n.task for n in first.nodes] == ["a", "b"]
    record = RunRecord.load(first.workdir / "run.json")
    assert record.phase == "Failed" and record.tasks["a"]["outputs"] == {"out": "yo+"} and record.tasks["b"]["phase"] == "Failed"

    marker.touch()
    second = LocalRunner(wf, {"greeting": "yo"}, {}, tmp_path / "runs", resume=record).run()
    assert second.phase == "Succeeded" and (second.workflow_name, second.workflow_uid) == (first.workflow_name, first.workflow_uid)
    assert [(n.task, n.reused) for n in second.nodes] == [("a", True), ("b", False), ("c", False)]
    assert second.node("c").outputs["out"] == "yo+++"
    assert (tmp_path / "a.log").read_text() == "ran\n"  # a ran once, in the first execution
    assert (tmp_path / "b.log").read_text() == "ran\n"  # b's first execution failed before writing
    after = RunRecord.load(first.workdir / "run.json")
    assert after.phase == "Succeeded" and after.executions == 2
    assert [e["execution"] for e in after.tasks["a"]["executions"]] == [1]
    assert [(e["execution"], e["phase"]) for e in after.tasks["b"]["executions"]] == [(1, "Failed"), (2, "Succeeded")]
    assert (first.workdir / "b.resume1" / "main.log").exists()  # the resumed execution's own folder


def test_resume_with_other_parameters_or_template_is_refused(tmp_path):
    from pipectl.pipelines.backends.runner import RunRecord

    wf = _chain(tmp_path, tmp_path / "never")
    first = LocalRunner(wf, {"greeting": "yo"}, {}, tmp_path / "runs").run()
    record = RunRecord.load(first.workdir / "run.json")
    with pytest.raises(LocalBackendError, match=r"other parameters: greeting='yo' \(now 'hey'\)"):
        LocalRunner(wf, {"greeting": "hey"}, {}, tmp_path / "runs", resume=record)
    with pytest.raises(LocalBackendError, match="another compiled workflow"):
        LocalRunner(_chain(tmp_path, tmp_path / "other"), {"greeting": "yo"}, {}, tmp_path / "runs", resume=record)


def test_an_interrupted_run_is_recorded_as_interrupted(tmp_path):
    """Ctrl-C (KeyboardInterrupt) during task b: the record says Interrupted, b Interrupted, a's outputs kept."""
    from pipectl.pipelines.backends.runner import RunRecord

    def on_event(kind, task, node):
        if kind == "start" and task == "b":
            raise KeyboardInterrupt

    runner = LocalRunner(_chain(tmp_path, tmp_path / "fixed"), {}, {}, tmp_path / "runs", on_event)
    with pytest.raises(KeyboardInterrupt):
        runner.run()
    record = RunRecord.load(runner.workdir / "run.json")
    assert record.phase == "Interrupted" and record.tasks["a"]["outputs"] == {"out": "hi+"}
    assert record.tasks["b"]["phase"] == "Interrupted"


def test_a_dag_template_as_a_task_runs_its_tasks_with_its_inputs(tmp_path):
    """The train step's shape (training.py train-retry): a DAG template around a leaf template,
    inputs passed through; the inner task named like the outer one uses its folder."""
    inner = {"name": "wrap", "inputs": {"parameters": [{"name": "text"}]},
             "dag": {"tasks": [{"name": "t", "template": "echo", "arguments": {"parameters": [
                 {"name": "text", "value": "{{inputs.parameters.text}}-in"}]}}]},
             "outputs": {"parameters": [{"name": "out", "valueFrom": {"parameter": "{{tasks.t.outputs.parameters.out}}"}}]}}
    wf = _wf([{"name": "t", "template": "wrap", "arguments": {"parameters": [{"name": "text", "value": "x"}]}}], [inner, ECHO])
    result = LocalRunner(wf, {}, {}, tmp_path / "runs").run()
    assert result.phase == "Succeeded", result.node("t").message
    assert result.node("t").outputs == {"out": "X-IN"}
    assert (result.workdir / "t" / "outputs" / "out").read_text() == "X-IN"


GANG_POD = """
import os, pathlib, sys, time
d, code, failing = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
me = d / ('runs-' + os.environ['VC_TASK_INDEX'])
with me.open('a') as f:
    f.write('x')
run = len(me.read_text())
if os.environ['VC_TASK_INDEX'] == '1':
    peer, deadline = d / 'runs-0', time.monotonic() + 30
    while (len(peer.read_text()) if peer.exists() else 0) < run and time.monotonic() < deadline:
        time.sleep(0.01)  # inside the pod: the whole gang has started this run before pod 1 fails it
    sys.exit(code if run <= failing else 0)
"""


@pytest.mark.parametrize(("code", "failing", "phase", "restarts", "runs"), [
    (143, 1, "Succeeded", 1, 2),   # a pod stopped (eviction, node shutdown): the whole gang restarts once
    (137, 5, "Failed", 2, 3),      # killed every time: maxRetry 3 runs, then the job fails
    (75, 5, "Failed", 2, 3),       # transient every time: the job's budget, and the step is not retried on top
    (1, 1, "Failed", 0, 1),        # the code failed: the job ends at once
])
def test_a_volcano_gang_that_loses_a_pod_restarts_whole_as_its_policy_says(tmp_path, code, failing, phase, restarts, runs):
    """The Volcano Job's own policies, read by the local backend as Volcano applies them: a pod
    failing with an infrastructure exit code restarts every pod of the gang (up to maxRetry runs);
    exit 1 ends the job. Pod 1 of 2 fails its first ``failing`` runs with ``code``."""
    from pipectl.pipelines.launchers.volcano import VOLCANO_POLICIES

    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "{{workflow.name}}-j"},
           "spec": {"minAvailable": 2, "maxRetry": 3, "policies": VOLCANO_POLICIES, "tasks": [{
               "name": "worker", "replicas": 2, "template": {"spec": {"containers": [{
                   "name": "c", "command": ["python", "-c", GANG_POD, str(tmp_path), str(code), str(failing)]}]}}}]}}
    import json

    tmpl = {"name": "gang", "retryStrategy": {"limit": 2}, "resource": {"action": "create", "manifest": json.dumps(job)}}
    result = LocalRunner(_wf([{"name": "g", "template": "gang"}], [tmpl]), {}, {}, tmp_path / "runs").run()
    node = result.node("g")
    assert (node.phase, node.gang_restarts, node.attempts) == (phase, restarts, 1), node.log_path.read_text()
    assert node.exit_code == (0 if phase == "Succeeded" else code)
    assert [(tmp_path / f"runs-{i}").read_text() for i in (0, 1)] == ["x" * runs] * 2  # every pod, every run
    log = node.log_path.read_text()
    assert log.count("the job's policy restarts the whole gang") == restarts, log
    assert node.message.endswith({"Succeeded": "(2 pods, 1 gang restart(s))", "Failed": "(2 pods, its 2 gang restart(s) spent)"}[phase]
                                 if restarts else "(2 pods)"), node.message
    if restarts:
        assert f"pod worker-1 of Job {result.workflow_name}-j exited {code}: the job's policy restarts the whole gang (restart 1 of 2)" in log


def test_a_pytorchjob_that_loses_a_pod_fails_without_a_restart(tmp_path):
    """A PyTorchJob (backoffLimit 0, restartPolicy Never) cannot restart the gang: a pod's 143 fails it."""
    manifest = """
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {name: "{{workflow.name}}-t"}
spec:
  runPolicy: {backoffLimit: 0}
  pytorchReplicaSpecs:
    Master: {replicas: 1, restartPolicy: Never, template: {spec: {containers: [{name: c, command: [python, -c, "raise SystemExit(143)"]}]}}}
"""
    tmpl = {"name": "gang", "resource": {"action": "create", "manifest": manifest}}
    node = LocalRunner(_wf([{"name": "g", "template": "gang"}], [tmpl]), {}, {}, tmp_path / "runs").run().node("g")
    assert (node.phase, node.exit_code, node.gang_restarts) == ("Failed", 143, 0)


def test_a_templates_own_input_default_has_the_workflows_globals_resolved_first_as_argo_does(tmp_path):
    """Argo replaces global tags in a template's inputs before it uses them (SubstituteParams:
    globals first); the train step's first gang affinity names the run that way."""
    echo = {**ECHO, "inputs": {"parameters": [{"name": "text", "default": "{{workflow.name}}-x"}]}}
    result = LocalRunner(_wf([{"name": "a", "template": "echo"}], [echo]), {}, {}, tmp_path / "runs").run()
    assert result.phase == "Succeeded"
    assert result.node("a").outputs["out"] == f"{result.workflow_name}-X".upper()


def test_a_skipped_step_says_why_in_the_parameters_words():
    from pipectl.pipelines.backends.runner import _skipped

    assert _skipped("{{workflow.parameters.warm-cache}} == true", "false == true") == "skipped: warm-cache is false"
    assert _skipped("{{workflow.parameters.epochs}} > 3", "2 > 3") == "skipped: epochs > 3 does not hold (2 > 3)"
