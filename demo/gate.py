"""The responders' way to Prometheus in a demo run: a loopback gate the run can close.

The responders read device health from Prometheus (`responder.reconcile.health`); Alertmanager
gets its alerts from the same Prometheus. A health-source outage (`demo.healthSourceDown`)
must cut the first path only: the alerts that warrant a quarantine keep flowing, and what the
run shows is the responders enforcing them (and moving the work) while no release step can be
taken. The gate forwards each GET (the responders' instant queries) to Prometheus while open
and answers 503 while closed, as a Service without a ready endpoint behind a proxy does; the
responder's client treats any failed query the same way (`HealthUnavailable`).
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler
from typing import Any

from gpuhealth.testing.loopback import LoopbackHttpServer

CLOSED_BODY = b"health source unavailable (the demo's outage)\n"


class HealthSourceGate:
    """Forwards GET requests to `upstream` (a base URL) while open; 503 while closed."""

    def __init__(self, upstream: str, *, timeout: float = 10.0) -> None:
        self.upstream = upstream
        self.timeout = timeout
        self._open = threading.Event()
        self._open.set()
        self.refused = 0
        """Requests answered 503 while closed."""
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status, content_type, body = gate.answer(self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = LoopbackHttpServer(Handler, "health-source-gate")
        self.url = self._http.url

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def close(self) -> None:
        self._open.clear()

    def open(self) -> None:
        self._open.set()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if not self._open.is_set():
            self.refused += 1
            return 503, "text/plain", CLOSED_BODY
        parsed = urllib.parse.urlsplit(self.upstream)
        connection = http.client.HTTPConnection(
            parsed.hostname or "127.0.0.1", parsed.port, timeout=self.timeout
        )
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.getheader("Content-Type") or "application/json", response.read()
        except OSError as exc:
            return 502, "text/plain", f"Prometheus did not answer: {exc}\n".encode()
        finally:
            connection.close()

    def __enter__(self) -> HealthSourceGate:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__(*exc)
