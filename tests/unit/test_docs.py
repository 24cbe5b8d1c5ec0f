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


# the admin's path, in the order the README's tested block must hold it
INSTALL_STEPS = ("pipectl site init site.yaml", "render cluster --write argo", "export PIPECTL_SITE=",
                 "kubectl apply --server-side -k argo/cluster", "kubectl apply --server-side -k argo/namespace",
                 "create secret generic pipectl-s3-credentials", "pipectl lint", "pipectl templates apply", "pipectl doctor")


def test_the_install_blocks_a_test_runs_verbatim_are_marked_and_hold_the_whole_path():
    """The README's cluster install is ONE marked block (tests/cluster/test_control_plane.py runs it
    on the control plane as written) holding every step of the admin's path, the site file's
    first; docs/install.md's site-file commands are marked too."""
    from tests.tools.doc_blocks import tested_blocks

    readme = tested_blocks(ROOT / "README.md")
    assert len(readme) == 1, f"README.md: {len(readme)} marked blocks, want the one install block"
    text = "\n".join(readme[0])
    at = [text.find(step) for step in INSTALL_STEPS]
    assert -1 not in at and at == sorted(at), [s for s, i in zip(INSTALL_STEPS, at) if i < 0] or readme[0]
    install = tested_blocks(ROOT / "docs" / "install.md")
    assert any("site init" in c for block in install for c in block), install


def test_the_marked_site_file_commands_run_as_written(tmp_path):
    """Each marked block's commands up to its first kubectl (the site file: init, show, render,
    export; they need no cluster) run verbatim, in one shell each, in a fresh copy of a checkout
    (the venv, no argo/ yet): each exits 0, site.yaml is written and argo/ rendered from it."""
    import os

    from tests.tools.doc_blocks import run_block, tested_blocks

    env = {k: v for k, v in os.environ.items() if k not in ("PIPECTL_SITE", "PIPECTL_NAMESPACE", "KUBECONFIG")}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"  # `pipectl` as an installed command
    blocks = tested_blocks(ROOT / "README.md") + tested_blocks(ROOT / "docs" / "install.md")
    for n, block in enumerate(blocks):
        local = block[:next((i for i, c in enumerate(block) if c.startswith("kubectl")), len(block))]
        assert any("render cluster --write argo" in c for c in local), block
        work = tmp_path / f"checkout-{n}"
        work.mkdir()
        (work / ".venv").symlink_to(ROOT / ".venv")
        run = run_block(local, work, env, timeout_s=300)
        assert not run.failed(), (run.failed(), run.output[-3000:])
        assert "namespace: pipectl" in (work / "site.yaml").read_text()
        for kustomization in ("argo/cluster", "argo/namespace", "argo"):
            assert (work / kustomization / "kustomization.yaml").is_file(), (kustomization, run.output[-2000:])


README_MAX_LINES = 400
# internal history: tracker numbers ("issue 12", "issues #3", a bare "#12" that is no upstream
# "owner/repo#12"), work-log entries
INTERNAL = re.compile(r"\bissues? #?\d+\b|(?<![\w./-])#\d{1,5}\b|\bwork[- ]?log", re.I)


def test_the_readme_is_a_users_page_and_no_product_file_cites_internal_history():
    """The README stays short (the user's path; the rest is in docs/), and no file of the product
    (docs, code, manifests, examples, scripts) cites tracker numbers or work-log entries; an
    upstream project's issue (``volcano-sh/volcano#5973``) is a reference, not history."""
    readme = (ROOT / "README.md").read_text().splitlines()
    assert len(readme) <= README_MAX_LINES, f"README.md has {len(readme)} lines (at most {README_MAX_LINES}): move detail to docs/"
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "README.md", "docs", "cli",
                          "pipelines", "components", "argo", "examples", "images", "scripts", "Makefile"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for rel in out.splitlines():
        path = ROOT / rel
        if not path.is_file() or path.suffix in (".png", ".jpg", ".npz", ".parquet"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found += [f"{rel}:{n}: {m.group(0)!r}" for m in INTERNAL.finditer(line)]
    assert not found, found[:20]
    assert INTERNAL.search("see issue 28") and INTERNAL.search("fixed in #41") and INTERNAL.search("work-log 2026-11-30")
    assert not INTERNAL.search("upstream volcano-sh/volcano#5973") and not INTERNAL.search("argo-workflows#9875")


DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def _measured_rows() -> list[str]:
    """The body rows of the "Measured" table at the top of docs/benchmarks.md."""
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    section = text.split("\n## Measured", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| what |")]


def _known_commits(names: set[str]) -> set[str]:
    """Those of ``names`` that name a commit of this repository; all of them where the checkout has no
    full history to look them up in (a shallow clone, a source tarball)."""
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        return names
    ordered = sorted(names)
    out = subprocess.run(["git", "cat-file", "--batch-check"], cwd=ROOT, input="".join(f"{n}^{{commit}}\n" for n in ordered),
                         capture_output=True, text=True, check=True).stdout.splitlines()
    return {n for n, line in zip(ordered, out) if not line.endswith(" missing")}


def test_every_measured_figure_carries_the_date_and_commit_it_was_recorded_at():
    """Each row of docs/benchmarks.md's "Measured" table names a date (YYYY-MM-DD) and a commit of this
    repository that recorded its figure, or says "date unknown": a figure without its date cannot be
    told stale."""
    rows = _measured_rows()
    assert len(rows) >= 20, f"the Measured table was not found whole: {len(rows)} rows"
    commits = _known_commits({c for row in rows for c in COMMIT.findall(row)})
    bad = [row[:80] for row in rows if "date unknown" not in row
           and not (DATE.search(row) and commits.intersection(COMMIT.findall(row)))]
    assert not bad, f"rows of docs/benchmarks.md's Measured table without a date and a commit: {bad}"
    assert not DATE.search("| 42.5 s wall |") and not COMMIT.search("| 1,797 files, 4.7 s |")
