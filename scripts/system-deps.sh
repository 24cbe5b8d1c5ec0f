#!/usr/bin/env bash
# Debian packages the test suite needs: a real single-node Ceph (monitor, manager, OSD, RADOS
# Gateway, MDS and ceph-fuse for CephFS), and Java + Maven to assemble Alluxio from Maven Central
# (tests/alluxio). Installed only when missing (~76 MB download, ~50 s for Ceph).
# `scripts/system-deps.sh --bench` also installs the peers of the storage benchmark (rclone).
set -euo pipefail
need=()
bins="ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd radosgw:radosgw ceph:ceph-common ceph-mds:ceph-mds ceph-fuse:ceph-fuse java:default-jre-headless mvn:maven"
[ "${1:-}" = --bench ] && bins="$bins rclone:rclone"
for bin in $bins; do
  command -v "${bin%%:*}" >/dev/null 2>&1 || need+=("${bin##*:}")
done
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
