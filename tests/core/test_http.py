"""The HTTP scaffolding every service shares (gpuhealth.http).

Aspects: the one listen grammar (HOST:PORT, :PORT, [IPv6]:PORT, port 0-65535) round-trips
with `format_listen` and refuses everything else with ListenError naming the grammar, never
another exception (fuzzed); ServerSettings checks itself; `/healthz`, `/readyz` and a
registry's `/metrics` with gzip negotiated from Accept-Encoding; background work started
with the app and cancelled with it, and a task that dies stops `serve` with the error;
`serve` stops on SIGTERM; a taken port is ListenFailed with the background work stopped; a
site given an `ssl.SSLContext` serves HTTPS only.
"""

from __future__ import annotations

import asyncio
import gzip
import ipaddress
import os
import signal
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import prometheus_client
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.fields import SettingsError
from gpuhealth.http import (
    METRICS_CONTENT_TYPE,
    BackgroundTaskFailed,
    ListenError,
    ListenFailed,
    ServerSettings,
    accepts_gzip,
    add_metrics,
    add_probes,
    background,
    format_listen,
    parse_listen,
    serve,
    start_site,
)
from tests.support.certificates import self_signed

# ----- the listen grammar ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("0.0.0.0:9842", ("0.0.0.0", 9842)),
        (":9842", ("0.0.0.0", 9842)),  # all interfaces, as the exporter has always read it
        ("localhost:65535", ("localhost", 65535)),
        ("gpu-node-1.example_net:80", ("gpu-node-1.example_net", 80)),
        ("[::1]:6443", ("::1", 6443)),
        ("[::]:0", ("::", 0)),
        ("[fe80::1%eth0]:80", ("fe80::1%eth0", 80)),
    ],
)
def test_listen_addresses_in_the_grammar(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("6443", "no port"),
        ("", "no port"),
        ("127.0.0.1:", "the port '' is not a number"),
        ("host:http", "the port 'http' is not a number"),
        ("host:-1", "the port '-1' is not a number"),
        ("host:+80", "the port '+80' is not a number"),
        ("host:١٢", "is not a number"),  # digits, but not ASCII ones
        ("host:65536", "port 65536 is out of range"),
        ("host:1234567", "out of range"),
        ("::1:80", "an IPv6 address goes in brackets"),
        ("[::1:80", "brackets go around an IPv6 address"),
        ("[127.0.0.1]:80", "'127.0.0.1' is not an IPv6 address"),
        ("[]:80", "'' is not an IPv6 address"),
        ("999.1.1.1:80", "'999.1.1.1' is not a host name or IPv4 address"),
        ("my host:80", "is not a host name"),
        ("host:80 ", "is not a number"),
    ],
)
def test_other_text_is_refused_with_the_reason_and_the_grammar(text: str, reason: str) -> None:
    with pytest.raises(ListenError) as error:
        parse_listen(text)
    message = str(error.value)
    assert message.startswith(f"{text!r}: ") and reason in message
    assert "expected HOST:PORT, :PORT (all interfaces) or [IPv6]:PORT with a port 0-65535" in message


ports = st.integers(min_value=0, max_value=65535)
hostnames = st.from_regex(r"[A-Za-z][A-Za-z0-9._-]{0,30}", fullmatch=True)
ipv4 = st.ip_addresses(v=4).map(str)
ipv6 = st.ip_addresses(v=6).map(str)


@given(host=st.one_of(hostnames, ipv4, ipv6), port=ports)
def test_format_and_parse_round_trip(host: str, port: int) -> None:
    assert parse_listen(format_listen(host, port)) == (host, port)


@given(st.text())
def test_any_text_is_an_address_or_a_listen_error(text: str) -> None:
    try:
        host, port = parse_listen(text)
    except ListenError as exc:
        assert "expected HOST:PORT" in str(exc)
        return
    assert 0 <= port <= 65535 and host
    if ":" in host:
        ipaddress.IPv6Address(host)


@given(host=st.one_of(hostnames, ipv4), port=st.integers(min_value=65536, max_value=10**9))
def test_ports_beyond_65535_are_refused(host: str, port: int) -> None:
    with pytest.raises(ListenError, match="out of range"):
        parse_listen(f"{host}:{port}")


# ----- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"port": -1}, "port"),
        ({"port": 65536}, "port"),
        ({"port": 80.0}, "port"),
        ({"gzip_level": 0}, "gzip_level"),
        ({"gzip_level": 10}, "gzip_level"),
        ({"host": ""}, "host"),
    ],
)
def test_server_settings_refuse_what_cannot_be_served(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(SettingsError, match=f"ServerSettings.{field}"):
        ServerSettings(**kwargs)  # type: ignore[arg-type]


def test_server_settings_write_their_address_in_the_grammar() -> None:
    assert ServerSettings(host="::1", port=80).listen == "[::1]:80"
    assert ServerSettings(port=9842).listen == "0.0.0.0:9842"


# ----- probes and metrics ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("gzip", True),
        ("GZIP", True),
        ("x-gzip", True),
        ("br, gzip ; q=0.1", True),
        ("*;q=0.5", True),
        ("gzip;q=0, *", False),  # an explicit refusal wins over the wildcard
        ("gzip;q=0.0", False),
        ("gzip;q=zero", False),  # a malformed weight is no acceptance
        ("", False),
        ("br", False),
    ],
)
def test_accepts_gzip(header: str, expected: bool) -> None:
    assert accepts_gzip(header) is expected


@pytest.fixture
async def probed() -> AsyncIterator[tuple[TestClient[web.Request, web.Application], list[bool]]]:
    ready = [False]
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Counter("gpuhealth_test_things", "Things.", registry=registry).inc(2)
    app = web.Application()
    add_probes(app, ready=lambda: ready[0], not_ready="the thing has not started")
    add_metrics(app, registry, ServerSettings(gzip_level=6))
    async with TestClient(TestServer(app)) as client:
        yield client, ready


@pytest.mark.integration
async def test_readyz_follows_the_callback_and_healthz_always_answers(
    probed: tuple[TestClient[web.Request, web.Application], list[bool]],
) -> None:
    client, ready = probed
    before = await client.get("/readyz")
    assert (before.status, await before.text()) == (503, "not ready: the thing has not started\n")
    assert (await client.get("/healthz")).status == 200
    ready[0] = True
    after = await client.get("/readyz")
    assert (after.status, await after.text()) == (200, "ready\n")


@pytest.mark.integration
async def test_metrics_serves_the_registry_gzipped_when_accepted(
    probed: tuple[TestClient[web.Request, web.Application], list[bool]],
) -> None:
    client, _ = probed
    plain = await client.get("/metrics", headers={"Accept-Encoding": "identity"}, auto_decompress=False)
    assert plain.headers["Content-Type"] == METRICS_CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert "Content-Encoding" not in plain.headers and plain.headers["Vary"] == "Accept-Encoding"
    text = await plain.read()
    assert b"gpuhealth_test_things_total 2.0" in text
    zipped = await client.get("/metrics", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
    assert zipped.headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(await zipped.read()) == text


# ----- background work and serving ---------------------------------------------------------


class Worker:
    """Background work that records its start and its cancellation."""

    def __init__(self, fail: BaseException | None = None, *, end: bool = False) -> None:
        self.started = asyncio.Event()
        self.cancelled = False
        self.fail = fail
        self.end = end

    async def run(self) -> None:
        self.started.set()
        if self.fail is not None:
            raise self.fail
        if self.end:
            return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def local() -> ServerSettings:
    return ServerSettings(host="127.0.0.1", port=0)


@pytest.mark.integration
async def test_background_work_runs_with_the_app_and_is_cancelled_with_it() -> None:
    worker = Worker()
    app = web.Application()
    app.cleanup_ctx.append(background("worker", worker.run))
    runner = await start_site(app, local())
    try:
        await asyncio.wait_for(worker.started.wait(), timeout=10)
    finally:
        await runner.cleanup()
    assert worker.cancelled


@pytest.mark.integration
@pytest.mark.parametrize(
    ("worker", "message"),
    [
        (Worker(RuntimeError("lost the API")), "background task worker failed: RuntimeError('lost the API')"),
        (Worker(end=True), "background task worker ended"),
    ],
)
async def test_background_work_that_dies_stops_serve_with_the_error(
    worker: Worker, message: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = web.Application()
    app.cleanup_ctx.append(background("worker", worker.run))
    with pytest.raises(BackgroundTaskFailed) as error:
        await asyncio.wait_for(serve(app, local()), timeout=10)
    assert str(error.value) == message
    assert error.value.__cause__ is worker.fail
    assert any(r.levelname == "ERROR" and "background task worker" in r.getMessage() for r in caplog.records)


@pytest.mark.integration
async def test_serve_stops_cleanly_on_sigterm() -> None:
    assert threading.current_thread() is threading.main_thread()  # where the handler is installed
    worker = Worker()
    app = web.Application()
    add_probes(app, ready=lambda: True, not_ready="-")
    app.cleanup_ctx.append(background("worker", worker.run))
    bound: list[tuple[str, int]] = []

    def started(address: tuple[str, int]) -> None:
        bound.append(address)
        os.kill(os.getpid(), signal.SIGTERM)

    await asyncio.wait_for(serve(app, local(), on_started=started), timeout=10)
    assert bound[0][0] == "127.0.0.1" and bound[0][1] > 0
    assert worker.started.is_set() and worker.cancelled


@pytest.mark.integration
async def test_a_taken_port_is_listen_failed_and_starts_nothing_that_keeps_running() -> None:
    worker = Worker()
    app = web.Application()
    app.cleanup_ctx.append(background("worker", worker.run))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenFailed, match=f"cannot listen on 127.0.0.1:{port}: Address already in use"):
            await serve(app, ServerSettings(host="127.0.0.1", port=port))
    # The worker was started with the app (it may not have run a step yet) and is gone with it.
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "gpuhealth-worker"]


@pytest.mark.integration
async def test_a_site_with_an_ssl_context_serves_https(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path, "server")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    app = web.Application()
    add_probes(app, ready=lambda: True, not_ready="-")
    runner = await start_site(app, local(), ssl_context=context)
    try:
        port = runner.addresses[0][1]
        client = ssl.create_default_context(cafile=str(cert))
        async with aiohttp.ClientSession() as session:
            async with session.get(f"https://127.0.0.1:{port}/healthz", ssl=client) as response:
                assert response.status == 200 and await response.text() == "ok\n"
            with pytest.raises(aiohttp.ClientError):  # plain HTTP is not served beside it
                async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                    await response.read()
    finally:
        await runner.cleanup()
