#!/usr/bin/env bash
# Start a real single-node Ceph (mon, mgr, memstore OSD, RADOS Gateway) on 127.0.0.1 under one
# folder and print its S3 endpoint and keys as shell exports:
#     eval "$(scripts/ceph-up.sh /tmp/pipectl-ceph)"
# CEPH_CEPHFS=1 adds an MDS and a CephFS; CEPH_MOUNT=DIR also mounts it there with ceph-fuse.
# Installs the Debian packages first if the binaries are missing (needs root or sudo).
# Stop it with scripts/ceph-down.sh (same folder).
set -euo pipefail
cd "$(dirname "$0")/.."
RUN_DIR="${1:-${CEPH_RUN_DIR:-/tmp/pipectl-ceph}}"
PACKAGES=(ceph-mon ceph-mgr ceph-osd radosgw ceph-common)
ARGS=()
CHECK=()
if [ "${CEPH_CEPHFS:-0}" = 1 ] || [ -n "${CEPH_MOUNT:-}" ]; then
    PACKAGES+=(ceph-mds ceph-fuse)
    ARGS+=(--cephfs)
    CHECK+=(--cephfs)
    [ -z "${CEPH_MOUNT:-}" ] || ARGS+=(--mount "$CEPH_MOUNT")
fi

if ! python3 tests/ceph/ceph.py check "${CHECK[@]}" 2>/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    echo "installing Debian packages: ${PACKAGES[*]}" >&2
    install() {
        $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            "${PACKAGES[@]}" >&2
    }
    install || { $SUDO apt-get update >&2 && install; }
    python3 tests/ceph/ceph.py check "${CHECK[@]}"
fi

if [ -e "$RUN_DIR/cluster.json" ]; then
    echo "$RUN_DIR already holds a cluster: run scripts/ceph-down.sh $RUN_DIR first" >&2
    exit 1
fi
exec python3 tests/ceph/ceph.py up "$RUN_DIR" "${ARGS[@]}"
