#!/usr/bin/env bash
# Stop the real node of scripts/node-up.sh (pods, kubelet, containerd, CoreDNS, forwarders; bridge).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-${PIPECTL_CLUSTER_DIR:-/tmp/pipectl-cluster}}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
exec "$PY" tests/cluster/node.py down "$RUN_DIR"
