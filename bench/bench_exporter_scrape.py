"""CPU cost of one node-mode scrape: 8 GPUs with full NVML readings, plus self metrics.

What a DaemonSet exporter does per Prometheus scrape: render the device and NVML families
of its snapshot (`render_metrics`) and append the `gpuhealth_exporter_*` self metrics of its
registry (`generate_latest`). Measured with `time.process_time` over many scrapes, in three
cases: the same snapshot every time (the usual case: states change rarely), a new
`DeviceState` object per device every scrape (worst case for the line cache), and the full
aiohttp handler (request in, gzip-compressed response object out). The baseline holds the
same series in prometheus_client labelled Gauges and calls `generate_latest`.

Target (issue 3): under 5 ms of CPU per scrape.

Run: `python -m bench exporter_scrape`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

import prometheus_client
from aiohttp.test_utils import make_mocked_request

from bench.gauges import DeviceGauges
from exporter.exposition import MetricsRenderer
from exporter.self_metrics import ExporterMetrics
from exporter.server import SOURCES, create_app
from exporter.snapshot import Allocation, DeviceState, NodeState, NvmlView, Snapshot
from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading

NODE = "gpu-node-00042"
NOW = 1_800_000_000.0
GPUS = 8
TARGET_MS = 5.0


def node_snapshot() -> Snapshot:
    devices = {}
    readings = {}
    for g in range(GPUS):
        uuid = f"GPU-{g:08x}-1f2e-4d3c-8b7a-0000000000{g:02x}"
        devices[(NODE, uuid)] = DeviceState(
            node=NODE,
            device=uuid,
            health="Healthy",
            message="",
            status_version=2,
            first_seen=NOW - 86_400,
            changed_at=NOW - 3_600,
            observed_at=NOW - 20,
            uuid=uuid,
            resource="nvidia.com/gpu",
            allocations=(Allocation("tenant-a", f"train-{g // 4}", "trainer", "nvidia.com/gpu"),),
        )
        readings[uuid] = DeviceReading(
            uuid=uuid,
            index=g,
            reachable=True,
            name="NVIDIA H100 80GB HBM3",
            ecc_corrected_volatile=g,
            ecc_uncorrected_volatile=0,
            remapped_rows_correctable=1,
            remapped_rows_uncorrectable=0,
            remapped_rows_pending=False,
            remapped_rows_failure=False,
            temperature_celsius=55.0 + g,
            power_watts=480.5 + g,
        )
    uuids = list(readings)
    nvml = NvmlView(
        readings=readings,
        read_at=dict.fromkeys(uuids, NOW - 1),
        xid_counts={(uuids[0], 79): 1, (uuids[3], 48): 2},
    )
    return Snapshot(devices=devices, nodes={NODE: NodeState(NODE, NOW - 4)}, nvml=nvml, node_name=NODE)


def self_metrics_registry() -> prometheus_client.CollectorRegistry:
    """The exporter's own self metrics (`ExporterMetrics`), with values in every family."""
    registry = prometheus_client.CollectorRegistry()
    metrics = ExporterMetrics(registry)
    for resource in ("pods", "resourceclaims", "resourceslices", "leases"):
        for kind in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            metrics.watch_events.labels(resource, kind).inc(17)
    metrics.watch_restarts.labels("pods", "expired").inc()
    metrics.last_event.set(NOW)
    for k in range(100):
        metrics.directory_write.observe(0.0001 * k)
    store = DeviceStateStore(ManualClock(NOW))
    for reason in ("bad_health", "unknown_claim", "malformed_status", "missing_device"):
        store.stats.parse_errors[reason] += 2
    metrics.track(store)
    return registry


def gauges_baseline(snapshot: Snapshot) -> prometheus_client.CollectorRegistry:
    """The same device and NVML series held in labelled Gauges (and a Counter for XIDs)."""
    registry = self_metrics_registry()
    gauges = DeviceGauges(registry)
    dev = ["node", "device"]
    g = prometheus_client.Gauge
    up = g("gpu_nvml_up", "u", dev, registry=registry)
    xid = prometheus_client.Counter("gpu_nvml_xid_errors", "x", [*dev, "xid"], registry=registry)
    ecc = prometheus_client.Counter("gpu_nvml_ecc_errors", "e", [*dev, "type"], registry=registry)
    rows = g("gpu_nvml_remapped_rows", "r", [*dev, "type"], registry=registry)
    temp = g("gpu_nvml_temperature_celsius", "t", dev, registry=registry)
    power = g("gpu_nvml_power_watts", "p", dev, registry=registry)
    for d in snapshot.devices.values():
        gauges.add(d, 20)
    gauges.lease.labels(NODE).set(4)
    assert snapshot.nvml is not None
    for uuid, r in snapshot.nvml.readings.items():
        up.labels(NODE, uuid).set(1)
        ecc.labels(NODE, uuid, "corrected").inc(r.ecc_corrected_volatile or 0)
        ecc.labels(NODE, uuid, "uncorrected").inc(r.ecc_uncorrected_volatile or 0)
        rows.labels(NODE, uuid, "correctable").set(r.remapped_rows_correctable or 0)
        rows.labels(NODE, uuid, "uncorrectable").set(r.remapped_rows_uncorrectable or 0)
        rows.labels(NODE, uuid, "pending").set(int(bool(r.remapped_rows_pending)))
        rows.labels(NODE, uuid, "failure").set(int(bool(r.remapped_rows_failure)))
        temp.labels(NODE, uuid).set(r.temperature_celsius or 0)
        power.labels(NODE, uuid).set(r.power_watts or 0)
    for (uuid, code), count in snapshot.nvml.xid_counts.items():
        xid.labels(NODE, uuid, str(code)).inc(count)
    return registry


def cpu_ms_per_call(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm up (caches, first allocation)
    started = time.process_time()
    for _ in range(runs):
        fn()
    return (time.process_time() - started) / runs * 1000


def main(argv: list[str] | None = None) -> None:
    runs = 3000
    snapshot = node_snapshot()
    registry = self_metrics_registry()
    renderer = MetricsRenderer()

    def steady() -> bytes:
        return renderer.render(snapshot, NOW) + prometheus_client.generate_latest(registry)

    def churned() -> bytes:
        # New state objects every scrape: the cache must rebuild every device's lines.
        devices = {
            k: dataclasses.replace(d, observed_at=d.observed_at + 1) for k, d in snapshot.devices.items()
        }
        fresh = dataclasses.replace(snapshot, devices=devices)
        return renderer.render(fresh, NOW) + prometheus_client.generate_latest(registry)

    app = create_app(
        None, snapshot=lambda: snapshot, clock=ManualClock(NOW), registry=registry, ready=lambda: True
    )
    # The /metrics GET handler, called on a mocked request: the server side of a scrape, no socket.
    metrics_handler = next(
        route.handler
        for route in app.router.routes()
        if route.method == "GET" and route.resource is not None and route.resource.canonical == "/metrics"
    )
    assert app[SOURCES].settings.offload_min_devices > GPUS  # node mode renders inline
    loop = asyncio.new_event_loop()

    def handler_gzip() -> object:
        request = make_mocked_request("GET", "/metrics", headers={"Accept-Encoding": "gzip"}, app=app)
        return loop.run_until_complete(metrics_handler(request))

    baseline_registry = gauges_baseline(snapshot)

    def baseline() -> bytes:
        return prometheus_client.generate_latest(baseline_registry)

    body = steady()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(f"node mode: {GPUS} GPUs with full NVML readings, {series} series, {len(body)} bytes per scrape")
    base_ms = cpu_ms_per_call(baseline, runs)
    rows = [
        ("generate_latest over labelled Gauges (baseline)", base_ms),
        ("render + self metrics, same snapshot", cpu_ms_per_call(steady, runs)),
        ("render + self metrics, every device state new", cpu_ms_per_call(churned, runs)),
        ("aiohttp /metrics handler, gzip level 1", cpu_ms_per_call(handler_gzip, runs)),
    ]
    loop.close()
    print(
        f"{'CPU per scrape (time.process_time, ' + str(runs) + ' runs)':52} {'ms':>7} {'vs base':>8}  target"
    )
    for name, ms in rows:
        verdict = (
            "" if name.endswith("(baseline)") else f"< {TARGET_MS} ms {'met' if ms < TARGET_MS else 'MISSED'}"
        )
        print(f"{name:52} {ms:7.3f} {ms / base_ms:7.3f}x  {verdict}")


if __name__ == "__main__":
    main()
