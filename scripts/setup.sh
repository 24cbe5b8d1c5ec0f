#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install pipectl into it.
#
# The environment is heavy (torch with its CUDA wheels, DALI, mlflow: ~7 GB), so it is built once
# under a cache folder keyed by the Python version and the dependency lists in pyproject.toml,
# and .venv is a link to it. A warm cache makes this a few seconds; a cold one downloads from PyPI.
#   PIPECTL_CACHE_DIR  cache root (default: ~/.cache/pipectl)
#   PYTHON             interpreter to build with (default: python3; needs 3.10-3.12)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CACHE_DIR=${PIPECTL_CACHE_DIR:-$HOME/.cache/pipectl}
mkdir -p "$CACHE_DIR"

key=$("$PYTHON" - <<'PY'
import hashlib, sys, tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
blob = repr((sys.version_info[:3], project["dependencies"], project.get("optional-dependencies", {})))
print(hashlib.sha256(blob.encode()).hexdigest()[:16])
PY
)
venv="$CACHE_DIR/venv-$key"

exec 9>"$CACHE_DIR/venv-$key.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  echo "setup: building $venv (cold: downloads torch, DALI, mlflow; several minutes)" >&2
  start=$(date +%s)
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # Dependencies only (the project itself is installed editable below, per checkout).
  "$PYTHON" - > "$venv/requirements.txt" <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
for dep in project["dependencies"] + project["optional-dependencies"]["dev"]:
    print(dep)
PY
  "$venv/bin/pip" install --quiet -r "$venv/requirements.txt"
  touch "$venv/.complete"
  echo "setup: environment built in $(( $(date +%s) - start )) s" >&2
fi
# setuptools' editable-install warnings are noise here; show them only if the install fails.
if ! "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e . 2>"$venv/editable-install.log"; then
  cat "$venv/editable-install.log" >&2
  exit 1
fi
ln -sfn "$venv" .venv
echo "setup: .venv -> $venv" >&2
