"""CPU time of each test, recorded in the JUnit XML (``cpu_s``) for the run's "most CPU" list.

On a shared 2-core machine a test's wall time says how crowded the machine was as much as what
the test costs; its CPU time (this process and every child it waited for, user + system, from
setup to teardown) is what it takes from the others. A service a session fixture started is
counted where it is reaped: at the teardown of the session's last test.
"""

from __future__ import annotations

import os

import pytest

_START = pytest.StashKey[float]()


def cpu_now() -> float:
    """User + system CPU seconds of this process and of the children it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_START] = cpu_now()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    if call.when == "teardown" and _START in item.stash:
        item.user_properties.append(("cpu_s", f"{cpu_now() - item.stash[_START]:.2f}"))
    yield
