"""argo/ holds the rendered manifests; they must equal what `pipectl render` produces.

Regenerate on request only: `make golden` (never silently in CI). Compared as parsed YAML
(normalised), so formatting noise cannot hide or fake a difference.
"""

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from pipectl.cli.main import main
from pipectl.pipelines.manifests import TEMPLATE_FILE, render_files

ARGO = Path(__file__).resolve().parents[2] / "argo"
RENDERED = render_files()


@pytest.mark.parametrize("rel", sorted(RENDERED))
def test_checked_in_manifest_matches_render(rel):
    path = ARGO / rel
    assert path.exists(), f"argo/{rel} missing: run `make golden`"
    assert list(yaml.safe_load_all(path.read_text())) == list(yaml.safe_load_all(RENDERED[rel])), f"argo/{rel} is stale: run `make golden`"


def test_argo_holds_nothing_unrendered():
    on_disk = sorted(p.relative_to(ARGO).as_posix() for p in ARGO.rglob("*.yaml"))
    assert on_disk == sorted(RENDERED)


def test_render_training_prints_the_checked_in_template():
    result = CliRunner().invoke(main, ["render", "training"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.output) == yaml.safe_load((ARGO / TEMPLATE_FILE).read_text())
