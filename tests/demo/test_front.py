"""The responders' webhook front (demo.front), with in-process replicas on loopback.

Aspects: a request reaches one replica with its path, body and Authorization, and the
sender gets the replica's answer (a replica's own 503 included: no retry elsewhere); replicas
are taken in turn; a replica that refuses the connection is skipped (failover); with none up
the front answers 503 (so Alertmanager retries) and counts it; the observer sees every request
before it is forwarded; the hook can duplicate a delivery or answer without forwarding.
"""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from demo.front import Forward, Reply, Request, WebhookFront
from gpuhealth.testing.loopback import free_port


class Replica:
    """A stand-in responder replica: records what it got, answers `status`."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.got: list[tuple[str, bytes, str]] = []
        replica = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                replica.got.append((self.path, body, self.headers.get("Authorization", "")))
                answer = f"replica says {replica.status}".encode()
                self.send_response(replica.status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    made = [Replica(), Replica()]
    yield made
    for r in made:
        r.close()


def post(url: str, body: bytes = b'{"alerts": []}') -> tuple[int, bytes]:
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"Authorization": "Bearer t", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_requests_reach_the_replicas_in_turn_with_path_body_and_token(replicas: list[Replica]) -> None:
    a, b = replicas
    with WebhookFront([a.url, b.url]) as front:
        for i in range(4):
            status, answer = post(f"{front.url}/webhook", f'{{"n": {i}}}'.encode())
            assert status == 200 and answer == b"replica says 200"
    assert [g[1] for g in a.got] + [g[1] for g in b.got] != []
    assert len(a.got) == len(b.got) == 2
    assert {g[0] for g in a.got + b.got} == {"/webhook"}
    assert {g[2] for g in a.got + b.got} == {"Bearer t"}
    assert sorted(g[1] for g in a.got + b.got) == [f'{{"n": {i}}}'.encode() for i in range(4)]
    assert front.forwarded == {a.url: 2, b.url: 2}


def test_a_replica_that_is_down_is_skipped_and_its_answers_are_passed_on(replicas: list[Replica]) -> None:
    a, b = replicas
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with WebhookFront([down, a.url]) as front:
        for _ in range(3):
            assert post(f"{front.url}/webhook")[0] == 200
        assert len(a.got) == 3 and front.refused == 0
        # A replica's own 503 (it could not record) is its answer: not retried elsewhere.
        a.status = 503
        front.set_backends([a.url, b.url])
        answers = sorted(post(f"{front.url}/webhook")[0] for _ in range(2))
    assert answers == [200, 503]


def test_no_replica_up_is_503_so_alertmanager_retries() -> None:
    with WebhookFront([f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]) as front:
        status, answer = post(f"{front.url}/webhook")
        assert status == 503 and b"no responder replica" in answer
        assert front.refused == 1
    with WebhookFront() as empty:
        assert post(f"{empty.url}/webhook")[0] == 503


def test_the_observer_sees_each_request_and_the_hook_decides_what_is_forwarded(
    replicas: list[Replica],
) -> None:
    a, _ = replicas
    seen: list[Request] = []

    def twice(request: Request, forward: Forward) -> Reply:
        forward(request)
        return forward(request)  # a duplicate delivery, as an HA pair or a retry makes

    with WebhookFront([a.url], hook=twice, observe=seen.append) as front:
        assert post(f"{front.url}/webhook", b'{"x": 1}')[0] == 200
        assert [r.body for r in seen] == [b'{"x": 1}'] and seen[0].path == "/webhook"
        assert [g[1] for g in a.got] == [b'{"x": 1}', b'{"x": 1}']
        front.hook = lambda request, forward: (202, b"held")
        assert post(f"{front.url}/webhook") == (202, b"held")
    assert len(a.got) == 2 and len(seen) == 2
