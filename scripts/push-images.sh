#!/usr/bin/env bash
# scripts/push-images.sh — build the step images with plain `docker build` and push them to your
# registry (`make images-push REGISTRY=...`).
#
#   scripts/push-images.sh REGISTRY [step-light] [step-train]        (default: both)
#
# REGISTRY: where the images go, as the site file's `registry` names it, e.g.
# registry.example.com/ml (log in first: docker login registry.example.com).
#
#   1. The base: BASE_IMAGE (default: the Dockerfile's, python:3.11-slim-bookworm) is pulled and
#      the build runs on its digest, so the images name exactly the base they were built on. A base
#      that cannot be pulled (one built on this machine) is used as it is, with a warning.
#   2. Each target of images/Dockerfile is built from the repository root and tagged
#      REGISTRY/<target>:<version>-<commit> (-dirty when the sources differ from the commit), then
#      pushed.
#   3. Prints the site file settings that name the pushed images by digest (stdout) and what to run
#      with them (stderr): a digest is never reused, so a node never runs an image it cached under
#      the same name for an earlier build.
#
# Env:  BASE_IMAGE, DOCKER (default: docker), DOCKER_BUILD_FLAGS (more `docker build` flags, split
#       on spaces, e.g. "--network host"). A network that intercepts TLS: images/build-ca.crt (see
#       images/Dockerfile).
# Exit: 0 pushed; 1 a build or push failed; 2 bad arguments.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DOCKER=${DOCKER:-docker}
TARGETS_ALL=(step-light step-train)
log() { printf '[push-images] %s\n' "$*" >&2; }
usage() { echo "usage: scripts/push-images.sh REGISTRY [step-light] [step-train]   (e.g. registry.example.com/ml)" >&2; exit 2; }

[[ $# -ge 1 ]] || usage
registry=${1%/}; shift
# the site file's pattern for `registry` (pipelines/pipectl/pipelines/training.py, CompileConfig)
[[ $registry =~ ^[a-z0-9]([a-z0-9.:_/-]*[a-z0-9])?$ ]] \
  || { echo "push-images: $registry is not a registry path (lower-case host[:port]/path, e.g. registry.example.com/ml)" >&2; exit 2; }
targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=("${TARGETS_ALL[@]}")
for t in "${targets[@]}"; do
  [[ " ${TARGETS_ALL[*]} " == *" $t "* ]] || { echo "push-images: unknown image $t: one of ${TARGETS_ALL[*]}" >&2; exit 2; }
done
"$DOCKER" version >/dev/null 2>&1 || { echo "push-images: $DOCKER does not answer: is the Docker engine running?" >&2; exit 1; }

cd "$ROOT"
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -1)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo nogit)
dirty=$(git status --porcelain -- pyproject.toml cli pipelines components images 2>/dev/null | head -1)
tag=$version-$commit${dirty:+-dirty}

# --- 1. the base, by digest --------------------------------------------------------------------
base=${BASE_IMAGE:-$(sed -n 's/^ARG BASE_IMAGE=//p' images/Dockerfile | head -1)}
if [[ $base != *@sha256:* ]]; then
  if "$DOCKER" pull -q "$base" >/dev/null 2>&1 \
     && pinned=$("$DOCKER" image inspect -f '{{index .RepoDigests 0}}' "$base" 2>/dev/null) && [[ -n $pinned ]]; then
    log "base $base is $pinned"
    base=$pinned
  elif "$DOCKER" image inspect "$base" >/dev/null 2>&1; then
    log "warning: base $base could not be pulled: built on the local image as it is (not pinned by a digest)"
  else
    echo "push-images: base image $base can be neither pulled nor found here" >&2; exit 1
  fi
fi

# --- 2. build and push -------------------------------------------------------------------------
read -r -a extra <<<"${DOCKER_BUILD_FLAGS:-}"
declare -A digest
for t in "${targets[@]}"; do
  ref=$registry/$t:$tag
  log "building $ref (images/Dockerfile --target $t, base $base)"
  "$DOCKER" build "${extra[@]}" -f images/Dockerfile --target "$t" --build-arg BASE_IMAGE="$base" \
    --build-arg PIPECTL_VERSION="$version" --build-arg CONTENT_HASH="$commit${dirty:+-dirty}" -t "$ref" . >&2 \
    || { echo "push-images: build of $t failed (output above)" >&2; exit 1; }
  log "pushing $ref"
  "$DOCKER" push "$ref" >&2 || { echo "push-images: push of $ref failed (output above; docker login?)" >&2; exit 1; }
  digest[$t]=$("$DOCKER" image inspect -f '{{range .RepoDigests}}{{println .}}{{end}}' "$ref" \
               | sed -n "s|^$registry/$t@||p" | head -1)
  [[ ${digest[$t]} == sha256:* ]] || { echo "push-images: $ref was pushed but has no digest from $registry" >&2; exit 1; }
done

# --- 3. what to deploy -------------------------------------------------------------------------
echo "registry: $registry"
echo "images:"
image_args=()
for t in "${targets[@]}"; do
  echo "  $t: ${digest[$t]}"
  image_args+=("--image $t=${digest[$t]}")
done
log "pushed ($tag). Put the lines above in your site file, then:"
log "  pipectl --site site.yaml render cluster --write argo   # the gang reaper's Deployment names step-light"
log "  kubectl apply --server-side -k argo/namespace && pipectl --site site.yaml templates apply"
log "or give them to one command: pipectl templates apply --registry $registry ${image_args[*]}"
