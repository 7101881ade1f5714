"""A real Prometheus (3.16, the pinned upstream build) scrapes the exporter's `/metrics`.

Aspects covered: Prometheus accepts the body (gzip, content type, HELP/TYPE, escaping) and
stores the contract's series with the exact labels and values: health, status age, escaped
pod labels on the allocation info series, NVML counters in node mode, and the self metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import prometheus_client
import pytest

from exporter.server import create_app, start_server
from exporter.settings import ExporterServerSettings
from exporter.snapshot import Allocation, DeviceState, NodeState, NvmlView, Snapshot
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading
from gpuhealth.testing.loopback import Prometheus, ScrapeJob, run_prometheus, wait_until

# No skip when `prometheus` is missing: `make test` installs it, and CI must not pass with
# this check silently gone.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

UUID = "GPU-11111111-2222-3333-4444-555555555555"
POD = 'infer-"0"\\x'


def snapshot(now: float) -> Snapshot:
    d = DeviceState(
        node="node-a",
        device=UUID,
        health="Unhealthy",
        message="XID 79",
        status_version=4,
        first_seen=now - 100,
        changed_at=now - 50,
        observed_at=now - 12,
        uuid=UUID,
        resource="nvidia.com/gpu",
        allocations=(Allocation("team-a", POD, "server", "nvidia.com/gpu"),),
    )
    reading = DeviceReading(
        uuid=UUID, index=0, reachable=True, ecc_uncorrected_volatile=3, temperature_celsius=70.0
    )
    return Snapshot(
        devices={(d.node, d.device): d},
        nodes={"node-a": NodeState("node-a", None)},
        nvml=NvmlView(readings={UUID: reading}, read_at={UUID: now}, xid_counts={(UUID, 79): 2}),
        node_name="node-a",
    )


@pytest.fixture
async def exporter_port() -> AsyncIterator[int]:
    clock = ManualClock(start=1_800_000_000.0)
    registry = prometheus_client.CollectorRegistry()
    prometheus_client.Gauge("gpuhealth_exporter_devices_tracked", "Devices.", registry=registry).set(1)
    current = snapshot(clock.now())
    app = create_app(None, snapshot=lambda: current, clock=clock, registry=registry, ready=lambda: True)
    runner = await start_server(app, ExporterServerSettings(host="127.0.0.1", port=0))
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


@pytest.fixture
async def prometheus(exporter_port: int, tmp_path: Path) -> AsyncIterator[Prometheus]:
    """A real Prometheus scraping the exporter every second.

    Started, waited on and stopped in a worker thread: this event loop serves the exporter
    meanwhile, and a blocked loop would fail the scrapes being waited for.
    """
    job = ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{exporter_port}"])
    with ExitStack() as stack:
        yield await asyncio.to_thread(stack.enter_context, run_prometheus(tmp_path / "prometheus", [job]))
        await asyncio.to_thread(stack.close)


async def test_prometheus_scrapes_and_stores_the_contract(prometheus: Prometheus) -> None:
    async def query(promql: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(prometheus.query, promql)

    def labels(result: list[dict[str, Any]]) -> list[dict[str, str]]:
        return [{k: v for k, v in r["metric"].items() if k not in ("instance", "job")} for r in result]

    # One successful scrape stores every series of the body at once (`up` with them), so
    # from here on a missing series is missing from the body, not from a scrape to come.
    await asyncio.to_thread(
        wait_until,
        "Prometheus to scrape the exporter",
        lambda: prometheus.value('up{job="gpuhealth-exporter"}') == 1.0,
    )
    health = await query("gpu_device_health == 1")
    assert labels(health) == [
        {"__name__": "gpu_device_health", "node": "node-a", "device": UUID, "status": "Unhealthy"}
    ]
    age = await query("gpu_device_status_age_seconds")
    assert [float(r["value"][1]) for r in age] == [12.0]
    alloc = await query("gpu_device_allocation_info")
    assert [r["metric"]["pod"] for r in alloc] == [POD]
    xid = await query('gpu_nvml_xid_errors_total{xid="79"}')
    assert [(r["metric"]["device"], float(r["value"][1])) for r in xid] == [(UUID, 2.0)]
    ecc = await query("gpu_nvml_ecc_errors_total")
    assert labels(ecc) == [
        {"__name__": "gpu_nvml_ecc_errors_total", "node": "node-a", "device": UUID, "type": "uncorrected"}
    ]
    self_metrics = await query("gpuhealth_exporter_devices_tracked")
    assert [float(r["value"][1]) for r in self_metrics] == [1.0]
    # None readings are absent, not zero (checked last, after the series stored beside it).
    assert await query("gpu_nvml_power_watts") == []
