"""Fixtures for tests on the loopback Kubernetes control plane (tests/cluster/cluster.py).

Without the cached binaries (tests/cluster/build.sh) or the Go modules' CRDs the tests are skipped,
naming what is missing; PIPECTL_REQUIRE_CLUSTER=1 makes that a failure instead.
"""

from __future__ import annotations

import os

import pytest

from tests.cluster.cluster import ClusterNotAvailable, TestCluster, ensure_available


def pytest_terminal_summary(terminalreporter):
    """Repeat the ``[timing] ...`` lines the cluster tests print (start-up, end-to-end run, faults)
    at the end of the run, passed tests included: the README's figures come from these."""
    lines = []
    for reports in terminalreporter.stats.values():  # passed setup reports are filed under ""
        for rep in reports:
            if getattr(rep, "when", None) in ("setup", "call"):
                lines += [f"{rep.nodeid.split('::')[-1]}: {ln}" for ln in (rep.capstderr + rep.capstdout).splitlines()
                          if ln.startswith(("[timing]", "steps lost", "lost pod"))]
    lines = list(dict.fromkeys(lines))  # a setup report can be filed twice
    if lines:
        terminalreporter.section("cluster timings")
        for ln in lines:
            terminalreporter.write_line(ln)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "cluster: needs the loopback Kubernetes control plane (etcd, kube-apiserver, Argo, KWOK)",
    )
    config.addinivalue_line(
        "markers",
        "session_last: runs after every other test of the session (it changes the shared cluster for good)",
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``session_last`` go to the end of the run, whatever file they are in (the
    shared test cluster is used by several files, which run in name order)."""
    items.sort(key=lambda item: item.get_closest_marker("session_last") is not None)


@pytest.fixture(scope="session")
def test_cluster(tmp_path_factory):
    try:
        ensure_available(volcano=False)
    except ClusterNotAvailable as e:
        if os.environ.get("PIPECTL_REQUIRE_CLUSTER") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))
    with TestCluster(tmp_path_factory.mktemp("k8s") / "run", argo_server=True) as c:
        yield c


@pytest.fixture(scope="session")
def k8s_api(test_cluster):
    """A kubernetes.client.ApiClient with admin credentials on the test cluster."""
    api = test_cluster.api_client()
    yield api
    api.close()
