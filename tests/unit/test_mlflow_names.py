"""pipectl's rule on MLflow names (pure): which requests of a team's user the MLflow server
refuses, the config section that names the teams, and `pipectl teams mlflow-config`. The real
server enforcing it: tests/integration/test_mlflow_auth.py (test_e)."""

from __future__ import annotations

import configparser

import pytest
import yaml

from pipectl.pipelines.backends.mlflow_names import KEY, SECTION, parse_team_prefixes, refusal, render_section
from tests.unit.test_cli_conventions import _run
from tests.unit.test_store_policy import SPEECH_USER
from tests.unit.test_teams import VISION

PREFIXES = {"vision": "vision", "speech": "sp"}


@pytest.mark.parametrize("path, body", [
    ("/api/2.0/mlflow/registered-models/create", {"name": "sp-digits"}),
    ("/ajax-api/2.0/mlflow/registered-models/create", {"name": "digits"}),
    ("/api/2.0/mlflow/experiments/create", {"name": "visionary-x"}),  # not vision-…
    ("/api/2.0/mlflow/registered-models/rename", {"name": "vision-a", "new_name": "sp-a"}),
    ("/api/2.0/mlflow/experiments/update", {"experiment_id": "3", "new_name": "x"}),
    ("/api/2.0/mlflow/registered-models/create", {}),
    ("/api/2.0/mlflow/registered-models/create", "not json"),
])
def test_a_team_user_may_not_name_anything_outside_its_prefix(path, body):
    why = refusal("vision", "POST", path, body, PREFIXES)
    assert why is not None and "only vision-<name>" in why


@pytest.mark.parametrize("user, method, path, body", [
    ("vision", "POST", "/api/2.0/mlflow/registered-models/create", {"name": "vision-digits"}),
    ("vision", "POST", "/api/2.0/mlflow/experiments/create", {"name": "vision-digits"}),
    ("vision", "POST", "/api/2.0/mlflow/model-versions/create", {"name": "sp-digits"}),  # the owner's permission decides
    ("vision", "GET", "/api/2.0/mlflow/registered-models/get", {"name": "sp-digits"}),
    ("admin", "POST", "/api/2.0/mlflow/registered-models/create", {"name": "sp-digits"}),
    ("analyst", "POST", "/api/2.0/mlflow/experiments/create", {"name": "anything"}),
])
def test_other_requests_and_users_are_left_to_mlflows_permissions(user, method, path, body):
    assert refusal(user, method, path, body, PREFIXES) is None


def test_the_config_section_round_trips_and_a_bad_entry_is_named():
    config = configparser.ConfigParser()
    config.read_string(render_section(PREFIXES))
    assert parse_team_prefixes(config.get(SECTION, KEY)) == PREFIXES
    assert parse_team_prefixes("") == {}
    with pytest.raises(ValueError, match="'vision' is not <MLflow user>=<model prefix>"):
        parse_team_prefixes("speech=sp, vision")


def test_teams_mlflow_config_prints_the_section_of_the_site_files_teams(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"teams": [VISION, SPEECH_USER]}))
    r = _run("--site", site, "teams", "mlflow-config")
    assert r.returncode == 0, r.stderr
    config = configparser.ConfigParser()
    config.read_string(r.stdout)
    assert parse_team_prefixes(config.get(SECTION, KEY)) == {"vision": "vision", "speech": "speech"}
    site.write_text(yaml.safe_dump({"namespace": "pipectl"}))
    r = _run("--site", site, "teams", "mlflow-config")
    assert r.returncode == 2 and "declares no teams" in r.stderr
