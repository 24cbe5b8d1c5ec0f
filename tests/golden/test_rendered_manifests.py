"""argo/ holds the rendered WorkflowTemplates; they must equal what `pipectl render` prints.

Regenerate on request only: `make golden` (never silently in CI).
"""

from pathlib import Path

import yaml
from click.testing import CliRunner

from pipectl.cli.main import main

ARGO = Path(__file__).resolve().parents[2] / "argo"


def test_training_template_in_argo_matches_render():
    result = CliRunner().invoke(main, ["render", "training"])
    assert result.exit_code == 0, result.output
    rendered = yaml.safe_load(result.output)
    checked_in = yaml.safe_load((ARGO / "workflowtemplates" / "training-v1.yaml").read_text())
    assert rendered == checked_in, "argo/workflowtemplates/training-v1.yaml is stale: run `make golden`"


def test_kustomization_lists_every_rendered_template():
    kustomization = yaml.safe_load((ARGO / "kustomization.yaml").read_text())
    rendered = sorted(p.relative_to(ARGO).as_posix() for p in (ARGO / "workflowtemplates").glob("*.yaml"))
    assert sorted(r for r in kustomization["resources"] if r.startswith("workflowtemplates/")) == rendered
