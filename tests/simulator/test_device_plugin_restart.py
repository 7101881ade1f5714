"""A restart of the NVIDIA device plugin on a node (`device-plugin-restart`).

Aspects: the plugin's Unhealthy is sticky until it restarts; after the restart every device reads
Healthy again (pod status and the node's allocatable), a card still broken in a way only NVML
sees included (it stays lost there), until the plugin sees a new fault; a broken ListAndWatch
stream is replaced by the new registration's; the kubelet keeps its checkpoint: the running pod
keeps the devices it had. The scenario file takes the fault on device-plugin nodes only, naming
the file, line and field of a misplaced one.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.scenario import DeviceRef, Fault, ScenarioError, from_dict, load_file

DATA: dict[str, Any] = {
    "settings": {"statusSyncInterval": "10s"},
    "fleet": [{"name": "n", "count": 1, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [{"name": "w", "namespace": "default", "replicas": 1, "gpusPerPod": 2}],
}


async def started() -> tuple[Fleet, Store]:
    clock = ManualClock()
    store = Store(clock, seed=5)
    fleet = Fleet(from_dict(DATA), store, clock)
    await fleet.start()
    return fleet, store


def inject(fleet: Fleet, kind: str, **where: Any) -> None:
    fleet.inject(Fault(at=fleet.now(), kind=kind, **where))


def allocatable(store: Store) -> str:
    return str(store.get("nodes", "n-0")["status"]["allocatable"]["nvidia.com/gpu"])


def pod_health(store: Store, name: str) -> list[str]:
    (cs,) = store.get("pods", name, "default")["status"]["containerStatuses"]
    return [r["health"] for r in cs["allocatedResourcesStatus"][0]["resources"]]


async def test_a_restart_forgets_every_unhealthy_and_running_pods_keep_their_devices() -> None:
    fleet, store = await started()
    try:
        (pod,) = fleet.nodes["n-0"].pods
        slots, free = pod.slots, list(fleet.nodes["n-0"].free)
        inject(fleet, "device-unhealthy", device=DeviceRef("n-0", pod.slots[0].gpu))
        inject(fleet, "gpu-lost", device=DeviceRef("n-0", free[0].gpu))
        await fleet.advance(15)
        assert allocatable(store) == "2"
        assert sorted(pod_health(store, pod.name)) == ["Healthy", "Unhealthy"]
        await fleet.advance(120)
        assert allocatable(store) == "2"  # sticky: the plugin never marks a device healthy itself

        inject(fleet, "device-plugin-restart", node="n-0")
        await fleet.advance(1)
        assert allocatable(store) == "4"
        assert pod_health(store, pod.name) == ["Healthy", "Healthy"]
        assert pod.slots == slots and fleet.nodes["n-0"].free == free  # the kubelet's checkpoint
        assert fleet.gpu("n-0", free[0].gpu).lost  # NVML still says so; the plugin does not

        # A new fault after the restart is reported again.
        inject(fleet, "xid", device=DeviceRef("n-0", pod.slots[1].gpu), xid=79, unhealthy=True)
        await fleet.advance(1)
        assert allocatable(store) == "3"
        assert sorted(pod_health(store, pod.name)) == ["Healthy", "Unhealthy"]
    finally:
        fleet.stop()


async def test_a_restart_replaces_a_broken_stream() -> None:
    fleet, store = await started()
    try:
        inject(fleet, "health-stream-broken", node="n-0")
        await fleet.advance(1)
        assert allocatable(store) == "0"
        inject(fleet, "device-plugin-restart", node="n-0")
        await fleet.advance(1)
        assert allocatable(store) == "4"
    finally:
        fleet.stop()


def test_the_scenario_file_takes_it_on_device_plugin_nodes_only(tmp_path: Any) -> None:
    ok = dict(DATA, timeline=[{"at": "1m", "fault": "device-plugin-restart", "node": "n-0"}])
    (fault,) = from_dict(ok).timeline
    assert (fault.kind, fault.node, fault.at) == ("device-plugin-restart", "n-0", 60.0)
    assert "every device Healthy until a new fault" in fault.describe()

    path = tmp_path / "s.yaml"
    path.write_text(
        "fleet:\n"
        "  - {name: d, count: 1, gpusPerNode: 2, path: dra}\n"
        "timeline:\n"
        "  - at: 1s\n"
        "    fault: device-plugin-restart\n"
        "    node: d-0\n"
    )
    with pytest.raises(ScenarioError) as excinfo:
        load_file(path)
    assert str(excinfo.value) == (
        f"{path}:6: timeline[0].node: device-plugin-restart needs a device-plugin node (the NVIDIA "
        "device plugin); 'd-0' is dra: its DRA driver's kubelet plugin restarts with dra-plugin-restart"
    )
    with pytest.raises(ScenarioError, match=r"timeline\[0\]\.duration: unknown field"):
        from_dict(
            dict(
                DATA,
                timeline=[{"at": "1s", "fault": "device-plugin-restart", "node": "n-0", "duration": "1m"}],
            )
        )
