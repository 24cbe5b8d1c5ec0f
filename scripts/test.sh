#!/usr/bin/env bash
# scripts/test.sh — `make test` (and so `.ci/run`): prepare everything the tests use, overlapping
# what waits on different things, run the three test tiers, and print a table of the phases, their
# budgets and the ten slowest tests at the end.
#
#   system-deps    Debian packages (Ceph, Java/Maven, Docker, containerd, ...)       serial, first
#   venv           the project's cached virtual environment (scripts/setup.sh)       ┐ in parallel:
#   go-cluster     the KWOK control plane's binaries (Go module proxy; cached)       │ PyPI / apt /
#   images         the step images and the example's (scripts/images.sh)             ┘ Go compiles
#   tests-local    pytest tier 1: unit, golden, integration — starts as soon as the venv exists,
#                  beside the Go builds (cold) or beside tier 2 (warm): it needs no cluster binary
#   tests-storage  pytest tier 1b: the tests marked `storage` (they use the session's Ceph or
#                  Alluxio; tests/conftest.py marks them) and `pipeline` (whole pipelines end to
#                  end), in a second process beside tier 1 once go-cluster is done (at once warm):
#                  one Ceph, one Alluxio
#   node-images    the step and example images into the real node's containerd store (after images + venv)
#   go-node        the real node's binaries (kubelet, pause, argoexec, coredns), after go-cluster and Karpenter,
#                  beside tier 2
#   tests-cluster  pytest tier 2: the KWOK control plane (tests/cluster), once go-cluster is done
#   tests-autoscaled  pytest tier 2b: Karpenter's build (cached), then tests/cluster/test_autoscaler.py
#                  on its own control plane (Karpenter creates every node), beside tier 2: its
#                  tests wait on Karpenter's loops, not on the CPU
#   real-pods      pytest tier 3: tests/cluster/test_real_pods.py on the real node, once tier 2b is
#                  done (both wait more than they compute), beside tiers 1, 1b and 2
#
# Every tier always runs when what it needs was prepared; the exit status is non-zero if any phase
# failed. Each background phase writes its log to $PIPECTL_TEST_LOGS (default .pipectl/test-logs);
# a failed one has its tail printed. The phase table goes to stdout and to $PIPECTL_TEST_LOGS/phases.txt.
# Usage: scripts/test.sh [PYTEST_ARGS...]   (extra arguments go to the tier 1, 1b and 2 runs)
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${PIPECTL_TEST_LOGS:-.pipectl/test-logs}
mkdir -p "$LOGS"
rm -f "$LOGS"/*.xml
: >"$LOGS/phases.tsv"
T0=$SECONDS
STAT0=$(head -1 /proc/stat 2>/dev/null || true)
N_ARGS=$#  # extra pytest arguments given by hand
rc_all=0
# The whole run warns past this (seconds): the CI gate stops at 90 minutes.
WARN_TOTAL_S=${PIPECTL_TEST_WARN_S:-3600}
# Budget of each phase in seconds (wall time; cold figures where a cache makes it a no-op warm).
declare -A BUDGET=([system-deps]=180 [venv]=420 [images]=900 [go-cluster]=2100 [go-node]=900
                   [node-images]=900 [tests-local]=1200 [tests-storage]=1200 [tests-cluster]=1200
                   [tests-autoscaled]=1200 [real-pods]=900)
# Go components by tier (tests/cluster/build.sh builds each once per version).
GO_CLUSTER=(etcd kube-apiserver kube-controller-manager kube-scheduler workflow-controller argo
            vc-scheduler vc-controller-manager kwok kubectl)
GO_AUTOSCALER=(karpenter)  # tier 2b only: built at its start, beside tier 2
GO_NODE=(kubelet pause argoexec coredns)
PYTEST=(.venv/bin/pytest -p no:cacheprovider)

log() { printf '[test %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
record() {  # record NAME START_S RC [END_S]
  printf '%s\t%d\t%d\t%d\n' "$1" "$(($2 - T0))" "$((${4:-$SECONDS} - $2))" "$3" >>"$LOGS/phases.tsv"
  [[ $3 -eq 0 ]] || rc_all=1
}
run_phase() {  # run_phase NAME CMD...: in the foreground, output to the terminal
  local name=$1 t=$SECONDS rc
  shift
  log "phase $name: $*"
  "$@"
  rc=$?
  record "$name" "$t" "$rc"
  return "$rc"
}
slowest() {  # the ten slowest and the ten most CPU-hungry tests of every tier (their JUnit XML), then
  # every failed or errored test with the first line of its message: last in the output, where a CI
  # page that shows only the tail still names them
  compgen -G "$LOGS/*.xml" >/dev/null || return 0
  [[ -x .venv/bin/python ]] || return 0
  .venv/bin/python - "$LOGS"/*.xml <<'PY'
import collections
import sys
import xml.etree.ElementTree as ET
rows, cpu_by_tier, shared, bad = [], collections.Counter(), collections.Counter(), []
for path in sys.argv[1:]:
    tier = path.rsplit("/", 1)[-1].removesuffix(".xml")
    for case in ET.parse(path).iter("testcase"):
        for el in [*case.findall("failure"), *case.findall("error")]:
            msg = (el.get("message") or el.text or "").strip().splitlines()
            bad.append(f"  {tier:<16} {el.tag:<7} {case.get('classname')}::{case.get('name')}\n"
                       f"      {(msg[0] if msg else '')[:300]}")
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        cpu = float(props.get("cpu_s", 0))
        cpu_by_tier[tier] += cpu + float(props.get("shared_cpu_s", 0))
        shared[tier] += float(props.get("shared_cpu_s", 0))
        rows.append((float(case.get("time", 0)), cpu, tier, f"{case.get('classname')}::{case.get('name')}"))
for title, key in (("slowest (wall", 0), ("most CPU-hungry (CPU", 1)):
    print(f"\nTen {title} seconds, tier, test):")
    for row in sorted(rows, key=lambda r: r[key], reverse=True)[:10]:
        print(f"  {row[key]:8.1f}  {row[2]:<16} {row[3]}")
print(f"  ({len(rows)} tests in all; CPU seconds by tier: "
      + ", ".join(f"{t} {c:,.0f}" for t, c in cpu_by_tier.most_common()) + ")")
print("  (module and session fixtures, counted apart when their services are reaped: "
      + ", ".join(f"{t} {c:,.0f}" for t, c in shared.most_common()) + ")")
if bad:
    print(f"\nFailed tests ({len(bad)}; their whole reports are in the tier logs above):")
    print("\n".join(bad))
PY
}
cpu_busy() {  # the machine's CPU busy share since the run started (all cores, from /proc/stat)
  [[ -n ${STAT0:-} ]] || return 0
  local now
  now=$(head -1 /proc/stat)
  awk -v a="$STAT0" -v b="$now" 'BEGIN { n = split(a, x); split(b, y); t = 0
    for (i = 2; i <= n; i++) t += y[i] - x[i]
    idle = (y[5] - x[5]) + (y[6] - x[6])
    if (t > 0) printf "CPU busy %.0f%% of the run (%d cores; idle and I/O wait are the room that overlap can win)\n", 100 * (t - idle) / t, '"$(nproc)"' }'
}
table() {
  local total=$((SECONDS - T0))
  {
    echo
    echo "Phases of this run (seconds from the start; wall time of each phase; its budget):"
    printf '  %-14s %7s %9s %8s  %s\n' phase start took budget result
    while IFS=$'\t' read -r name start took rc; do
      local b=${BUDGET[$name]:-0} over=""
      [[ $b -gt 0 && $took -gt $b ]] && over=" — OVER BUDGET"
      printf '  %-14s %6ss %8ss %7ss  %s%s\n' "$name" "$start" "$took" "$b" \
        "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED (exit $rc)")" "$over"
    done <"$LOGS/phases.tsv"
    printf '  %-14s %7s %8ss %7ss  %s\n' total "" "$total" "$WARN_TOTAL_S" "$([[ $rc_all -eq 0 ]] && echo ok || echo FAILED)"
    cpu_busy
    slowest
    awk -F'\t' '$4 != 0 { bad = bad " " $1 " (exit " $4 ")" } END { if (bad != "") print "Failed phases:" bad }' "$LOGS/phases.tsv"
    if [[ $total -gt $WARN_TOTAL_S ]]; then
      echo "WARNING: this run took $((total / 60)) min, over the $((WARN_TOTAL_S / 60))-minute warning line (the CI gate stops at 90 min)"
    fi
  } | tee "$LOGS/phases.txt"
}
trap table EXIT

run_phase system-deps bash scripts/system-deps.sh ceph alluxio node ui || exit 1

declare -A pid start
bg() {  # bg NAME CMD...
  local p=$1
  shift
  log "phase $p (background; log $LOGS/$p.log): $*"
  start[$p]=$SECONDS
  rm -f "$LOGS/$p.end"
  # the subshell's SECONDS goes on counting: its end time is the phase's, not when it is reaped
  ( "$@"; rc=$?; echo "$SECONDS" >"$LOGS/$p.end"; exit "$rc" ) >"$LOGS/$p.log" 2>&1 &
  pid[$p]=$!
}
reap() {  # reap NAME [TAIL_LINES]: wait for it, record it, show its tail (more of it when it failed)
  local p=$1 rc
  [[ -n ${pid[$p]:-} ]] || return 1
  wait "${pid[$p]}"
  rc=$?
  record "$p" "${start[$p]}" "$rc" "$(cat "$LOGS/$p.end" 2>/dev/null || echo "$SECONDS")"
  if [[ $rc -ne 0 ]]; then
    log "phase $p FAILED (exit $rc); last lines of $LOGS/$p.log:"
    if grep -q '^=* FAILURES =*$' "$LOGS/$p.log"; then  # a pytest tier: its failures and summary
      sed -n '/^=* FAILURES =*$/,$p' "$LOGS/$p.log" | tail -n 800 | sed "s/^/    [$p] /" >&2
    else
      tail -n "${2:-60}" "$LOGS/$p.log" | sed "s/^/    [$p] /" >&2
    fi
  else
    tail -n "${2:-3}" "$LOGS/$p.log" | sed "s/^/    [$p] /" >&2
  fi
  return "$rc"
}
tier() {  # tier NAME PYTEST_ARGS...: one pytest run with its JUnit XML kept for the slowest list
  local name=$1 rc
  shift
  "${PYTEST[@]}" --durations=10 --junitxml="$LOGS/$name.xml" "$@"
  rc=$?
  # a selection given by hand (scripts/test.sh -k ...) may leave a tier nothing to run (pytest's 5)
  [[ $rc -eq 5 && $N_ARGS -gt 0 ]] && return 0
  return "$rc"
}

autoscaled() {  # tier 2b: Karpenter's build (cached warm), then its tests
  bash tests/cluster/build.sh "${GO_AUTOSCALER[@]}" && tier tests-autoscaled tests/cluster/test_autoscaler.py "$@"
}

node_binaries() {  # the real node's binaries, after Karpenter's: tier 2b waits for Karpenter now,
  # tier 3 for the node's binaries only once tier 2b is done (one build at a time: build.sh's lock;
  # whichever of the two takes it first, Karpenter is built first and the other finds it cached)
  bash tests/cluster/build.sh "${GO_AUTOSCALER[@]}" && bash tests/cluster/build.sh "${GO_NODE[@]}"
}

export PIPECTL_REQUIRE_CEPH=1 PIPECTL_REQUIRE_CLUSTER=1
bg venv bash scripts/setup.sh
# The Go builds are the cold run's critical path (tier 2 waits for them; tier 1 does not): they
# run ahead of the tests (nice -5 against tier 1's 0; tests/cluster/build.sh defaults to nice 10 by
# hand). Without root the builds keep the tests' priority (nice warns and goes on).
export PIPECTL_BUILD_NICE=${PIPECTL_BUILD_NICE:--5}
bg go-cluster bash tests/cluster/build.sh "${GO_CLUSTER[@]}"
bg images bash scripts/images.sh
reap venv || exit 1
bg tests-local tier tests-local --ignore=tests/cluster -m "not storage and not pipeline" "$@"
images_ok=0
reap images && images_ok=1 && bg node-images .venv/bin/python tests/cluster/node.py preload
cluster_ok=0
reap go-cluster && cluster_ok=1
# Tier 1b once the Go builds are done: in a cold run they are the critical path, and a second
# test process beside them (Ceph, Alluxio's JVM, training) took CPU from them; warm they take no time.
bg tests-storage tier tests-storage --ignore=tests/cluster -m "storage or pipeline" "$@"
if [[ $cluster_ok -eq 1 ]]; then
  bg tests-autoscaled autoscaled "$@"
  bg go-node node_binaries
  bg tests-cluster tier tests-cluster tests/cluster --ignore=tests/cluster/test_real_pods.py \
    --ignore=tests/cluster/test_autoscaler.py "$@"
fi
# Tier 3 once tier 2b is done, beside tiers 1 and 2: both mostly wait (on Karpenter's loops, on
# the real node's containers), so one after the other they load the CPU about as one test process;
# after tier 2 instead, the run's last minutes left a core idle (tier 3 alone).
[[ $cluster_ok -eq 1 ]] && reap tests-autoscaled 60
node_ok=$cluster_ok
[[ $cluster_ok -eq 1 ]] && { reap go-node || node_ok=0; }
[[ $images_ok -eq 1 ]] && { reap node-images || node_ok=0; }
if [[ $node_ok -eq 1 && $images_ok -eq 1 ]]; then
  PIPECTL_NODE_TESTS=1 run_phase real-pods tier real-pods tests/cluster/test_real_pods.py
else
  log "real-pods not run: what it needs was not prepared (see the phases above)"
  rc_all=1
fi
[[ $cluster_ok -eq 1 ]] && reap tests-cluster 120
# tier 1's whole reports: their failures and the slowest tests are in the last lines
reap tests-storage 120
reap tests-local 120
exit "$rc_all"
