#!/usr/bin/env bash
# scripts/images.sh — build the step images (`make images`) with Debian's Docker engine.
#
#   1. Docker engine: Debian's docker.io `dockerd`, started here in the background when no engine
#      answers (log: $PIPECTL_CACHE_DIR/images/dockerd.log). Only the legacy builder exists.
#   2. Base image: no registry is reachable, so the base is bootstrapped: `debootstrap
#      --variant=minbase bookworm` + python3 python3-venv (the stand-in for production's
#      python:3.11-slim-bookworm). Tarball cached under $PIPECTL_CACHE_DIR/images/ keyed by
#      suite + mirror + package list; imported as pipectl/debian-base:<key>.
#   3. Step images from images/Dockerfile (targets step-light, step-train) with
#      --build-arg BASE_IMAGE=pipectl/debian-base:<key>. The build context is laid out as the
#      repository (what `docker build -f images/Dockerfile .` sends) in a temp folder: images/,
#      the project sources git lists, a stub README, and the host CA bundle as
#      images/build-ca.crt (builder stages only: pip on this network needs it). Tagged
#      pipectl/<target>:c-<content hash> only (the
#      release tag <version> that argo/ names is given when a release is pushed, never by a
#      build); a build is skipped when the content-hash tag exists (hash over the context, the
#      base image id and the target).
#      The content tags are what a cluster should run (a rebuild never reuses them): printed as
#      `--image <target>=c-<hash>` arguments for `pipectl templates apply` and written to
#      $PIPECTL_CACHE_DIR/images/image-args.txt.
#
#   4. The examples' own images (with step-train): each example with a Dockerfile `FROM ${BASE}`
#      is built as its README tells a team, `docker build --build-arg BASE=<step-train> -t <ref> .`
#      on the example's files (what git lists there), tagged pipectl/example-<name>:c-<hash of those
#      files and the step-train image id>, skipped when that tag exists; written to
#      $PIPECTL_CACHE_DIR/images/example-images.txt (<name>=<ref>) for the real-pod tests.
#
# Prints, per image: build seconds (or "cached") and size; a summary line per image goes to
# $PIPECTL_CACHE_DIR/images/build-times.txt.
# Usage: scripts/images.sh [step-light] [step-train]      (default: both; the examples come with step-train)
# Env:   PIPECTL_CACHE_DIR (default ~/.cache/pipectl), PIPECTL_DEBIAN_MIRROR (default: the host's
#        first deb.debian.org-style URI in /etc/apt/sources.list*), PIPECTL_DOCKER_DATA_ROOT.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${PIPECTL_CACHE_DIR:-$HOME/.cache/pipectl}/images
mkdir -p "$CACHE"
SUITE=bookworm
INCLUDE=python3,python3-venv
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -1)
DOCKER=/usr/bin/docker; [[ -x $DOCKER ]] || DOCKER=docker
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
record_build() {  # record_build IMAGE:TAG TOOK: a line (time, image, build seconds or "cached", size) to the log and build-times.txt
  local size line
  size=$("$DOCKER" image inspect -f '{{.Size}}' "$1")
  line=$(printf '%s %-38s build %-7s size %s MB' "$(date -u +%FT%TZ)" "$1" "$2" "$((size / 1000000))")
  log "$line"
  echo "$line" >>"$CACHE/build-times.txt"
}

# --- 1. engine ---------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
  echo "images: dockerd/debootstrap missing: run scripts/system-deps.sh images (as root)" >&2; exit 1
fi
if ! "$DOCKER" info >/dev/null 2>&1; then
  log "starting dockerd (log $CACHE/dockerd.log)"
  setsid dockerd --host unix:///var/run/docker.sock ${PIPECTL_DOCKER_DATA_ROOT:+--data-root "$PIPECTL_DOCKER_DATA_ROOT"} \
    >>"$CACHE/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 300); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 0.2; done
  "$DOCKER" info >/dev/null 2>&1 || { echo "images: dockerd did not start; tail of its log:" >&2; tail -20 "$CACHE/dockerd.log" >&2; exit 1; }
fi

# --- 2. base -----------------------------------------------------------------------------------
mirror=${PIPECTL_DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
  mirror=$( (grep -rhoE '^(URIs:|deb) +https?://[^ ]+/debian/?$' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) \
           | awk '{print $2}' | sed -n 1p)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
key=$(printf '%s|%s|%s|minbase' "$SUITE" "$mirror" "$INCLUDE" | sha256sum | cut -c1-12)
tarball=$CACHE/debian-$SUITE-minbase-$key.tar
BASE=pipectl/debian-base:$SUITE-$key
if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
  if [[ ! -f $tarball ]]; then
    t0=$SECONDS
    dir=$(mktemp -d /tmp/pipectl-debootstrap.XXXXXX)
    log "debootstrap $SUITE minbase (+$INCLUDE) from $mirror"
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$dir" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
      || { echo "images: debootstrap failed; tail of $CACHE/debootstrap.log:" >&2; tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/*
    tar -C "$dir" -cf "$tarball.partial" . && mv "$tarball.partial" "$tarball"
    rm -rf "$dir"
    log "base tarball $(du -h "$tarball" | cut -f1) in $((SECONDS - t0))s"
  fi
  "$DOCKER" import -c 'CMD ["/bin/bash"]' "$tarball" "$BASE" >/dev/null
  log "imported $BASE"
fi
base_id=$("$DOCKER" image inspect -f '{{.Id}}' "$BASE")

# --- 3. step images ----------------------------------------------------------------------------
ctx=$(mktemp -d /tmp/pipectl-images-ctx.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/images"
cp "$ROOT/images/Dockerfile" "$ROOT"/images/requirements-*.txt "$ctx/images/"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- pyproject.toml README.md cli pipelines components \
   | xargs -0 cp --parents -t "$ctx")
# pyproject.toml names README.md as the long description: a stub keeps documentation edits from
# rebuilding the images (and re-loading GBs into the node's containerd).
printf '# pipectl\n\nStep image of pipectl; documentation: the project README.\n' >"$ctx/README.md"
ca=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
cp "$ca" "$ctx/images/build-ca.crt"
ctx_hash=$(cd "$ctx" && find . -type f ! -name build-ca.crt -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)

targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(step-light step-train)
refs=()
# The dependency stages are no final image's parents (multi-stage), so `docker image prune` deletes
# them and the next build reinstalls GBs: keep them tagged (pipectl/build-cache:deps-train holds
# deps-light as its parent). Cheap when cached.
log "tagging the dependency stages (pipectl/build-cache:deps-train)"
"$DOCKER" build --network host -f "$ctx/images/Dockerfile" --target deps-train --build-arg BASE_IMAGE="$BASE" \
  -t pipectl/build-cache:deps-train "$ctx" >"$CACHE/build-deps.log" 2>&1 \
  || { echo "images: build of the dependency stages failed; tail of $CACHE/build-deps.log:" >&2; tail -30 "$CACHE/build-deps.log" >&2; exit 1; }
for target in "${targets[@]}"; do
  h=$(printf '%s|%s|%s' "$ctx_hash" "$base_id" "$target" | sha256sum | cut -c1-16)
  img=pipectl/$target
  if "$DOCKER" image inspect "$img:c-$h" >/dev/null 2>&1; then
    took=cached
  else
    log "building $img ($target, content hash $h; log $CACHE/build-$target.log)"
    t0=$SECONDS
    if ! "$DOCKER" build --network host -f "$ctx/images/Dockerfile" --target "$target" \
         --build-arg BASE_IMAGE="$BASE" --build-arg PIPECTL_VERSION="$VERSION" --build-arg CONTENT_HASH="$h" \
         -t "$img:c-$h" "$ctx" >"$CACHE/build-$target.log" 2>&1; then
      echo "images: build of $target failed; tail of $CACHE/build-$target.log:" >&2
      tail -30 "$CACHE/build-$target.log" >&2; exit 1
    fi
    took=$((SECONDS - t0))s
  fi
  record_build "$img:c-$h" "$took"
  refs+=("--image $target=c-$h")
done
# Earlier builds' content tags of the images just built go (each holds GBs once its dependencies
# changed); the dependency stages stay tagged (above), so nothing is downloaded again.
for target in "${targets[@]}"; do
  keep=$(printf '%s\n' "${refs[@]}" | sed -n "s/^--image $target=//p")
  "$DOCKER" images --format '{{.Repository}}:{{.Tag}}' "pipectl/$target" | grep -v -x "pipectl/$target:$keep" \
    | xargs -r "$DOCKER" rmi >/dev/null 2>&1 || true
done
"$DOCKER" image prune -f >/dev/null 2>&1 || true
# What to deploy this build with (a content tag, never a reused one; a node that cached
# a tag keeps running what it cached): pipectl templates apply <these>. Builds are not tagged with
# the release version: that tag is given once, when a release is pushed.
# (targets not built by this run keep their line from the last run that built them)
args_file=$CACHE/image-args.txt
{ if [[ -f $args_file ]]; then grep -v -E -- "^--image ($(IFS='|'; echo "${targets[*]}"))=" "$args_file" || true; fi
  printf '%s\n' "${refs[@]}"; } >"$args_file.new"
mv "$args_file.new" "$args_file"
log "deploy with: pipectl templates apply $(tr '\n' ' ' <"$args_file")(in $args_file)"

# --- 4. the examples' images -------------------------------------------------------------------
EXAMPLES=(image-classifier)
build_example() {  # build_example NAME STEP_TRAIN_REF: prints NAME=REF
  local name=$1 base=$2 ectx=$ctx/examples/$1 h img took
  mkdir -p "$ectx"
  (cd "$ROOT/examples/$name" && git ls-files -z --cached --others --exclude-standard -- . | xargs -0 cp --parents -t "$ectx")
  h=$(printf '%s|%s' "$(cd "$ectx" && find . -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)" \
        "$("$DOCKER" image inspect -f '{{.Id}}' "$base")" | sha256sum | cut -c1-16)
  img=pipectl/example-$name
  if "$DOCKER" image inspect "$img:c-$h" >/dev/null 2>&1; then
    took=cached
  else
    log "building $img (examples/$name/Dockerfile FROM $base; log $CACHE/build-example-$name.log)"
    local t0=$SECONDS
    # what the example's README tells a team to run; nothing to download (--network none)
    if ! "$DOCKER" build --network none --build-arg BASE="$base" --label io.pipectl.content-hash="$h" \
         -t "$img:c-$h" "$ectx" >"$CACHE/build-example-$name.log" 2>&1; then
      echo "images: build of examples/$name failed; tail of $CACHE/build-example-$name.log:" >&2
      tail -30 "$CACHE/build-example-$name.log" >&2; return 1
    fi
    took=$((SECONDS - t0))s
  fi
  record_build "$img:c-$h" "$took"
  # earlier builds of this example go (each keeps an earlier step-train's GBs alive)
  "$DOCKER" images --format '{{.Repository}}:{{.Tag}}' "$img" | grep -v -x "$img:c-$h" | xargs -r "$DOCKER" rmi >/dev/null 2>&1 || true
  echo "$name=$img:c-$h"
}
train_tag=$(printf '%s\n' "${refs[@]}" | sed -n 's/^--image step-train=//p')
if [[ -n $train_tag ]]; then
  examples_file=$CACHE/example-images.txt
  : >"$examples_file.new"
  for ex in "${EXAMPLES[@]}"; do
    build_example "$ex" "pipectl/step-train:$train_tag" >>"$examples_file.new" || exit 1
  done
  mv "$examples_file.new" "$examples_file"
  log "example images: $(tr '\n' ' ' <"$examples_file")(in $examples_file)"
fi
