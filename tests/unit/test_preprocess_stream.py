"""The bounded, ordered prefetch and the batching that feed DALI in the preprocess step."""

from __future__ import annotations

import threading
import time

import pytest

from pipectl.components.preprocess.stream import batched, prefetch_ordered


def test_prefetch_keeps_order_when_fetches_finish_out_of_order():
    def fetch(i: int) -> int:
        time.sleep(0.002 * (7 - i % 7))  # later items finish first
        return i * i

    assert list(prefetch_ordered(range(40), fetch, workers=8, max_items=10)) == [(i, i * i) for i in range(40)]


@pytest.mark.parametrize("max_items, max_bytes, size, bound", [(5, 1 << 30, 1, 5), (100, 30, 10, 3)])
def test_prefetch_never_runs_further_ahead_than_its_window(max_items, max_bytes, size, bound):
    """At most ``bound`` items fetched or in flight beyond what the consumer has taken."""
    fetched, taken, worst = [0], [0], [0]
    lock = threading.Lock()

    def fetch(i: int) -> int:
        with lock:
            fetched[0] += 1
            worst[0] = max(worst[0], fetched[0] - taken[0])
        return i

    for _ in prefetch_ordered(range(50), fetch, workers=8, max_items=max_items, max_bytes=max_bytes, size=lambda _: size):
        time.sleep(0.001)
        with lock:
            taken[0] += 1
    assert taken[0] == 50
    assert 1 <= worst[0] <= bound


def test_an_item_larger_than_the_byte_window_still_passes():
    assert [i for i, _ in prefetch_ordered(range(3), lambda i: i, max_bytes=10, size=lambda _: 100)] == [0, 1, 2]


def test_a_fetch_error_is_raised_at_its_turn_and_later_items_are_not_started():
    started: list[int] = []

    def fetch(i: int) -> int:
        started.append(i)
        if i == 3:
            raise OSError("connection reset")
        return i

    got = []
    with pytest.raises(OSError, match="connection reset"):
        for i, _ in prefetch_ordered(range(1000), fetch, workers=2, max_items=4):
            got.append(i)
    assert got == [0, 1, 2]
    assert max(started) < 10


def test_batched():
    assert list(batched(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(batched([], 3)) == []
    assert list(batched(range(6), 3)) == [[0, 1, 2], [3, 4, 5]]
