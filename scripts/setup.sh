#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment and install pipectl into it.
#
# The environment is heavy (torch with its CUDA wheels, DALI, mlflow: ~7 GB), so it is built once
# under a cache folder keyed by the Python version and the dependency lists in pyproject.toml,
# and .venv is a link to it. A warm cache makes this a few seconds; a cold one downloads from PyPI.
#   PIPECTL_CACHE_DIR  cache root (default: ~/.cache/pipectl)
#   PYTHON             interpreter to build with (default: python3; needs ≥ 3.10 and wheels of the pinned torch and DALI for it)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CACHE_DIR=${PIPECTL_CACHE_DIR:-$HOME/.cache/pipectl}
mkdir -p "$CACHE_DIR"

# What the dev venv installs: the CLI's dependencies and EVERY extra (steps: torch, DALI, mlflow...;
# dev: pytest...). The cache key is this requirement set (sorted: moving a requirement between
# pyproject's lists changes nothing) and the Python version.
reqs=$("$PYTHON" - <<'PY'
import tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project.get("optional-dependencies", {})
print("\n".join(sorted(set(project["dependencies"]).union(*extras.values()))))
PY
)
key=$(printf '%s\n%s\n' "$("$PYTHON" -c 'import sys; print(sys.version_info[:3])')" "$reqs" | sha256sum | cut -c1-16)
venv="$CACHE_DIR/venv-$key"

exec 9>"$CACHE_DIR/venv-$key.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  # A cached venv of this Python that already satisfies every requirement (pip's dry run would
  # install nothing: a reorganised pyproject, a requirement that came transitively) is reused
  # through a link instead of downloading GBs again.
  pyver=$("$PYTHON" -c 'import sys; print(sys.version_info[:3])')
  for old in "$CACHE_DIR"/venv-*/; do
    old=${old%/}
    [ -f "$old/.complete" ] && [ ! -L "$old" ] && [ "$old" != "$venv" ] || continue
    [ "$("$old/bin/python" -c 'import sys; print(sys.version_info[:3])' 2>/dev/null)" = "$pyver" ] || continue
    report=$(printf '%s\n' "$reqs" | "$old/bin/pip" install --dry-run --quiet --report - -r /dev/stdin 2>/dev/null) || continue
    # What pip would install: nothing (reuse as it is), or only new, small distributions that
    # nothing in the old venv has (installed into it: it still satisfies its own set, since no
    # installed distribution changes), or anything else (build a new venv).
    adds=$(printf '%s' "$report" | "$old/bin/python" -c '
import json, sys
from importlib.metadata import PackageNotFoundError, version
items = json.load(sys.stdin)["install"]
def installed(name):
    try:
        return version(name)
    except PackageNotFoundError:
        return None
heavy = [i for i in items if i["metadata"]["name"].lower().startswith(("torch", "nvidia", "mlflow"))
         and i["metadata"]["name"].lower() not in ("torchvision",)]
if heavy or len(items) > 15 or any(installed(i["metadata"]["name"]) for i in items):
    print("rebuild")
else:
    print(" ".join("%s==%s" % (i["metadata"]["name"], i["metadata"]["version"]) for i in items))
') || continue
    [ "$adds" != rebuild ] || continue
    if [ -n "$adds" ]; then
      echo "setup: adding to $old: $adds" >&2
      # shellcheck disable=SC2086
      ( flock 8; "$old/bin/pip" install --quiet --no-deps $adds ) 8>"$old.lock" || continue
    fi
    rm -rf "$venv"
    ln -s "$old" "$venv"
    echo "setup: $old satisfies this requirement set; reused as $venv" >&2
    break
  done
fi
if [ ! -f "$venv/.complete" ]; then
  echo "setup: building $venv (cold: downloads torch, DALI, mlflow; several minutes)" >&2
  start=$(date +%s)
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  # Dependencies only (the project itself is installed editable below, per checkout).
  printf '%s\n' "$reqs" > "$venv/requirements.txt"
  "$venv/bin/pip" install --quiet -r "$venv/requirements.txt"
  touch "$venv/.complete"
  echo "setup: environment built in $(( $(date +%s) - start )) s" >&2
fi
venv=$(cd "$venv" && pwd -P)  # a reused venv: its own path (its console scripts name it)
# The checkout's own .venv: a light venv that sees the cached dependencies through a .pth file
# (site.addsitedir, so their own .pth files load too) and has pipectl installed editable from
# THIS checkout. Two checkouts never fight over one editable install.
PY_MM=$("$PYTHON" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
deps_site="$venv/lib/python$PY_MM/site-packages"
if [ -L .venv ]; then rm .venv; fi  # older layout: a link to the cache
if [ ! -x .venv/bin/python ] || [ "$(cat .venv/.deps 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
  "$PYTHON" -m venv --without-pip .venv
fi
own_site=".venv/lib/python$PY_MM/site-packages"
echo "import site; site.addsitedir('$deps_site')" > "$own_site/pipectl-deps.pth"
# Console scripts of the dependencies (torchrun, mlflow, pytest...), re-pointed at this venv.
for script in "$venv"/bin/*; do
  name=$(basename "$script")
  case "$name" in python*|pip*|activate*|Activate*) continue ;; esac
  if head -c 64 "$script" 2>/dev/null | grep -q "^#!$venv/bin/python"; then
    sed "1s|.*|#!$PWD/.venv/bin/python|" "$script" > ".venv/bin/$name"
    chmod +x ".venv/bin/$name"
  fi
done
echo "$venv" > .venv/.deps
# setuptools' editable-install warnings are noise here; show them only if the install fails.
if ! "$venv/bin/pip" --python .venv/bin/python install --quiet --no-deps --no-build-isolation -e . 2>.venv/editable-install.log; then
  cat .venv/editable-install.log >&2
  exit 1
fi
echo "setup: .venv (this checkout) + dependencies from $venv" >&2
