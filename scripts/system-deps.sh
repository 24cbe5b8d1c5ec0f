#!/usr/bin/env bash
# Debian packages the test suite needs, by group (installed only when missing):
#   ceph     a real single-node Ceph: monitor, manager, OSD, RADOS Gateway, MDS and ceph-fuse for
#            CephFS (~76 MB, ~50 s)
#   alluxio  Java + Maven, to assemble Alluxio from Maven Central (tests/alluxio)
#   node     the real test node and its images: Docker engine + debootstrap for
#            `make images`; containerd, runc, CNI plugins, socat, iptables for `make node-up`
#            (~60 MB, ~30 s)
#   ui       Debian's Chromium + chromium-driver: the browser tests of the Argo UI drive it with
#            Playwright through /usr/bin/chromium (Playwright never downloads a browser); and
#            Debian's Prometheus 2.42 with promtool: tests/cluster/test_monitoring.py scrapes the
#            test cluster and runs the dashboards' and alerts' queries (~19 MB, ~5 s)
#   bench    the peers of the storage benchmark (rclone)
# Usage: scripts/system-deps.sh [GROUP...]   (default: ceph alluxio node ui; `--bench` = bench)
set -euo pipefail
groups=()
for a in "$@"; do [ "$a" = --bench ] && groups+=(bench) || groups+=("$a"); done
[ ${#groups[@]} -gt 0 ] || groups=(ceph alluxio node ui)
need=()
for g in "${groups[@]}"; do
  case $g in
    ceph) bins="ceph-mon:ceph-mon ceph-mgr:ceph-mgr ceph-osd:ceph-osd radosgw:radosgw ceph:ceph-common ceph-mds:ceph-mds ceph-fuse:ceph-fuse" ;;
    alluxio) bins="java:default-jre-headless mvn:maven" ;;
    node|images) bins="dockerd:docker.io debootstrap:debootstrap containerd:containerd ctr:containerd runc:runc socat:socat iptables:iptables /usr/lib/cni/bridge:containernetworking-plugins" ;;
    ui) bins="chromium:chromium chromedriver:chromium-driver prometheus:prometheus promtool:prometheus" ;;
    bench) bins="rclone:rclone" ;;
    *) echo "system-deps: unknown group '$g' (ceph, alluxio, node, ui, bench)" >&2; exit 2 ;;
  esac
  for bin in $bins; do
    b=${bin%%:*}
    if [[ $b == /* ]]; then [ -x "$b" ] && continue; else command -v "$b" >/dev/null 2>&1 && continue; fi
    need+=("${bin##*:}")
  done
done
[ ${#need[@]} -eq 0 ] || mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "system-deps: missing Debian packages: ${need[*]} (run as root, or: sudo apt-get install ${need[*]})" >&2
  exit 1
fi
echo "system-deps: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
