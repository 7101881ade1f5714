"""The exporter's HTTP endpoints (`exporter.server`).

Aspects covered: `/metrics` content type, body = device metrics then the registry's self
metrics, rendered at the injected clock's time from the latest snapshot (swapped between
scrapes); gzip only when Accept-Encoding allows it (the negotiation itself is tested with
`gpuhealth.http` in tests/core/test_http.py); the worker
thread path for large snapshots gives the same body, streamed in pieces (one gzip stream
over them); a render failure is a 500, not a partial body, and one midway a dropped
connection; `/readyz` 503 until ready, then 200; `/healthz`; settings validation;
`start_server` on a real socket.
"""

from __future__ import annotations

import dataclasses
import gzip
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import prometheus_client
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter import exposition
from exporter import server as server_module
from exporter.exposition import render_metrics
from exporter.self_metrics import ExporterMetrics
from exporter.server import create_app, start_server
from exporter.settings import ExporterServerSettings
from exporter.snapshot import DeviceState, NodeState, Snapshot
from gpuhealth.clock import ManualClock

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def device(health: str = "Healthy") -> DeviceState:
    return DeviceState(
        node="node-a",
        device=UUID,
        health=health,
        message="",
        status_version=1,
        first_seen=1_800_000_000.0,
        changed_at=1_800_000_000.0,
        observed_at=1_800_000_000.0,
        uuid=UUID,
        resource="nvidia.com/gpu",
    )


class Harness:
    """The providers an app is built from, changeable between requests."""

    def __init__(self) -> None:
        self.clock = ManualClock(start=1_800_000_030.0)
        self.snapshot = Snapshot(
            devices={("node-a", UUID): device()}, nodes={"node-a": NodeState("node-a", 1_800_000_000.0)}
        )
        self.is_ready = False
        self.registry = prometheus_client.CollectorRegistry()
        ExporterMetrics(self.registry).watch_events.labels("pods", "ADDED").inc(3)

    def app(self, settings: ExporterServerSettings | None = None) -> web.Application:
        return create_app(
            settings,
            snapshot=lambda: self.snapshot,
            clock=self.clock,
            registry=self.registry,
            ready=lambda: self.is_ready,
        )


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    async with TestClient(TestServer(harness.app())) as c:
        yield c


def values(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.mark.integration
async def test_metrics_is_device_metrics_then_self_metrics_in_text_format(
    client: TestClient[web.Request, web.Application], harness: Harness
) -> None:
    response = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert response.status == 200
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in response.headers
    body = await response.read()
    expected = render_metrics(harness.snapshot, harness.clock.now()) + prometheus_client.generate_latest(
        harness.registry
    )
    assert body == expected
    parsed = values(body.decode())
    assert (
        parsed[("gpu_device_status_age_seconds", frozenset({("node", "node-a"), ("device", UUID)}))] == 30.0
    )
    assert (
        parsed[
            ("gpuhealth_exporter_watch_events_total", frozenset({("resource", "pods"), ("type", "ADDED")}))
        ]
        == 3.0
    )


@pytest.mark.integration
async def test_each_scrape_renders_the_latest_snapshot_at_the_clock_time(
    client: TestClient[web.Request, web.Application], harness: Harness
) -> None:
    age_key = ("gpu_device_status_age_seconds", frozenset({("node", "node-a"), ("device", UUID)}))
    unhealthy_key = (
        "gpu_device_health",
        frozenset({("node", "node-a"), ("device", UUID), ("status", "Unhealthy")}),
    )
    first = values(await (await client.get("/metrics")).text())
    harness.clock.advance(15)
    harness.snapshot = Snapshot(devices={("node-a", UUID): device("Unhealthy")}, nodes=harness.snapshot.nodes)
    second = values(await (await client.get("/metrics")).text())
    assert (first[age_key], first[unhealthy_key]) == (30.0, 0.0)
    assert (second[age_key], second[unhealthy_key]) == (45.0, 1.0)


@pytest.mark.integration
@pytest.mark.parametrize("accept", ["gzip", "deflate, gzip;q=0.5", "*", "x-gzip"])
async def test_metrics_is_gzipped_when_the_scraper_accepts_it(
    client: TestClient[web.Request, web.Application], harness: Harness, accept: str
) -> None:
    response = await client.get("/metrics", headers={"Accept-Encoding": accept}, auto_decompress=False)
    assert response.status == 200
    assert response.headers["Content-Encoding"] == "gzip"
    assert response.headers["Vary"] == "Accept-Encoding"
    assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    plain = gzip.decompress(await response.read())
    assert plain == render_metrics(harness.snapshot, harness.clock.now()) + prometheus_client.generate_latest(
        harness.registry
    )


@pytest.mark.integration
@pytest.mark.parametrize("accept", ["", "identity", "gzip;q=0", "deflate", "*;q=0", "gzip;q=zero"])
async def test_metrics_is_plain_otherwise(
    client: TestClient[web.Request, web.Application], accept: str
) -> None:
    response = await client.get("/metrics", headers={"Accept-Encoding": accept}, auto_decompress=False)
    assert response.status == 200
    assert "Content-Encoding" not in response.headers
    assert (await response.read()).startswith(b"# HELP gpu_device_health ")


@pytest.mark.integration
async def test_large_snapshots_render_in_a_worker_thread_with_the_same_body(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []

    def recording(snapshot: Snapshot, now: float) -> Iterator[bytes]:
        threads.append(threading.current_thread())
        yield render_metrics(snapshot, now)

    monkeypatch.setattr(server_module, "metrics_pieces", recording)
    devices = {}
    for n in range(3):
        for g in range(4):
            d = device()
            uuid = f"GPU-{n}-{g}"
            devices[(f"node-{n}", uuid)] = DeviceState(
                node=f"node-{n}",
                device=uuid,
                health=d.health,
                message="",
                status_version=1,
                first_seen=d.first_seen,
                changed_at=d.changed_at,
                observed_at=d.observed_at,
            )
    harness.snapshot = Snapshot(devices=devices)
    inline_app = harness.app(ExporterServerSettings(offload_min_devices=100))
    thread_app = harness.app(ExporterServerSettings(offload_min_devices=1))
    async with TestClient(TestServer(inline_app)) as inline, TestClient(TestServer(thread_app)) as threaded:
        a = await (await inline.get("/metrics")).read()
        b = await (await threaded.get("/metrics", headers={"Accept-Encoding": "gzip"})).read()
    assert a == b
    assert threads[0] is threading.main_thread() and threads[1] is not threading.main_thread()
    assert a.count(b"gpu_device_status_version{") == 12


def many_devices(nodes: int, gpus: int) -> dict[tuple[str, str], DeviceState]:
    return {
        (f"node-{n}", f"GPU-{n}-{g}"): dataclasses.replace(device(), node=f"node-{n}", device=f"GPU-{n}-{g}")
        for n in range(nodes)
        for g in range(gpus)
    }


@pytest.mark.integration
@pytest.mark.parametrize("accept", ["gzip", "identity"])
async def test_large_snapshots_are_streamed_in_pieces_that_make_the_whole_body(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, accept: str
) -> None:
    monkeypatch.setattr(exposition, "PIECE_LINES", 5)
    monkeypatch.setattr(server_module, "PIECE_BYTES", 512)
    harness.snapshot = Snapshot(devices=many_devices(10, 8), nodes=harness.snapshot.nodes)
    whole = render_metrics(harness.snapshot, harness.clock.now()) + prometheus_client.generate_latest(
        harness.registry
    )
    app = harness.app(ExporterServerSettings(offload_min_devices=1))
    async with TestClient(TestServer(app)) as streamed:
        response = await streamed.get("/metrics", headers={"Accept-Encoding": accept}, auto_decompress=False)
        assert response.status == 200
        assert "Content-Length" not in response.headers
        assert response.headers["Transfer-Encoding"] == "chunked"
        received = [chunk async for chunk in response.content.iter_any()]
    body = b"".join(received)
    assert (gzip.decompress(body) if accept == "gzip" else body) == whole
    assert len(whole) > 20 * 512  # so the body went in many pieces, each compressed as it came
    assert response.headers.get("Content-Encoding") == ("gzip" if accept == "gzip" else None)


@pytest.mark.integration
async def test_a_render_failing_midway_drops_the_connection(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "PIECE_BYTES", 1)

    def failing(snapshot: Snapshot, now: float) -> Iterator[bytes]:
        yield b"# HELP gpu_device_health first piece\n"
        raise RuntimeError("bug")

    monkeypatch.setattr(server_module, "metrics_pieces", failing)
    app = harness.app(ExporterServerSettings(offload_min_devices=1))
    async with TestClient(TestServer(app)) as streamed:
        response = await streamed.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert response.status == 200  # the headers went with the first piece
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


@pytest.mark.integration
async def test_a_failing_render_is_a_500_not_a_partial_body(
    client: TestClient[web.Request, web.Application], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> bytes:
        raise RuntimeError("bug")

    monkeypatch.setattr(server_module, "metrics_pieces", broken)
    response = await client.get("/metrics")
    assert response.status == 500
    assert "gpu_device" not in await response.text()


@pytest.mark.integration
async def test_readyz_is_503_until_the_initial_list_is_done(
    client: TestClient[web.Request, web.Application], harness: Harness
) -> None:
    before = await client.get("/readyz")
    assert before.status == 503
    assert "initial list" in await before.text()
    harness.is_ready = True
    after = await client.get("/readyz")
    assert after.status == 200


@pytest.mark.integration
async def test_healthz_answers_while_not_ready(client: TestClient[web.Request, web.Application]) -> None:
    response = await client.get("/healthz")
    assert response.status == 200
    assert await response.text() == "ok\n"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": -1},
        {"port": 70000},
        {"gzip_level": 0},
        {"gzip_level": 10},
        {"offload_min_devices": -5},
        {"offload_min_devices": 1.5},
    ],
)
def test_bad_settings_are_rejected_with_a_clear_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ExporterServerSettings(**kwargs)


def test_settings_defaults() -> None:
    settings = ExporterServerSettings()
    assert (settings.host, settings.port, settings.gzip_level) == ("0.0.0.0", 9842, 1)


@pytest.mark.integration
async def test_start_server_serves_on_a_real_socket(harness: Harness) -> None:
    settings = ExporterServerSettings(host="127.0.0.1", port=0)
    runner = await start_server(harness.app(settings))
    try:
        host, port = runner.addresses[0][:2]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{host}:{port}/metrics") as response,
        ):
            assert response.status == 200
            assert response.headers["Content-Encoding"] == "gzip"  # aiohttp asks for it by default
            text = await response.text()
    finally:
        await runner.cleanup()
    assert "gpuhealth_exporter_watch_events_total" in text


@pytest.mark.integration
async def test_devices_api_is_the_latest_snapshot_as_json_at_the_clock_time(
    client: TestClient[web.Request, web.Application], harness: Harness
) -> None:
    first = await client.get("/api/v1/devices")
    assert first.status == 200
    assert first.headers["Content-Type"].startswith("application/json")
    doc = await first.json()
    assert doc["kind"] == "DeviceList" and doc["time"] == "2027-01-15T08:00:30Z"
    assert [(d["device"], d["health"], d["statusAgeSeconds"]) for d in doc["devices"]] == [
        (UUID, "Healthy", 30.0)
    ]
    harness.clock.advance(15)
    harness.snapshot = Snapshot(devices={("node-a", UUID): device("Unhealthy")}, nodes=harness.snapshot.nodes)
    doc = await (await client.get("/api/v1/devices")).json()
    assert [(d["health"], d["statusAgeSeconds"]) for d in doc["devices"]] == [("Unhealthy", 45.0)]
    refused = await client.post("/api/v1/devices", data=b"{}")
    assert refused.status == 405  # read-only
