"""Pods whose `nvidia.com/gpu` a DRA DeviceClass serves (KEP-5004): held devices with no report.

Aspects covered: such a pod carries no `allocatedResourcesStatus` (kubernetes#139939), only
`status.extendedResourceClaimStatus` (the special claim and its request per container); the
exporter shows the pod on its device (an allocation naming the special claim, on
`gpu_device_allocation_info`) through the claim's allocation results, on the dict path and the
decoded-Struct path alike. The pod is never the device's health source: the driver's slice
taint still reaches a device such a pod holds (an Unhealthy status change with source
`resourceslice`), since the pod reports nothing. The claim arriving after the pod, the pod
finishing and the pod being deleted move the allocation as they should; after a restart the
holding comes back from the directory still report-less (the taint still reaches it); a malformed
`extendedResourceClaimStatus` is counted and says nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporter.decode import pod_from_dict
from exporter.directory import Directory, open_store
from exporter.exposition import render_metrics
from exporter.observer import persist
from exporter.parse import MALFORMED_POD, ExtendedAllocation, parse_pod, parse_pod_struct
from exporter.snapshot import SOURCE_SLICE, Allocation
from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import DRIVER, claim, gpu_uuid, pod, slice_

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
SPECIAL = "serve-0-extended-resources-x7k9p"
REQUEST = "container-0-request-2"
XID = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}


def _slice(taints: dict[str, list[dict[str, str]]] | None = None) -> dict[str, Any]:
    return slice_("node-1-gpus", "node-1", {"gpu-0": U0, "gpu-1": U1}, taints=taints)


def _extended_pod(rv: int = 1, phase: str = "Running", status: Any = None) -> dict[str, Any]:
    """A pod written for device plugins, served by DRA: no allocatedResourcesStatus at all."""
    obj = pod("serve-0", {"name": "server", "ready": True}, rv=rv, phase=phase)
    obj["status"]["extendedResourceClaimStatus"] = (
        status
        if status is not None
        else {
            "resourceClaimName": SPECIAL,
            "requestMappings": [
                {"containerName": "server", "resourceName": "nvidia.com/gpu", "requestName": REQUEST}
            ],
        }
    )
    return obj


def _special_claim() -> dict[str, Any]:
    return claim(SPECIAL, [(REQUEST, DRIVER, "node-1", "gpu-1")])


HELD = Allocation("team-a", "serve-0", "server", "nvidia.com/gpu", SPECIAL)


def test_both_parse_paths_read_the_mapping_and_no_report() -> None:
    obj = _extended_pod()
    want = (ExtendedAllocation("server", "nvidia.com/gpu", SPECIAL, REQUEST),)
    by_dict = parse_pod(obj)
    decoded = pod_from_dict(obj)
    assert decoded is not None
    by_struct = parse_pod_struct(decoded)
    assert by_dict is not None and by_struct is not None
    assert by_dict.extended == by_struct.extended == want
    assert by_dict.entries == by_struct.entries == ()


def test_a_malformed_extended_claim_status_is_counted_and_says_nothing() -> None:
    for bad in (
        {"requestMappings": []},
        {"resourceClaimName": SPECIAL, "requestMappings": [{"containerName": 3}]},
    ):
        observation = parse_pod(_extended_pod(status=bad))
        assert observation is not None
        assert observation.extended == ()
        assert MALFORMED_POD in observation.errors


def test_the_pod_shows_on_its_device_through_the_special_claim(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _special_claim())
    store.apply_pod("ADDED", _extended_pod())
    devices = store.snapshot().devices
    assert devices[("node-1", U1)].allocations == (HELD,)
    assert devices[("node-1", U0)].allocations == ()
    # Not the health source: the pod says nothing about the device.
    assert devices[("node-1", U1)].source == SOURCE_SLICE
    text = render_metrics(store.snapshot(), clock.now()).decode()
    info = [line for line in text.splitlines() if line.startswith("gpu_device_allocation_info{")]
    assert len(info) == 1
    assert f'claim="{SPECIAL}"' in info[0] and 'pod="serve-0"' in info[0] and 'container="server"' in info[0]


def test_the_claim_arriving_after_the_pod_resolves_it(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_pod("ADDED", _extended_pod())
    assert store.snapshot().devices[("node-1", U1)].allocations == ()
    store.apply_claim("ADDED", _special_claim())
    assert store.snapshot().devices[("node-1", U1)].allocations == (HELD,)


def test_the_driver_taint_reaches_a_device_such_a_pod_holds(
    store: DeviceStateStore, clock: ManualClock
) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _special_claim())
    store.apply_pod("ADDED", _extended_pod())
    before = store.snapshot().devices[("node-1", U1)]
    clock.advance(5)
    store.apply_slice("MODIFIED", _slice({"gpu-1": [XID]}))
    after = store.snapshot().devices[("node-1", U1)]
    assert (after.health, after.source, after.status_version) == (
        "Unhealthy",
        SOURCE_SLICE,
        before.status_version + 1,
    )
    assert after.allocations == (HELD,)


def test_a_finished_or_deleted_pod_lets_go_of_the_device(store: DeviceStateStore) -> None:
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _special_claim())
    store.apply_pod("ADDED", _extended_pod())
    store.apply_pod("MODIFIED", _extended_pod(rv=2, phase="Succeeded"))
    assert store.snapshot().devices[("node-1", U1)].allocations == ()
    store.apply_pod("MODIFIED", _extended_pod(rv=3))
    assert store.snapshot().devices[("node-1", U1)].allocations == (HELD,)
    store.apply_pod("DELETED", _extended_pod(rv=4))
    device = store.snapshot().devices[("node-1", U1)]
    assert (device.allocations, device.health, device.source) == ((), "Healthy", SOURCE_SLICE)


def test_after_a_restart_the_held_device_still_takes_the_slice_taint(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = str(tmp_path / "directory.sqlite")
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_slice("ADDED", _slice())
    store.apply_claim("ADDED", _special_claim())
    store.apply_pod("ADDED", _extended_pod())
    persist(store, directory, force=True)
    directory.close()
    directory = Directory(path, clock=clock)
    restored = open_store(directory, clock)
    assert restored.snapshot().devices[("node-1", U1)].allocations == (HELD,)
    # Restored as a report-less holding: the taint is still the device's evidence.
    clock.advance(5)
    restored.apply_slice("ADDED", _slice({"gpu-1": [XID]}))
    device = restored.snapshot().devices[("node-1", U1)]
    assert (device.health, device.source, device.allocations) == ("Unhealthy", SOURCE_SLICE, (HELD,))
    directory.close()
