"""The fake NVML of a simulated node, through the `NvmlSource` interface and as JSON.

Aspects: one reading per GPU with UUIDs matching the pods' device IDs; ECC and row-remap
counters follow the faults; a lost GPU is unreachable with GPU_IS_LOST; XID events are
drained once each, from the reader's start; recovery resets volatile counters; power and
temperature are deterministic; the JSON document carries a resumable sequence number.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.clock import ManualClock
from gpuhealth.nvml import NvmlSource
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import gpu_uuid
from simulator.nvml import FakeNvml, nvml_document
from simulator.scenario import DeviceRef, Fault, from_dict

DATA = {
    "fleet": [{"name": "n", "count": 2, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [{"name": "w", "replicas": 1, "gpusPerPod": 2}],
}


async def make() -> Fleet:
    clock = ManualClock()
    fleet = Fleet(from_dict(DATA), Store(clock), clock)
    await fleet.start()
    return fleet


def fault(fleet: Fleet, kind: str, gpu: int, **extra: Any) -> None:
    fleet.inject(Fault(at=fleet.now(), kind=kind, device=DeviceRef("n-0", gpu), **extra))


async def test_readings_follow_the_faults_and_xids_drain_once() -> None:
    fleet = await make()
    nvml: NvmlSource = FakeNvml(fleet, "n-0")
    fault(fleet, "xid", 0, xid=13, unhealthy=False)  # before start: not replayed
    await fleet.advance(1)
    assert nvml.start() is True
    readings = nvml.read()
    assert [r.uuid for r in readings] == [gpu_uuid("n-0", i) for i in range(4)]
    assert all(r.reachable and r.ecc_uncorrected_volatile == 0 for r in readings)
    busy, idle = readings[0], readings[3]  # the pod holds GPUs 0 and 1
    assert busy.power_watts is not None and idle.power_watts is not None
    assert busy.power_watts > idle.power_watts
    assert nvml.read() == readings  # same moment, same noise

    fault(fleet, "ecc", 1, corrected=5, uncorrected=2)
    fault(fleet, "row-remap-failure", 1)
    fault(fleet, "xid", 2, xid=79, unhealthy=True)
    fault(fleet, "gpu-lost", 3)
    await fleet.advance(1)
    r = {x.index: x for x in nvml.read()}
    assert (r[1].ecc_corrected_volatile, r[1].ecc_uncorrected_volatile) == (5, 2)
    assert (r[1].remapped_rows_uncorrectable, r[1].remapped_rows_failure) == (1, True)
    assert (r[3].reachable, r[3].error) == (False, "NVML_ERROR_GPU_IS_LOST")
    events = nvml.drain_xid_events()
    assert [(e.uuid, e.xid) for e in events] == [(gpu_uuid("n-0", 2), 79), (gpu_uuid("n-0", 3), 79)]
    assert nvml.drain_xid_events() == []

    fault(fleet, "recover", 1)
    fault(fleet, "recover", 3)
    await fleet.advance(1)
    r = {x.index: x for x in nvml.read()}
    assert (r[1].ecc_corrected_volatile, r[1].remapped_rows_failure) == (0, False)
    assert r[1].remapped_rows_uncorrectable == 1  # remapped rows are permanent
    assert r[3].reachable
    nvml.close()
    assert nvml.read() == []


async def test_unknown_node_does_not_start() -> None:
    fleet = await make()
    assert FakeNvml(fleet, "nope").start() is False


async def test_json_document_resumes_from_next_seq() -> None:
    fleet = await make()
    fault(fleet, "xid", 0, xid=48, unhealthy=True)
    fleet.inject(Fault(at=fleet.now(), kind="xid", device=DeviceRef("n-1", 0), xid=74, unhealthy=True))
    await fleet.advance(1)
    doc = nvml_document(fleet, "n-0", 0)
    assert doc["node"] == "n-0"
    assert len(doc["devices"]) == 4
    assert set(doc["devices"][0]) >= {"uuid", "index", "reachable", "ecc_corrected_volatile", "power_watts"}
    assert [(e["xid"], e["seq"]) for e in doc["xid_events"]] == [(48, 1)]
    assert doc["next_seq"] == 2  # n-1's event is not n-0's, but it is behind the cursor too
    fault(fleet, "xid", 1, xid=94, unhealthy=True)
    await fleet.advance(1)
    again = nvml_document(fleet, "n-0", doc["next_seq"])
    assert [e["xid"] for e in again["xid_events"]] == [94]
