#!/usr/bin/env bash
# Start the loopback Kubernetes test cluster (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, KWOK fake nodes, Argo workflow-controller, Volcano) under one folder and print
# its kubeconfig as shell exports:
#     eval "$(scripts/cluster-up.sh /tmp/pipectl-cluster)"
# Idempotent: when that folder already holds a running cluster it only prints the exports.
# CLUSTER_NODES=N fake nodes (default 4); CLUSTER_VOLCANO=0 skips Volcano; CLUSTER_ARGO_SERVER=1
# also starts `argo server` (plain http, auth mode server) and exports ARGO_SERVER.
# Binaries come from tests/cluster/build.sh's cache (built first if missing).
# Stop it with scripts/cluster-down.sh (same folder).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-${PIPECTL_CLUSTER_DIR:-/tmp/pipectl-cluster}}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
ARGS=(--nodes "${CLUSTER_NODES:-4}")
[ "${CLUSTER_VOLCANO:-1}" = 1 ] || ARGS+=(--no-volcano)
[ "${CLUSTER_ARGO_SERVER:-0}" = 0 ] || ARGS+=(--argo-server)

if ! "$PY" tests/cluster/cluster.py check 2>/dev/null; then
    echo "building the cluster binaries (tests/cluster/build.sh; cold build takes long)" >&2
    tests/cluster/build.sh >&2
    "$PY" tests/cluster/cluster.py check
fi
exec "$PY" tests/cluster/cluster.py up "$RUN_DIR" "${ARGS[@]}"
