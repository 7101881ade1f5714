"""An idle device-plugin GPU's evidence in cluster mode: its node's capacity and allocatable counts.

Aspects covered: the counts read from a Node (GPU and MIG resources only; a missing allocatable
counts 0; a count that is not a whole number refused with the field named, and counted as a
malformed node); an idle device-plugin GPU a pod left Unhealthy turns Healthy when every
registered device of its node is allocatable again (source `node`, a message with the counts, a
new status version observed then), at once or at the hand-back when the counts came back while
the pod still held it; counts seen before the failure was reported do not heal it, nor does an
update that changes no count; a count below capacity names no device and changes none; a held
device, a DRA device and (node mode) a device NVML reads are never touched; a deleted node's
counts speak no more; on a MIG `mixed` node every MIG resource must be whole. Properties: the
decision never heals while some count is short, a held device or a DRA device; the store, fed
any counts with one short, turns no device Healthy.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter import parse
from exporter.nodealloc import (
    NodeCounts,
    NodeCountsError,
    ResourceCount,
    gpu_counts,
    speaks_healthy,
    unvouched,
)
from exporter.podresources import GPU_RESOURCE
from exporter.snapshot import SOURCE_NODE, SOURCE_NVML, SOURCE_POD, DeviceState
from exporter.state import NODES, DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading
from tests.exporter.fixtures.builders import container, gpu_uuid, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
MIG_SMALL, MIG_LARGE = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def node(name: str = "node-1", **counts: tuple[int | str, int | str]) -> dict[str, Any]:
    """A Node whose status counts `resource=(capacity, allocatable)` (`_` for `/` and `.` in names)."""
    capacity: dict[str, Any] = {"cpu": "192", "memory": "2113460Mi", "pods": "110"}
    allocatable: dict[str, Any] = {"cpu": "191500m", "memory": "2100000Mi", "pods": "110"}
    for key, (cap, alloc) in counts.items():
        capacity[key], allocatable[key] = cap, alloc
    return {"metadata": {"name": name}, "status": {"capacity": capacity, "allocatable": allocatable}}


def gpus(cap: int, alloc: int, name: str = "node-1") -> dict[str, Any]:
    return node(name, **{GPU_RESOURCE: (str(cap), str(alloc))})


def failed_under_pod(store: DeviceStateStore, uuid: str = U1, res: str = GPU_RESOURCE) -> dict[str, Any]:
    """A pod whose GPU the kubelet reports Unhealthy (the device plugin saw a fatal XID)."""
    held = pod("p", container("main", (res, [resource(uuid, "Unhealthy", "")])))
    store.apply_pod("ADDED", held)
    return held


def status(store: DeviceStateStore, uuid: str = U1) -> DeviceState:
    return store.snapshot().devices[("node-1", uuid)]


# ----- reading the counts -------------------------------------------------------------


def test_the_counts_are_the_gpu_and_mig_resources_only() -> None:
    counts = gpu_counts(
        node(**{GPU_RESOURCE: ("8", "7"), MIG_SMALL: ("7", "7"), "example.com/fpga": ("2", "1")})
    )
    assert counts == NodeCounts(
        (ResourceCount(GPU_RESOURCE, 8, 7), ResourceCount(MIG_SMALL, 7, 7)),
    )
    assert not counts.all_allocatable
    assert gpu_counts(node()) == NodeCounts() and not NodeCounts().all_allocatable
    assert gpu_counts({"metadata": {"name": "n"}}) == NodeCounts()


def test_a_capacity_without_allocatable_counts_none_allocatable() -> None:
    obj = node(**{GPU_RESOURCE: ("4", "4")})
    del obj["status"]["allocatable"][GPU_RESOURCE]
    assert gpu_counts(obj) == NodeCounts((ResourceCount(GPU_RESOURCE, 4, 0),))


def test_zero_devices_are_not_all_allocatable() -> None:
    # A plugin gone (its resource at 0 after the kubelet restarted) vouches for nothing.
    assert not gpu_counts(gpus(0, 0)).all_allocatable


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        ({GPU_RESOURCE: ("8k", "8")}, r"status.capacity\[nvidia.com/gpu\]: '8k'"),
        ({GPU_RESOURCE: ("8", "-1")}, r"status.allocatable\[nvidia.com/gpu\]: '-1'"),
        ({GPU_RESOURCE: ("8", "7.5")}, "not a whole"),
        ({GPU_RESOURCE: ("8", None)}, "is not a device count"),
        ({MIG_SMALL: (True, "1")}, "is not a device count"),
    ],
)
def test_a_count_that_is_no_whole_number_is_refused_with_its_field(
    counts: dict[str, tuple[Any, Any]], reason: str
) -> None:
    with pytest.raises(NodeCountsError, match=reason):
        gpu_counts(node(**counts))


def test_a_status_that_is_no_object_is_refused() -> None:
    with pytest.raises(NodeCountsError, match="status is not an object"):
        gpu_counts({"metadata": {"name": "n"}, "status": []})
    with pytest.raises(NodeCountsError, match=r"capacity or status\.allocatable"):
        gpu_counts({"metadata": {"name": "n"}, "status": {"capacity": ["x"]}})


def test_a_malformed_node_is_counted_and_its_last_counts_stand(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_event(NODES, "ADDED", gpus(4, 3))
    store.apply_event(NODES, "MODIFIED", {"metadata": {}})
    store.apply_event(NODES, "MODIFIED", node(**{GPU_RESOURCE: ("4", "four")}))
    assert store.stats.parse_errors[parse.MALFORMED_NODE] == 2
    failed_under_pod(store)
    clock.advance(10)
    store.apply_pod("DELETED", pod("p"))
    assert status(store).health == "Unhealthy"  # 4/3 still stands


# ----- what the counts say of an idle device-plugin GPU -------------------------------


def test_a_recovered_idle_gpu_turns_healthy_when_every_device_is_allocatable_again(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    clock.advance(5)
    held = failed_under_pod(store)
    clock.advance(10)
    store.apply_event(NODES, "MODIFIED", gpus(4, 3))  # the kubelet's node status catches up
    clock.advance(5)
    store.apply_pod("DELETED", held)  # the responder moved the work away
    before = status(store)
    assert (before.health, before.source) == ("Unhealthy", SOURCE_POD)
    clock.advance(60)
    store.apply_event(NODES, "MODIFIED", gpus(4, 4))  # the device plugin restarted: all 4 healthy
    after = status(store)
    assert (after.health, after.source) == ("Healthy", SOURCE_NODE)
    assert after.message == "node allocatable: all 4 nvidia.com/gpu allocatable"
    assert after.status_version == before.status_version + 1
    assert after.changed_at == after.observed_at == clock.now()


def test_counts_that_came_back_while_the_pod_held_it_speak_at_the_hand_back(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    held = failed_under_pod(store)
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 3))
    clock.advance(10)
    store.apply_event(NODES, "MODIFIED", gpus(4, 4))
    assert status(store).health == "Unhealthy"  # the pod's report is the authority while it runs
    clock.advance(10)
    store.apply_pod("DELETED", held)
    assert (status(store).health, status(store).source) == ("Healthy", SOURCE_NODE)


def test_counts_seen_before_the_failure_was_reported_do_not_heal_it(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    clock.advance(1)
    held = failed_under_pod(store)  # the pod's status is written before the node's
    clock.advance(1)
    store.apply_pod("DELETED", held)
    assert status(store).health == "Unhealthy"
    # A node update that changes no GPU count (a condition's heartbeat) is no new word.
    refreshed = gpus(4, 4)
    refreshed["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    clock.advance(30)
    store.apply_event(NODES, "MODIFIED", refreshed)
    assert (status(store).health, status(store).source) == ("Unhealthy", SOURCE_POD)


def test_a_short_count_names_no_device(store: DeviceStateStore, clock: ManualClock) -> None:
    store.apply_pod("DELETED", failed_under_pod(store))
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 3))
    clock.advance(10)
    store.apply_event(NODES, "MODIFIED", gpus(5, 4))
    assert status(store).health == "Unhealthy"


def test_a_deleted_node_speaks_no_more(store: DeviceStateStore, clock: ManualClock) -> None:
    held = failed_under_pod(store)
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    store.apply_event(NODES, "DELETED", gpus(4, 4))
    store.apply_pod("DELETED", held)
    assert status(store).health == "Unhealthy"


def test_a_relist_that_no_longer_names_a_node_forgets_its_counts(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    held = failed_under_pod(store)
    clock.advance(10)
    store.relist(NODES, [gpus(4, 4)])
    store.relist(NODES, [gpus(4, 4, name="node-2")])
    store.apply_pod("DELETED", held)
    assert status(store).health == "Unhealthy"


def test_a_dra_device_keeps_its_slice_evidence(store: DeviceStateStore, clock: ManualClock) -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    store.apply_slice("ADDED", slice_("node-1-gpu", "node-1", {"gpu-0": U0}, taints={"gpu-0": [taint]}))
    assert status(store, U0).health == "Unhealthy"
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    assert status(store, U0).health == "Unhealthy"


def test_node_mode_leaves_a_gpu_nvml_reads_to_nvml(clock: ManualClock) -> None:
    store = DeviceStateStore(clock, node_name="node-1", nvml=True)
    store.apply_nvml([DeviceReading(uuid=U1, index=1, reachable=False, error="GPU is lost")], [])
    held = failed_under_pod(store)
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    clock.advance(10)
    store.apply_pod("DELETED", held)
    assert (status(store).health, status(store).source) == ("Unhealthy", SOURCE_NVML)


def test_a_mig_mixed_node_needs_every_mig_resource_whole(store: DeviceStateStore, clock: ManualClock) -> None:
    mig = "MIG-5c0e1b2a-0000-0000-0000-000000000001"
    store.apply_pod("DELETED", failed_under_pod(store, mig, MIG_SMALL))
    clock.advance(10)
    store.apply_event(NODES, "ADDED", node(**{MIG_SMALL: ("4", "4"), MIG_LARGE: ("1", "0")}))
    assert status(store, mig).health == "Unhealthy"
    clock.advance(10)
    store.apply_event(NODES, "MODIFIED", node(**{MIG_SMALL: ("4", "4"), MIG_LARGE: ("1", "1")}))
    healed = status(store, mig)
    assert (healed.health, healed.source) == ("Healthy", SOURCE_NODE)
    assert healed.message == (
        "node allocatable: all 4 nvidia.com/mig-1g.10gb allocatable, all 1 nvidia.com/mig-3g.40gb allocatable"
    )


def test_a_healed_idle_gpu_whose_count_falls_short_again_reads_unknown(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("DELETED", failed_under_pod(store))
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    assert status(store).health == "Healthy"
    clock.advance(60)
    # It may be the card that failed again, idle (nothing else reads Unhealthy): no evidence left.
    store.apply_event(NODES, "MODIFIED", gpus(4, 3))
    relapsed = status(store)
    assert (relapsed.health, relapsed.source) == ("Unknown", SOURCE_NODE)
    assert relapsed.message == (
        "node allocatable: 3 of 4 nvidia.com/gpu allocatable; which device is short is not said"
    )
    assert relapsed.unknown_since == clock.now()
    clock.advance(60)
    store.apply_event(NODES, "MODIFIED", gpus(4, 4))
    assert (status(store).health, status(store).source) == ("Healthy", SOURCE_NODE)


def test_a_shortfall_a_reported_failure_explains_leaves_a_healed_gpu_healthy(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_pod("DELETED", failed_under_pod(store))
    clock.advance(10)
    store.apply_event(NODES, "ADDED", gpus(4, 4))
    clock.advance(60)
    other = pod("q", container("main", (GPU_RESOURCE, [resource(U0, "Unhealthy", "")])))
    store.apply_pod("ADDED", other)  # another GPU fails under its pod
    store.apply_event(NODES, "MODIFIED", gpus(4, 3))
    assert (status(store).health, status(store).source) == ("Healthy", SOURCE_NODE)
    assert status(store, U0).health == "Unhealthy"


# ----- properties ----------------------------------------------------------------------

resource_names = st.sampled_from([GPU_RESOURCE, MIG_SMALL, MIG_LARGE])
counts_st = st.lists(
    st.tuples(resource_names, st.integers(0, 16), st.integers(0, 16)),
    min_size=0,
    max_size=3,
    unique_by=lambda c: c[0],
).map(lambda cs: NodeCounts(tuple(ResourceCount(r, c, a) for r, c, a in sorted(cs))))
devices_st = st.builds(
    DeviceState,
    node=st.just("node-1"),
    device=st.just(U1),
    health=st.sampled_from(["Healthy", "Unhealthy", "Unknown"]),
    message=st.just(""),
    status_version=st.just(1),
    first_seen=st.just(0.0),
    changed_at=st.floats(0, 100),
    observed_at=st.just(0.0),
    driver=st.sampled_from(["", "gpu.nvidia.com"]),
    resource=resource_names,
    source=st.sampled_from([SOURCE_POD, SOURCE_NODE]),
)


@given(counts_st, st.floats(0, 100), devices_st, st.booleans())
def test_the_decision_heals_only_an_idle_device_plugin_gpu_of_a_whole_node(
    counts: NodeCounts, since: float, device: DeviceState, held: bool
) -> None:
    if speaks_healthy(counts, since, device, held=held):
        assert counts.counts and all(c.allocatable == c.capacity > 0 for c in counts.counts)
        assert not held and not device.driver and device.health != "Healthy"
        assert since > device.changed_at and device.resource in counts.resources()


@given(counts_st, st.lists(st.tuples(devices_st, st.booleans()), max_size=4))
def test_only_an_idle_device_plugin_gpu_the_counts_vouched_for_loses_its_healthy(
    counts: NodeCounts, devices: list[tuple[DeviceState, bool]]
) -> None:
    for device in unvouched(counts, devices):
        assert not any(held for d, held in devices if d is device)
        assert (device.health, device.source, device.driver) == ("Healthy", SOURCE_NODE, "")
        assert device.resource in counts.short()
    if counts.all_allocatable or not counts.counts:
        assert unvouched(counts, devices) == []


@given(
    st.lists(st.tuples(st.integers(1, 8), st.integers(0, 8)), min_size=1, max_size=6),
    st.sampled_from(["Unhealthy", "Unknown"]),
)
def test_the_store_heals_nothing_while_some_count_is_short(steps: list[tuple[int, int]], health: str) -> None:
    clock = ManualClock(start=1_800_000_000.0)
    store = DeviceStateStore(clock)
    held = pod("p", container("main", (GPU_RESOURCE, [resource(U1, health, "")])))
    store.apply_pod("ADDED", held)
    store.apply_pod("DELETED", held)
    for cap, alloc in steps:
        clock.advance(5)
        short = min(alloc, cap - 1)  # always one device not allocatable
        store.apply_event(NODES, "MODIFIED", gpus(cap, short))
        assert status(store).health == health
