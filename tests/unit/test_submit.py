"""pipectl submit/templates/cron without a cluster: dry runs, validation first, unreachable -> 3."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipectl.components.contracts import TrainingParameters
from pipectl.pipelines.workflows import workflow_for
from pipectl.pipelines.lint import lint_objects

PIPECTL = str(Path(sys.executable).parent / "pipectl")


def _run(*args, env=None):
    import os

    return subprocess.run([PIPECTL, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_dry_run_prints_exactly_the_validated_workflow():
    r = _run("submit", "training", "--lane", "urgent", "-p", "epochs=3", "--dry-run")
    assert r.returncode == 0, r.stderr
    wf = yaml.safe_load(r.stdout)
    expected = workflow_for("training-v1", "pipectl", TrainingParameters(epochs=3, lane="urgent"))
    assert wf == expected
    assert wf["spec"]["priority"] == 100 and wf["metadata"]["labels"]["pipectl.io/lane"] == "urgent"
    assert lint_objects([("t", wf)]) == []


@pytest.mark.parametrize("bad", [["-p", "lane=superurgent"], ["-p", "workers=0"], ["-p", "nope=1"],
                                 ["-p", "gpus-per-worker=4", "-p", "processes-per-worker=2"],
                                 ["-p", "shard-mib=0"], ["-p", "shard-mib=5121"]])
def test_bad_parameters_exit_2_before_any_connection(bad):
    r = _run("submit", "training", *bad, env={"KUBECONFIG": "/nonexistent"})
    assert r.returncode == 2, r.stderr
    assert "Kubernetes" not in r.stderr


def test_a_shard_size_past_one_put_is_refused_with_the_numbers():
    r = _run("submit", "training", "-p", "shard-mib=5121", env={"KUBECONFIG": "/nonexistent"})
    assert r.returncode == 2 and "shard-mib" in r.stderr and "5120" in r.stderr, r.stderr
    assert TrainingParameters(image_size=512, shard_mib=1).shard_mib == 1  # one uint8 image of 0.75 MiB fits


def test_C04_uneven_processes_and_gpus_are_rejected_before_submit():
    with pytest.raises(ValueError, match="one torchrun process per GPU"):
        TrainingParameters(gpus_per_worker=4, processes_per_worker=2)
    assert TrainingParameters(gpus_per_worker=4, processes_per_worker=4, workers=2).workers == 2


def test_unreachable_api_server_exits_3_naming_it(tmp_path):
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "x", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
    }))
    r = _run("submit", "training", env={"KUBECONFIG": str(kubeconfig)})
    assert r.returncode == 3, r.stderr
    assert "127.0.0.1:9" in r.stderr and "unreachable" in r.stderr


def test_templates_and_cron_dry_runs_are_lint_clean():
    for args in (["templates", "apply", "--dry-run"], ["cron", "apply", "--dry-run"]):
        r = _run(*args)
        assert r.returncode == 0, r.stderr
        objs = list(yaml.safe_load_all(r.stdout))
        assert objs and lint_objects([("t", o) for o in objs]) == []
    cron = yaml.safe_load(_run("cron", "apply", "--dry-run").stdout)
    assert cron["spec"]["concurrencyPolicy"] == "Forbid" and cron["spec"]["timezone"] == "Europe/Berlin"
    assert cron["spec"]["workflowSpec"]["workflowTemplateRef"]["name"] == "training-v1"
