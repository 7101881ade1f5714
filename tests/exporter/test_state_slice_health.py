"""Devices of a DRA driver that streams no health to the kubelet: the NVIDIA DRA driver as it is.

Aspects covered: the driver's own taints read as the NVIDIA driver sets them (a fatal XID
`gpu.nvidia.com/xid=<xid>:NoSchedule` and a lost GPU `gpu.nvidia.com/gpu-lost:NoSchedule`
Unhealthy, a non-fatal XID `...:None` only a warning: Healthy with the taint as its message,
`gpu.nvidia.com/unmonitored:None` Unknown), the message naming the taint; for a driver named
in `slice_health_drivers` a device a pod holds takes its health from the slice's taints, not
from the kubelet's Unknown (which says only that it heard nothing), with source `resourceslice`,
a new status version when the taints change and none when the pod leaves; the pod's repeated
status still confirms the device, and its age grows once the driver's kubelet plugin is not
Ready, however often the Lease is renewed; without the setting the kubelet's Unknown stands;
a pod seen before its slice keeps the kubelet's word until the slice arrives.
"""

from __future__ import annotations

from exporter.identity import SLICE_HEALTHY_MESSAGE, slice_health
from exporter.snapshot import SOURCE_POD, SOURCE_SLICE, DriverTaint, producer_down_since, status_age
from exporter.state import DeviceStateStore, producer_resource
from gpuhealth.clock import ManualClock
from gpuhealth.kube.meta import rfc3339
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

U0 = gpu_uuid("node-1", 0)
FATAL = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
NON_FATAL = {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}
LOST = {"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}


def test_the_nvidia_drivers_taints_read_as_it_sets_them() -> None:
    assert slice_health((DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),)) == (
        "Unhealthy",
        "ResourceSlice taint gpu.nvidia.com/xid=79:NoSchedule",
    )
    assert slice_health((DriverTaint("gpu.nvidia.com/gpu-lost", "NoSchedule"),)) == (
        "Unhealthy",
        "ResourceSlice taint gpu.nvidia.com/gpu-lost:NoSchedule",
    )
    assert slice_health((DriverTaint("gpu.nvidia.com/xid", "None", "13"),)) == (
        "Healthy",
        "ResourceSlice taint gpu.nvidia.com/xid=13:None (non-fatal: a warning)",
    )
    assert slice_health((DriverTaint("gpu.nvidia.com/unmonitored", "None"),)) == (
        "Unknown",
        "ResourceSlice taint gpu.nvidia.com/unmonitored:None",
    )
    # A warning never hides a failure or an unmonitored device, in either order.
    warning = DriverTaint("gpu.nvidia.com/xid", "None", "13")
    assert slice_health((warning, DriverTaint("gpu.nvidia.com/gpu-lost", "NoSchedule")))[0] == "Unhealthy"
    assert slice_health((warning, DriverTaint("gpu.nvidia.com/unmonitored", "None")))[0] == "Unknown"


def _slice(*taints: dict[str, str]) -> dict:
    return slice_("node-1-gpus", "node-1", {"gpu-0": U0}, taints={"gpu-0": list(taints)} if taints else None)


def _pod(rv: int = 1, phase: str = "Running") -> dict:
    """A pod on gpu-0 whose entry is what a 1.36 kubelet writes for a driver that never reported."""
    return pod(
        "p",
        container(
            "main", ("claim:gpus", [resource("k8s.gpu.nvidia.com/claim=claim-uid-p-gpus-gpu-0", "Unknown")])
        ),
        rv=rv,
        claim_statuses={"gpus": "p-gpus"},
        phase=phase,
    )


def _held(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", claim("p-gpus", [("gpus", DRIVER, "node-1", "gpu-0")]))
    store.apply_pod("ADDED", _pod())


def test_a_held_device_of_a_slice_health_driver_takes_its_health_from_the_slice(clock: ManualClock) -> None:
    store = DeviceStateStore(clock, slice_health_drivers=[DRIVER])
    _held(store)
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.message, device.source) == ("Healthy", SLICE_HEALTHY_MESSAGE, SOURCE_SLICE)
    assert [a.pod for a in device.allocations] == ["p"]
    version = device.status_version

    # A fatal XID: the driver taints the device it still holds; no pod status changes with it.
    clock.advance(5)
    store.apply_slice("MODIFIED", _slice(FATAL))
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.message, device.status_version, device.changed_at) == (
        "Unhealthy",
        "ResourceSlice taint gpu.nvidia.com/xid=79:NoSchedule",
        version + 1,
        clock.now(),
    )
    assert device.unknown_since is None

    # The kubelet rewrites the pod (Unknown again): a confirmation of what the device says, not news.
    clock.advance(5)
    store.apply_pod("MODIFIED", _pod(rv=2))
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.status_version, device.observed_at) == (
        "Unhealthy",
        version + 1,
        clock.now(),
    )

    # The pod leaves: the slice already vouched for the device; nothing changes but the holders.
    clock.advance(5)
    store.apply_pod("DELETED", _pod(rv=3))
    idle = store.snapshot().devices[("node-1", U0)]
    assert (idle.health, idle.source, idle.allocations, idle.status_version) == (
        "Unhealthy",
        SOURCE_SLICE,
        (),
        version + 1,
    )


def test_a_non_fatal_xid_or_a_lost_gpu_on_a_held_device(clock: ManualClock) -> None:
    store = DeviceStateStore(clock, slice_health_drivers=[DRIVER])
    _held(store)
    store.apply_slice("MODIFIED", _slice(NON_FATAL))
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.message) == (
        "Healthy",
        "ResourceSlice taint gpu.nvidia.com/xid=13:None (non-fatal: a warning)",
    )
    store.apply_slice("MODIFIED", _slice(NON_FATAL, LOST))
    assert store.snapshot().devices[("node-1", U0)].health == "Unhealthy"
    # The driver's kubelet plugin restarted: its taints are gone, the device reads Healthy again.
    store.apply_slice("MODIFIED", _slice())
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.message) == ("Healthy", SLICE_HEALTHY_MESSAGE)


def test_without_the_setting_the_kubelets_unknown_stands(store: DeviceStateStore, clock: ManualClock) -> None:
    _held(store)
    store.apply_slice("MODIFIED", _slice(FATAL))
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.source) == ("Unknown", SOURCE_POD)
    assert device.driver_taints == (DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),)


def test_a_pod_seen_before_its_slice_keeps_the_kubelets_word_until_the_slice_arrives(
    clock: ManualClock,
) -> None:
    store = DeviceStateStore(clock, slice_health_drivers=[DRIVER])
    store.apply_claim("ADDED", claim("p-gpus", [("gpus", DRIVER, "node-1", "gpu-0")]))
    store.apply_pod("ADDED", _pod())
    (device,) = store.snapshot().devices.values()
    assert device.health == "Unknown"
    store.apply_slice("ADDED", _slice(FATAL))
    device = store.snapshot().devices[("node-1", U0)]
    assert (device.health, device.source, [a.pod for a in device.allocations]) == (
        "Unhealthy",
        SOURCE_SLICE,
        ["p"],
    )


def test_the_slices_word_ages_with_the_nodes_lease_and_the_drivers_kubelet_plugin(clock: ManualClock) -> None:
    """The slice carries no heartbeat: a held device's health is fresh while the node's kubelet
    renews its Lease and the driver's kubelet plugin (which would re-taint) is Ready."""
    store = DeviceStateStore(clock, slice_health_drivers=[DRIVER])
    store.apply_event(producer_resource(DRIVER), "ADDED", plugin_pod(True, clock.now()))
    store.apply_lease("ADDED", lease("node-1", rfc3339(clock.now())))
    _held(store)

    def age() -> float:
        snap = store.snapshot()
        device = snap.devices[("node-1", U0)]
        return status_age(
            device, snap.nodes.get("node-1"), snap.nvml, clock.now(), producer_down_since(snap, device)
        )

    clock.advance(300)
    store.apply_lease("MODIFIED", lease("node-1", rfc3339(clock.now())))
    assert age() == 0.0
    down = clock.now()
    store.apply_event(producer_resource(DRIVER), "MODIFIED", plugin_pod(False, down, rv=2))
    clock.advance(120)
    store.apply_lease("MODIFIED", lease("node-1", rfc3339(clock.now())))
    store.apply_pod("MODIFIED", _pod(rv=2))  # the kubelet rewrites its Unknown: no confirmation
    assert age() == 120.0
