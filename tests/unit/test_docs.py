"""What the product's text says about itself stays true: the Python versions the README states
are pyproject's, every document it points to is in the repository, and every field-case id a user
can read has its glossary entry."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASE_ID = re.compile(r"\bC\d{2}\b")


def _product_files() -> list[Path]:
    """The repository's files (tracked, and new ones not ignored), tests and vendored schemas included."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return [ROOT / p for p in out.splitlines() if (ROOT / p).is_file()]


def test_the_readme_states_the_python_versions_pyproject_requires():
    """The light install runs on every Python pyproject allows: no upper bound in the README that
    pyproject does not have."""
    import tomllib

    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    floor = re.fullmatch(r">=\s*(3\.\d+)", requires)
    assert floor, f"requires-python {requires!r}: update this test and the README together"
    readme = (ROOT / "README.md").read_text()
    assert f"Python ≥ {floor[1]}" in readme
    for path in (ROOT / "README.md", ROOT / "scripts" / "setup.sh", *(ROOT / "docs").glob("*.md")):
        capped = re.findall(r"Python \(?3\.\d+\s*[-–]\s*3\.\d+|needs 3\.\d+\s*[-–]\s*3\.\d+", path.read_text())
        assert not capped, f"{path.relative_to(ROOT)}: {capped} (pyproject: {requires})"


def test_no_file_points_to_a_document_outside_the_repository():
    names = ("DESIGN" + ".md", "REFERENCE" + ".md")  # spelled apart so this file does not name them
    found = [f"{p.relative_to(ROOT)}: {n}" for p in _product_files() if p.suffix not in (".png", ".jpg")
             for n in names if n in p.read_text(errors="replace")]
    assert not found, found


def _user_strings(path: Path) -> list[str]:
    """The string literals of a module that are not docstrings (messages, descriptions, help)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_every_field_case_id_a_user_reads_has_a_glossary_entry():
    """Messages (lint's among them), the rendered manifests (the Argo UI shows their descriptions)
    and the user docs may cite a field case only if docs/glossary.md explains it."""
    glossary = set(re.findall(r"^## (C\d{2}) ", (ROOT / "docs" / "glossary.md").read_text(), re.M))
    cited: dict[str, str] = {}
    for root in ("cli", "pipelines", "components"):
        for path in (ROOT / root).rglob("*.py"):
            for text in _user_strings(path):
                cited.update((i, str(path.relative_to(ROOT))) for i in CASE_ID.findall(text))
    for path in [*(ROOT / "argo").rglob("*.yaml"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        cited.update((i, str(path.relative_to(ROOT))) for i in CASE_ID.findall(path.read_text()))
    assert {"C10", "C15"} <= set(cited)  # lint's messages cite these: the scan sees them
    missing = {i: where for i, where in cited.items() if i not in glossary}
    assert not missing, f"field-case ids without a docs/glossary.md entry: {missing}"
