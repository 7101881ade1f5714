"""Electors against the simulated cluster over real HTTP, on the real clock.

Aspects: two electors racing for one Lease (exactly one leads, through renewals, and the
Lease names it); the leader's renewals blocked by an unanswering server (its work cancelled
and finished before the peer starts leading); shutdown releasing the Lease (the peer takes
over in well under a lease duration); an apiserver answering 5xx past the renew deadline
(leadership lost, work stopped, regained when it recovers) and briefly (leadership kept).

Failures are real network behaviour: each elector's transport can be switched to a server
answering 503 with a Status body, or to a socket that accepts and never answers (read
timeouts), both through the same `KubeTransport` as the apiserver.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.elector import LeaderElector, Term
from gpuhealth.kube.lease import ElectionSettings, LeaseRecord
from gpuhealth.kube.resources import LEASE
from gpuhealth.kube.transport import KubeTransport, Params, Response
from simulator.apiserver.kubeconfig import write_kubeconfig
from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration

NS, NAME = "kube-system", "gpuhealth-responder"
FAST = ElectionSettings(lease_duration_seconds=3, renew_deadline_seconds=2.0, retry_period_seconds=0.25)
"""Short enough for a test; the client's read timeout (1 s) stays under the renew deadline."""
PATIENT = ElectionSettings(lease_duration_seconds=30, renew_deadline_seconds=20.0, retry_period_seconds=0.25)
"""A lease far longer than any hand-over or brief outage in these tests."""
WAIT_SECONDS = 30.0


class _Unavailable(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = (
            b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
            b'"message":"the server is currently unable to handle the request","reason":"ServiceUnavailable",'
            b'"code":503}'
        )
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


class Switch:
    """A `Transport` that sends each request to the apiserver, a 503 server or a black hole."""

    def __init__(self, routes: dict[str, KubeTransport]) -> None:
        self.routes = routes
        self.route = "apiserver"
        self.requests: dict[str, int] = dict.fromkeys(routes, 0)

    def request(
        self,
        method: str,
        path: str,
        params: Params = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: tuple[float, float],
    ) -> Response:
        route = self.route
        self.requests[route] += 1
        return self.routes[route].request(
            method, path, params, body=body, content_type=content_type, timeout=timeout
        )


class Network:
    """The simulated cluster, a 503 server and a black hole, and a switchable client per elector."""

    def __init__(self, tmp_path: Path) -> None:
        self.cluster = ServedCluster(tmp_path / "kubeconfig")
        self.unavailable = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
        threading.Thread(target=self.unavailable.serve_forever, daemon=True).start()
        # Listening but never accepting: connections complete in the backlog, reads time out.
        self.black_hole = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.kubeconfigs = {
            "apiserver": str(self.cluster.kubeconfig),
            "503": self._kubeconfig(tmp_path / "kubeconfig-503", self.unavailable.server_address[1]),
            "black-hole": self._kubeconfig(tmp_path / "kubeconfig-hole", self.black_hole.getsockname()[1]),
        }
        self._api_clients: list[Any] = []
        self._clients: list[KubeClient] = []
        self._reader: KubeClient | None = None

    @staticmethod
    def _kubeconfig(path: Path, port: int) -> str:
        write_kubeconfig(path, f"http://127.0.0.1:{port}")
        return str(path)

    def client(self) -> tuple[KubeClient, Switch]:
        routes = {}
        for route, kubeconfig in self.kubeconfigs.items():
            api = api_client(kubeconfig)
            self._api_clients.append(api)
            routes[route] = KubeTransport(api)
        switch = Switch(routes)
        client = KubeClient(switch, connect_timeout_seconds=1.0, read_timeout_seconds=1.0)
        self._clients.append(client)
        return client, switch

    def lease(self) -> LeaseRecord:
        """The Lease as the apiserver has it now."""
        if self._reader is None:
            self._reader, _ = self.client()
        return LeaseRecord.from_lease(self._reader.get(LEASE, NAME, namespace=NS))

    def close(self) -> None:
        for client in self._clients:
            client.close()
        for api in self._api_clients:
            api.close()
        self.unavailable.shutdown()
        self.unavailable.server_close()
        self.black_hole.close()
        self.cluster.stop()


class Replica:
    """One elector and its leader work, which records when it starts and when it has stopped."""

    def __init__(
        self, network: Network, identity: str, events: list[str], settings: ElectionSettings
    ) -> None:
        self.identity = identity
        self.events = events
        self.client, self.switch = network.client()
        self.terms: list[Term] = []
        self.elector = LeaderElector(
            self.client,
            namespace=NS,
            name=NAME,
            identity=identity,
            settings=settings,
            on_leading_changed=lambda leading: events.append(f"{identity} leading={leading}"),
        )
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(self._lead))

    async def _lead(self, term: Term) -> None:
        self.terms.append(term)
        self.events.append(f"{self.identity} started")
        try:
            await asyncio.Event().wait()
        finally:
            # Cleanup that takes a moment, as a reconciler finishing its step would.
            await asyncio.sleep(0.05)
            self.events.append(f"{self.identity} finished")

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task


@pytest.fixture
def network(tmp_path: Path) -> Iterator[Network]:
    net = Network(tmp_path)
    yield net
    net.close()


@pytest.fixture
async def replicas(network: Network) -> AsyncIterator[Callable[..., Replica]]:
    events: list[str] = []
    made: list[Replica] = []

    def make(identity: str, settings: ElectionSettings = FAST) -> Replica:
        replica = Replica(network, identity, events, settings)
        made.append(replica)
        return replica

    yield make
    for replica in made:
        await replica.stop()


async def eventually(check: Callable[[], bool], what: str, seconds: float = WAIT_SECONDS) -> None:
    """Wait for positive evidence, failing with `what` at the deadline."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.02)


async def test_two_electors_racing_one_leads(network: Network, replicas: Callable[..., Replica]) -> None:
    # A patient lease: "never both, and the leader keeps it" must hold even when the machine
    # stalls a process for seconds; renewals still come every retry period.
    a, b = replicas("a", PATIENT), replicas("b", PATIENT)
    a.start()
    b.start()
    await eventually(
        lambda: a.elector.is_leader != b.elector.is_leader and a.elector.holder == b.elector.holder != "",
        "one leads and the other has seen its lease",
    )
    leader, follower = (a, b) if a.elector.is_leader else (b, a)
    first = await asyncio.to_thread(network.lease)
    assert first.holder_identity == leader.identity
    renewals = 0
    while renewals < 3:
        # Through renewals, never both; the follower keeps seeing the leader's renewals.
        assert leader.elector.is_leader and not follower.elector.is_leader
        record = await asyncio.to_thread(network.lease)
        if record.renew_time != first.renew_time:
            renewals += 1
            first = record
        assert record.holder_identity == leader.identity and record.lease_transitions == 0
        await asyncio.sleep(0.1)
    assert len(leader.terms) == 1 and follower.terms == []


async def test_blocked_renewals_fence_the_leader_before_the_peer_leads(
    network: Network, replicas: Callable[..., Replica]
) -> None:
    a = replicas("a")
    a.start()
    await eventually(lambda: a.elector.is_leader, "a leads")
    b = replicas("b")
    b.start()
    await eventually(lambda: b.elector.holder == "a", "b has seen a's lease")
    a.switch.route = "black-hole"
    await eventually(lambda: "b started" in b.events, "b takes over")
    events = a.events
    assert events.index("a finished") < events.index("a leading=False") < events.index("b started")
    assert a.switch.requests["black-hole"] >= 1
    record = await asyncio.to_thread(network.lease)
    assert (record.holder_identity, record.lease_transitions) == ("b", 1)


async def test_shutdown_releases_and_the_peer_takes_over_quickly(
    network: Network, replicas: Callable[..., Replica]
) -> None:
    a, b = replicas("a", PATIENT), replicas("b", PATIENT)
    a.start()
    await eventually(lambda: a.elector.is_leader, "a leads")
    b.start()
    await eventually(lambda: b.elector.holder == "a", "b has seen a's lease")
    stopped = time.monotonic()
    await a.stop()
    released = await asyncio.to_thread(network.lease)
    assert (released.holder_identity, released.lease_duration_seconds) == ("", 1)
    await eventually(lambda: "b started" in b.events, "b takes over")
    # A lease duration is 30 s; after a release the peer needs one jittered retry.
    assert time.monotonic() - stopped < PATIENT.lease_duration_seconds / 2
    assert a.events.index("a finished") < a.events.index("a leading=False") < a.events.index("b started")
    record = await asyncio.to_thread(network.lease)
    assert (record.holder_identity, record.lease_transitions) == ("b", 1)


async def test_5xx_past_the_deadline_stops_the_work_until_the_api_recovers(
    network: Network, replicas: Callable[..., Replica]
) -> None:
    a = replicas("a")
    a.start()
    await eventually(lambda: a.elector.is_leader, "a leads")
    a.switch.route = "503"
    await eventually(lambda: "a leading=False" in a.events, "a stops leading")
    assert a.events.index("a finished") < a.events.index("a leading=False")
    assert a.switch.requests["503"] >= 2, "renewals were retried before giving up"
    a.switch.route = "apiserver"
    await eventually(lambda: a.elector.is_leader and len(a.terms) == 2, "a leads again")


async def test_a_brief_5xx_outage_does_not_cost_leadership(
    network: Network, replicas: Callable[..., Replica]
) -> None:
    a = replicas("a", PATIENT)
    a.start()
    await eventually(lambda: a.elector.is_leader, "a leads")
    before = await asyncio.to_thread(network.lease)
    a.switch.route = "503"
    await eventually(lambda: a.switch.requests["503"] >= 2, "two renewals failed")
    a.switch.route = "apiserver"
    await eventually(lambda: network.lease().renew_time != before.renew_time, "a renewed again")
    assert a.elector.is_leader and len(a.terms) == 1
    assert "a leading=False" not in a.events
