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


# A stand-in for the docker CLI: records each call (one line, arguments joined by spaces) in
# $DOCKER_LOG; `image inspect -f FORMAT REF` answers REF's repository @ a digest derived from REF
# (what a registry returns for a pushed or pulled image); everything else succeeds.
FAKE_DOCKER = r"""#!/usr/bin/env bash
echo "$*" >> "$DOCKER_LOG"
if [[ $1 == image && $2 == inspect && $3 == -f ]]; then
  ref=$5
  echo "${ref%:*}@sha256:$(printf %s "$ref" | sha256sum | cut -c1-64)"
fi
exit 0
"""


def test_push_images_builds_on_the_bases_digest_pushes_and_prints_settings_the_site_file_and_cli_take(tmp_path):
    """`make images-push REGISTRY=...` (scripts/push-images.sh) with a stand-in docker: the base
    is pulled and each target built on its digest from images/Dockerfile, tagged
    <registry>/<target>:<version>-<commit>, pushed; stdout is the site file's `registry` and
    `images` by digest (a site file made of it loads and names exactly those images), and the
    one-command alternative it prints is accepted by `pipectl templates apply` (dry run)."""
    import os
    import shlex

    import yaml

    from pipectl.pipelines.site import site_config

    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    log = tmp_path / "docker.log"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "DOCKER": str(docker), "DOCKER_LOG": str(log)}
    r = subprocess.run(["bash", str(REPO / "scripts" / "push-images.sh"), "registry.example.com/ml/"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    calls = log.read_text().splitlines()
    base = re.search(r"^ARG BASE_IMAGE=(\S+)", (REPO / "images" / "Dockerfile").read_text(), re.M)[1]
    assert f"pull -q {base}" in calls, calls
    builds = [c for c in calls if c.startswith("build ")]
    pushes = [c.split()[1] for c in calls if c.startswith("push ")]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert [re.search(r"--target (\S+)", b)[1] for b in builds] == ["step-light", "step-train"], builds
    for build, target in zip(builds, ("step-light", "step-train")):
        assert "-f images/Dockerfile" in build and f"--build-arg BASE_IMAGE={base.rsplit(':', 1)[0]}@sha256:" in build, build
        tag = re.search(r"-t (\S+)", build)[1]
        assert re.fullmatch(rf"registry\.example\.com/ml/{target}:{re.escape(version)}-[0-9a-f]{{12}}(-dirty)?", tag), tag
        assert tag in pushes, (tag, pushes)

    settings = yaml.safe_load(r.stdout)
    assert settings["registry"] == "registry.example.com/ml" and set(settings["images"]) == {"step-light", "step-train"}
    site = tmp_path / "site.yaml"
    site.write_text(r.stdout)
    cfg = site_config(site)
    for target, digest in settings["images"].items():
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
        assert cfg.image(target) == f"registry.example.com/ml/{target}@{digest}"

    command = re.search(r"or give them to one command: (pipectl templates apply .*)", r.stderr)[1]
    dry = subprocess.run([str(REPO / ".venv" / "bin" / "pipectl"), *shlex.split(command)[1:], "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert dry.returncode == 0, (command, dry.stderr[-2000:])
    for target, digest in settings["images"].items():
        assert f"image: registry.example.com/ml/{target}@{digest}" in dry.stdout, (target, dry.stdout[-2000:])
