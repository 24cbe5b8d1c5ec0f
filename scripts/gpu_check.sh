#!/usr/bin/env bash
# The GPU check: scripts/gpu_check.py on the lent GPU machine, or here (GPU rows skipped).
#
#   bash scripts/gpu_check.sh run [gpu_check.py args]   # `make gpu-check`: run the check with what is installed,
#                                                      # or with a pack received below (GPU machine)
#   bash scripts/gpu_check.sh pack                     # here (needs the registry): wheels for the GPU machine,
#                                                      # tarred and split into parts under .pipectl/gpu-pack/
#   bash scripts/gpu_check.sh receive PART             # GPU machine: keep one carried part in /tmp/gpu-pack
#
# Why a pack: the GPU machine (one H200, 16 cores, Python 3.12 with torch 2.11 cu130)
# reaches no registry, and a call carries at most 64 MiB (working tree + carried paths). The check needs
# NVIDIA DALI (nvidia-dali-cuda130 2.4.0, ~200 MB, + nvimgcodec, nvcomp, nvjpeg for CUDA 13: ~260 MB) and
# the step's Python dependencies (~60 MB; 318 MB in all, packed 2026-12-01). They travel as a tar split in parts
# of PART_MIB (default 59 MiB: 6 parts; the working tree is ~4.7 MiB, `pack` checks the sum), one part per call, each copied to /tmp/gpu-pack; paths carried earlier
# stay only while the machine is warm (30 s idle), so the calls must follow each other.
#
# Order of calls with the session's `run` tool (device time: ~20 s per part call once warm; the check
# itself ~5 min with the default sizes 500,2000):
#   1. here:   bash scripts/gpu_check.sh pack                 -> .pipectl/gpu-pack/part-00 .. part-NN + SHA256SUMS
#   2. device: run(command="bash scripts/gpu_check.sh receive part-00", carry=[".pipectl/gpu-pack/part-00"])
#      ... one call per part, in order, without pauses ...
#   3. device: run(command="bash scripts/gpu_check.sh receive part-05 && bash scripts/gpu_check.sh run",
#                  carry=[".pipectl/gpu-pack/part-05", ".pipectl/gpu-pack/SHA256SUMS"], timeout_s=600)
#      joins the parts, checks the sha256 of the tar, installs the wheels into /tmp/gpu-site (pip
#      --no-index, else unzip), lays the project out as the `pipectl` package, runs scripts/gpu_check.py
#      and leaves the table in $OUT/gpu-check.md (+ .json). Then give the machine back.
# (the last part travels with the run call itself: 6 calls in all for 6 parts.)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PACK_DIR=${PACK_DIR:-.pipectl/gpu-pack}
RECV_DIR=${RECV_DIR:-/tmp/gpu-pack}
SITE=${SITE:-/tmp/gpu-site}
PART_MIB=${PART_MIB:-59}
PY=${PYTHON:-}
if [[ -z $PY ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=$(command -v python3 || command -v python); fi
fi

# What the GPU machine lacks (it has torch, numpy, and CUDA 13 libraries through torch's wheels).
WHEELS=(
  "nvidia-dali-cuda130==2.4.0" "nvidia-nvimgcodec-cu13" "nvidia-libnvcomp-cu13" "nvidia-nvjpeg"
  "pydantic" "pydantic-settings" "boto3" "moto[s3]==5.2.5" "flask" "flask-cors" "mlflow-skinny==3.17.2" "importlib_metadata<9"
  "pillow" "obstore==0.12.1" "prometheus-client"
)

case "${1:-run}" in
pack)
  rm -rf "$PACK_DIR" && mkdir -p "$PACK_DIR/wheels"
  "$PY" -m pip download --dest "$PACK_DIR/wheels" --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    "${WHEELS[@]}"
  # torch, numpy and friends are on the GPU machine already: leave out what it has
  find "$PACK_DIR/wheels" \( -name 'torch-*' -o -name 'numpy-*' -o -name 'nvidia_cu*' -o -name 'nvidia_cudnn*' \
    -o -name 'nvidia_nccl*' -o -name 'triton-*' -o -name 'sympy-*' -o -name 'networkx-*' \) -delete
  printf '%s\n' "${WHEELS[@]}" > "$PACK_DIR/wheels/WHEELS.txt"  # what this pack was built from (run checks it)
  tar -C "$PACK_DIR" -cf "$PACK_DIR/pack.tar" wheels
  rm -rf "$PACK_DIR/wheels"
  split -b "${PART_MIB}M" -d -a 2 "$PACK_DIR/pack.tar" "$PACK_DIR/part-"
  (cd "$PACK_DIR" && sha256sum pack.tar > SHA256SUMS && rm pack.tar)
  tree_kib=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | awk '{print int($1/1024)}')
  echo "pack: $(ls "$PACK_DIR" | grep -c part-) parts of <= ${PART_MIB} MiB in $PACK_DIR (working tree ${tree_kib} KiB; a call carries <= 64 MiB)"
  if (( PART_MIB * 1024 + tree_kib + 64 > 64 * 1024 )); then
    echo "error: a part + the working tree exceed 64 MiB: PART_MIB=$(( (64 * 1024 - tree_kib - 64) / 1024 )) bash $0 pack" >&2
    exit 1
  fi
  ls -l "$PACK_DIR"
  ;;
receive)
  part=${2:?usage: gpu_check.sh receive part-NN}
  mkdir -p "$RECV_DIR"
  cp "$PACK_DIR/$part" "$RECV_DIR/$part"
  echo "received $part: $(du -h "$RECV_DIR/$part" | cut -f1); in $RECV_DIR: $(ls "$RECV_DIR" | tr '\n' ' ')"
  ;;
run)
  shift || true
  if [[ -d $RECV_DIR ]] && ls "$RECV_DIR"/part-* >/dev/null 2>&1 && [[ ! -d $SITE ]]; then
    # GPU machine: join, check, install the pack; the project as the `pipectl` package
    cat "$RECV_DIR"/part-* > "$RECV_DIR/pack.tar"
    if [[ -f $PACK_DIR/SHA256SUMS ]]; then (cd "$RECV_DIR" && sha256sum -c "$REPO/$PACK_DIR/SHA256SUMS"); \
      else echo "warning: no $PACK_DIR/SHA256SUMS carried: the joined pack is not checked" >&2; fi
    tar -C "$RECV_DIR" -xf "$RECV_DIR/pack.tar"
    if "$PY" -m pip --version >/dev/null 2>&1; then
      "$PY" -m pip install --quiet --no-index --no-deps --target "$SITE" "$RECV_DIR"/wheels/*.whl
    else
      mkdir -p "$SITE" && for w in "$RECV_DIR"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
    fi
  fi
  if [[ -f $RECV_DIR/wheels/WHEELS.txt ]] && ! diff -q <(printf '%s\n' "${WHEELS[@]}") "$RECV_DIR/wheels/WHEELS.txt" >/dev/null; then
    echo "error: the pack was built from another wheel list than this checkout's (scripts/gpu_check.sh WHEELS):" >&2
    diff <(printf '%s\n' "${WHEELS[@]}") "$RECV_DIR/wheels/WHEELS.txt" >&2 || true
    echo "hint: rebuild it where the registry is reachable: bash scripts/gpu_check.sh pack, then send its parts again" >&2
    exit 2
  fi
  if ! "$PY" -c 'import pipectl.components' 2>/dev/null; then
    # not installed: the three folders are roots of the pipectl namespace (README "Layout")
    export PYTHONPATH="$REPO/cli:$REPO/pipelines:$REPO/components:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  elif [[ -d $SITE ]]; then
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
  exec "$PY" scripts/gpu_check.py "$@"
  ;;
*)
  echo "usage: $0 run [args] | pack | receive PART" >&2
  exit 2
  ;;
esac
