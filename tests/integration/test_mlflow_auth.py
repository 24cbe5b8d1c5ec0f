"""MLflow behind its own basic-auth app, a user per team: a real ``mlflow server --app-name
basic-auth`` with ``default_permission = READ`` (tests/harness/mlflow_auth.py), no mocks.

The admin creates the teams' users (``pipectl teams mlflow-user``'s MLflow half; the Secret half is
tests/cluster/test_mlflow_user_secret.py); a request without credentials writes nothing; the
register step run as team-b (its real entrypoint, as its pod runs it) cannot add a version of
team-a's model nor move its ``champion`` alias, and fails once, clearly, not retried; team-b still
reads team-a's model (the champion a candidate is compared with).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipectl.components.contracts import Decision, PromotionMetric, RegisterInput
from pipectl.components.errors import Unreachable, ValidationFailed
from pipectl.pipelines.backends.mlflow_users import TeamUser, ensure_team_user
from tests.harness.mlflow_auth import as_user, auth_mlflow

pytestmark = pytest.mark.integration

MODEL = "team-a-digits"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with auth_mlflow(tmp_path_factory.mktemp("mlflow-auth")) as srv:
        yield srv


@pytest.fixture(scope="module")
def users(server) -> dict[str, TeamUser]:
    """team-a and team-b, created by the admin as ``pipectl teams mlflow-user`` does."""
    with as_user(server.admin, server.admin_password):
        return {t: ensure_team_user(server.url, t, server.admin) for t in ("team-a", "team-b")}


def _client(server):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server.url, registry_uri=server.url)


def _log_candidate(server, users) -> str:
    """As team-a: a run in experiment ``team-a-digits`` (the experiment is the model's name, as
    the train step names it) with a logged model; returns its model URI."""
    import mlflow

    from pipectl.components.models import SmallCNN

    with as_user("team-a", users["team-a"].password):
        mlflow.set_tracking_uri(server.url)
        mlflow.set_experiment(MODEL)
        with mlflow.start_run():
            info = mlflow.pytorch.log_model(SmallCNN(num_classes=10, width=4), name="model", serialization_format="pickle",
                                            pip_requirements=["torch"])
    return info.model_uri


def _register_step(server, user: TeamUser | None, inp: RegisterInput, tmp_path) -> subprocess.CompletedProcess:
    """``python -m pipectl.components.register`` as its pod runs it: the MLflow URI from the store
    ConfigMap's variable, the team's user from its Secret's (none: no Secret)."""
    from pipectl.components.contracts import kebab

    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    env["PIPECTL_MLFLOW_URI"] = server.url
    if user is not None:
        env |= {"MLFLOW_TRACKING_USERNAME": user.username, "MLFLOW_TRACKING_PASSWORD": user.password or ""}
    args = [a for n, v in inp.model_dump(mode="json").items() for a in (f"--{kebab(n)}", str(v))]
    return subprocess.run([sys.executable, "-m", "pipectl.components.register", *args, "--outputs-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=180)


def _inp(model_uri: str, sha256: str, run_id: str, run_key: str, decision: Decision = Decision.promote) -> RegisterInput:
    return RegisterInput(model_name=MODEL, run_key=run_key, promotion_metric=PromotionMetric.accuracy, mlflow_run_id=run_id,
                         model_uri=model_uri, model_sha256=sha256, decision=decision, metric=0.9, metric_name="accuracy")


@pytest.fixture(scope="module")
def team_a_model(server, users, tmp_path_factory):
    """team-a's ``team-a-digits``: version 1 (champion) and version 2 (kept), each registered by
    the register step as team-a; returns (inputs of version 2, the champion's model URI)."""
    from pipectl.components.models import download_model, model_sha256

    folder = tmp_path_factory.mktemp("team-a")
    inputs = []
    for n, decision in ((1, Decision.promote), (2, Decision.keep)):
        uri = _log_candidate(server, users)
        with as_user("team-a", users["team-a"].password):
            download_model(uri, folder / f"m{n}", tracking_uri=server.url)
            run_id = _client(server).get_logged_model(uri.removeprefix("models:/")).source_run_id
        inp = _inp(uri, model_sha256(folder / f"m{n}" / "model"), run_id, f"wf-team-a-{n}", decision)
        r = _register_step(server, users["team-a"], inp, folder / f"out{n}")
        assert r.returncode == 0, r.stderr
        inputs.append(inp)
    return inputs[1], inputs[0].model_uri


def test_a_the_admin_creates_a_teams_user_once_and_gives_it_a_new_password_only_when_asked(server, users):
    """Each team's user is created with a generated password it can sign in with; a second run
    keeps the user and its password (says so: no password back); --rotate gives a new one and the
    old one is refused from then on."""
    import mlflow.exceptions

    assert (users["team-a"].created, users["team-b"].created) == (True, True)
    assert users["team-a"].password and users["team-a"].password != users["team-b"].password
    with as_user(server.admin, server.admin_password):
        again = ensure_team_user(server.url, "team-c", server.admin)
        assert ensure_team_user(server.url, "team-c", server.admin) == TeamUser("team-c", None, created=False)
    with as_user("team-c", again.password):
        _client(server).search_experiments()  # signs in
    with as_user(server.admin, server.admin_password):
        rotated = ensure_team_user(server.url, "team-c", server.admin, rotate=True)
    assert (rotated.created, rotated.password not in (None, again.password)) == (False, True)
    with as_user("team-c", rotated.password):
        _client(server).search_experiments()
    with as_user("team-c", again.password), pytest.raises(mlflow.exceptions.MlflowException, match="401"):
        _client(server).search_experiments()


def test_a_the_admin_command_refuses_a_non_admin_wrong_credentials_no_server_and_an_mlflow_without_auth(server, users, services):
    """Each bad case is one error naming what and how to fix it; the user is not created."""
    from pipectl.pipelines.backends.processes import free_port

    with as_user("team-a", users["team-a"].password), pytest.raises(Unreachable, match="team-a is not an MLflow admin") as e:
        ensure_team_user(server.url, "team-x", "team-a")
    assert e.value.exit_code == 3 and "MLFLOW_TRACKING_USERNAME" in e.value.hint
    with as_user(server.admin, "wrong"), pytest.raises(Unreachable, match="refused the credentials of pipectl-admin .401") as e:
        ensure_team_user(server.url, "team-x", server.admin)
    with pytest.raises(Unreachable, match="did not answer /health"):
        ensure_team_user(f"http://127.0.0.1:{free_port()}", "team-x", server.admin)
    with as_user(server.admin, server.admin_password), pytest.raises(ValidationFailed, match="does not run MLflow's basic-auth app"):
        ensure_team_user(services.mlflow_url, "team-x", server.admin)
    with as_user(server.admin, server.admin_password), pytest.raises(Exception, match="RESOURCE_DOES_NOT_EXIST"):
        from mlflow.server import get_app_client

        get_app_client("basic-auth", tracking_uri=server.url).get_user("team-x")


def test_b_without_credentials_a_write_is_refused_and_nothing_is_written(server, team_a_model, tmp_path):
    """No Secret in the namespace (no credentials): MLflow refuses the step's first request (401);
    the register step fails once (exit 1, not the retried 75) naming what to do, and writes nothing."""
    inp, _ = team_a_model
    r = _register_step(server, None, inp.model_copy(update={"model_name": "team-a-anonymous"}), tmp_path)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "MLflow refused a request without credentials" in r.stderr and "not authenticated (401" in r.stderr, r.stderr
    assert "pipectl teams mlflow-user" in r.stderr and "Traceback" not in r.stderr, r.stderr
    with as_user(None, None), pytest.raises(Exception, match="401"):
        _client(server).create_registered_model("team-a-anonymous")
    with as_user("pipectl-admin", "admin-password-for-tests-only"):
        assert _client(server).search_registered_models("name = 'team-a-anonymous'") == []


def test_c_team_b_cannot_add_a_version_of_team_as_model_nor_move_its_champion(server, users, team_a_model, tmp_path):
    """The register step as team-b on team-a's model: refused (403) with the user, the model and
    what to do; exit 1 (a permission error is not retried); no version created, the champion stays."""
    inp, _ = team_a_model
    client = _client(server)
    with as_user("team-a", users["team-a"].password):
        before = sorted(int(mv.version) for mv in client.search_model_versions(f"name = '{MODEL}'"))
        assert before == [1, 2] and client.get_model_version_by_alias(MODEL, "champion").version == "1"

    new_version = _register_step(server, users["team-b"], inp.model_copy(update={"run_key": "wf-team-b"}), tmp_path / "new")
    # the same run's version (a retried step's path): promote it
    move_alias = _register_step(server, users["team-b"], inp.model_copy(update={"decision": Decision.promote}), tmp_path / "alias")
    for r in (new_version, move_alias):
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert f"MLflow refused user team-b to write registered model {MODEL} (a version, the champion alias): " \
               "permission denied (403" in r.stderr, r.stderr
        assert "model prefix" in r.stderr and "Traceback" not in r.stderr, r.stderr

    from pipectl.components.mlflow_access import mlflow_access
    from pipectl.components.runtime import StepError

    with as_user("team-b", users["team-b"].password), pytest.raises(StepError, match="user team-b .* permission denied") as e:
        with mlflow_access(f"move the champion alias of {MODEL}"):
            client.set_registered_model_alias(MODEL, "champion", "2")
    assert not e.value.transient
    with as_user("team-a", users["team-a"].password):
        assert sorted(int(mv.version) for mv in client.search_model_versions(f"name = '{MODEL}'")) == before
        assert client.get_model_version_by_alias(MODEL, "champion").version == "1"


def test_c_team_b_cannot_log_a_training_run_to_team_as_experiment(server, users, team_a_model):
    """The train step's MLflow run goes to the experiment named as the model: team-a's is
    read-only to team-b, a clear failure that is not retried."""
    from pipectl.components.contracts import StoreSettings, TrainInput
    from pipectl.components.runtime import StepError
    from pipectl.components.train.core import _mlflow_run

    inp = TrainInput.model_construct(model_name=MODEL, workflow_name="training-team-b")
    with as_user("team-b", users["team-b"].password), pytest.raises(StepError, match=f"user team-b to log a run to experiment {MODEL}"):
        _mlflow_run(inp, StoreSettings(mlflow_uri=server.url))


def test_d_team_b_reads_team_as_model_and_its_champion(server, users, team_a_model, tmp_path):
    """READ for everyone: team-b's evaluate may compare its candidate with team-a's champion."""
    from pipectl.components.models import download_model

    _, champion_uri = team_a_model
    client = _client(server)
    with as_user("team-b", users["team-b"].password):
        assert client.get_registered_model(MODEL).name == MODEL
        champion = client.get_model_version_by_alias(MODEL, "champion")
        assert champion.version == "1"
        download_model(champion_uri, tmp_path / "champion", tracking_uri=server.url)
    assert any((tmp_path / "champion").rglob("MLmodel"))


def test_e_a_team_cannot_take_a_name_under_anothers_prefix_before_it_does(server, users, team_a_model):
    """No team has used ``team-a-unused`` yet, and still team-b's user cannot create it (a model or
    an experiment), nor rename its own model into team-a's prefix; under its own prefix it may.
    The admin is not held to a prefix. The server's own rule (pipectl.pipelines.backends.mlflow_names)."""
    from mlflow.exceptions import MlflowException

    client = _client(server)
    with as_user("team-b", users["team-b"].password):
        for create in (lambda: client.create_registered_model("team-a-unused"),
                       lambda: client.create_experiment("team-a-unused"),
                       lambda: client.create_registered_model("unprefixed")):
            with pytest.raises(MlflowException) as refused:
                create()
            assert refused.value.error_code == "PERMISSION_DENIED"
            assert "user team-b may name a" in str(refused.value) and "only team-b-<name>" in str(refused.value)
        client.create_registered_model("team-b-own")
        with pytest.raises(MlflowException, match="only team-b-<name>"):
            client.rename_registered_model("team-b-own", "team-a-own")
        experiment = client.create_experiment("team-b-own")
        with pytest.raises(MlflowException, match="only team-b-<name>"):
            client.rename_experiment(experiment, "team-a-own")
    with as_user(server.admin, server.admin_password):
        assert [m.name for m in client.search_registered_models(filter_string="name LIKE 'team-a-%'")] == [MODEL]
        assert client.get_registered_model("team-b-own").name == "team-b-own"
        assert client.create_registered_model("team-a-by-the-admin").name == "team-a-by-the-admin"


def test_a_secret_that_cannot_be_written_after_the_user_was_created_says_so_and_how_to_rerun(server, tmp_path, monkeypatch):
    """The API server accepts the dry run, then refuses the write (its RBAC changed in between; the
    one stand-in here: a cluster whose second answer differs): the command names the user it
    created, the Secret it did not write and `--rotate`, prints no password, and exits with the
    cluster error's code; the rerun with --rotate writes a Secret whose password signs in."""
    import yaml
    from click.testing import CliRunner

    from pipectl.cli.main import main
    from pipectl.pipelines.backends import kube

    written: list[dict] = []

    class Cluster:
        refuse = True

        def __init__(self, namespace: str, context: str | None = None) -> None:
            self.namespace = namespace

        def apply_secret(self, body: dict, *, dry_run: bool = False) -> None:
            if not dry_run and Cluster.refuse:
                raise Unreachable(f"apply Secret pipectl-mlflow-credentials in namespace {self.namespace}: the API server "
                                  "refused us (403 Forbidden)", "check your kubeconfig credentials and RBAC")
            if not dry_run:
                written.append(body)

    monkeypatch.setattr(kube, "ArgoCluster", Cluster)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [{"name": "team-d", "namespace": "ml-team-d", "groups": ["team-d-ml"], "max_gpus": 1,
                                               "model_prefix": "team-d", "s3_prefix": "s3://pipectl/teams/team-d/"}]}))
    env = {"MLFLOW_TRACKING_USERNAME": server.admin, "MLFLOW_TRACKING_PASSWORD": server.admin_password}
    argv = ["--site", str(site), "teams", "mlflow-user", "team-d", "--mlflow-uri", server.url]
    r = CliRunner().invoke(main, argv, env=env)
    assert r.exit_code == 3, r.output
    assert "MLflow user team-d was created, but Secret ml-team-d/pipectl-mlflow-credentials was not written" in r.output
    assert "mlflow-user team-d --rotate" in r.output and not written
    Cluster.refuse = False
    r = CliRunner().invoke(main, argv + ["--rotate"], env=env)
    assert r.exit_code == 0 and "given a new password" in r.output, r.output
    import base64

    creds = {k: base64.b64decode(v).decode() for k, v in written[0]["data"].items()}
    assert creds["MLFLOW_TRACKING_PASSWORD"] not in r.output
    with as_user(creds["MLFLOW_TRACKING_USERNAME"], creds["MLFLOW_TRACKING_PASSWORD"]):
        _client(server).search_experiments()


def test_doctor_checks_the_mlflow_secret_against_what_mlflow_asks_for(server, users, services):
    """``pipectl doctor``'s MLflow credentials row: with basic auth on, a missing Secret fails
    (MLflow answers 401 to the steps), a wrong password or a half Secret fails naming the fix, the
    team's real user passes; an MLflow without auth needs no Secret; a server that does not answer
    leaves the Secret's shape only."""
    import base64

    from pipectl.pipelines.backends.doctor_mlflow import credentials_row
    from pipectl.pipelines.backends.processes import free_port

    def secret(user: str | None, password: str | None) -> dict[str, str]:
        pairs = (("MLFLOW_TRACKING_USERNAME", user), ("MLFLOW_TRACKING_PASSWORD", password))
        return {k: base64.b64encode(v.encode()).decode() for k, v in pairs if v is not None}

    missing = credentials_row(server.url, None, "ml-vision")
    assert missing.status == "fail" and "asks for credentials (401)" in missing.detail
    assert "pipectl teams mlflow-user TEAM" in missing.fix and "ml-vision" in missing.fix
    right = credentials_row(server.url, secret("team-a", users["team-a"].password), "ml-vision")
    assert right.status == "ok" and "accepts user team-a" in right.detail, right
    wrong = credentials_row(server.url, secret("team-a", "not-the-password"), "ml-vision")
    assert wrong.status == "fail" and "refuses user team-a" in wrong.detail and "--rotate" in wrong.fix, wrong
    half = credentials_row(server.url, secret("team-a", None), "ml-vision")
    assert half.status == "fail" and "lacks MLFLOW_TRACKING_PASSWORD" in half.detail, half
    assert credentials_row(services.mlflow_url, None, "ml-vision").status == "ok"  # no auth: no Secret needed
    silent = credentials_row(f"http://127.0.0.1:{free_port()}", secret("team-a", "x"), "ml-vision")
    assert silent.status == "ok" and "not tried" in silent.detail, silent
