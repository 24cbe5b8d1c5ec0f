#!/usr/bin/env bash
# Stop the cluster started by scripts/cluster-up.sh in this folder (kills its components' process
# groups) and remove the folder. Idempotent: nothing running is fine.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-${PIPECTL_CLUSTER_DIR:-/tmp/pipectl-cluster}}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" tests/cluster/cluster.py down "$RUN_DIR"
