"""CPU time of each test, recorded in the JUnit XML (``cpu_s``) for the run's "most CPU" list.

On a shared 2-core machine a test's wall time says how crowded the machine was as much as what
the test costs; its CPU time (this process and every child it waited for, user + system, from
setup to teardown) is what it takes from the others. A service a module or session fixture
started is counted where it is reaped, in the teardown of the last test that used the fixture:
that teardown's CPU is recorded apart (``shared_cpu_s``, listed as the shared fixtures' own line),
not charged to the test.
"""

from __future__ import annotations

import os

import pytest

_START = pytest.StashKey[float]()
_SHARED = pytest.StashKey[float]()


def cpu_now() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """A teardown that ends a module's or the session's fixtures (the last test of its module or
    of the run): its CPU is the shared fixtures' (their services reaped), kept apart."""
    reaps = nextitem is None or nextitem.module is not item.module
    t0 = cpu_now()
    yield
    if reaps and _START in item.stash:
        item.stash[_SHARED] = cpu_now() - t0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and _START in item.stash:
        shared = item.stash.get(_SHARED, 0.0)
        item.user_properties.append(("cpu_s", f"{cpu_now() - item.stash[_START] - shared:.2f}"))
        if shared:
            item.user_properties.append(("shared_cpu_s", f"{shared:.2f}"))
    yield
