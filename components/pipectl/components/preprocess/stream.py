"""The stream of images into the decoder: objects fetched ahead in threads, in order and bounded,
and grouped into batches."""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")

FETCH_THREADS = 16
PREFETCH_BATCHES = 4
PREFETCH_BYTES = 512 << 20


def prefetch_ordered(
    items: Sequence[T],
    fetch: Callable[[T], R],
    *,
    workers: int = FETCH_THREADS,
    max_items: int = 1024,
    max_bytes: int = PREFETCH_BYTES,
    size: Callable[[T], int] = lambda _: 0,
) -> Iterator[tuple[T, R]]:
    """Yield ``(item, fetch(item))`` in the order of ``items``, fetching ahead in ``workers`` threads.

    Bounded: at most ``max_items`` items and ``max_bytes`` of their ``size(item)`` (bytes) are
    fetched or being fetched ahead of the consumer (always at least one). An exception from
    ``fetch`` is raised when its item's turn comes; leaving early cancels what has not started.
    """
    window: deque[tuple[T, Future[R], int]] = deque()
    in_flight = 0
    source = iter(items)
    end = object()
    nxt: Any = next(source, end)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fetch") as pool:
        try:
            while True:
                while nxt is not end and (not window or (len(window) < max_items and in_flight + size(nxt) <= max_bytes)):
                    n = size(nxt)
                    window.append((nxt, pool.submit(fetch, nxt), n))
                    in_flight += n
                    nxt = next(source, end)
                if not window:
                    return
                item, fut, n = window.popleft()
                in_flight -= n
                yield item, fut.result()
        finally:
            for _, fut, _ in window:
                fut.cancel()


def batched(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Lists of ``size`` consecutive items (the last may be shorter; none is empty)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
