#!/usr/bin/env bash
# Bring up a real node (containerd + runc + CNI + kubelet; tests/cluster/node.py) on top of the
# loopback control plane of `make cluster-up`, with the pause, argoexec and step images loaded.
# Needs root. KWOK's fake nodes are cordoned so that pods land on the real node.
#     eval "$(make -s cluster-up)"; make node-up; ...; make node-down; make cluster-down
# Builds what is missing first: node binaries (tests/cluster/build.sh), images (scripts/images.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-${PIPECTL_CLUSTER_DIR:-/tmp/pipectl-cluster}}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
bash scripts/system-deps.sh node >&2
bash tests/cluster/build.sh kubelet pause argoexec coredns >&2
bash scripts/images.sh >&2
exec "$PY" tests/cluster/node.py up "$RUN_DIR"
