"""The responders' webhook front: one loopback URL for the replicas, like a Kubernetes Service.

Alertmanager posts to `WebhookFront.url` + path; the front forwards the request (method POST,
path, body, Authorization and Content-Type) to one replica, taking them in turn (round robin),
and trying the next on a connection error (a replica killed or not listening yet). It answers
what the replica answered; when no replica accepts the connection it answers 503, so that
Alertmanager retries (it retries 5xx only). Replies from a replica are passed on unchanged: a
503 from a replica that cannot record is the replica's answer, not a reason to try another.

Two seams:
- `observe(request)`: called for every request the front receives, before forwarding (the
  demo journals each webhook body from the responders' side).
- `hook(request, forward) -> (status, body)`: decides what is forwarded and what the sender
  is answered; the default, `forward_once`, forwards once and answers the replica's reply. A
  fault injector duplicates a delivery by calling `forward` twice, reorders by keeping a
  request and forwarding it after a later one (from within the later call, or its own
  thread), or answers without forwarding (a 503 makes Alertmanager send it again). `forward`
  is thread-safe. The sender waits for the hook's answer, so a hook that holds a request
  should answer for it honestly: 200 only for what a replica accepted.
"""

from __future__ import annotations

import http.client
import itertools
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpuhealth.testing.loopback import LoopbackHttpServer

FORWARDED_HEADERS = ("Authorization", "Content-Type")


@dataclass(frozen=True)
class Request:
    path: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    received_at: float = 0.0
    """Monotonic seconds when the front received it."""


Reply = tuple[int, bytes]
"""(HTTP status, body) as answered to the sender."""

Forward = Callable[[Request], Reply]
Hook = Callable[[Request, Forward], Reply]


def forward_once(request: Request, forward: Forward) -> Reply:
    """The default hook: forward the request once, answer what the replica answered."""
    return forward(request)


NO_REPLICA: Reply = (503, b"no responder replica is accepting connections\n")


class WebhookFront:
    """Forwards webhook requests to responder replicas; use as a context manager."""

    def __init__(
        self,
        backends: Sequence[str] = (),
        *,
        hook: Hook = forward_once,
        observe: Callable[[Request], None] | None = None,
        timeout: float = 10.0,
    ) -> None:
        self._backends = list(backends)
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self.hook = hook
        self.observe = observe
        self.timeout = timeout
        self.forwarded: dict[str, int] = {}
        """Requests each replica answered, by base URL."""
        self.refused = 0
        """Requests answered 503 because no replica accepted the connection."""
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                headers = {h: v for h in FORWARDED_HEADERS if (v := self.headers.get(h)) is not None}
                request = Request(self.path, body, headers, time.monotonic())
                status, reply = front.handle(request)
                self.send_response(status)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = LoopbackHttpServer(Handler, "webhook-front")
        self.url = self._http.url

    def set_backends(self, backends: Sequence[str], *, context: ssl.SSLContext | None = None) -> None:
        """The replicas' base URLs; `context`: TLS for `https://` ones (their certificate checked)."""
        with self._lock:
            self._backends = list(backends)
            self._context = context

    def handle(self, request: Request) -> Reply:
        if self.observe is not None:
            self.observe(request)
        return self.hook(request, self.forward)

    def forward(self, request: Request) -> Reply:
        """Send `request` to the next replica that accepts a connection; 503 when none does."""
        with self._lock:
            backends = list(self._backends)
            start = next(self._turn)
        for i in range(len(backends)):
            base = backends[(start + i) % len(backends)]
            try:
                reply = self._send(base, request)
            except (ConnectionError, TimeoutError, OSError):
                continue  # killed, not listening yet, or gone mid-request: the next one
            with self._lock:
                self.forwarded[base] = self.forwarded.get(base, 0) + 1
            return reply
        with self._lock:
            self.refused += 1
        return NO_REPLICA

    def _send(self, base: str, request: Request) -> Reply:
        parsed = urllib.parse.urlsplit(base)
        connection = (
            http.client.HTTPSConnection(
                parsed.hostname or "127.0.0.1", parsed.port, timeout=self.timeout, context=self._context
            )
            if parsed.scheme == "https"
            else http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port, timeout=self.timeout)
        )
        try:
            connection.request("POST", request.path, body=request.body, headers=request.headers)
            response = connection.getresponse()
            return response.status, response.read()
        finally:
            connection.close()

    def __enter__(self) -> WebhookFront:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__(*exc)
