#!/usr/bin/env bash
# Stop the Ceph started by scripts/ceph-up.sh in this folder (kills its daemons' process groups)
# and remove the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-${CEPH_RUN_DIR:-/tmp/pipectl-ceph}}"
exec python3 tests/ceph/ceph.py down "$RUN_DIR"
