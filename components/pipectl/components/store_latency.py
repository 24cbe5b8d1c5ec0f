"""How long the object store takes to answer a small request on a kept-alive connection.

Every step reads and writes through kept-alive connections (boto3, obstore). An S3 gateway whose
sockets keep Nagle's algorithm on answers a small object in two writes (headers, then the body)
and the second waits for the client's delayed ACK: ~40 ms a request instead of ~1 ms. Measured on
this project's Ceph 16.2 RGW (beast frontend) on one machine, 2026-12-05: a GET of 1-30 KB took
44 ms with boto3 and with obstore, 0.7-1.5 ms with the frontend's ``tcp_nodelay=1``; preprocess of
5,000 images of 7.5 KiB ran 360 images/s, waiting 12.9 s of 14 s for its GETs, and 2,140 images/s
with the option. The fix is the gateway's (Ceph: ``rgw frontends = beast ... tcp_nodelay=1``; in
Rook, the CephObjectStore's ``gateway`` settings), not the client's.

:func:`small_request_ms` asks the endpoint's root anonymously (an S3 endpoint answers 403 with a
short XML body) a few times on one connection and returns the median of all but the first.
"""

from __future__ import annotations

import http.client
import statistics
import time
import urllib.parse

SLOW_MS = 20.0
"""A small request slower than this on a kept-alive connection, from a machine near the store,
is the delayed-ACK stall (one is ~40 ms), not distance."""
FIX = ("turn Nagle's algorithm off on the gateway's sockets: Ceph RGW `rgw frontends = beast ... tcp_nodelay=1` "
       "(Rook: the CephObjectStore's gateway settings); other S3 servers: their TCP_NODELAY option")


def small_request_ms(url: str, *, requests: int = 6, timeout_s: float = 5.0) -> float:
    """Median milliseconds of ``requests - 1`` anonymous GETs of ``url``'s root on one kept-alive
    connection (the first, which opens it, is not counted). Raises OSError when it does not answer."""
    parts = urllib.parse.urlsplit(url)
    conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = conn_type(parts.hostname or "", parts.port, timeout=timeout_s)
    times = []
    try:
        for _ in range(max(2, requests)):
            t0 = time.perf_counter()
            conn.request("GET", "/", headers={"Connection": "keep-alive"})
            resp = conn.getresponse()
            resp.read()
            times.append(1000 * (time.perf_counter() - t0))
            if resp.getheader("Connection", "").lower() == "close":
                conn.close()
    finally:
        conn.close()
    return statistics.median(times[1:])


def verdict(ms: float) -> tuple[str, str, str]:
    """(status, detail, fix) for a measured :func:`small_request_ms`."""
    if ms >= SLOW_MS:
        return ("warn", f"a small request takes {ms:.0f} ms on a kept-alive connection (a gateway answering without "
                        f"TCP_NODELAY: every small GET waits for a delayed ACK; the steps' reads of small images slow "
                        f"down tens of times)", FIX)
    return "ok", f"a small request takes {ms:.1f} ms on a kept-alive connection", ""
