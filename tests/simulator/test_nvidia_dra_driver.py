"""The NVIDIA DRA driver as it is (`draDriver: nvidia`), stepped with a ManualClock.

Aspects: its ResourceSlice publishes the kubelet plugin's names and attributes (value kinds
included) and is a valid v1 ResourceSlice; the kubelet hears no health from it, so every
allocated device reads Unknown without a message in pod status, whatever the card does; a fatal
XID taints the device `gpu.nvidia.com/xid=<xid>:NoSchedule`, a non-fatal one `...:None`, and a
later non-fatal XID never weakens a fatal one; a lost GPU taints every device of the node
`gpu.nvidia.com/gpu-lost:NoSchedule` (no value); nothing is NoExecute; the card's recovery lifts
no taint; a restart of the kubelet plugin (`dra-plugin-restart`) publishes the slice without the
taints of events that passed, and with those of a GPU still lost; the scenario file refuses what
a cluster cannot be (a device-plugin group with a DRA driver profile, two profiles in one fleet,
a plugin restart on a node without one).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE, gpu_uuid
from simulator.scenario import DeviceRef, Fault, ScenarioError, from_dict

SLICES = "resourceslices.resource.k8s.io"


def nvidia_node(gpus: int = 4, **group: Any) -> dict[str, Any]:
    return {
        "settings": {"statusSyncInterval": "10s", "leaseRenewInterval": "10s"},
        "fleet": [
            {"name": "n", "count": 1, "gpusPerNode": gpus, "path": "dra", "draDriver": "nvidia", **group}
        ],
        "workloads": [{"name": "w", "replicas": gpus // 2, "gpusPerPod": 2}],
    }


async def make_fleet(data: dict[str, Any]) -> tuple[Fleet, Store]:
    clock = ManualClock()
    store = Store(clock, seed=1)
    fleet = Fleet(from_dict(data), store, clock)
    await fleet.start()
    return fleet, store


def inject(fleet: Fleet, **fault: Any) -> None:
    fleet.inject(Fault(at=fleet.now(), **fault))


def the_slice(store: Store) -> dict[str, Any]:
    (slice_,) = store.list(SLICES)[0]
    return slice_


def taints(store: Store) -> dict[str, list[tuple[str, str, str]]]:
    """Per device name: (key, value, effect) of each taint, sorted."""
    return {
        d["name"]: sorted((t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints", []))
        for d in the_slice(store)["spec"]["devices"]
    }


def health_rows(store: Store) -> list[dict[str, Any]]:
    pods, _ = store.list("pods")
    return [
        row
        for pod in pods
        if pod["metadata"]["namespace"] != DRA_PLUGIN_NAMESPACE
        for cs in pod["status"].get("containerStatuses", [])
        for entry in cs.get("allocatedResourcesStatus", [])
        for row in entry["resources"]
    ]


async def test_its_slice_publishes_the_kubelet_plugins_names_and_attributes() -> None:
    _, store = await make_fleet(nvidia_node(product="NVIDIA H200", memory="141Gi"))
    slice_ = the_slice(store)
    assert slice_["spec"]["driver"] == "gpu.nvidia.com"
    assert slice_["spec"]["nodeName"] == slice_["spec"]["pool"]["name"] == "n-0"
    devices = slice_["spec"]["devices"]
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    gpu1 = devices[1]
    assert gpu1["attributes"] == {
        "type": {"string": "gpu"},
        "uuid": {"string": gpu_uuid("n-0", 1)},
        "productName": {"string": "NVIDIA H200"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:28:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:27"},
    }
    assert gpu1["capacity"] == {"memory": {"value": "141Gi"}}
    assert "taints" not in gpu1
    store.validator.validate(store.registry.get(SLICES), slice_)  # a valid resource.k8s.io/v1 shape


async def test_the_kubelet_reports_its_allocated_devices_unknown_whatever_the_card_does() -> None:
    fleet, store = await make_fleet(nvidia_node())
    await fleet.advance(15)
    rows = health_rows(store)
    assert len(rows) == 4
    assert {(r["health"], r.get("message")) for r in rows} == {("Unknown", None)}
    inject(fleet, kind="xid", device=DeviceRef("n-0", 0), xid=79)
    await fleet.advance(15)
    assert taints(store)["gpu-0"] == [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    # No stream carries the failure to the kubelet: pod status still says only Unknown.
    assert {(r["health"], r.get("message")) for r in health_rows(store)} == {("Unknown", None)}


async def test_xid_taints_carry_the_xid_and_its_classification_and_a_later_one_never_weakens() -> None:
    fleet, store = await make_fleet(nvidia_node())
    inject(fleet, kind="xid", device=DeviceRef("n-0", 1), xid=13)  # an application's error
    await fleet.advance(0)
    assert taints(store)["gpu-1"] == [("gpu.nvidia.com/xid", "13", "None")]
    inject(fleet, kind="xid", device=DeviceRef("n-0", 1), xid=48)
    await fleet.advance(0)
    assert taints(store)["gpu-1"] == [("gpu.nvidia.com/xid", "48", "NoSchedule")]
    inject(fleet, kind="xid", device=DeviceRef("n-0", 1), xid=43)
    await fleet.advance(0)
    assert taints(store)["gpu-1"] == [("gpu.nvidia.com/xid", "48", "NoSchedule")]
    assert taints(store)["gpu-0"] == []


async def test_a_lost_gpu_taints_every_device_of_the_node_and_nothing_is_ever_noexecute() -> None:
    fleet, store = await make_fleet(nvidia_node(gpus=2))
    inject(fleet, kind="gpu-lost", device=DeviceRef("n-0", 1))
    await fleet.advance(0)
    assert taints(store) == {
        "gpu-0": [("gpu.nvidia.com/gpu-lost", "", "NoSchedule")],
        "gpu-1": [("gpu.nvidia.com/gpu-lost", "", "NoSchedule"), ("gpu.nvidia.com/xid", "79", "NoSchedule")],
    }
    assert all(t["effect"] != "NoExecute" for d in the_slice(store)["spec"]["devices"] for t in d["taints"])


async def test_recovery_lifts_nothing_and_a_plugin_restart_lifts_what_passed() -> None:
    fleet, store = await make_fleet(nvidia_node())
    inject(fleet, kind="xid", device=DeviceRef("n-0", 2), xid=79)
    await fleet.advance(0)
    inject(fleet, kind="recover", device=DeviceRef("n-0", 2))
    await fleet.advance(120)
    assert taints(store)["gpu-2"] == [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    generation = the_slice(store)["spec"]["pool"]["generation"]

    inject(fleet, kind="dra-plugin-restart", node="n-0")
    await fleet.advance(0)
    assert taints(store) == {f"gpu-{i}": [] for i in range(4)}
    assert the_slice(store)["spec"]["pool"]["generation"] > generation


async def test_a_plugin_restart_taints_again_a_gpu_still_lost() -> None:
    fleet, store = await make_fleet(nvidia_node(gpus=2))
    inject(fleet, kind="gpu-lost", device=DeviceRef("n-0", 0))
    await fleet.advance(0)
    inject(fleet, kind="dra-plugin-restart", node="n-0")
    await fleet.advance(0)
    assert taints(store) == {
        "gpu-0": [("gpu.nvidia.com/gpu-lost", "", "NoSchedule")],
        "gpu-1": [("gpu.nvidia.com/gpu-lost", "", "NoSchedule")],
    }


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (
            {
                "fleet": [
                    {
                        "name": "a",
                        "count": 1,
                        "gpusPerNode": 1,
                        "path": "device-plugin",
                        "draDriver": "nvidia",
                    }
                ]
            },
            "fleet[0].draDriver: a DRA driver profile applies to the dra path only",
        ),
        (
            {"fleet": [{"name": "a", "count": 1, "gpusPerNode": 1, "path": "dra", "draDriver": "nvidai"}]},
            "fleet[0].draDriver: 'nvidai' is not one of: kep4680, nvidia",
        ),
        (
            {
                "fleet": [
                    {"name": "a", "count": 1, "gpusPerNode": 1, "path": "dra", "draDriver": "nvidia"},
                    {"name": "b", "count": 1, "gpusPerNode": 1, "path": "dra"},
                ]
            },
            "fleet[1].draDriver: 'kep4680', but group 'a' runs 'nvidia': a fleet runs one DRA driver profile",
        ),
        (
            {
                "fleet": [{"name": "a", "count": 1, "gpusPerNode": 1, "path": "device-plugin"}],
                "timeline": [{"at": "1s", "fault": "dra-plugin-restart", "node": "a-0"}],
            },
            "timeline[0].node: dra-plugin-restart needs a DRA node (its driver's kubelet plugin); "
            "'a-0' is device-plugin",
        ),
    ],
)
def test_the_scenario_file_refuses_what_a_cluster_cannot_be(data: dict[str, Any], error: str) -> None:
    with pytest.raises(ScenarioError) as excinfo:
        from_dict(data, "s.yaml")
    assert error in str(excinfo.value)
