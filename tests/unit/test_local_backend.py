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
