"""The test cluster's upstream binaries and Go modules: versions, where the cache keeps them, and
what is missing.

Binaries are built from Go modules and cached by tests/cluster/build.sh under
``${PIPECTL_CACHE_DIR:-~/.cache/pipectl}/cluster-bin/<component>-<version>/<component>``; the CRDs
the cluster applies are read from the Go module cache (``go env GOMODCACHE``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

K8S_VERSION = "v1.34.4"
VERSIONS = {
    "etcd": "v3.6.16",
    "kube-apiserver": K8S_VERSION,
    "kube-controller-manager": K8S_VERSION,
    "kube-scheduler": K8S_VERSION,
    "workflow-controller": "v4.0.5",
    "argo": "v4.0.5-ui",  # tests/cluster/build.sh: the CLI + argo server with the real UI embedded
    "vc-scheduler": "v1.10.0",
    "vc-controller-manager": "v1.10.0",
    "kwok": "v0.8.0",
    "karpenter": "v1.13.0",  # Karpenter with its KWOK cloud provider (only the autoscaler tests)
    "kubectl": K8S_VERSION,  # only for `kubectl apply -k argo/` as a user would
}
# Go modules whose manifests (CRDs, stages) are applied: module@version -> files inside it
MODULES = {
    "argo": "github.com/argoproj/argo-workflows/v4@" + VERSIONS["workflow-controller"],
    "volcano": "volcano.sh/volcano@" + VERSIONS["vc-scheduler"],
    "kwok": "sigs.k8s.io/kwok@" + VERSIONS["kwok"],
    "karpenter": "sigs.k8s.io/karpenter@" + VERSIONS["karpenter"],
}
CRD_GLOBS = {
    "kwok": ["kustomize/crd/bases/kwok.x-k8s.io_stages.yaml"],
    "argo": ["manifests/base/crds/full/argoproj.io_*.yaml"],
    "volcano": ["config/crd/volcano/bases/*.yaml", "config/crd/jobflow/bases/*.yaml"],
    # NodePool, NodeClaim, NodeOverlay and the KWOK provider's KWOKNodeClass
    "karpenter": ["pkg/apis/crds/karpenter.sh_*.yaml", "kwok/apis/crds/*.yaml"],
}
REQUIRED_COMPONENTS = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                       "kwok", "workflow-controller"]
OPTIONAL_COMPONENTS = ["vc-scheduler", "vc-controller-manager"]


class ClusterNotAvailable(RuntimeError):
    """A binary or Go module the cluster needs is not in the cache (see `missing()`)."""


def cache_root() -> Path:
    """``$PIPECTL_CACHE_DIR``, default ``~/.cache/pipectl``."""
    return Path(os.environ.get("PIPECTL_CACHE_DIR", Path.home() / ".cache" / "pipectl"))


def binary(component: str) -> Path:
    """The cached binary of ``component`` (a key of VERSIONS); it may not exist."""
    v = VERSIONS[component]
    return cache_root() / "cluster-bin" / f"{component}-{v}" / component


def gomodcache() -> Path:
    """``$GOMODCACHE``, else what ``go env GOMODCACHE`` says, else ``$GOPATH/pkg/mod``."""
    if os.environ.get("GOMODCACHE"):
        return Path(os.environ["GOMODCACHE"])
    for go in (shutil.which("go"), "/usr/local/go/bin/go"):
        if go and os.path.exists(go):
            try:
                out = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True,
                                     timeout=20, check=False).stdout.strip()
            except (OSError, subprocess.TimeoutExpired):
                out = ""
            if out:
                return Path(out)
    return Path(os.environ.get("GOPATH", Path.home() / "go")) / "pkg" / "mod"


def module_dir(name: str) -> Path:
    return gomodcache() / MODULES[name]


def crd_files(name: str) -> list[Path]:
    d = module_dir(name)
    return sorted(p for g in CRD_GLOBS[name] for p in d.glob(g))


def missing(volcano: bool = True, autoscaler: bool = False) -> list[str]:
    """What the cluster needs and cannot find: binaries in the cache, module CRDs."""
    out = []
    for c in REQUIRED_COMPONENTS + (OPTIONAL_COMPONENTS if volcano else []) + (["karpenter"] if autoscaler else []):
        if not os.access(binary(c), os.X_OK):
            out.append(f"binary {binary(c)} (run tests/cluster/build.sh {c})")
    for m in ["kwok", "argo"] + (["volcano"] if volcano else []) + (["karpenter"] if autoscaler else []):
        if not crd_files(m):
            out.append(f"CRDs of Go module {MODULES[m]} under {gomodcache()} "
                       f"(run: go mod download {MODULES[m]})")
    return out


def ensure_available(volcano: bool = True, autoscaler: bool = False) -> None:
    """Raise ClusterNotAvailable naming everything `missing()` finds."""
    m = missing(volcano, autoscaler)
    if m:
        raise ClusterNotAvailable("test cluster components missing: " + "; ".join(m))


def load_yaml_docs(path: Path) -> list[dict]:
    """The non-empty YAML documents of ``path`` (libyaml when available: 10x faster on Argo's CRDs)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(path.read_text(), Loader=loader) if d]
