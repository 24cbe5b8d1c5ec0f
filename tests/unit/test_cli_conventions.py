"""Command-line conventions users bring from `argo` and `kubectl`, the parts that need no
cluster: --parameter-file, the kubeconfig context's namespace, an unknown --context, -o, shell
completion. The real pipectl executable of this venv in a subprocess each time. Against the API
server and the Argo controller: tests/cluster/test_cli_conventions.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PIPECTL = str(Path(sys.executable).parent / "pipectl")


def _run(*args, env=None, **kw) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "PIPECTL_NAMESPACE")}
    return subprocess.run([PIPECTL, *map(str, args)], capture_output=True, text=True, timeout=60, env={**base, **(env or {})}, **kw)


def _arguments(stdout: str) -> dict[str, str]:
    wf = yaml.safe_load(stdout)
    return {p["name"]: p["value"] for p in wf["spec"]["arguments"]["parameters"]}


@pytest.fixture()
def kubeconfig(tmp_path) -> Path:
    """Contexts `team-a` (namespace team-a, current), `team-b` (namespace team-b), `bare` (none),
    `kind` (namespace default, as many generated kubeconfigs write it);
    the server is a closed port: nothing here may need it."""
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "team-a",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "team-a", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}},
                     {"name": "team-b", "context": {"cluster": "c", "user": "u", "namespace": "team-b"}},
                     {"name": "bare", "context": {"cluster": "c", "user": "u"}},
                     {"name": "kind", "context": {"cluster": "c", "user": "u", "namespace": "default"}}],
    }))
    return path


# ---------------------------------------------------------------- --parameter-file


@pytest.mark.parametrize("suffix, text", [
    (".yaml", "epochs: 4\nlane: urgent\nlearning-rate: 0.01\nworkers: 2\n"),
    (".json", json.dumps({"epochs": 4, "lane": "urgent", "learning_rate": 0.01, "workers": 2})),
])
def test_parameter_file_yaml_or_json_and_p_overrides_it(tmp_path, suffix, text):
    f = tmp_path / f"params{suffix}"
    f.write_text(text)
    r = _run("submit", "training", "--dry-run", "--parameter-file", f)
    assert r.returncode == 0, r.stderr
    got = _arguments(r.stdout)
    assert (got["epochs"], got["lane"], got["learning-rate"], got["workers"]) == ("4", "urgent", "0.01", "2")
    r = _run("submit", "training", "--dry-run", "-f", f, "-p", "epochs=7", "--lane", "batch")
    assert r.returncode == 0, r.stderr
    got = _arguments(r.stdout)
    assert (got["epochs"], got["lane"], got["workers"]) == ("7", "batch", "2")  # -p and --lane win, the rest stays


def test_parameter_file_values_are_validated_like_p(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("workers: 0\n")
    r = _run("submit", "training", "--dry-run", "--parameter-file", f)
    assert r.returncode == 2 and "workers" in r.stderr, r.stderr


@pytest.mark.parametrize("text, expected", [
    ("- epochs\n- 5\n", "a list, not a mapping"),
    ("epochs: [1, 2]\n", "parameter 'epochs' is a list"),
    ("epochs:\n", "parameter 'epochs' is empty"),
    ("epochs: {a: 1}\n", "parameter 'epochs' is a dict"),
    ("epochs: 5\n  lane: [\n", "not YAML or JSON"),
])
def test_a_bad_parameter_file_exits_2_naming_the_file_and_the_problem(tmp_path, text, expected):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    r = _run("submit", "training", "--dry-run", "--parameter-file", f)
    assert r.returncode == 2, r.stdout + r.stderr
    assert str(f) in r.stderr and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_a_missing_parameter_file_is_a_usage_error(tmp_path):
    r = _run("submit", "training", "--dry-run", "--parameter-file", tmp_path / "nope.yaml")
    assert r.returncode == 2 and "nope.yaml" in r.stderr and "does not exist" in r.stderr, r.stderr


# ---------------------------------------------------------------- namespace and --context


def _namespace(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stderr
    return yaml.safe_load(r.stdout)["metadata"]["namespace"]


def test_the_kubeconfig_contexts_namespace_is_used_when_n_is_absent(kubeconfig):
    env = {"KUBECONFIG": str(kubeconfig)}
    assert _namespace(_run("submit", "training", "--dry-run", env=env)) == "team-a"  # the current context's
    assert _namespace(_run("submit", "training", "--dry-run", "--context", "team-b", env=env)) == "team-b"
    assert _namespace(_run("submit", "training", "--dry-run", "--context", "bare", env=env)) == "pipectl"
    # kubectl cannot tell an explicit `default` from none: both mean pipectl's own namespace
    assert _namespace(_run("submit", "training", "--dry-run", "--context", "kind", env=env)) == "pipectl"
    assert _namespace(_run("submit", "training", "--dry-run", "--context", "kind", "-n", "default", env=env)) == "default"
    assert _namespace(_run("submit", "training", "--dry-run", "-n", "mine", env=env)) == "mine"  # -n wins
    assert _namespace(_run("submit", "training", "--dry-run", env={**env, "PIPECTL_NAMESPACE": "from-env"})) == "from-env"
    assert _namespace(_run("submit", "training", "--dry-run", env={"KUBECONFIG": str(kubeconfig.parent / "none")})) == "pipectl"
    r = _run("templates", "apply", "--dry-run", env=env)
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["metadata"]["namespace"] == "team-a"


def test_kubeconfig_files_merge_as_kubectl_merges_them(kubeconfig, tmp_path):
    """KUBECONFIG=a:b: b's contexts are there too; a's current-context wins."""
    other = tmp_path / "other"
    other.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "team-c",
                                     "contexts": [{"name": "team-c", "context": {"cluster": "c", "user": "u", "namespace": "team-c"}}]}))
    env = {"KUBECONFIG": f"{kubeconfig}{os.pathsep}{other}"}
    assert _namespace(_run("submit", "training", "--dry-run", env=env)) == "team-a"
    assert _namespace(_run("submit", "training", "--dry-run", "--context", "team-c", env=env)) == "team-c"


@pytest.mark.parametrize("args", [("submit", "training", "--dry-run"), ("submit", "training"), ("list",), ("status", "x"),
                                  ("stop", "x"), ("logs", "-f", "x")])
def test_an_unknown_context_exits_2_naming_the_contexts_there_are(kubeconfig, args):
    r = _run(*args, "--context", "tema-a", env={"KUBECONFIG": str(kubeconfig)})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "--context tema-a: no such context" in r.stderr and "bare, kind, team-a, team-b" in r.stderr, r.stderr


def test_a_context_without_a_kubeconfig_never_falls_back_to_in_cluster_credentials(tmp_path):
    # what a pod would see: the service account token and the in-cluster environment
    env = {"KUBECONFIG": str(tmp_path / "none"), "KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "9"}
    r = _run("list", "--context", "prod", env=env)
    assert r.returncode == 2, r.stderr
    assert "--context prod: there is no kubeconfig" in r.stderr and "none does not exist" in r.stderr, r.stderr
    r = _run("list", env=env)  # no --context and no kubeconfig: in-cluster is tried, and says so
    assert r.returncode == 3 and "not in a cluster" in r.stderr, r.stderr


def test_a_kubeconfig_that_is_not_yaml_exits_3_naming_it(tmp_path):
    bad = tmp_path / "config"
    bad.write_text("clusters: [\n")
    r = _run("list", env={"KUBECONFIG": str(bad)})
    assert r.returncode == 3 and f"kubeconfig {bad} cannot be read" in r.stderr, r.stderr


# ---------------------------------------------------------------- -o and the new commands


def test_o_is_offered_with_the_kubectl_formats():
    for cmd in ("list", "status", "submit"):
        r = _run(cmd, "--help")
        assert "-o, --output [text|wide|json|yaml|name]" in r.stdout, r.stdout
    r = _run("list", "-o", "table")
    assert r.returncode == 2 and "'table' is not one of" in r.stderr, r.stderr


def test_stop_terminate_delete_need_a_name():
    for cmd in ("stop", "terminate", "delete"):
        r = _run(cmd)
        assert r.returncode == 2 and "Missing argument 'NAMES...'" in r.stderr, r.stderr


# ---------------------------------------------------------------- shell completion


def test_completion_prints_clicks_own_script_for_each_shell():
    for shell in ("bash", "zsh", "fish"):
        r = _run("completion", shell)
        assert r.returncode == 0, r.stderr
        source = _run(env={"_PIPECTL_COMPLETE": f"{shell}_source"})
        assert r.stdout.strip() == source.stdout.strip() and f"_PIPECTL_COMPLETE={shell}_complete" in r.stdout.replace('"', "")
    r = _run("completion", "tcsh")
    assert r.returncode == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in r.stderr, r.stderr


@pytest.mark.parametrize("line, expected", [
    ("pipectl su", {"submit"}),
    ("pipectl st", {"status", "stop"}),
    ("pipectl submit training --lane ", {"urgent", "standard", "batch"}),
    ("pipectl list -o ", {"text", "wide", "json", "yaml", "name"}),
    ("pipectl render training --launcher ", {"volcano", "pytorchjob"}),
    ("pipectl completion ", {"bash", "zsh", "fish"}),
])
def test_bash_completes_commands_and_choices_through_the_printed_script(tmp_path, line, expected):
    """A real bash sources `pipectl completion bash` and calls its completion function as <TAB> would."""
    script = tmp_path / "pipectl.bash"
    script.write_text(_run("completion", "bash").stdout)
    words = line.split(" ")
    code = (f"PATH={Path(PIPECTL).parent}:$PATH; source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
            f"COMP_CWORD={len(words) - 1}; _pipectl_completion pipectl; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert set(r.stdout.split()) == expected, r.stdout + r.stderr


def test_remote_text_is_printed_as_it_is_never_as_markup(capsys):
    """Step names and messages come from the cluster, and a parameter value can reach a message:
    `[/]` or `[bold]` in one is printed verbatim by `submit --wait`'s progress, not read as rich
    markup (`[/]` alone used to end the command with a MarkupError)."""
    from pipectl.cli.cluster_cmds import _follow

    message = "parameter model-name: '[/]x[bold]y' is not valid"

    class Cluster:
        def wait(self, name, on_change, timeout_s=None):
            wf = {"status": {"nodes": {"a": {"type": "Pod", "displayName": "validate(0)", "phase": "Failed",
                                             "message": message, "startedAt": "t"}}}}
            on_change(wf)
            return wf

    _follow(Cluster(), "training-x")
    assert message in capsys.readouterr().err


def _node(name, kind, phase, started, finished=None, message=""):
    return {"displayName": name, "type": kind, "phase": phase, "startedAt": started,
            **({"finishedAt": finished} if finished else {}), **({"message": message} if message else {})}


def _finished_workflow(run_id="0123abcd") -> dict:
    """A workflow as the API server returns it at its end: steps (one retried after a lost pod, one
    still running), and the run id evaluate exports as the workflow's output."""
    outputs = {"outputs": {"parameters": [{"name": "mlflow-run-id", "value": run_id}]}} if run_id else {}
    return {"metadata": {"name": "training-x7k2p", "namespace": "team-a"},
            "status": {"phase": "Succeeded", **outputs, "nodes": {
                "w": _node("training-x7k2p", "DAG", "Succeeded", "2026-12-01T10:00:00Z", "2026-12-01T12:05:30Z"),
                "v": _node("validate", "Pod", "Succeeded", "2026-12-01T10:00:00Z", "2026-12-01T10:00:04Z"),
                "t": _node("train", "Retry", "Succeeded", "2026-12-01T10:00:05Z", "2026-12-01T10:03:12Z"),
                "t0": _node("train(0)", "Pod", "Failed", "2026-12-01T10:00:05Z", "2026-12-01T10:01:00Z", "pod deleted"),
                "e": _node("evaluate", "Pod", "Succeeded", "2026-12-01T10:03:13Z", "2026-12-01T12:05:20Z"),
                "r": _node("register", "Pod", "Running", "2026-12-01T12:05:21Z")}}}


def test_wait_progress_shows_each_finished_steps_duration():
    """`submit --wait` / `wait`: a finished step's line carries how long it ran (startedAt to
    finishedAt); a running step's has none; name and phase stay side by side (`train Succeeded`)."""
    from pipectl.cli.cluster_cmds import _step_line

    lines = {n["displayName"]: _step_line(n) for n in _finished_workflow()["status"]["nodes"].values()}
    assert lines["validate"] == "validate Succeeded (4s)"
    assert lines["train"] == "train Succeeded (3m07s)"
    assert lines["train(0)"] == "train(0) Failed (55s) pod deleted"
    assert lines["evaluate"] == "evaluate Succeeded (2h02m)"
    assert lines["register"] == "register Running"
    assert _step_line(_node("stage", "Pod", "Failed", "t", "u", "boom")) == "stage Failed boom"  # unreadable times


def test_wait_ends_with_the_argo_ui_and_mlflow_links_when_they_are_known():
    from pipectl.cli.cluster_cmds import _workflow_links

    wf = _finished_workflow()
    assert _workflow_links(wf, "default", "https://argo.example.com:2746", "https://mlflow.example.com/") == [
        "Argo UI: https://argo.example.com:2746/workflows/team-a/training-x7k2p",
        "MLflow run: https://mlflow.example.com/#/runs/0123abcd"]
    assert _workflow_links(wf, "default", None, "https://mlflow.example.com") == ["MLflow run: https://mlflow.example.com/#/runs/0123abcd"]
    assert _workflow_links(_finished_workflow(run_id=""), "default", None, "https://mlflow.example.com") == []  # no run id: no link
    assert _workflow_links({"metadata": {"name": "w"}}, "ns", "http://localhost:2746", None) == ["Argo UI: http://localhost:2746/workflows/ns/w"]


def test_follow_prints_durations_and_links(capsys, monkeypatch):
    """The whole of `_follow` on a workflow dict (no cluster): ARGO_SERVER as the `argo` CLI reads it."""
    from pipectl.cli.cluster_cmds import _follow

    monkeypatch.setenv("ARGO_SERVER", "localhost:2746")
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.delenv("PIPECTL_SITE", raising=False)

    class Cluster:
        namespace = "team-a"

        def wait(self, name, on_change, timeout_s=None):
            wf = _finished_workflow()
            on_change(wf)
            return wf

    _follow(Cluster(), "training-x7k2p")
    err = capsys.readouterr().err
    assert "✓ train Succeeded (3m07s)" in err and "✗ train(0) Failed (55s) pod deleted" in err, err
    assert "Argo UI: http://localhost:2746/workflows/team-a/training-x7k2p" in err, err
    assert "/#/runs/0123abcd" in err, err


def test_wait_links_the_site_files_argo_ui_without_argo_server(capsys, monkeypatch, tmp_path):
    """Without ARGO_SERVER, the site file's argo_ui is where the run's page is; a bad one exits 2
    naming the key; with ARGO_SERVER set, its address wins."""
    import click

    from pipectl.cli.cluster_cmds import _follow
    from pipectl.cli.common import SITE_META
    from pipectl.pipelines.site import site_config

    class Cluster:
        namespace = "team-a"

        def wait(self, name, on_change, timeout_s=None):
            on_change(_finished_workflow())
            return _finished_workflow()

    site = tmp_path / "site.yaml"
    site.write_text("argo_ui: https://argo.example.com/\n")
    monkeypatch.delenv("ARGO_SERVER", raising=False)
    with click.Context(click.Command("wait")) as ctx:
        ctx.meta[SITE_META] = site
        _follow(Cluster(), "training-x7k2p")
        assert "Argo UI: https://argo.example.com/workflows/team-a/training-x7k2p" in capsys.readouterr().err
        monkeypatch.setenv("ARGO_SERVER", "localhost:2746")
        monkeypatch.setenv("ARGO_SECURE", "false")
        _follow(Cluster(), "training-x7k2p")
        assert "Argo UI: http://localhost:2746/workflows/team-a/training-x7k2p" in capsys.readouterr().err
    site.write_text("argo_ui: argo.example.com\n")
    with pytest.raises(Exception, match="argo_ui"):
        site_config(site)


def test_submit_log_prints_each_pods_lines_then_each_steps_outcome_and_links(capsys, monkeypatch):
    """`submit --log` on a workflow dict (no cluster; the log following itself runs against the
    control plane in tests/cluster): log lines on stdout prefixed with their pod, as `logs -f`;
    then on stderr each step's outcome with its duration and the links, as `submit --wait` ends."""
    from pipectl.cli.cluster_cmds import _follow_logs

    monkeypatch.delenv("ARGO_SERVER", raising=False)
    monkeypatch.delenv("PIPECTL_SITE", raising=False)

    class Cluster:
        namespace = "team-a"

        def follow_logs(self, name, emit, step="", **window):
            assert (name, step, window) == ("training-x7k2p", "", {})
            emit("training-x7k2p-train-1", "epoch 3 loss 0.21")
            emit("training-x7k2p-stage-2", "[/] staged 80 files")  # remote text, never markup
            return _finished_workflow()

    final = _follow_logs(Cluster(), "training-x7k2p")
    out, err = capsys.readouterr()
    assert final["metadata"]["name"] == "training-x7k2p"
    assert out.splitlines() == ["training-x7k2p-train-1: epoch 3 loss 0.21", "training-x7k2p-stage-2: [/] staged 80 files"]
    assert "✓ train Succeeded (3m07s)" in err and "✗ train(0) Failed (55s) pod deleted" in err, err
    assert "… register Running" in err and "/#/runs/0123abcd" in err, err


def test_submit_and_run_with_a_pipeline_list_its_parameters_in_help():
    """`pipectl submit PIPELINE --help` (and `run`): every parameter of the contract, with its type,
    bounds, choices, default and description; options before the pipeline do not hide it."""
    from pipectl.components.contracts import TrainingParameters

    for args in (["submit", "training", "--help"], ["run", "-p", "epochs=3", "training", "-h"]):
        r = _run(*args)
        assert r.returncode == 0, r.stderr
        help_text = " ".join(r.stdout.split())
        assert "Parameters of training" in help_text
        for name in TrainingParameters.model_fields:
            assert f" {name.replace('_', '-')} " in help_text, name
        assert "[integer, 1 to 1,000; default: 15]" in help_text  # epochs
        assert "[one of urgent|standard|batch; default: standard]" in help_text
        assert "[number, > 0, < 1; default: 0.2]" in help_text  # validation-fraction


def test_help_without_a_pipeline_says_how_to_list_parameters_and_a_bad_one_is_named():
    r = _run("submit", "--help")
    assert r.returncode == 0 and "`pipectl submit PIPELINE --help` lists the pipeline's parameters" in r.stdout
    r = _run("submit", "no-such-pipeline", "--help")
    assert r.returncode == 2 and "unknown pipeline 'no-such-pipeline'" in r.stderr and "Traceback" not in r.stderr


def test_a_user_pipeline_help_shows_its_own_defaults(tmp_path):
    (tmp_path / "p.py").write_text(
        "from pipectl.sdk import Pipeline, stage, preprocess, train, evaluate, register\n"
        "mine = Pipeline('mine', [stage(), preprocess(), train(), evaluate(), register()], defaults={'epochs': 7})\n")
    r = _run("submit", f"{tmp_path / 'p.py'}:mine", "--help")
    assert r.returncode == 0, r.stderr
    assert "default: 7]" in " ".join(r.stdout.split())


@pytest.mark.parametrize("uri", ["./my-images", "/data/images", "manifest.csv", "cephfs:///datasets/x"])
def test_submit_refuses_a_dataset_only_this_machine_can_read(uri):
    """No pod of a run can read this machine's files: exit 2 before anything is sent, with the
    command that pushes the folder to the store."""
    r = _run("submit", "training", "--dry-run", "-p", f"dataset-uri={uri}")
    assert r.returncode == 2, r.stdout
    assert "is a path on this machine" in r.stderr and f"pipectl data push {uri}" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("message", ["bad [/] value", "[bold red]x", "ends with \\", "[/red] unbalanced", ""])
def test_a_steps_message_is_shown_as_text_never_as_markup(message):
    """`pipectl run`'s progress row for a finished step: the step's own text (a user's exception)
    is printed as it is, whatever brackets it holds."""
    from rich.console import Console

    from pipectl.cli.run_cmd import step_row

    console = Console(record=True, width=200, color_system=None)
    console.print(step_row("train", "Failed", False, message))
    assert console.export_text().rstrip() == f"✗ train {message}".rstrip()


def test_get_and_watch_are_the_names_argo_users_type_for_status_and_wait():
    for alias, name in (("get", "status"), ("watch", "wait")):
        a, b = _run(alias, "--help"), _run(name, "--help")
        assert a.returncode == b.returncode == 0, a.stderr + b.stderr
        assert a.stdout.replace(f"pipectl {alias} ", f"pipectl {name} ", 1) == b.stdout
    top = _run("--help").stdout
    assert "get    = status" in top and "watch  = wait" in top
    r = _run("get")  # the alias's own usage error, as the command's
    assert r.returncode == 2 and "Missing argument 'NAME'" in r.stderr


# ---------------------------------------------------------------- retry: one meaning (in place); resubmit


class _RetryCluster:
    """What `retry` and `resubmit` ask of the cluster: the workflow (in ``phase``), releasing its
    gang, creating a Workflow. Every call is recorded in ``calls``."""

    def __init__(self, phase: str | None):
        self.phase, self.calls = phase, []

    def get(self, kind, name):
        return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
                "metadata": {"name": name, "generateName": "training-", "labels": {"pipectl.io/lane": "standard"}},
                "spec": {"workflowTemplateRef": {"name": "training-v1"}, "arguments": {"parameters": [{"name": "epochs", "value": "3"}]}},
                "status": {"phase": self.phase} if self.phase else {}}

    def release_gangs(self, workflow, *, failed_only=False):
        self.calls.append(("release", workflow, failed_only))
        return [f"{workflow}-train"]

    def create_workflow(self, wf):
        self.calls.append(("create", wf))
        return {"metadata": {"name": "training-new01"}}


@pytest.fixture()
def retry_cli(monkeypatch, tmp_path):
    """Invoke the pipectl command group in-process against a :class:`_RetryCluster` (``phase``), the
    Argo Server's retry recorded, not sent: returns ``(invoke, cluster, server_calls)``."""
    from click.testing import CliRunner

    from pipectl.cli import cluster_cmds
    from pipectl.cli.main import main
    from pipectl.pipelines.backends.kube import ArgoServer

    for var in ("ARGO_SERVER", "ARGO_SECURE", "ARGO_TOKEN", "PIPECTL_SITE", "KUBECONFIG", "PIPECTL_NAMESPACE"):
        monkeypatch.delenv(var, raising=False)
    state = {"cluster": _RetryCluster("Failed")}
    server_calls = []
    monkeypatch.setattr(cluster_cmds, "_cluster", lambda namespace, context: state["cluster"])
    monkeypatch.setattr(ArgoServer, "retry", lambda self, namespace, name: server_calls.append((self.base, namespace, name)) or {})

    def invoke(*args, phase="Failed", env=None):
        state["cluster"] = _RetryCluster(phase)
        r = CliRunner().invoke(main, [*args, "-n", "team-a"], env=env or {})
        return r, state["cluster"]

    return invoke, server_calls


def _split(r) -> tuple[str, str]:
    """(stdout, stderr) of a CliRunner result, whichever click version mixes them or not."""
    try:
        return r.stdout, r.stderr
    except ValueError:
        return r.output, r.output


def test_retry_help_gives_it_one_meaning_and_names_resubmit():
    r = _run("retry", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "Retry workflow NAME in place" in text
    assert "only its failed steps run again, succeeded steps keep their outputs" in text
    assert "ARGO_SERVER" in text and "argo_ui" in text and "pipectl resubmit NAME" in text
    assert "--resubmit" not in r.stdout  # no second meaning behind a flag
    r = _run("resubmit", "--help")
    assert r.returncode == 0 and "pipectl retry NAME" in " ".join(r.stdout.split()), r.stdout + r.stderr
    top = _run("--help").stdout
    assert "retry " in top and "resubmit " in top


def test_retry_without_an_argo_server_changes_nothing_and_says_what_to_do(retry_cli):
    """No ARGO_SERVER and no argo_ui in a site file: the cluster cannot be asked to retry in place.
    Exit 2, nothing released or created, and the hint names each way forward."""
    invoke, server_calls = retry_cli
    r, cluster = invoke("retry", "training-x7k2p")
    err = _split(r)[1]
    assert r.exit_code == 2, r.output
    assert cluster.calls == [] and server_calls == []
    text = " ".join(err.split())
    assert "workflow training-x7k2p can only be retried in place through the Argo Server, and none is configured" in text
    for fix in ("ARGO_SERVER=host:port", "argo_ui", "RETRY", "pipectl resubmit training-x7k2p"):
        assert fix in text, (fix, text)


def test_retry_goes_in_place_through_argo_server_else_the_site_files_argo_ui(retry_cli, tmp_path):
    """The Argo Server as the `argo` CLI finds it (ARGO_SERVER, ARGO_SECURE), else the site file's
    argo_ui; the failed gang job is released first (failed jobs only), the workflow's name on
    stdout, never a new Workflow."""
    invoke, server_calls = retry_cli
    r, cluster = invoke("retry", "training-x7k2p", env={"ARGO_SERVER": "localhost:2746", "ARGO_SECURE": "false"})
    assert r.exit_code == 0, r.output
    assert cluster.calls == [("release", "training-x7k2p", True)]
    assert server_calls == [("http://localhost:2746", "team-a", "training-x7k2p")]
    assert _split(r)[0].strip().splitlines()[-1] == "training-x7k2p"

    site = tmp_path / "site.yaml"
    site.write_text("argo_ui: https://argo.example.com\n")
    server_calls.clear()
    r, cluster = invoke("--site", str(site), "retry", "training-x7k2p", phase="Error")
    assert r.exit_code == 0, r.output
    assert server_calls == [("https://argo.example.com", "team-a", "training-x7k2p")]
    assert [c[0] for c in cluster.calls] == ["release"]

    server_calls.clear()  # both set: ARGO_SERVER wins, as for the links submit --wait prints
    r, _ = invoke("--site", str(site), "retry", "training-x7k2p", env={"ARGO_SERVER": "argo.internal:2746"})
    assert r.exit_code == 0 and server_calls == [("https://argo.internal:2746", "team-a", "training-x7k2p")], r.output


@pytest.mark.parametrize("phase, headline, fix", [
    ("Succeeded", "workflow training-x7k2p Succeeded: there is nothing to retry in place", "pipectl resubmit training-x7k2p"),
    ("Running", "workflow training-x7k2p is Running: only a workflow that ended Failed or Error can be retried",
     "pipectl stop training-x7k2p"),
    (None, "workflow training-x7k2p is not started", "pipectl wait training-x7k2p"),
])
def test_retry_of_a_workflow_that_cannot_be_retried_in_place_exits_2_naming_the_way(retry_cli, phase, headline, fix):
    invoke, server_calls = retry_cli
    r, cluster = invoke("retry", "training-x7k2p", phase=phase, env={"ARGO_SERVER": "localhost:2746"})
    text = " ".join(_split(r)[1].split())
    assert r.exit_code == 2 and headline in text and fix in text, r.output
    assert cluster.calls == [] and server_calls == []


def test_retry_resubmit_flag_is_refused_pointing_to_resubmit(retry_cli):
    invoke, server_calls = retry_cli
    r, cluster = invoke("retry", "--resubmit", "training-x7k2p")
    assert r.exit_code == 2 and "pipectl resubmit training-x7k2p" in " ".join(_split(r)[1].split()), r.output
    assert cluster.calls == [] and server_calls == []


def test_resubmit_releases_the_old_gang_then_creates_a_new_workflow_with_its_arguments(retry_cli):
    invoke, server_calls = retry_cli
    r, cluster = invoke("resubmit", "training-x7k2p")
    assert r.exit_code == 0, r.output
    assert [c[0] for c in cluster.calls] == ["release", "create"] and cluster.calls[0] == ("release", "training-x7k2p", False)
    new = cluster.calls[1][1]
    assert new["metadata"]["labels"]["pipectl.io/retry-of"] == "training-x7k2p"
    assert new["spec"]["arguments"] == {"parameters": [{"name": "epochs", "value": "3"}]}
    assert _split(r)[0].strip().splitlines()[-1] == "training-new01" and server_calls == []

    r, cluster = invoke("resubmit", "training-x7k2p", phase="Succeeded")  # nothing of a Succeeded run to release
    assert r.exit_code == 0 and [c[0] for c in cluster.calls] == ["create"], r.output

    r, cluster = invoke("resubmit", "training-x7k2p", phase="Running")  # its gang would train beside the new run
    assert r.exit_code == 2 and cluster.calls == [], r.output
    assert "pipectl stop training-x7k2p" in " ".join(_split(r)[1].split())
