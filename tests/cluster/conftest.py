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


# How long a module's objects may take to finish after its last test: a gang job's pods end on
# KWOK within a few seconds of their workflow; Argo's controller marks a workflow whose pods are
# gone within its resync.
LEFTOVER_DEADLINE_S = 90.0


@pytest.fixture(scope="module", autouse=True)
def nothing_left_running(request):
    """Each module that uses the shared control plane must leave nothing running or waiting
    (tests/harness/leftovers.py): objects it created that are still active after
    LEFTOVER_DEADLINE_S fail its teardown, named, and are deleted so the next module starts clean."""
    module_items = [i for i in request.session.items if i.module is request.module]
    if not any("test_cluster" in i.fixturenames for i in module_items):
        yield
        return
    from tests.harness import leftovers

    try:
        cluster = request.getfixturevalue("test_cluster")
    except (pytest.skip.Exception, pytest.fail.Exception):
        yield  # the module's own tests report the missing control plane
        return
    api = cluster.api_client()
    try:
        before = {o.uid for o in leftovers.active(api)}
        yield
        new = lambda: [o for o in leftovers.active(api) if o.uid not in before]  # noqa: E731
        try:
            cluster.wait_for("the module's objects to finish", lambda: not new(),
                             timeout_s=LEFTOVER_DEADLINE_S, interval_s=1.0)
        except TimeoutError:
            left = new()
            leftovers.delete(api, left)
            pytest.fail(f"{request.module.__name__} left {len(left)} object(s) running or waiting on the shared "
                        f"control plane {LEFTOVER_DEADLINE_S:.0f} s after its last test (deleted now): "
                        + "; ".join(map(str, left)), pytrace=False)
    finally:
        api.close()
