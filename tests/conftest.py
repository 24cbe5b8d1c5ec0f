"""Shared fixtures. Integration fixtures start real local services themselves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

# Each test's CPU time goes into the JUnit XML (scripts/test.sh lists the hungriest).
pytest_plugins = ["tests.tools.cpu_account"]



def pytest_configure(config):
    """SIGTERM (``timeout``, a CI runner cancelling the job) ends the run as Ctrl-C does: pytest
    then tears down its session fixtures, so the Ceph daemons, MLflow servers and control planes
    they started are stopped instead of outliving the run."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        def _interrupt(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")
        signal.signal(signal.SIGTERM, _interrupt)


# Benchmarks are run by `make bench` (python -m tests.bench.run), never collected as tests.
collect_ignore = ["bench"]

# A real single-node Ceph with its S3 gateway on 127.0.0.1; an MDS + CephFS is added only when a
# test asks for `cephfs_mount` (the MDS bring-up is paid by sessions that use CephFS only).
# Without the Debian packages its tests are skipped with the packages named; PIPECTL_REQUIRE_CEPH=1
# (set by `make test` after it installs them) makes that a failure instead.
from tests.ceph.ceph import (
    CephCluster,
    CephNotInstalled,
    ensure_installed,
    missing_packages,
)

# Fixtures that start (or stand on) the session's Ceph or Alluxio. A test that asks for one, directly
# or through another fixture, is marked `storage`: `make test` runs those in one pytest process
# (one Ceph, one Alluxio) and everything else of tier 1 in another, side by side.
STORAGE_FIXTURES = frozenset({"ceph_cluster", "ceph_s3", "cephfs_mount", "ceph_settings", "alluxio"})


def uses_storage(item: pytest.Item) -> bool:
    """Whether a collected test asks for the session's Ceph or Alluxio (see STORAGE_FIXTURES). A
    fixture that picks Ceph by its parameter marks that parameter itself:
    ``pytest.param("ceph-rgw", marks=pytest.mark.storage)``."""
    return bool(STORAGE_FIXTURES & set(getattr(item, "fixturenames", ())))


def pytest_collection_modifyitems(items):
    for item in items:
        if uses_storage(item):
            item.add_marker(pytest.mark.storage)


def _cephfs_possible() -> bool:
    return not missing_packages(cephfs=True) and os.access("/dev/fuse", os.R_OK | os.W_OK)


@pytest.fixture(scope="session")
def ceph_cluster(tmp_path_factory):
    try:
        ensure_installed()
    except CephNotInstalled as e:
        if os.environ.get("PIPECTL_REQUIRE_CEPH") == "1":
            pytest.fail(str(e))
        pytest.skip(str(e))
    with CephCluster(tmp_path_factory.mktemp("ceph") / "run") as c:
        yield c


def require_storage_mark(request) -> None:
    """Fail a test that reached Ceph without the ``storage`` mark (through a parameter of a
    fixture that picks Ceph): ``make test`` would start a second Ceph for it in the other process."""
    if request.node.get_closest_marker("storage") is None:
        pytest.fail(f"{request.node.nodeid} uses Ceph but is not marked storage: mark the parameter that picks "
                    "Ceph, pytest.param(\"ceph-rgw\", marks=pytest.mark.storage)")


@pytest.fixture()
def ceph_s3(request, ceph_cluster):
    """A boto3 S3 client for the cluster's RADOS Gateway (path-style, checksums when required)."""
    require_storage_mark(request)
    return ceph_cluster.s3_client()


@pytest.fixture(scope="session")
def cephfs_mount(ceph_cluster, tmp_path_factory):
    """The cluster's CephFS mounted with ceph-fuse (MDS started on first use; unmounted when the
    cluster stops). Skipped (a failure under PIPECTL_REQUIRE_CEPH=1) without ceph-mds/ceph-fuse
    or a usable /dev/fuse."""
    if not _cephfs_possible():
        msg = "CephFS needs the Debian packages ceph-mds and ceph-fuse and a usable /dev/fuse"
        if os.environ.get("PIPECTL_REQUIRE_CEPH") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return ceph_cluster.mount_cephfs(tmp_path_factory.mktemp("cephfs"))



@pytest.fixture(scope="session")
def digits_dir(tmp_path_factory) -> Path:
    """The bundled digits dataset written as JPEGs (ImageFolder layout)."""
    from pipectl.components.data import write_example

    d = tmp_path_factory.mktemp("digits")
    write_example("digits", d)
    return d


@pytest.fixture(scope="session")
def small_digits_dir(digits_dir, tmp_path_factory) -> Path:
    """30 digits images per class (300 in all): for tests that need a real but quick dataset."""
    import shutil

    d = tmp_path_factory.mktemp("small-digits")
    for label_dir in sorted(digits_dir.iterdir()):
        (d / label_dir.name).mkdir()
        for p in sorted(label_dir.iterdir())[:30]:
            shutil.copy(p, d / label_dir.name / p.name)
    return d
