"""A fault-injecting HTTP proxy for S3 tests: forwards to an upstream S3 endpoint and, at a given
rate, answers 503 SlowDown or resets the connection instead; optionally adds latency to every
request (bounded, loopback only).

Used to show that `stage` survives the faults a loaded Ceph RGW or a flaky network produces.
"""

from __future__ import annotations

import hashlib
import http.client
import http.server
import random
import re
import socket
import struct
import threading
import time
from urllib.parse import urlparse

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


def _opaque(etag: bytes) -> bytes:
    """A stable ETag that is no MD5 of the content (the quoting kept as given)."""
    inner = etag.replace(b"&quot;", b"").strip(b'"')
    opaque = hashlib.sha256(b"kms:" + inner).hexdigest()[:32].encode()
    return etag.replace(inner, opaque)


class FaultyProxy:
    """``with FaultyProxy(upstream, rate=0.1) as p: p.url`` -> counts in ``p.faults``/``p.requests``."""

    def __init__(self, upstream: str, rate: float, seed: int = 1, delay_s: float = 0.0, opaque_etags: bool = False,
                 cut_rate: float = 0.0) -> None:
        """``opaque_etags``: replace every ETag the store answers (headers and listings) by a
        stable value that is no MD5 of the content, as S3 does for SSE-KMS/SSE-C objects and some
        gateways always do (field case C14). ``cut_rate``: the share of GETs answered with the
        status and headers of the store (the whole Content-Length) but only the first half of the
        body, then a reset: a read cut short while the body streams (counted in ``faults["cut"]``)."""
        self.upstream = urlparse(upstream)
        self.rate = rate
        self.delay_s = delay_s
        self.opaque_etags = opaque_etags
        self.cut_rate = cut_rate
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.requests = 0
        self.faults = {"503": 0, "reset": 0, "cut": 0}
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    proxy.requests += 1
                    roll = proxy.rng.random()
                    cut = self.command == "GET" and proxy.rng.random() < proxy.cut_rate
                if proxy.delay_s:
                    time.sleep(proxy.delay_s)  # a slower network
                if roll < proxy.rate / 2:
                    with proxy.lock:
                        proxy.faults["503"] += 1
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    self.wfile.write(SLOW_DOWN)
                    return
                if roll < proxy.rate:
                    with proxy.lock:
                        proxy.faults["reset"] += 1
                    # RST instead of FIN: SO_LINGER with a zero timeout, then close.
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                if proxy.opaque_etags:
                    data = re.sub(rb"<ETag>(.*?)</ETag>", lambda m: b"<ETag>" + _opaque(m.group(1)) + b"</ETag>", data)
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() == "etag" and proxy.opaque_etags:
                        v = _opaque(v.encode()).decode()
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # a HEAD's Content-Length is the object's size, not the (empty) body's
                head_length = resp.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", head_length or str(len(data)))
                self.end_headers()
                if cut and len(data) > 1:
                    with proxy.lock:
                        proxy.faults["cut"] += 1
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                elif self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FaultyProxy":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
