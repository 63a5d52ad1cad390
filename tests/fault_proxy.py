"""An HTTP proxy on 127.0.0.1 that breaks S3 requests on purpose: errors, resets and truncated bodies.

It sits in front of a real S3 endpoint (the tests' moto server) and, for each request, draws from a seeded
RNG whether to inject a fault and which one:

* `ERROR_500` / `ERROR_503`: an S3 error response (`InternalError` / `SlowDown`); nothing is forwarded.
* `RESET_BEFORE`: the connection is reset before the request is forwarded (the store never sees it).
* `RESET_AFTER`: the request is forwarded and applied, then the connection is reset: the response is lost.
* `TRUNCATE`: the response announces its full length but only half the body arrives before a reset
  (a response without a body to cut short is lost instead, as with `RESET_AFTER`).

Each request draws once: a fault with probability `rate`, then which one, uniformly. `inject_next` forces
faults on the next matching requests, for tests of one exact failure. The counters (`requests`,
`injected`) let a test check that faults really happened; `log` lists every request (method, path, Range),
so a test can tell which bytes a reader asked for, whatever client sent the request.
"""

from __future__ import annotations

import contextlib
import http.client
import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


class Fault(StrEnum):
    ERROR_500 = "500"
    ERROR_503 = "503"
    RESET_BEFORE = "reset-before"
    RESET_AFTER = "reset-after"
    TRUNCATE = "truncate"


ALL_FAULTS = tuple(Fault)
_ERRORS = {
    Fault.ERROR_500: (500, "InternalError", "We encountered an internal error. Please try again."),
    Fault.ERROR_503: (503, "SlowDown", "Please reduce your request rate."),
}
# Not forwarded hop by hop: the proxy re-frames bodies itself.
_HOP_HEADERS = frozenset({"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection"})


@dataclass
class _Forced:
    fault: Fault
    method: str | None
    path_contains: str | None
    remaining: int


class FaultProxy:
    """A threaded proxy to `upstream` (`http://host:port`) injecting faults at `rate` (0..1).

    `serialise=True` forwards one request at a time (for an upstream moto server that is not serialised).
    """

    def __init__(
        self,
        upstream: str,
        *,
        rate: float = 0.0,
        seed: int = 0,
        faults: tuple[Fault, ...] = ALL_FAULTS,
        serialise: bool = False,
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream = (parts.hostname, parts.port)
        self.rate = rate
        self.faults = faults
        self.requests = 0
        # Every request as it arrived: (method, path, Range header or None), faults included.
        self.log: list[tuple[str, str, str | None]] = []
        self.injected: Counter[Fault] = Counter()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._forced: list[_Forced] = []
        # moto checks `If-None-Match` and stores without a lock; forwarding one request at a time restores
        # the atomic conditional writes S3 has (tests/conftest.py serialises its server the same way).
        self.forward_lock: threading.Lock | contextlib.nullcontext[None] = (
            threading.Lock() if serialise else contextlib.nullcontext()
        )
        self._server = _QuietServer(("127.0.0.1", 0), _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def through(self, settings: dict[str, str]) -> dict[str, str]:
        """boto3 client `settings` of the upstream, with the endpoint replaced by this proxy's."""
        return {**settings, "endpoint_url": self.endpoint_url}

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._rng = random.Random(seed)

    @contextmanager
    def faulty(self, rate: float) -> Iterator[FaultProxy]:
        """Inject faults at `rate` inside the block only (set-up and checks run fault-free)."""
        self.rate = rate
        try:
            yield self
        finally:
            self.rate = 0.0

    def inject_next(
        self, fault: Fault, *, method: str | None = None, path_contains: str | None = None, times: int = 1
    ) -> None:
        """Inject `fault` into the next `times` requests with that method and a path containing the text."""
        with self._lock:
            self._forced.append(_Forced(fault, method, path_contains, times))

    def clear(self) -> None:
        """Forget the faults `inject_next` forced that did not happen yet."""
        with self._lock:
            self._forced.clear()

    def choose(self, method: str, path: str, byte_range: str | None = None) -> Fault | None:
        """The fault for this request (forced ones first, in order), or `None` to relay it faithfully."""
        with self._lock:
            self.requests += 1
            self.log.append((method, path, byte_range))
            for forced in self._forced:
                if (
                    forced.remaining > 0
                    and forced.method in (None, method)
                    and (forced.path_contains is None or forced.path_contains in path)
                ):
                    forced.remaining -= 1
                    self.injected[forced.fault] += 1
                    return forced.fault
            if not self.faults or self._rng.random() >= self.rate:
                return None
            fault = self._rng.choice(self.faults)
            self.injected[fault] += 1
            return fault


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        del request, client_address  # a client that hung up mid-request (often our own reset): expected


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            del format, args

        def do_GET(self) -> None:
            self._relay()

        do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

        def _relay(self) -> None:
            body = self._read_body()
            fault = proxy.choose(self.command, self.path, self.headers.get("Range"))
            if fault in _ERRORS:
                status, code, message = _ERRORS[fault]
                payload = (
                    f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>{message}</Message></Error>"
                ).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if fault is Fault.RESET_BEFORE:
                self._reset()
                return
            status, reason, headers, payload = self._forward(body)
            after = fault
            if after is Fault.TRUNCATE and (self.command == "HEAD" or len(payload) < 2):
                after = Fault.RESET_AFTER  # nothing to cut short: the response is lost instead
            if after is Fault.RESET_AFTER:
                self._reset()
                return
            self.send_response(status, reason)
            for name, value in headers:
                if name.lower() not in _HOP_HEADERS and name.lower() != "content-length":
                    self.send_header(name, value)
            length = {k.lower(): v for k, v in headers}.get("content-length", "0")
            self.send_header("Content-Length", length if self.command == "HEAD" else str(len(payload)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if after is Fault.TRUNCATE:
                self.wfile.write(payload[: len(payload) // 2])
                self.wfile.flush()
                self._reset()
                return
            self.wfile.write(payload)

        def _read_body(self) -> bytes:
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            headers["Content-Length"] = str(len(body))
            connection = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                with proxy.forward_lock:
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    payload = response.read()
                return response.status, response.reason, response.getheaders(), payload
            finally:
                connection.close()

        def _reset(self) -> None:
            # SO_LINGER 0: close() sends a TCP reset instead of an orderly FIN.
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass

    return Handler
