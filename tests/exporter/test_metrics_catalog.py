"""The exporter's `/metrics` against its catalog (`exporter.metrics`).

Aspects covered: a scrape of a small node-mode store (device-plugin and DRA devices,
allocations, a driver taint, the DRA driver's kubelet plugin pod (its health producer), a
Lease, NVML readings and an XID, every self metric moved) exposes exactly the declared
families, each with its declared type, HELP and labels, and every declared family appears, so
the catalog cannot drift from the code either way; no `_created` series is exposed
(client_python's are turned off where the exporter builds its metrics); the exposition's
families are the catalog's device and NVML families.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import prometheus_client
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from exporter import exposition
from exporter.metrics import CATALOG, CLUSTER_FAMILIES, NVML_FAMILIES, SELF_FAMILIES
from exporter.self_metrics import ExporterMetrics
from exporter.server import create_app
from exporter.state import DeviceStateStore, producer_resource
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading, MigDevice, XidEvent
from tests.exporter.fixtures.builders import (
    DRIVER,
    claim,
    container,
    gpu_uuid,
    lease,
    plugin_pod,
    pod,
    resource,
    slice_,
)

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)


def small_store(clock: ManualClock) -> DeviceStateStore:
    """Node mode with one sample or more in every device and NVML family."""
    store = DeviceStateStore(clock, node_name="node-1", nvml=True)
    store.apply_lease("ADDED", lease("node-1"))
    store.apply_pod(
        "ADDED",
        pod("trainer", container("main", ("nvidia.com/gpu", [resource(U0, "Healthy")])), uid="u-trainer"),
    )
    store.apply_slice(
        "ADDED",
        slice_(
            "node-1-gpus",
            "node-1",
            {"gpu-1": U1},
            taints={"gpu-1": [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]},
        ),
    )
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-1")]))
    store.apply_event(producer_resource(DRIVER), "ADDED", plugin_pod(True, clock.now()))  # its kubelet plugin
    store.apply_pod(
        "ADDED",
        pod(
            "p",
            container(
                "main",
                (
                    "claim:gpus/big",
                    [resource("k8s.gpu.nvidia.com/claim=claim-uid-p-gpus-gpu-1", "Unhealthy")],
                ),
            ),
            claim_statuses={"gpus": "p-gpus"},
        ),
    )
    full = DeviceReading(
        uuid=U0,
        index=0,
        reachable=True,
        ecc_corrected_volatile=3,
        ecc_uncorrected_volatile=0,
        remapped_rows_correctable=1,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        temperature_celsius=55.0,
        power_watts=300.0,
        # A MIG-enabled card: its partitions are listed (gpu_nvml_mig_device_info), the card stays the device.
        mig_devices=(
            MigDevice(f"MIG-{U0[4:]}", gpu_instance_id=7, compute_instance_id=0, profile="3g.40gb"),
        ),
    )
    store.apply_nvml([full], [XidEvent(U0, 79, clock.now())])
    store.stats.parse_errors["invalid_json"] += 1
    store.stats.events_ignored["duplicate"] += 1
    return store


@pytest.fixture
async def scrape() -> AsyncIterator[str]:
    """The body of one `/metrics` scrape, as the exporter serves it."""
    # As in a fresh process: whatever an earlier test left, the exporter's metrics decide.
    prometheus_client.enable_created_metrics()
    clock = ManualClock(start=1_800_000_000.0)
    store = small_store(clock)
    registry = prometheus_client.CollectorRegistry()
    metrics = ExporterMetrics(registry)
    metrics.track(store)
    metrics.watch_events.labels("pods", "ADDED").inc(2)
    metrics.watch_restarts.labels("pods", "closed").inc()
    metrics.last_event.set(clock.now())
    metrics.directory_write.observe(0.002)
    app = create_app(None, snapshot=store.snapshot, clock=clock, registry=registry, ready=lambda: True)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
        assert response.status == 200
        yield await response.text()


@pytest.mark.integration
async def test_a_scrape_exposes_exactly_the_declared_families_with_their_labels(scrape: str) -> None:
    seen: set[str] = set()
    for parsed in text_string_to_metric_families(scrape):
        assert parsed.name in CATALOG, f"{parsed.name} is exposed but not declared in exporter.metrics"
        family = CATALOG[parsed.name]
        assert (parsed.type, parsed.documentation) == (family.text_type, family.help)
        for sample in parsed.samples:
            assert CATALOG.family_of(sample.name) is family, sample.name
            assert set(sample.labels) == family.sample_labels(sample.name), sample
        if parsed.samples:
            seen.add(parsed.name)
    assert seen == {family.name for family in CATALOG}, "declared families without a sample"


@pytest.mark.integration
async def test_no_created_series_is_exposed(scrape: str) -> None:
    assert "_created" not in scrape
    samples = [s for parsed in text_string_to_metric_families(scrape) for s in parsed.samples]
    assert "gpuhealth_exporter_watch_events_total" in {s.name for s in samples}  # the counters are there
    assert not [s.name for s in samples if s.name.endswith("_created")]


def test_the_exposition_renders_the_catalogs_device_and_nvml_families() -> None:
    names = {family.exposed_name for family in (*CLUSTER_FAMILIES, *NVML_FAMILIES)}
    body = exposition.MetricsRenderer().render(
        small_store(ManualClock(start=1_800_000_000.0)).snapshot(), 0.0
    )
    typed = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE ")}
    assert typed == names
    assert {f.name for f in SELF_FAMILIES}.isdisjoint(f.name for f in (*CLUSTER_FAMILIES, *NVML_FAMILIES))
