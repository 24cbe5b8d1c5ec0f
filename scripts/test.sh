#!/usr/bin/env bash
# scripts/test.sh — `make test` (and so `.ci/run`): prepare everything the tests use, in parallel
# where it is independent, then run the test suite, and print a table of the phases at the end.
#
#   system-deps   Debian packages (Ceph, Java/Maven, Docker, containerd, ...)    serial, first
#   venv          the project's cached virtual environment (scripts/setup.sh)    ┐
#   go-build      the test cluster's binaries from the Go module proxy          ├ in parallel:
#   images        the step images (scripts/images.sh)                            │ pip/apt downloads
#   node-images   the step images into the real node's containerd store         ┘ overlap Go compiles
#                 (tests/cluster/node.py preload; after images)
#   tests         pytest: unit, golden, integration, Ceph, Alluxio, KWOK cluster
#   real-pods     pytest tests/cluster/test_real_pods.py (the real node; after the KWOK cluster is
#                 down: both bind the node's ports and load the 2 cores)
#
# Both pytest runs always run; the exit status is non-zero if any phase failed. Each parallel phase
# writes its log to $PIPECTL_TEST_LOGS (default .pipectl/test-logs); a failed one has its tail
# printed. The phase table goes to stdout and to $PIPECTL_TEST_LOGS/phases.txt.
# Usage: scripts/test.sh [PYTEST_ARGS...]   (extra arguments go to the first pytest run)
set -uo pipefail
cd "$(dirname "$0")/.."
LOGS=${PIPECTL_TEST_LOGS:-.pipectl/test-logs}
mkdir -p "$LOGS"
: >"$LOGS/phases.tsv"
T0=$SECONDS
rc_all=0

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
table() {
  {
    echo
    echo "Phases of this run (seconds from the start; wall time of each phase):"
    printf '  %-12s %7s %9s  %s\n' phase start took result
    while IFS=$'\t' read -r name start took rc; do
      printf '  %-12s %6ss %8ss  %s\n' "$name" "$start" "$took" "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED (exit $rc)")"
    done <"$LOGS/phases.tsv"
    printf '  %-12s %7s %8ss  %s\n' total "" "$((SECONDS - T0))" "$([[ $rc_all -eq 0 ]] && echo ok || echo FAILED)"
  } | tee "$LOGS/phases.txt"
}
trap table EXIT

run_phase system-deps bash scripts/system-deps.sh ceph alluxio node ui || exit 1

# Independent, and each mostly waits on a different thing (PyPI, the Go compiler, Docker builds).
# node-images (the step images into the real node's cached containerd store, minutes cold) starts
# once the images and the venv are there, still beside the Go builds.
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
prepared=0
reap() {  # reap NAME: wait for it, record it, show its tail (all of the end when it failed)
  local p=$1 rc
  wait "${pid[$p]}"
  rc=$?
  record "$p" "${start[$p]}" "$rc" "$(cat "$LOGS/$p.end" 2>/dev/null || echo "$SECONDS")"
  if [[ $rc -ne 0 ]]; then
    prepared=1
    log "phase $p FAILED (exit $rc); last lines of $LOGS/$p.log:"
    tail -n 40 "$LOGS/$p.log" | sed 's/^/    | /' >&2
  else
    tail -n 3 "$LOGS/$p.log" | sed "s/^/    [$p] /" >&2
  fi
  return "$rc"
}
bg venv bash scripts/setup.sh
bg go-build bash tests/cluster/build.sh
bg images bash scripts/images.sh
reap venv
reap images
[[ $prepared -eq 0 ]] && bg node-images .venv/bin/python tests/cluster/node.py preload
reap go-build
[[ -z ${start[node-images]:-} ]] || reap node-images
[[ $prepared -eq 0 ]] || exit 1

export PIPECTL_REQUIRE_CEPH=1 PIPECTL_REQUIRE_CLUSTER=1
run_phase tests .venv/bin/pytest --durations=15 --ignore=tests/cluster/test_real_pods.py "$@"
PIPECTL_NODE_TESTS=1 run_phase real-pods .venv/bin/pytest --durations=10 tests/cluster/test_real_pods.py
exit "$rc_all"
