"""``pipectl teams mlflow-user TEAM`` end to end: a real MLflow in basic-auth mode
(tests/harness/mlflow_auth.py) and the real API server of the shared control plane. The user is
created on MLflow and its Secret written in the team's namespace; the Secret's credentials sign in;
a second run keeps both; --rotate changes both; a team whose namespace does not exist fails
before MLflow is changed. The MLflow half alone: tests/integration/test_mlflow_auth.py."""

from __future__ import annotations

import base64
import os
import subprocess

import pytest
import yaml

from tests.cluster.test_control_plane import PIPECTL
from tests.harness.mlflow_auth import as_user, auth_mlflow

pytestmark = pytest.mark.cluster

NS = "mlflow-team-a"
TEAMS = [{"name": "team-a", "namespace": NS, "groups": ["team-a-ml"], "max_gpus": 1, "model_prefix": "team-a",
          "s3_prefix": "s3://pipectl/teams/team-a/"},
         {"name": "team-b", "namespace": "mlflow-team-b-not-created", "groups": ["team-b-ml"], "max_gpus": 1,
          "model_prefix": "team-b", "s3_prefix": "s3://pipectl/teams/team-b/"}]


def _secret(core) -> tuple[dict[str, str], str]:
    s = core.read_namespaced_secret("pipectl-mlflow-credentials", NS)
    return {k: base64.b64decode(v).decode() for k, v in s.data.items()}, s.metadata.resource_version


def _signs_in(url: str, creds: dict[str, str]) -> bool:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    with as_user(creds["MLFLOW_TRACKING_USERNAME"], creds["MLFLOW_TRACKING_PASSWORD"]):
        try:
            MlflowClient(tracking_uri=url).search_experiments()
            return True
        except MlflowException as e:
            assert e.error_code == "UNAUTHENTICATED", e
            return False


def test_the_admin_command_writes_the_teams_secret_its_steps_sign_in_with(test_cluster, k8s_api, tmp_path):
    from kubernetes import client

    core = client.CoreV1Api(k8s_api)
    core.create_namespace({"metadata": {"name": NS}})
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": TEAMS}))
    try:
        with auth_mlflow(tmp_path / "mlflow") as srv:
            env = {**{k: v for k, v in os.environ.items() if k != "PIPECTL_NAMESPACE"}, "KUBECONFIG": str(test_cluster.kubeconfig),
                   "MLFLOW_TRACKING_USERNAME": srv.admin, "MLFLOW_TRACKING_PASSWORD": srv.admin_password}

            def cli(*args: str) -> subprocess.CompletedProcess:
                return subprocess.run([str(PIPECTL), "--site", str(site), "teams", "mlflow-user", *args, "--mlflow-uri", srv.url],
                                      capture_output=True, text=True, timeout=120, env=env)

            r = cli("team-a")
            assert r.returncode == 0 and "MLflow user team-a created" in r.stderr, r.stderr
            first, version = _secret(core)
            assert first["MLFLOW_TRACKING_USERNAME"] == "team-a" and first["MLFLOW_TRACKING_PASSWORD"] not in r.stderr + r.stdout
            assert _signs_in(srv.url, first)

            r = cli("team-a")
            assert r.returncode == 0 and "exists" in r.stderr and "--rotate" in r.stderr, r.stderr
            assert _secret(core) == (first, version)

            r = cli("team-a", "--rotate")
            assert r.returncode == 0 and "given a new password" in r.stderr, r.stderr
            rotated, _ = _secret(core)
            assert rotated["MLFLOW_TRACKING_PASSWORD"] != first["MLFLOW_TRACKING_PASSWORD"]
            assert _signs_in(srv.url, rotated) and not _signs_in(srv.url, first)

            r = cli("team-b")  # its namespace does not exist: the API server's dry run refuses before MLflow is asked
            assert r.returncode != 0 and "Secret pipectl-mlflow-credentials in namespace mlflow-team-b-not-created" in r.stderr, r.stderr
            from mlflow.server import get_app_client

            with as_user(srv.admin, srv.admin_password), pytest.raises(Exception, match="RESOURCE_DOES_NOT_EXIST"):
                get_app_client("basic-auth", tracking_uri=srv.url).get_user("team-b")
    finally:
        core.delete_namespace(NS)
