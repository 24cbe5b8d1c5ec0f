"""The light install: `pip install .` (the distribution pipectl-ml) WITHOUT the `steps` extra, into a fresh venv
of the newest Python this machine has (3.10-3.14; pyenv's versions too),
gives a working command line for people who only submit: render, lint, submit --dry-run, and
completion; the steps' heavy dependencies (torch, DALI, MLflow, boto3, moto) are not installed, and
`pipectl run` says which extra to install instead of failing on an import.

Downloads from PyPI (hera, kubernetes, pydantic, click, rich, jsonschema and their dependencies,
~40 MB; pip's cache makes a second run faster). The time of each part is printed ([timing] lines).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DEV_PIPECTL = Path(sys.executable).parent / "pipectl"
HEAVY = ("torch", "mlflow", "nvidia.dali", "boto3", "moto", "sklearn")


def _sources(dest: Path) -> Path:
    """The checkout's tracked and new files of the package, copied (an in-tree build would write
    build/ and *.egg-info into the shared working tree)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                            "pyproject.toml", "README.md", "cli", "pipelines", "components"],
                           cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    for rel in filter(None, files):
        src = REPO / rel.decode()
        if src.is_file():
            (dest / rel.decode()).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel.decode()).write_bytes(src.read_bytes())
    return dest


def _run(argv: list, timeout: int = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)


def _newest_python() -> tuple[str, tuple[int, int]]:
    """The newest CPython 3.10-3.14 on this machine that can make a venv: ``python3.X`` on PATH (a
    pyenv shim of a version not selected fails and is passed over), else pyenv's own versions, else
    this interpreter. ``$PIPECTL_LIGHT_PYTHON`` names one instead."""
    import glob
    import shutil

    def usable(exe: str | None) -> tuple[int, int] | None:
        r = _run([exe, "-c", "import ensurepip, sys, venv; print(*sys.version_info[:2])"], timeout=30) if exe else None
        return tuple(map(int, r.stdout.split())) if r is not None and r.returncode == 0 else None  # type: ignore[return-value]

    if os.environ.get("PIPECTL_LIGHT_PYTHON"):
        exe = os.environ["PIPECTL_LIGHT_PYTHON"]
        version = usable(exe)
        assert version, f"PIPECTL_LIGHT_PYTHON={exe} cannot make a venv"
        return exe, version
    root = _run(["pyenv", "root"], timeout=30).stdout.strip() if shutil.which("pyenv") else ""
    for minor in range(14, 9, -1):
        found = [shutil.which(f"python3.{minor}")] + sorted(glob.glob(f"{root}/versions/3.{minor}.*/bin/python3.{minor}") if root else [])
        for exe in filter(None, found):
            if (version := usable(exe)) is not None:
                return exe, version
    return sys.executable, sys.version_info[:2]


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("light")
    src = _sources(tmp / "src")
    venv = tmp / "venv"
    python, version = _newest_python()
    assert version >= sys.version_info[:2], (python, version)
    t0 = time.monotonic()
    r = _run([python, "-m", "venv", venv])
    assert r.returncode == 0, r.stderr
    print(f"[light install] Python {version[0]}.{version[1]} ({python})", file=sys.stderr)
    t1 = time.monotonic()
    # a normal install of the checkout (no --no-deps): what `pip install .` resolves
    r = _run([venv / "bin" / "pip", "install", "--quiet", src], timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    t2 = time.monotonic()
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink())
    print(f"[timing] light install: venv {t1 - t0:.1f} s, pip install {t2 - t1:.1f} s, {size / 2**20:.0f} MiB installed", file=sys.stderr)
    return venv


def test_light_install_has_none_of_the_steps_heavy_dependencies(light_venv):
    code = ("import importlib.util, sys\n"
            "def found(m):\n"
            "    try:\n"
            "        return importlib.util.find_spec(m) is not None\n"
            "    except ModuleNotFoundError:\n"
            "        return False\n"
            f"print([m for m in {HEAVY!r} if found(m)])\n"
            "print(found('hera'), found('kubernetes'), found('pipectl.cli.main'))")
    r = _run([light_venv / "bin" / "python", "-c", code])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[]", "True True True"], r.stdout
    # the same probe sees them in the dev venv (the check can fail)
    r = _run([sys.executable, "-c", code])
    assert r.stdout.splitlines()[0] != "[]", r.stdout


def test_light_install_renders_lints_and_dry_runs_as_the_full_install(light_venv, tmp_path):
    pipectl = light_venv / "bin" / "pipectl"
    env = {**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")}
    t0 = time.monotonic()
    light = _run([pipectl, "render", "training"], env=env)
    assert light.returncode == 0, light.stderr
    full = _run([DEV_PIPECTL, "render", "training"], env=env)
    assert light.stdout == full.stdout and "kind: WorkflowTemplate" in light.stdout
    # a user pipeline whose train function needs torch (in its image only) renders alike
    example = f"{Path(__file__).resolve().parents[2] / 'examples' / 'image-classifier' / 'pipeline.py'}:pipeline"
    light, full = _run([pipectl, "render", example], env=env), _run([DEV_PIPECTL, "render", example], env=env)
    assert light.returncode == 0 and light.stdout == full.stdout and "shapes.train:train" in light.stdout, light.stderr

    params = tmp_path / "params.yaml"
    params.write_text("epochs: 2\nlane: urgent\n")
    args = ["submit", "training", "--dry-run", "--parameter-file", params, "-p", "epochs=3"]
    light = _run([pipectl, *args], env=env)
    assert light.returncode == 0, light.stderr
    full = _run([DEV_PIPECTL, *args], env=env)
    assert light.stdout == full.stdout
    assert "- name: epochs\n      value: '3'" in light.stdout and "pipectl.io/lane: urgent" in light.stdout

    # lint (jsonschema: once only a transitive dependency of the steps' packages) on what it rendered
    rendered = tmp_path / "training-v1.yaml"
    rendered.write_text(_run([pipectl, "render", "training"], env=env).stdout)
    r = _run([pipectl, "lint", rendered], env=env)
    assert r.returncode == 0, r.stderr
    assert "1 object(s) valid" in r.stderr, r.stderr
    r = _run([pipectl, "completion", "bash"], env=env)
    assert r.returncode == 0 and "_PIPECTL_COMPLETE" in r.stdout, r.stderr
    print(f"[timing] light install: render + submit --dry-run + lint + completion {time.monotonic() - t0:.1f} s",
          file=sys.stderr)


def test_light_install_run_names_the_extra_to_install(light_venv, tmp_path):
    for argv in (["run", "training"], ["data", "example", tmp_path / "digits"]):
        r = _run([light_venv / "bin" / "pipectl", *argv])
        assert r.returncode == 2, r.stdout + r.stderr
        assert "pipectl-ml[steps]" in r.stderr and "'<checkout>[steps]'" in r.stderr and "Traceback" not in r.stderr, r.stderr
