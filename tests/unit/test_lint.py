"""pipectl lint: every policy rule and the schema check have a failing example (and pass on argo/)."""

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipectl.pipelines.lint import lint_objects
from pipectl.pipelines.builtin import build_training
from pipectl.pipelines.training import CompileConfig

ARGO = Path(__file__).resolve().parents[2] / "argo"


@pytest.fixture(scope="module", params=["volcano", "pytorchjob"])
def good(request):
    return build_training(CompileConfig(launcher=request.param)).to_dict()


def _messages(obj):
    return [str(f) for f in lint_objects([("test", obj)])]


def _tmpl(wt, name):
    return next(t for t in wt["spec"]["templates"] if t["name"] == name)


def test_rendered_templates_are_clean(good):
    assert _messages(good) == []


def test_everything_under_argo_is_clean():
    r = subprocess.run([str(Path(sys.executable).parent / "pipectl"), "lint", str(ARGO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    objects = sum(1 for f in ARGO.rglob("*.yaml") if f.name != "kustomization.yaml"
                  for d in yaml.safe_load_all(f.read_text()) if d)
    assert f"{objects} object(s) valid" in r.stderr


def _broken(good, mutate):
    wt = copy.deepcopy(good)
    mutate(wt)
    return _messages(wt)


def test_default_outside_enum(good):
    def m(wt):
        next(p for p in wt["spec"]["arguments"]["parameters"] if p["name"] == "lane")["value"] = "superurgent"
    assert any("default 'superurgent' of lane is not in its enum" in x for x in _broken(good, m))


def test_replicas_quoted_become_strings_C03(good):
    def m(wt):
        res = _tmpl(wt, "train")["resource"]
        res["manifest"] = res["manifest"].replace("replicas: {{=sprig.atoi(inputs.parameters['workers'])}}",
                                                  "replicas: '{{=sprig.atoi(inputs.parameters['workers'])}}'")
        res["manifest"] = res["manifest"].replace("replicas: {{=sprig.atoi(inputs.parameters['workers']) - 1}}",
                                                  "replicas: '{{=sprig.atoi(inputs.parameters['workers']) - 1}}'")
    assert any("replicas must be integers" in x for x in _broken(good, m))


def test_min_available_below_the_gang(good):
    wt = copy.deepcopy(good)
    next(p for p in wt["spec"]["arguments"]["parameters"] if p["name"] == "workers")["value"] = "4"
    res = _tmpl(wt, "train")["resource"]
    res["manifest"] = res["manifest"].replace("minAvailable: {{=sprig.atoi(inputs.parameters['workers'])}}", "minAvailable: 3")
    assert any("minAvailable 3 must equal the gang size 4" in x for x in _messages(wt))


def test_fractional_gpus(good):
    def m(wt):
        res = _tmpl(wt, "train")["resource"]
        res["manifest"] = res["manifest"].replace("nvidia.com/gpu: {{=sprig.atoi(inputs.parameters['gpus-per-worker'])}}", "nvidia.com/gpu: 0.5")
    assert any("whole number" in x for x in _broken(good, m))


def test_lane_that_does_not_exist(good):
    def m(wt):
        res = _tmpl(wt, "train")["resource"]
        res["manifest"] = res["manifest"].replace("'pipectl-' + inputs.parameters['lane']", "'gold-' + inputs.parameters['lane']")
    out = _broken(good, m)
    assert any("is not a lane's" in x for x in out)


def test_secret_literal_in_env(good):
    def m(wt):
        _tmpl(wt, "stage")["container"]["env"] = [{"name": "AWS_SECRET_ACCESS_KEY", "value": "hunter2"}]
    assert any("AWS_SECRET_ACCESS_KEY carries a secret literal" in x for x in _broken(good, m))


def test_template_without_command(good):
    def m(wt):
        del _tmpl(wt, "evaluate")["container"]["command"]
    assert any("'evaluate' sets no command" in x for x in _broken(good, m))


@pytest.mark.parametrize("image", ["pipectl/step-light", "pipectl/step-light:latest"])
def test_unpinned_image(good, image):
    def m(wt):
        _tmpl(wt, "register")["container"]["image"] = image
    assert any("is not pinned" in x for x in _broken(good, m))


def _index(wt: dict, name: str) -> int:
    return [t["name"] for t in wt["spec"]["templates"]].index(name)


def test_schema_names_a_misspelled_field_and_a_wrong_type(good):
    def m(wt):
        _tmpl(wt, "stage")["retryStrateg"] = {"limit": 1}
        wt["spec"]["parallelism"] = "many"
    out = _broken(good, m)
    i = _index(good, "stage")
    assert any(f"spec.templates[{i}].retryStrateg" in x and "unknown field" in x for x in out), out
    assert any("spec.parallelism" in x and "'many' is not of type 'integer'" in x for x in out), out


def test_lint_cli_exits_2_naming_the_field(tmp_path, good):
    wt = copy.deepcopy(good)
    _tmpl(wt, "stage")["container"]["imagePullPolicee"] = "Always"
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(wt))
    r = subprocess.run([str(Path(sys.executable).parent / "pipectl"), "lint", str(tmp_path / "broken.yaml")], capture_output=True, text=True)
    assert r.returncode == 2
    assert f"spec.templates[{_index(good, 'stage')}].container.imagePullPolicee" in r.stderr


# -- every security rule has a failing example -------------------------------------------


def _manifest_edit(wt: dict, old: str, new: str) -> None:
    """Replace ``old`` with ``new`` on every line of the gang manifest, at that line's indentation."""
    res = _tmpl(wt, "train")["resource"]
    assert old in res["manifest"], old
    lines = []
    for line in res["manifest"].splitlines():
        if line.strip() == old:
            indent = line[: len(line) - len(line.lstrip())]
            lines += [indent + part for part in new.split("\n")]
        else:
            lines.append(line)
    res["manifest"] = "\n".join(lines) + "\n"


SECURITY_BREAKS = {
    "workflow pods may run as root": (
        lambda wt: wt["spec"]["securityContext"].pop("runAsNonRoot"), "spec.securityContext: runAsNonRoot must be true"),
    "no seccomp profile": (
        lambda wt: wt["spec"]["securityContext"].pop("seccompProfile"), "seccompProfile.type must be RuntimeDefault"),
    "a step escalates privileges": (
        lambda wt: _tmpl(wt, "stage")["container"]["securityContext"].update(allowPrivilegeEscalation=True),
        "allowPrivilegeEscalation must be false"),
    "a privileged step": (
        lambda wt: _tmpl(wt, "evaluate")["container"]["securityContext"].update(privileged=True), "privileged containers are not allowed"),
    "a capability added": (
        lambda wt: _tmpl(wt, "register")["container"]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]),
        "capabilities.add ['SYS_ADMIN']"),
    "capabilities kept": (
        lambda wt: _tmpl(wt, "validate")["container"]["securityContext"].pop("capabilities"), "capabilities.drop must include ALL"),
    "a hostPath volume on a step": (
        lambda wt: _tmpl(wt, "stage")["volumes"].append({"name": "host", "hostPath": {"path": "/"}}), "volume 'host' is a hostPath"),
    "a gang pod mounts its token": (
        lambda wt: _manifest_edit(wt, "automountServiceAccountToken: false", "automountServiceAccountToken: true"),
        "must not mount a service-account token"),
    "step containers mount a token": (
        lambda wt: wt["spec"].pop("automountServiceAccountToken"), "step containers must not mount a service-account token"),
    "no executor account for Argo's own containers": (
        lambda wt: wt["spec"].pop("executor"), "executor.serviceAccountName"),
    "a step that does not call the API mounts a token": (
        lambda wt: _tmpl(wt, "preprocess").update(automountServiceAccountToken=True), "template 'preprocess' mounts a service-account token"),
    "a gang pod on the host network": (
        lambda wt: _manifest_edit(wt, "automountServiceAccountToken: false", "automountServiceAccountToken: false\nhostNetwork: true"),
        "hostNetwork: true shares the node's namespace"),
    "a gang container escalates": (
        lambda wt: _manifest_edit(wt, "allowPrivilegeEscalation: false", "allowPrivilegeEscalation: true"),
        "allowPrivilegeEscalation must be false"),
    "C15: a step runs before validate": (
        lambda wt: next(t for t in _tmpl(wt, "training")["dag"]["tasks"] if t["name"] == "stage").pop("dependencies"),
        "tasks[stage]: runs before `validate`"),
    "C15: no validate task": (
        lambda wt: _tmpl(wt, "training")["dag"].update(tasks=[t for t in _tmpl(wt, "training")["dag"]["tasks"] if t["name"] != "validate"]),
        "no `validate` task"),
}


@pytest.mark.parametrize("case", sorted(SECURITY_BREAKS))
def test_security_rule_has_a_failing_example(good, case):
    mutate, message = SECURITY_BREAKS[case]
    out = _broken(good, mutate)
    assert any(message in x for x in out), out


def _argo_objects(kind: str) -> list[dict]:
    return [d for f in sorted(ARGO.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == kind]


@pytest.mark.parametrize("field", ["verbs", "resources", "apiGroups"])
def test_role_with_a_wildcard(field):
    role = copy.deepcopy(_argo_objects("Role")[0])
    role["rules"][0][field] = ["*"]
    assert any(f"rules[0].{field}: wildcard" in x for x in _messages(role))


def test_cluster_wide_rights():
    binding = copy.deepcopy(_argo_objects("RoleBinding")[0])
    binding["kind"] = "ClusterRoleBinding"
    binding["metadata"].pop("namespace")
    assert any("needs no cluster-wide rights" in x for x in _messages(binding))


def test_namespace_without_restricted_enforcement():
    ns = copy.deepcopy(_argo_objects("Namespace")[0])
    assert _messages(ns) == []
    ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] = "baseline"
    assert any("enforce must be restricted" in x for x in _messages(ns))


def test_cron_workflow_with_an_inline_privileged_template():
    cron = copy.deepcopy(_argo_objects("CronWorkflow")[0])
    assert _messages(cron) == []
    cron["spec"]["workflowSpec"] = {"entrypoint": "main", "templates": [
        {"name": "main", "container": {"image": "busybox:1.36", "command": ["sh"], "securityContext": {"privileged": True}}}]}
    out = _messages(cron)
    assert any("spec.workflowSpec spec.securityContext: runAsNonRoot must be true" in x for x in out), out
    assert any("privileged containers are not allowed" in x for x in out), out
