"""runtime.Deferred: a value built in the background, waited for where it is first used."""

from __future__ import annotations

import threading

import pytest

from pipectl.components.runtime import Deferred


def test_the_first_use_waits_for_the_value_and_reads_its_attributes():
    release, built = threading.Event(), []

    class Client:
        endpoint = "http://store:7480"

        def ping(self) -> str:
            return "pong"

    def build() -> Client:
        assert release.wait(30)  # held until the constructor below has returned
        built.append(Client())
        return built[-1]

    client = Deferred(build)  # returns while build() is still held: built in the background
    assert built == []
    release.set()
    assert client.endpoint == "http://store:7480" and client.ping() == "pong"
    assert client.get() is built[0] and len(built) == 1  # built once


def test_what_building_raised_is_raised_where_the_value_is_used():
    client = Deferred(lambda: (_ for _ in ()).throw(ValueError("Invalid endpoint: htp://x")))
    with pytest.raises(ValueError, match="Invalid endpoint"):
        client.meta  # noqa: B018
    with pytest.raises(ValueError, match="Invalid endpoint"):  # every time, not only the first
        client.get()
