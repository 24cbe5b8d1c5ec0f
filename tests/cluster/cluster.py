"""The loopback test cluster: Kubernetes + Argo Workflows + Volcano on 127.0.0.1, pods by KWOK.

The code lives in the harness package (tests/harness/: binaries.py, pki.py, kwok.py,
controlplane.py, argoexec.py, cli.py, manifests/); this module keeps the names the tests and
scripts use and the command line::

    python tests/cluster/cluster.py up RUN_DIR [--nodes N] [--no-volcano] [--argo-server]
    python tests/cluster/cluster.py down RUN_DIR
    python tests/cluster/cluster.py check        # exit 1 naming what is missing

Usage::

    from tests.cluster.cluster import TestCluster
    with TestCluster(tmp_path / "k8s") as c:
        api = c.api_client()
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: import from the repository, not this folder
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from tests.harness.argoexec import (  # noqa: E402
    COMPLETED_LABEL,
    NODE_ID_ANNOTATION,
    TEST_OUTPUTS_CONFIGMAP,
    WF_LABEL,
    run_taskresult_reporter,
)
from tests.harness.binaries import (  # noqa: E402
    CRD_GLOBS,
    K8S_VERSION,
    MODULES,
    OPTIONAL_COMPONENTS,
    REQUIRED_COMPONENTS,
    VERSIONS,
    ClusterNotAvailable,
    binary,
    cache_root,
    crd_files,
    ensure_available,
    gomodcache,
    missing,
    module_dir,
)
from tests.harness.cli import main  # noqa: E402
from tests.harness.cli import state as _state  # noqa: E402,F401 - node.py's `up` reads it
from tests.harness.controlplane import (  # noqa: E402
    AUDIT_POLICY,
    EXECUTOR_IMAGE,
    SERVICE_CIDR,
    STATE_FILE,
    STOP_ORDER,
    ClusterStartError,
    TestCluster,
)
from tests.harness.kwok import FAKE_NODE_ANNOTATION, NODE_CAPACITY, POD_CIDR, fake_node  # noqa: E402

__all__ = [
    "AUDIT_POLICY", "COMPLETED_LABEL", "CRD_GLOBS", "EXECUTOR_IMAGE", "FAKE_NODE_ANNOTATION", "K8S_VERSION",
    "MODULES", "NODE_CAPACITY", "NODE_ID_ANNOTATION", "OPTIONAL_COMPONENTS", "POD_CIDR", "REQUIRED_COMPONENTS",
    "SERVICE_CIDR", "STATE_FILE", "STOP_ORDER", "TEST_OUTPUTS_CONFIGMAP", "VERSIONS", "WF_LABEL",
    "ClusterNotAvailable", "ClusterStartError", "TestCluster", "binary", "cache_root", "crd_files",
    "ensure_available", "fake_node", "gomodcache", "main", "missing", "module_dir", "run_taskresult_reporter",
]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
