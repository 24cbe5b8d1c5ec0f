"""A TLS proxy in front of the test cluster's kube-apiserver that loses the response to a write.

What it stands in for: the API server's answer when etcd is slow (k8s.io/apiserver
pkg/storage/errors/storage.go ``InterpretCreateError``: storage unreachable ->
``NewServerTimeout(resource, "create", 2)``, a 500 with ``Retry-After: 2``) although the write may
have committed, and client-go's reaction to it (client-go rest/with_retry.go ``checkWait``: any 5xx
or 429 with ``Retry-After`` is retried, whatever the verb). The proxy forwards the matching write
to the real API server (so it commits), throws the real response away and answers that 500
instead; the client then sends the same request again. Everything else is relayed untouched,
streams (watches, logs) included.

Clients authenticate with bearer tokens (ServiceAccount tokens: pods, or a TokenRequest token),
which the proxy passes on; it never presents a credential of its own. It serves the API server's
own certificate, so clients verify it with the cluster CA under the same names (127.0.0.1, the
``kubernetes`` Service address). HTTP/1.1 only (ALPN), which client-go accepts.

    with KubeFaultProxy(upstream_port, pki_dir, fail=lambda m, p: m == "PATCH" and "/jobs/" in p) as px:
        ... px.port, px.events   # [(method, path, upstream status, status answered)]
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import ssl
import threading
from pathlib import Path
from typing import Callable

HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


def server_timeout_body(path: str) -> bytes:
    """The Status the API server sends for a create whose storage write timed out (same reason,
    code and retryAfterSeconds as ``errors.NewServerTimeout(..., "create", 2)``)."""
    return json.dumps({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": f"The create operation against {path} could not be completed at this time, please try again.",
        "reason": "ServerTimeout", "details": {"causes": [{"reason": "UnexpectedServerResponse", "message": "create"}],
                                               "retryAfterSeconds": 2}, "code": 500,
    }).encode()


class KubeFaultProxy:
    """Relay to ``https://127.0.0.1:<upstream_port>``; the first ``times`` requests for which
    ``fail(method, path)`` is true are forwarded, then answered with a ServerTimeout 500 + Retry-After.

    host/port: where to listen (port 0 picks one; ``self.port`` says which). ``pki``: the test
    cluster's PKI folder (apiserver.crt/.key to serve, ca.crt to verify the upstream).
    """

    def __init__(self, upstream_port: int, pki: Path, fail: Callable[[str, str], bool], times: int = 1,
                 host: str = "127.0.0.1", port: int = 0, retry_after_s: int = 1) -> None:
        self.upstream_port = upstream_port
        self.fail = fail
        self.left = times
        self.retry_after_s = retry_after_s
        self.events: list[tuple[str, str, int, int]] = []
        self.lock = threading.Lock()
        self.up_ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.up_ctx.check_hostname = False  # the upstream is addressed as 127.0.0.1 (in its SANs anyway)
        srv_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        srv_ctx.load_cert_chain(str(pki / "apiserver.crt"), str(pki / "apiserver.key"))
        srv_ctx.set_alpn_protocols(["http/1.1"])
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    fault = proxy.left > 0 and proxy.fail(self.command, self.path)
                    if fault:
                        proxy.left -= 1
                conn = http.client.HTTPSConnection("127.0.0.1", proxy.upstream_port, context=proxy.up_ctx, timeout=3600)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP and k.lower() != "host"}
                headers["Host"] = f"127.0.0.1:{proxy.upstream_port}"
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    if fault:
                        resp.read()
                        data = server_timeout_body(self.path.split("?")[0])
                        with proxy.lock:
                            proxy.events.append((self.command, self.path, resp.status, 500))
                        self.send_response(500)
                        self.send_header("Content-Type", "application/json")
                        self.send_header("Retry-After", str(proxy.retry_after_s))
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    if self.command in ("POST", "PUT", "PATCH", "DELETE"):
                        with proxy.lock:
                            proxy.events.append((self.command, self.path, resp.status, resp.status))
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in HOP and k.lower() != "content-length":
                            self.send_header(k, v)
                    if self.command == "HEAD" or resp.status in (204, 304) or resp.status < 200:
                        # no body may follow (RFC 9112 6.3): a chunked "0" terminator here would be read
                        # as the start of the next response on the connection (kubectl's discovery
                        # cache revalidates with If-None-Match and gets 304s)
                        resp.read()
                        self.end_headers()
                        return
                    if resp.getheader("Content-Length") is not None and resp.getheader("Transfer-Encoding") is None:
                        data = resp.read()
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    # a stream (watch, follow): relay chunk by chunk as it arrives
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while True:
                        chunk = resp.read1(65536)
                        if not chunk:
                            break
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (OSError, http.client.HTTPException):
                    self.close_connection = True
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _handle

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True
            address_family = socket.AF_INET

            def get_request(self):  # TLS per connection, handshake in the handler thread
                sock, addr = self.socket.accept()
                return srv_ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

            def finish_request(self, request, client_address):
                try:
                    request.do_handshake()
                except (OSError, ssl.SSLError):
                    return
                super().finish_request(request, client_address)

        self.server = Server((host, port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"https://{host}:{self.port}"

    def writes(self) -> list[tuple[str, str, int, int]]:
        with self.lock:
            return list(self.events)

    def __enter__(self) -> "KubeFaultProxy":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
