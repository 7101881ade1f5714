"""An idle device-plugin GPU's evidence in node mode: the kubelet's allocatable devices with NVML.

Aspects covered: the pod-resources answer decoded from the protobuf wire format (round trip
against the simulated kubelet's encoder, fuzzed; unknown fields skipped; malformed bytes refused
with a reason; gRPC framing); a GPU NVML reaches that the kubelet does not list reads Unhealthy
with a message naming the kubelet, listed (itself or a time-slicing replica) Healthy; an idle
device that relapses turns Unhealthy and its recovery Healthy again, each a new status version;
a pod holding the GPU stays the authority; a failed read changes no evidence and is counted; a
slice still outranks for a DRA device; cluster mode ignores the view.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.podresources import (
    GPU_RESOURCE,
    Allocatable,
    PodResourcesError,
    decode_allocatable,
    unframe,
)
from exporter.snapshot import SOURCE_NVML, SOURCE_POD, SOURCE_SLICE
from exporter.state import POD_RESOURCES_UNLISTED, DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading
from simulator.pod_resources import encode_allocatable
from tests.exporter.fixtures.builders import container, gpu_uuid, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
READINGS = [DeviceReading(uuid=U0, index=0, reachable=True), DeviceReading(uuid=U1, index=1, reachable=True)]


def _store(clock: ManualClock) -> DeviceStateStore:
    return DeviceStateStore(clock, node_name="node-1", nvml=True)


def _health(store: DeviceStateStore) -> dict[str, tuple[str, str, str]]:
    return {k[1]: (d.health, d.source, d.message) for k, d in store.snapshot().devices.items()}


ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)


@given(st.dictionaries(st.text(min_size=1, max_size=30), st.lists(ids, max_size=8), max_size=4))
def test_the_answer_round_trips_through_the_wire_format(devices: dict[str, list[str]]) -> None:
    decoded = decode_allocatable(encode_allocatable(devices))
    assert decoded == Allocatable({name: frozenset(i) for name, i in devices.items()})


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_are_refused_with_a_reason(data: bytes) -> None:
    try:
        decode_allocatable(data)
    except PodResourcesError as exc:
        assert str(exc)


def test_fields_of_other_parts_of_the_schema_are_skipped() -> None:
    # cpu_ids (field 2, packed varints), a memory entry (3), and a topology (3) inside devices.
    devices = b"\x0a\x0envidia.com/gpu" + b"\x12\x03GPU" + b"\x1a\x04\x0a\x02\x08\x01"
    data = b"\x0a" + bytes([len(devices)]) + devices + b"\x12\x02\x01\x02" + b"\x1a\x00" + b"\x28\x07"
    assert decode_allocatable(data) == Allocatable({GPU_RESOURCE: frozenset({"GPU"})})


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x0a\x05ab", "5 bytes announced"),
        (b"\x0a\x02\x12\x00", "without resource_name"),
        (b"\x08\x01", r"devices \(field 1\) is not a message"),  # field 1 as a varint
        (b"\x0b", "groups"),
        (b"\x00", "field number 0"),
        (b"\x0a\x03\x0a\x01\xff", "not UTF-8"),
    ],
)
def test_malformed_answers_are_refused_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(PodResourcesError, match=reason):
        decode_allocatable(data)


def test_grpc_frames() -> None:
    assert unframe(b"\x00\x00\x00\x00\x02\x0a\x00") == b"\x0a\x00"
    for bad, why in (
        (b"\x00\x00", "5 bytes"),
        (b"\x01\x00\x00\x00\x00", "compressed"),
        (b"\x00\x00\x00\x00\x05", "announces"),
    ):
        with pytest.raises(PodResourcesError, match=why):
            unframe(bad)


def test_a_replica_lists_its_gpu() -> None:
    allocatable = Allocatable({GPU_RESOURCE: frozenset({f"{U0}::1"})})
    assert allocatable.lists(U0) and not allocatable.lists(U1)
    assert not Allocatable({"other.com/gpu": frozenset({U1})}).lists(U1)


def test_an_idle_gpu_the_kubelet_does_not_offer_reads_unhealthy_and_recovers(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({U0, U1})}))
    store.apply_nvml(READINGS, [])
    assert _health(store)[U1][:2] == ("Healthy", SOURCE_NVML)
    before = store.snapshot().devices[("node-1", U1)].status_version
    clock.advance(5)
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({U0})}))  # the plugin says Unhealthy
    assert _health(store)[U1] == ("Unhealthy", SOURCE_NVML, POD_RESOURCES_UNLISTED)
    assert "kubelet pod-resources" in POD_RESOURCES_UNLISTED
    assert _health(store)[U0][0] == "Healthy"
    store.apply_nvml(READINGS, [])  # the next NVML poll does not clear it
    assert _health(store)[U1][0] == "Unhealthy"
    clock.advance(5)
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({U0, U1})}))
    d = store.snapshot().devices[("node-1", U1)]
    assert (d.health, d.status_version) == ("Healthy", before + 2)


def test_a_failed_read_keeps_the_evidence_and_is_counted(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({U0})}))
    store.apply_nvml(READINGS, [])
    store.apply_pod_resources(None)
    store.apply_nvml(READINGS, [])
    assert _health(store)[U1][0] == "Unhealthy"
    assert store.stats.pod_resources_failures == 1


def test_a_pod_holding_the_gpu_stays_the_authority(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_nvml(READINGS, [])
    held = pod("p", container("main", (GPU_RESOURCE, [resource(U1, "Healthy", "")])))
    store.apply_pod("ADDED", held)
    # A pod's device is not allocatable any more; the kubelet's report on it is the authority.
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({U0})}))
    assert _health(store)[U1][:2] == ("Healthy", SOURCE_POD)
    store.apply_pod("DELETED", held)
    assert _health(store)[U1][:2] == ("Unhealthy", SOURCE_NVML)  # handed back, and not offered


def test_a_slice_still_speaks_for_a_dra_gpu(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_slice("ADDED", slice_("node-1-gpus", "node-1", {"gpu-0": U0}))
    store.apply_pod_resources(Allocatable({}))  # DRA devices are never in the kubelet's list
    store.apply_nvml(READINGS[:1], [])
    assert _health(store)[U0][:2] == ("Healthy", SOURCE_SLICE)


def test_cluster_mode_ignores_the_view(clock: ManualClock) -> None:
    store = DeviceStateStore(clock)
    store.apply_pod_resources(None)
    assert store.stats.pod_resources_failures == 0
