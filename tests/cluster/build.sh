#!/usr/bin/env bash
# tests/cluster/build.sh — build (once) and cache the binaries of the loopback
# test cluster from the Go module proxy.
#
# These machines reach the Go module proxy, Debian and PyPI, but not GitHub
# releases or image registries, so every component is compiled from its
# published Go module:
#
#   etcd                     go.etcd.io/etcd/server/v3       via etcd-wrapper/go.mod
#   kube-apiserver           k8s.io/kubernetes/cmd/...       via k8s-wrapper/go.mod
#   kube-controller-manager    (staging modules replaced by their v0.N.P tags)
#   kube-scheduler
#   workflow-controller      github.com/argoproj/argo-workflows/v4   go install @version
#   argo (CLI + argo server) github.com/argoproj/argo-workflows/v4   writable copy, with the real UI:
#                            ui/ built by yarn 1 + webpack from the npm registry (build_argo_ui)
#   vc-scheduler             volcano.sh/volcano              writable copy (go.mod has replaces)
#   vc-controller-manager
#   kwok                     sigs.k8s.io/kwok/cmd/kwok       go install @version
#   karpenter                sigs.k8s.io/karpenter/kwok      go install @version (Karpenter with its
#                            KWOK cloud provider: NodeClaims become KWOK nodes)
#
# The real node (scripts/node-up.sh, tests/cluster/node.py) adds:
#   kubelet                  k8s.io/kubernetes/cmd/kubelet   via k8s-wrapper/go.mod
#   pause                    k8s.io/kubernetes build/pause/linux/pause.c, gcc -static (as upstream)
#   argoexec                 github.com/argoproj/argo-workflows/v4   writable copy + the git
#                            symlink the module zip drops (osspecific/signal_linux.go)
#   coredns                  github.com/coredns/coredns      writable copy, only the plugins the
#                            node's Corefile uses (bind, kubernetes, errors, log, cache, ...)
#
# Cache layout (one directory per component and version, so bumping a version
# rebuilds only that component):
#
#   ${PIPECTL_CACHE_DIR:-$HOME/.cache/pipectl}/cluster-bin/<component>-<version>/<component>
#
# A component whose cached binary exists is skipped, so the script is
# idempotent and cheap on a warm cache. Binaries are written to a temporary
# name and renamed into place only after a successful build, so an interrupted
# build never leaves a "cached" half-written binary.
#
# Usage:   tests/cluster/build.sh [component ...]     (default: all of them)
# Env:     PIPECTL_CACHE_DIR   cache root (default ~/.cache/pipectl)
#          PIPECTL_BUILD_NICE  nice level for the compiler (default 10; the
#                              machine is shared with other test runs)
#
# Components are built one after another with GOMAXPROCS=2 to keep the machine
# usable. A component that fails is reported (with the tail of its log) and the
# others are still built; the exit status is 1 if any component failed.

set -euo pipefail
shopt -s inherit_errexit   # command substitutions fail like other commands

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# --- versions -----------------------------------------------------------------
K8S_VERSION=v1.34.4          # k8s.io/kubernetes; staging modules are v0.34.4
ETCD_VERSION=v3.6.16         # go.etcd.io/etcd/server/v3 (keep in sync with etcd-wrapper/go.mod)
ARGO_VERSION=v4.0.5          # github.com/argoproj/argo-workflows/v4 (v3 is not on the proxy)
VOLCANO_VERSION=v1.10.0      # volcano.sh/volcano (newer versions are not on the proxy)
KWOK_VERSION=v0.8.0          # sigs.k8s.io/kwok
KARPENTER_VERSION=v1.13.0    # sigs.k8s.io/karpenter (v1.14.3+ need go >= 1.26.10; this machine has 1.26.8)
COREDNS_VERSION=v1.14.7      # github.com/coredns/coredns (pod DNS on the real node)
PAUSE_TAG=3.10.1             # build/pause/Makefile TAG in k8s.io/kubernetes@K8S_VERSION

ALL_COMPONENTS=(
  etcd
  kube-apiserver kube-controller-manager kube-scheduler
  workflow-controller argo
  vc-scheduler vc-controller-manager
  kwok karpenter
  kubelet pause argoexec coredns
  kubectl
)

# --- paths ----------------------------------------------------------------------
CACHE_ROOT=${PIPECTL_CACHE_DIR:-$HOME/.cache/pipectl}
BIN_ROOT=$CACHE_ROOT/cluster-bin
WORK=$BIN_ROOT/.work        # wrapper modules and writable module copies
LOGS=$BIN_ROOT/.logs        # one build log per component
mkdir -p "$BIN_ROOT" "$WORK" "$LOGS"

# --- Go toolchain and build settings -------------------------------------------
if ! command -v go >/dev/null 2>&1; then
  export PATH=/usr/local/go/bin:$PATH
fi
export GOTOOLCHAIN=local     # never try to download another toolchain
export GOWORK=off            # never pick up a go.work from a parent directory
export GOFLAGS=-mod=mod      # let go resolve and record go.sum entries in the work dirs
export GOMAXPROCS=2          # also the default for `go build -p`
export CGO_ENABLED=0         # static binaries, like the upstream release builds
NICE=(nice -n "${PIPECTL_BUILD_NICE:-10}")
# -buildvcs=false: the work dirs may sit inside some git checkout; stamping its
# VCS state into third-party binaries would be wrong (and needs git).
GO_BUILD_FLAGS=(-trimpath -buildvcs=false -gcflags=all=-dwarf=false)
BUILD_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# Only one build at a time per cache (a second invocation waits).
exec {LOCK_FD}>"$BIN_ROOT/.build.lock"
if ! flock -n "$LOCK_FD"; then
  echo "build.sh: another build holds $BIN_ROOT/.build.lock; waiting..."
  flock "$LOCK_FD"
fi

# --- helpers --------------------------------------------------------------------

log() { printf '[build.sh %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# module_dir MODULE VERSION: download a module into the module cache (read-only)
# and print its directory.
module_dir() {
  local json dir
  json=$(cd "$WORK" && GOFLAGS= go mod download -json "$1@$2")
  dir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
  [[ -d $dir ]] || { echo "module_dir: no directory for $1@$2: $json" >&2; return 1; }
  echo "$dir"
}

# writable_copy MODULE VERSION NAME: copy a module out of the (read-only) module
# cache into $WORK/NAME and print that directory. Needed when the module's
# go.mod has replace directives (they only apply to the main module, so
# `go install mod/cmd@version` refuses it) or when files must be added.
# A stamp file marks a complete copy; an incomplete one is redone.
writable_copy() {
  local src dst=$WORK/$3
  if [[ ! -f $dst/.pipectl-copy-complete ]]; then
    src=$(module_dir "$1" "$2")
    rm -rf "$dst"
    cp -r "$src" "$dst"
    chmod -R u+w "$dst"
    touch "$dst/.pipectl-copy-complete"
  fi
  echo "$dst"
}

# wrapper_dir NAME: a fresh work copy of the wrapper module tests/cluster/NAME
# (go build -mod=mod writes go.sum and may tidy go.mod; keep that out of the repo).
wrapper_dir() {
  local dst=$WORK/$1
  mkdir -p "$dst"
  cp "$HERE/$1/go.mod" "$dst/go.mod"
  echo "$dst"
}

# has_replaces GO_MOD: true if the go.mod file contains replace directives.
has_replaces() { grep -Eq '^[[:space:]]*replace[[:space:](]' "$1"; }

# --- one function per component: build_<name> OUTPUT_PATH ------------------------

build_etcd() {
  local dir
  dir=$(wrapper_dir etcd-wrapper)
  cd "$dir"
  # The server module's root package is the etcd main (it calls etcdmain.Main).
  "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -ldflags '-s -w' \
    -o "$1" go.etcd.io/etcd/server/v3
}

# Kubernetes: hack/lib/golang.sh builds with these tags, and hack/lib/version.sh
# sets the same version variables in component-base and client-go. The version
# matters: kube-apiserver derives its binary/emulation version from gitVersion.
# The module zip carries no git commit, so gitCommit stays empty and the tree
# state is "archive" (what upstream uses for tarball builds).
K8S_TAGS=selinux,notest,grpcnotrace
k8s_ldflags() {
  local major minor flags="-s -w" pkg
  major=${K8S_VERSION#v}; major=${major%%.*}
  minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$BUILD_DATE"
  done
  echo "$flags"
}
build_k8s_cmd() {  # build_k8s_cmd CMD OUTPUT_PATH
  local dir
  dir=$(wrapper_dir k8s-wrapper)
  cd "$dir"
  "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -tags "$K8S_TAGS" -ldflags "$(k8s_ldflags)" \
    -o "$2" "k8s.io/kubernetes/cmd/$1"
}
build_kube-apiserver()          { build_k8s_cmd kube-apiserver "$1"; }
build_kube-controller-manager() { build_k8s_cmd kube-controller-manager "$1"; }
build_kube-scheduler()          { build_k8s_cmd kube-scheduler "$1"; }
build_kubelet()                 { build_k8s_cmd kubelet "$1"; }
build_kubectl()                 { build_k8s_cmd kubectl "$1"; }   # `kubectl apply -k argo/` as users do

# The pause container's binary: C, compiled statically as build/pause/Makefile does
# (CFLAGS -Os -Wall -Werror -static -DVERSION=v$(TAG)-$(REV); REV is a git describe, "archive" here).
build_pause() {
  local src
  src=$(module_dir k8s.io/kubernetes "$K8S_VERSION")/build/pause/linux
  "${NICE[@]}" gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-archive" -o "$1" "$src/pause.c"
  strip "$1"
}

# Argo Workflows: version variables as in its Makefile. `version` also picks
# the default executor image tag (tests pass --executor-image anyway).
ARGO_MOD=github.com/argoproj/argo-workflows/v4
argo_ldflags() {
  echo "-s -w -X $ARGO_MOD.version=$ARGO_VERSION -X $ARGO_MOD.buildDate=$BUILD_DATE -X $ARGO_MOD.gitTreeState=archive"
}
build_workflow-controller() {
  local mod_dir gobin
  mod_dir=$(module_dir "$ARGO_MOD" "$ARGO_VERSION")
  if has_replaces "$mod_dir/go.mod"; then
    # A release with replace directives must be built from a writable copy.
    local dir
    dir=$(writable_copy "$ARGO_MOD" "$ARGO_VERSION" "argo-workflows-$ARGO_VERSION")
    cd "$dir"
    "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -ldflags "$(argo_ldflags)" \
      -o "$1" ./cmd/workflow-controller
  else
    # v4.0.5 has none: install straight from the module, with upstream's go.mod.
    gobin=$(mktemp -d "$WORK/gobin.XXXXXX")
    (cd "$WORK" && GOBIN=$gobin "${NICE[@]}" go install "${GO_BUILD_FLAGS[@]}" \
      -ldflags "$(argo_ldflags)" "$ARGO_MOD/cmd/workflow-controller@$ARGO_VERSION")
    mv "$gobin/workflow-controller" "$1"
    rm -rf "$gobin"
  fi
}
# The Argo UI (ui/ of the module: yarn 1 lockfile + webpack), built once into
# $BIN_ROOT/argo-ui-$ARGO_VERSION/app and embedded by `argo` (ui/embed.go: //go:embed dist/app).
# Node >= 20 and npm must be on the machine; yarn 1 is installed from the npm registry into the
# work dir (never globally). What differs from upstream's `yarn build`, because only the npm
# registry is reachable here (no GitHub):
#  - package.json's `argo-ui` is a GitHub commit (git+https://github.com/argoproj/argo-ui#54f36c7);
#    the npm registry's argo-ui@1.0.0 (an older snapshot of the same components) replaces it, and
#    yarn resolves its dependencies (the rest of yarn.lock stays as locked; not --frozen-lockfile);
#  - two imports of that older argo-ui are patched: `uuid/v1` (uuid 8's exports have no such path:
#    use uuid's named v1) and the xterm stylesheet path (argo-ui's own xterm 2.4 is nested).
# The lockfile's registry.yarnpkg.com URLs are pointed at registry.npmjs.org.
ARGO_UI_YARN=1.22.22
build_argo_ui() {  # build_argo_ui OUT_DIR: OUT_DIR/app is the bundle
  local mod_dir w=$WORK/argo-ui-$ARGO_VERSION yarn node_major
  node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  [[ $node_major -ge 20 ]] || { echo "build_argo_ui: node >= 20 needed (found: $(node --version 2>&1))" >&2; return 1; }
  mod_dir=$(module_dir "$ARGO_MOD" "$ARGO_VERSION")
  rm -rf "$w"
  mkdir -p "$w/api"
  cp -r "$mod_dir/ui" "$w/ui"                       # webpack copies ../api/{openapi-spec,jsonschema}
  cp -r "$mod_dir/api/openapi-spec" "$mod_dir/api/jsonschema" "$w/api/"
  chmod -R u+w "$w"
  cd "$w/ui"
  sed -i 's#"argo-ui": "git+https://github.com/argoproj/argo-ui.git\#[0-9a-f]*"#"argo-ui": "1.0.0"#' package.json
  grep -q '"argo-ui": "1.0.0"' package.json || { echo "build_argo_ui: argo-ui dependency not replaced" >&2; return 1; }
  sed -i 's#https://registry.yarnpkg.com#https://registry.npmjs.org#' yarn.lock
  sed -i '/frozen-lockfile/d' .yarnrc              # the argo-ui entry changes the lockfile
  echo 'registry "https://registry.npmjs.org"' >>.yarnrc
  "${NICE[@]}" npm install --silent --no-save --prefix "$WORK/yarn-$ARGO_UI_YARN" "yarn@$ARGO_UI_YARN"
  yarn=$WORK/yarn-$ARGO_UI_YARN/node_modules/.bin/yarn
  "${NICE[@]}" "$yarn" install --non-interactive --network-timeout 300000 --cache-folder "$WORK/yarn-cache"
  local ff=node_modules/argo-ui/src/components/form-field/form-field.tsx
  local lv=node_modules/argo-ui/src/components/logs-viewer/logs-viewer.scss
  sed -i "s#require('uuid/v1')#require('uuid').v1#" "$ff"
  sed -i "s#'node_modules/xterm/dist/xterm'#'node_modules/argo-ui/node_modules/xterm/dist/xterm'#" "$lv"
  grep -q "require('uuid').v1" "$ff" && grep -q argo-ui/node_modules/xterm "$lv" \
    || { echo "build_argo_ui: argo-ui patches did not apply" >&2; return 1; }
  # webpack's production build peaks at ~2 GB of heap; the default limit is close to that.
  NODE_OPTIONS=--max-old-space-size=6144 NODE_ENV=production VERSION=$ARGO_VERSION \
    "${NICE[@]}" node_modules/.bin/webpack --mode production
  grep -q '<script.*main\.[0-9a-f]*\.js' dist/app/index.html || { echo "build_argo_ui: no bundle in dist/app/index.html" >&2; return 1; }
  rm -rf "$1.partial"
  mkdir -p "$1.partial"
  mv dist/app "$1.partial/app"
  rm -rf "$1"
  mv "$1.partial" "$1"
  cd / && rm -rf "$w" "$WORK/yarn-cache"           # node_modules ~700 MB, yarn cache ~940 MB: rebuilt only on a version change
}
build_argo() {
  local dir ui=$BIN_ROOT/argo-ui-$ARGO_VERSION
  if [[ ! -f $ui/app/index.html ]]; then
    log "argo: building the UI first (yarn + webpack; a few minutes cold)"
    build_argo_ui "$ui"
  fi
  dir=$(writable_copy "$ARGO_MOD" "$ARGO_VERSION" "argo-workflows-$ARGO_VERSION")
  cd "$dir"
  # The CLI (which contains `argo server`) embeds the UI bundle with //go:embed dist/app.
  rm -rf ui/dist/app
  mkdir -p ui/dist
  cp -r "$ui/app" ui/dist/app
  "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -ldflags "$(argo_ldflags)" -o "$1" ./cmd/argo
}

# argoexec: the module zip drops workflow/executor/osspecific/signal_linux.go, a git symlink to
# signal_darwin.go upstream (module zips carry no symlinks), so Linux builds lack Setpgid & co.
build_argoexec() {
  local dir
  dir=$(writable_copy "$ARGO_MOD" "$ARGO_VERSION" "argo-workflows-$ARGO_VERSION")
  cd "$dir"
  if [[ ! -e workflow/executor/osspecific/signal_linux.go ]]; then
    ln -s signal_darwin.go workflow/executor/osspecific/signal_linux.go
  fi
  "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -ldflags "$(argo_ldflags)" -o "$1" ./cmd/argoexec
}

# CoreDNS: the full binary links every cloud provider's SDK; the node needs a handful of plugins,
# so the generated plugin list (core/plugin/zplugin.go) is cut down in a writable copy, the way
# CoreDNS documents custom builds (plugin.cfg + go generate). Directive order stays upstream's.
build_coredns() {
  local dir p
  dir=$(writable_copy github.com/coredns/coredns "$COREDNS_VERSION" "coredns-$COREDNS_VERSION")
  cd "$dir"
  {
    echo '// pipectl: cut-down plugin list (tests/cluster/build.sh)'
    echo 'package plugin'
    echo 'import ('
    for p in bind errors log cache health ready kubernetes loadbalance hosts whoami loop reload; do
      echo "	_ \"github.com/coredns/coredns/plugin/$p\""
    done
    echo ')'
  } >core/plugin/zplugin.go
  "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" -o "$1" .
}

# Volcano: go.mod replaces k8s.io/* and grpc, so build from a writable copy.
# Version variables as in its Makefile.def (no git SHA in a module zip).
VOLCANO_MOD=volcano.sh/volcano
volcano_ldflags() {
  echo "-s -w -X $VOLCANO_MOD/pkg/version.Version=$VOLCANO_VERSION -X $VOLCANO_MOD/pkg/version.Built=$BUILD_DATE"
}
build_volcano_cmd() {  # build_volcano_cmd CMD_DIR OUTPUT_PATH
  local dir
  dir=$(writable_copy "$VOLCANO_MOD" "$VOLCANO_VERSION" "volcano-$VOLCANO_VERSION")
  cd "$dir"
  "${NICE[@]}" go build "${GO_BUILD_FLAGS[@]}" -ldflags "$(volcano_ldflags)" -o "$2" "./cmd/$1"
}
build_vc-scheduler()          { build_volcano_cmd scheduler "$1"; }
build_vc-controller-manager() { build_volcano_cmd controller-manager "$1"; }

# KWOK: no replace directives, so a plain `go install ...@version`.
build_kwok() {
  local gobin
  gobin=$(mktemp -d "$WORK/gobin.XXXXXX")
  (cd "$WORK" && GOBIN=$gobin "${NICE[@]}" go install "${GO_BUILD_FLAGS[@]}" \
    -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION")
  mv "$gobin/kwok" "$1"
  rm -rf "$gobin"
}

# Karpenter's controller with the KWOK cloud provider (its kwok/main.go): the autoscaler tests.
build_karpenter() {
  local gobin
  gobin=$(mktemp -d "$WORK/gobin.XXXXXX")
  (cd "$WORK" && GOBIN=$gobin "${NICE[@]}" go install "${GO_BUILD_FLAGS[@]}" -ldflags "-s -w" \
    "sigs.k8s.io/karpenter/kwok@$KARPENTER_VERSION")
  mv "$gobin/kwok" "$1"
  rm -rf "$gobin"
}

version_of() {
  case $1 in
    etcd) echo "$ETCD_VERSION" ;;
    kube-*) echo "$K8S_VERSION" ;;
    workflow-controller) echo "$ARGO_VERSION" ;;
    argo) echo "$ARGO_VERSION-ui" ;;   # -ui: with the real UI (binaries before it embedded a placeholder)
    vc-*) echo "$VOLCANO_VERSION" ;;
    kwok) echo "$KWOK_VERSION" ;;
    karpenter) echo "$KARPENTER_VERSION" ;;
    kubelet|pause|kubectl) echo "$K8S_VERSION" ;;
    argoexec) echo "$ARGO_VERSION" ;;
    coredns) echo "$COREDNS_VERSION" ;;
    *) return 1 ;;
  esac
}

# --- driver -----------------------------------------------------------------------

fmt_duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

components=("$@")
[[ ${#components[@]} -gt 0 ]] || components=("${ALL_COMPONENTS[@]}")
for c in "${components[@]}"; do
  version_of "$c" >/dev/null || { echo "build.sh: unknown component '$c' (known: ${ALL_COMPONENTS[*]})" >&2; exit 2; }
done

log "go: $(go version); cache: $BIN_ROOT"
summary=()
failed=0
total_start=$SECONDS
for c in "${components[@]}"; do
  version=$(version_of "$c")
  dest=$BIN_ROOT/$c-$version/$c
  if [[ -x $dest ]]; then
    log "$c $version: cached at $dest"
    summary+=("$(printf '%-24s %-9s %-8s %8s  %s' "$c" "$version" cached - "$dest")")
    continue
  fi
  mkdir -p "$(dirname "$dest")"
  tmp=$dest.partial.$$
  logfile=$LOGS/$c-$version.log
  log "$c $version: building (log: $logfile)"
  start=$SECONDS
  # Subshell: each build function may cd; `set -e` inside stops at the first
  # error. errexit is off in this shell around the pipeline (bash would ignore
  # `set -e` inside a subshell that is part of an `||` list).
  set +e
  ( set -euo pipefail; "build_$c" "$tmp" ) 2>&1 | tee "$logfile"
  rc=${PIPESTATUS[0]}
  set -e
  took=$((SECONDS - start))
  if [[ $rc -eq 0 && -x $tmp ]]; then
    mv -f "$tmp" "$dest"
    log "$c $version: built in $(fmt_duration "$took") -> $dest"
    summary+=("$(printf '%-24s %-9s %-8s %8s  %s' "$c" "$version" built "$(fmt_duration "$took")" "$dest")")
  else
    rm -f "$tmp"
    failed=1
    log "$c $version: FAILED after $(fmt_duration "$took") (exit $rc); last lines of $logfile:"
    tail -n 25 "$logfile" | sed 's/^/    | /'
    summary+=("$(printf '%-24s %-9s %-8s %8s  %s' "$c" "$version" FAILED "$(fmt_duration "$took")" "see $logfile")")
  fi
done

echo
log "summary (total $(fmt_duration $((SECONDS - total_start)))):"
printf '  %-24s %-9s %-8s %8s  %s\n' component version status time path
printf '  %s\n' "${summary[@]}"
exit "$failed"
