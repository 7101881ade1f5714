"""`RemoteNvmlSource` against a small aiohttp server speaking the simulator's NVML document.

Aspects covered: readings round-trip from the document (the simulator sends
`dataclasses.asdict(DeviceReading)`); the `since` cursor (events before start not replayed,
each event delivered once, drain polls when nobody read); an absent simulator or node ->
start() False, logged once; failures after start -> `[]` (never GPUs marked lost), logged
on failing and on recovery; timeouts; malformed devices, events and documents; argument
validation; every DeviceReading field is read.

The source is synchronous, so tests call it through `asyncio.to_thread` while the test
server runs on the test's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuhealth.nvml import DeviceReading, MigDevice, XidEvent
from gpuhealth.testing.loopback import free_port
from simulator.nvml_remote import READ_FIELDS, RemoteNvmlSource, event_from_json, reading_from_json

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"


def readings() -> list[DeviceReading]:
    return [
        DeviceReading(
            uuid="GPU-0000",
            index=0,
            reachable=True,
            name="NVIDIA H100 80GB HBM3",
            ecc_corrected_volatile=4,
            ecc_uncorrected_volatile=0,
            remapped_rows_correctable=1,
            remapped_rows_uncorrectable=0,
            remapped_rows_pending=False,
            remapped_rows_failure=False,
            temperature_celsius=61.2,
            power_watts=498.7,
            mig_devices=(
                MigDevice(uuid="MIG-0000", gpu_instance_id=1, compute_instance_id=0, profile="1g.10gb"),
            ),
        ),
        DeviceReading(uuid="GPU-0001", index=1, reachable=False, error="NVML_ERROR_GPU_IS_LOST"),
    ]


class FakeSimulator:
    """The simulator's NVML route with scriptable failures."""

    def __init__(self) -> None:
        self.devices: list[dict[str, Any]] = [dataclasses.asdict(r) for r in readings()]
        self.events: list[dict[str, Any]] = []
        self.seq = 0
        self.sinces: list[int] = []
        self.status = 200
        self.body: bytes | None = None
        self.delay = 0.0

    def xid(self, uuid: str, xid: int, timestamp: float) -> None:
        self.seq += 1
        self.events.append({"uuid": uuid, "xid": xid, "timestamp": timestamp, "seq": self.seq})

    async def handle(self, request: web.Request) -> web.Response:
        if self.delay:
            await asyncio.sleep(self.delay)
        node = request.match_info["node"]
        if node != NODE:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        if self.status != 200:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        if self.body is not None:
            return web.Response(body=self.body, content_type="application/json")
        since = int(request.query.get("since", "0"))
        self.sinces.append(since)
        return web.json_response(
            {
                "node": node,
                "devices": self.devices,
                "xid_events": [e for e in self.events if e["seq"] > since],
                "next_seq": max(since, self.seq),
            }
        )


@pytest.fixture
async def sim() -> AsyncIterator[tuple[FakeSimulator, str]]:
    fake = FakeSimulator()
    app = web.Application()
    app.router.add_get("/simulator/v1/nodes/{node}/nvml", fake.handle)
    async with TestServer(app) as server:
        yield fake, str(server.make_url("/"))


async def test_readings_round_trip_and_events_are_delivered_once(sim: tuple[FakeSimulator, str]) -> None:
    fake, url = sim
    fake.xid("GPU-0000", 13, 1_800_000_000.0)  # before start: not replayed
    src = RemoteNvmlSource(url, NODE)
    assert await asyncio.to_thread(src.start) is True
    fake.xid("GPU-0001", 79, 1_800_000_005.0)
    assert await asyncio.to_thread(src.read) == readings()
    assert await asyncio.to_thread(src.drain_xid_events) == [XidEvent("GPU-0001", 79, 1_800_000_005.0)]
    assert await asyncio.to_thread(src.read) == readings()
    assert await asyncio.to_thread(src.drain_xid_events) == []
    assert fake.sinces == [0, 1, 2]  # the cursor follows next_seq
    src.close()
    assert await asyncio.to_thread(src.read) == []


async def test_drain_polls_when_nobody_read_since_the_last_drain(sim: tuple[FakeSimulator, str]) -> None:
    fake, url = sim
    src = RemoteNvmlSource(url, NODE)
    assert await asyncio.to_thread(src.start)
    fake.xid("GPU-0000", 48, 1.0)
    assert await asyncio.to_thread(src.drain_xid_events) == [XidEvent("GPU-0000", 48, 1.0)]
    fake.xid("GPU-0000", 94, 2.0)
    assert await asyncio.to_thread(src.drain_xid_events) == [XidEvent("GPU-0000", 94, 2.0)]
    assert fake.sinces == [0, 0, 1]


async def test_no_simulator_means_start_false_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    src = RemoteNvmlSource(f"http://127.0.0.1:{free_port()}", NODE, timeout=1.0)
    with caplog.at_level(logging.WARNING, logger="simulator.nvml_remote"):
        assert await asyncio.to_thread(src.start) is False
        assert await asyncio.to_thread(src.start) is False
    assert len(caplog.records) == 1
    assert caplog.records[0].getMessage().startswith("NVML not available: GET http://127.0.0.1:")
    assert caplog.records[0].getMessage().endswith("; NVML readings disabled")
    assert await asyncio.to_thread(src.read) == []
    assert await asyncio.to_thread(src.drain_xid_events) == []


async def test_unknown_node_means_start_false(
    sim: tuple[FakeSimulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    _, url = sim
    src = RemoteNvmlSource(url, "no-such-node")
    with caplog.at_level(logging.WARNING, logger="simulator.nvml_remote"):
        assert await asyncio.to_thread(src.start) is False
    assert "HTTP 404" in caplog.text


async def test_failures_after_start_give_no_readings_not_lost_gpus(
    sim: tuple[FakeSimulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = sim
    src = RemoteNvmlSource(url, NODE)
    assert await asyncio.to_thread(src.start)
    fake.status = 503
    fake.xid("GPU-0000", 79, 3.0)
    with caplog.at_level(logging.INFO, logger="simulator.nvml_remote"):
        assert await asyncio.to_thread(src.read) == []
        assert await asyncio.to_thread(src.read) == []
        fake.status = 200
        assert await asyncio.to_thread(src.read) == readings()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unreadable" in m and "HTTP 503" in m for m in messages) == 1  # once, not per poll
    assert sum("answers again" in m for m in messages) == 1
    assert await asyncio.to_thread(src.drain_xid_events) == [XidEvent("GPU-0000", 79, 3.0)]  # nothing lost


async def test_a_slow_simulator_times_out(sim: tuple[FakeSimulator, str]) -> None:
    fake, url = sim
    src = RemoteNvmlSource(url, NODE, timeout=0.2)
    assert await asyncio.to_thread(src.start)
    fake.delay = 1.0
    assert await asyncio.to_thread(src.read) == []


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"node": "gpu-node-1", "devices": {}, "xid_events": [], "next_seq": 0}', b"{}"],
    ids=["not-json", "list", "devices-not-list", "empty"],
)
async def test_a_malformed_document_gives_no_readings(sim: tuple[FakeSimulator, str], body: bytes) -> None:
    fake, url = sim
    src = RemoteNvmlSource(url, NODE)
    assert await asyncio.to_thread(src.start)
    fake.body = body
    assert await asyncio.to_thread(src.read) == []


@pytest.mark.parametrize(
    "broken",
    [
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"node"',
        b"not an HTTP answer\r\n\r\n",
    ],
    ids=["body-cut-short", "not-http"],
)
async def test_a_broken_http_answer_gives_no_readings(broken: bytes) -> None:
    document = orjson.dumps({"node": NODE, "devices": [], "xid_events": [], "next_seq": 0})
    good = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (
        len(document),
        document,
    )
    answers = [good, broken]  # start() gets a good answer, every later request the broken one
    handlers: list[asyncio.Task[Any]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.append(asyncio.current_task())  # type: ignore[arg-type]
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answers.pop(0) if len(answers) > 1 else answers[0])
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        port = server.sockets[0].getsockname()[1]
        src = RemoteNvmlSource(f"http://127.0.0.1:{port}", NODE)
        assert await asyncio.to_thread(src.start)
        assert await asyncio.to_thread(src.read) == []
        assert await asyncio.to_thread(src.drain_xid_events) == []
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.gather(*handlers, return_exceptions=True)


async def test_a_malformed_device_or_event_is_skipped_alone(
    sim: tuple[FakeSimulator, str], caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = sim
    src = RemoteNvmlSource(url, NODE)
    assert await asyncio.to_thread(src.start)
    fake.devices.append({"uuid": "GPU-0002", "index": 2, "reachable": True, "temperature_celsius": "hot"})
    fake.events.append({"uuid": "GPU-0000", "xid": "79", "timestamp": 1.0, "seq": 1})
    fake.seq = 1
    fake.xid("GPU-0000", 48, 2.0)
    with caplog.at_level(logging.WARNING, logger="simulator.nvml_remote"):
        assert await asyncio.to_thread(src.read) == readings()
        assert await asyncio.to_thread(src.drain_xid_events) == [XidEvent("GPU-0000", 48, 2.0)]
    assert "temperature_celsius must be a number" in caplog.text
    assert "xid must be an integer" in caplog.text


def test_every_device_reading_field_is_read() -> None:
    assert {f.name for f in dataclasses.fields(DeviceReading)} == READ_FIELDS
    for reading in readings():
        assert reading_from_json(dataclasses.asdict(reading)) == reading


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "not an object"),
        ({"uuid": "", "index": 0, "reachable": True}, "uuid"),
        ({"uuid": "G", "index": True, "reachable": True}, "index"),
        ({"uuid": "G", "index": 0, "reachable": 1}, "reachable"),
        ({"uuid": "G", "index": 0, "reachable": True, "remapped_rows_pending": 1}, "remapped_rows_pending"),
        ({"uuid": "G", "index": 0, "reachable": True, "power_watts": True}, "power_watts"),
        ({"uuid": "G", "index": 0, "reachable": False, "error": 5}, "error"),
        ({"uuid": "G", "index": 0, "reachable": True, "mig_devices": {}}, "mig_devices must be a list"),
        (
            {"uuid": "G", "index": 0, "reachable": True, "mig_devices": [{"uuid": ""}]},
            r"mig_devices\[0\].uuid",
        ),
        (
            {
                "uuid": "G",
                "index": 0,
                "reachable": True,
                "mig_devices": [{"uuid": "M", "gpu_instance_id": "1"}],
            },
            "instance ids must be integers",
        ),
        (
            {
                "uuid": "G",
                "index": 0,
                "reachable": True,
                "mig_devices": [{"uuid": "M", "gpu_instance_id": 1, "compute_instance_id": 0, "profile": 7}],
            },
            "profile must be a string",
        ),
    ],
)
def test_reading_from_json_names_what_is_wrong(obj: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reading_from_json(obj)


def test_event_from_json() -> None:
    assert event_from_json({"uuid": "G", "xid": 79, "timestamp": 5, "seq": 3}) == XidEvent("G", 79, 5.0)
    with pytest.raises(ValueError, match="timestamp"):
        event_from_json({"uuid": "G", "xid": 79, "timestamp": None})


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("localhost:1", NODE), {}, "base_url"),
        (("http://localhost:1", ""), {}, "node"),
        (("http://localhost:1", NODE), {"timeout": 0}, "timeout"),
    ],
)
def test_bad_arguments_are_rejected(args: tuple[str, str], kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RemoteNvmlSource(*args, **kwargs)
