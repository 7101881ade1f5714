"""Device-plugin pods before Kubernetes 1.36: which GPU a pod holds, from the kubelet's `List`.

Aspects covered: a pod whose status names no device (no `allocatedResourcesStatus`) is shown on
the GPUs `List` names for it (an allocation with its container and resource, no claim), whichever
came first (the pod, the answer, NVML's first read); it never speaks for the GPU's health (NVML
and the kubelet's allocatable devices still do); a report the pod's status carries is never
overridden (no second allocation, the pod stays the source); a time-slicing replica is held on
its GPU, a MIG partition on its card; a pod that leaves the answer, ends or is deleted lets go;
a failed read keeps what was held and is counted; an unchanged answer costs no work; whatever
answers came before (fuzzed), the holdings are those the last answer gives a fresh exporter; the
holdings merge with a DRA-backed extended resource's; cluster mode ignores the answer;
`gpu_device_allocation_info` carries the pod with `claim=""`, which the responder's hold reads.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.exposition import render_metrics
from exporter.podresources import GPU_RESOURCE, Allocatable, Assigned, Assignments
from exporter.snapshot import SOURCE_NVML, SOURCE_POD, Allocation
from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading, MigDevice
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, pod, resource, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
READINGS = [DeviceReading(uuid=U0, index=0, reachable=True), DeviceReading(uuid=U1, index=1, reachable=True)]
TRAIN = Allocation("team-a", "train-0", "main", GPU_RESOURCE, "")


def _store(clock: ManualClock) -> DeviceStateStore:
    store = DeviceStateStore(clock, node_name="node-1", nvml=True)
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({U0, U1})}))
    return store


def _listing(*held: tuple[str, str, str]) -> Assignments:
    """`List` naming pods of team-a: (pod, container, device ID)."""
    pods: dict[tuple[str, str], tuple[Assigned, ...]] = {}
    for name, container_name, device_id in held:
        key = ("team-a", name)
        pods[key] = (*pods.get(key, ()), Assigned(container_name, GPU_RESOURCE, device_id))
    return Assignments(pods)


def _silent_pod(name: str = "train-0", **kwargs: Any) -> dict[str, Any]:
    """A running pod whose kubelet writes no allocatedResourcesStatus (before 1.36)."""
    return pod(name, container("main"), **kwargs)


def _held(store: DeviceStateStore) -> dict[str, tuple[Allocation, ...]]:
    return {k[1]: d.allocations for k, d in store.snapshot().devices.items() if d.allocations}


def test_a_pod_without_a_report_is_shown_on_the_gpu_list_names(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_nvml(READINGS, [])
    store.apply_pod("ADDED", _silent_pod())
    assert _held(store) == {}
    store.apply_assignments(_listing(("train-0", "main", U1)))
    assert _held(store) == {U1: (TRAIN,)}
    device = store.snapshot().devices[("node-1", U1)]
    # Held, never a health source: NVML (with the kubelet's allocatable devices) still speaks.
    assert (device.health, device.source) == ("Healthy", SOURCE_NVML)
    text = render_metrics(store.snapshot(), clock.now()).decode()
    assert 'namespace="team-a",pod="train-0",container="main",resource="nvidia.com/gpu",claim=""' in text


def test_the_answer_before_the_pod_or_before_nvml_holds_once_both_are_known(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_assignments(_listing(("train-0", "main", U0)))  # no device tracked yet
    store.apply_pod("ADDED", _silent_pod())
    assert _held(store) == {}
    store.apply_nvml(READINGS, [])  # the same poll's NVML read: the device is tracked now
    assert _held(store) == {U0: (TRAIN,)}
    other = _store(clock)
    other.apply_nvml(READINGS, [])
    other.apply_assignments(_listing(("train-0", "main", U0)))
    other.apply_pod("ADDED", _silent_pod())  # the pod after the answer
    assert _held(other) == {U0: (TRAIN,)}


def test_a_report_the_pods_status_carries_is_never_overridden(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_nvml(READINGS, [])
    reporting = pod("train-0", container("main", (GPU_RESOURCE, [resource(U0, "Unhealthy", "XID 79")])))
    store.apply_pod("ADDED", reporting)
    store.apply_assignments(_listing(("train-0", "main", U0), ("train-0", "main", U1)))
    devices = store.snapshot().devices
    u0 = devices[("node-1", U0)]
    assert (u0.allocations, u0.source, u0.health) == ((TRAIN,), SOURCE_POD, "Unhealthy")
    # The device its status does not name is held from the answer, report-less.
    assert devices[("node-1", U1)].allocations == (TRAIN,)
    assert devices[("node-1", U1)].source == SOURCE_NVML


def test_a_replica_is_held_on_its_gpu_and_a_partition_on_its_card(clock: ManualClock) -> None:
    store = _store(clock)
    mig = "MIG-00000001-aaaa-bbbb-cccc-dddddddddddd"
    part = MigDevice(uuid=mig, gpu_instance_id=1, compute_instance_id=0, profile="1g.10gb")
    readings = [READINGS[0], DeviceReading(uuid=U1, index=1, reachable=True, mig_devices=(part,))]
    store.apply_pod_resources(Allocatable({GPU_RESOURCE: frozenset({f"{U0}::0", f"{U0}::3", mig})}))
    store.apply_nvml(readings, [])
    store.apply_pod("ADDED", _silent_pod())
    store.apply_pod("ADDED", _silent_pod("infer-0"))
    store.apply_assignments(
        _listing(("train-0", "main", f"{U0}::0"), ("train-0", "main", f"{U0}::3"), ("infer-0", "main", mig))
    )
    assert _held(store) == {U0: (TRAIN,), U1: (Allocation("team-a", "infer-0", "main", GPU_RESOURCE, ""),)}
    assert not any(k[1].startswith("MIG-") or "::" in k[1] for k in store.snapshot().devices)


def test_a_pod_that_leaves_the_answer_ends_or_is_deleted_lets_go(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_nvml(READINGS, [])
    store.apply_pod("ADDED", _silent_pod())
    store.apply_pod("ADDED", _silent_pod("train-1"))
    store.apply_pod("ADDED", _silent_pod("train-2"))
    listing = _listing(("train-0", "main", U0), ("train-1", "main", U1), ("train-2", "main", U1))
    store.apply_assignments(listing)
    assert [a.pod for a in _held(store)[U1]] == ["train-1", "train-2"]
    store.apply_assignments(_listing(("train-0", "main", U0), ("train-2", "main", U1)))
    assert [a.pod for a in _held(store)[U1]] == ["train-2"]
    store.apply_pod("MODIFIED", _silent_pod("train-2", rv=2, phase="Succeeded"))
    store.apply_pod("DELETED", _silent_pod(rv=3))
    assert _held(store) == {}
    # The kubelet still lists the pods it has not forgotten yet: an ended pod holds nothing.
    store.apply_assignments(listing)
    assert [a.pod for a in _held(store)[U1]] == ["train-1"]


def test_a_failed_read_keeps_what_was_held_and_is_counted(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_nvml(READINGS, [])
    store.apply_pod("ADDED", _silent_pod())
    store.apply_assignments(_listing(("train-0", "main", U0)))
    before = store.snapshot()
    store.apply_assignments(None)
    assert store.stats.pod_resources_failures == 1
    store.apply_assignments(_listing(("train-0", "main", U0)))  # the same answer: nothing to do
    assert store.snapshot() is before
    assert _held(store) == {U0: (TRAIN,)}


PODS = ("train-0", "train-1", "infer-0")
answers = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(PODS), st.sampled_from(("main", "side")), st.sampled_from((U0, U1, f"{U1}::2"))
        ),
        max_size=5,
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(answers, st.sets(st.sampled_from(PODS)))
def test_the_holdings_are_the_last_answers_whatever_came_before(
    history: list[list[tuple[str, str, str]]], reporting: set[str]
) -> None:
    def fresh() -> DeviceStateStore:
        store = _store(ManualClock(start=1_800_000_000.0))
        store.apply_nvml(READINGS, [])
        for name in PODS:
            # Some pods' status reports U0 (a kubelet of 1.36): List never overrides that report.
            reported = (GPU_RESOURCE, [resource(U0)]) if name in reporting else None
            store.apply_pod("ADDED", pod(name, container("main", *([reported] if reported else []))))
        return store

    replayed = fresh()
    for answer in history:
        replayed.apply_assignments(_listing(*answer))
    last = fresh()
    last.apply_assignments(_listing(*history[-1]))
    assert _held(replayed) == _held(last)
    held = _held(last)
    for name in reporting:
        # Its report's allocation on U0 alone, whatever List says of the pod's containers there.
        assert [a for a in held[U0] if a.pod == name] == [
            Allocation("team-a", name, "main", GPU_RESOURCE, "")
        ]


def test_holdings_merge_with_a_dra_backed_extended_resources(clock: ManualClock) -> None:
    store = _store(clock)
    store.apply_nvml(READINGS, [])
    special, request = "train-0-extended-resources-x7k9p", "container-0-request-0"
    store.apply_slice("ADDED", slice_("node-1-gpus", "node-1", {"gpu-0": U0, "gpu-1": U1}))
    store.apply_claim("ADDED", claim(special, [(request, DRIVER, "node-1", "gpu-1")]))
    obj = _silent_pod()
    obj["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": special,
        "requestMappings": [
            {"containerName": "main", "resourceName": "example.com/gpu", "requestName": request}
        ],
    }
    store.apply_pod("ADDED", obj)
    extended = Allocation("team-a", "train-0", "main", "example.com/gpu", special)
    assert _held(store) == {U1: (extended,)}
    store.apply_assignments(_listing(("train-0", "main", U0)))
    assert _held(store) == {U0: (TRAIN,), U1: (extended,)}
    store.apply_assignments(_listing())
    assert _held(store) == {U1: (extended,)}


def test_cluster_mode_ignores_the_answer(clock: ManualClock) -> None:
    store = DeviceStateStore(clock)
    store.apply_pod("ADDED", _silent_pod())
    store.apply_assignments(_listing(("train-0", "main", U0)))
    store.apply_assignments(None)
    assert _held(store) == {} and store.stats.pod_resources_failures == 0
