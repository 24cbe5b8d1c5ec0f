"""The step images' build from the repository root (images/Dockerfile, .dockerignore) and the push
script's arguments (scripts/push-images.sh). A real build and push: docs/testing.md, "Step images
with plain docker build"."""

from __future__ import annotations

import glob
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _copy_sources() -> list[str]:
    """The sources of the Dockerfile's COPY instructions from the build context (not --from=)."""
    sources = []
    for line in (REPO / "images" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            sources += line.split()[1:-1]
    return sources


def test_the_dockerfile_copies_from_the_repository_root_what_exists_and_every_source_root():
    sources = _copy_sources()
    # each names something in the repository, or the optional CA bundle (a pattern that may match nothing)
    for src in sources:
        assert glob.glob(str(REPO / src)) or src == "images/build-ca.cr[t]", f"COPY {src}: nothing of that name"
    roots = {d.split("/", 1)[0] for d in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()}
    assert roots <= set(sources), f"source roots not copied into the image: {sorted(roots - set(sources))}"
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") + 1:][:7] == ["!pyproject.toml", "!README.md", "!cli/", "!pipelines/", "!components/", "!images/",
                                                  "**/__pycache__"], ignore
    assert "images/build-ca.crt" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.parametrize("args, message", [
    ([], "usage: scripts/push-images.sh REGISTRY"),
    (["Registry.Example.com/ML"], "is not a registry path"),
    (["registry.example.com/ml", "step-gpu"], "unknown image step-gpu: one of step-light step-train"),
])
def test_push_images_refuses_bad_arguments_before_any_build(args, message):
    r = subprocess.run(["bash", str(REPO / "scripts" / "push-images.sh"), *args], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "DOCKER": "/bin/false"})
    assert r.returncode == 2 and message in r.stderr, (r.returncode, r.stderr)
    assert not re.search(r"building|pushing", r.stderr)
