"""MIG on DRA in the simulator: the NVIDIA DRA driver's profile (`draDriver: nvidia`) on a group
with `mig:`, stepped with a ManualClock.

Aspects: the slice publishes each card's MIG devices instead of the card, named and attributed
as the driver's kubelet plugin names them (`gpu-<minor>-mig-<profile>-<profile id>-<placement>`,
`type: mig`, the MIG UUID, `parentUUID`, the profile, the card's product and versions) and is a
valid v1 ResourceSlice; the scenario's pods get a MIG device each, card by card, and their pod
status names the device's CDI id; a fatal XID of a card taints every MIG device of that card and
none of the other card, a lost GPU every device of the node; a replacement pod is allocated
through the scheduler's DRA allocator a MIG device that no NoSchedule DeviceTaintRule names, and
runs on it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.fleet import Fleet
from simulator.fleet.mig import dra_device_name, partition_uuid, placement_start, profile_id
from simulator.fleet.objects import DRA_PLUGIN_NAMESPACE, cdi_id, gpu_uuid
from simulator.model import MigLayout
from simulator.scenario import DeviceRef, Fault, from_dict
from tests.simulator.test_nvidia_dra_driver import taints, the_slice

SLICES = "resourceslices.resource.k8s.io"
CLAIMS = "resourceclaims.resource.k8s.io"
CARD0 = ["gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4"]
CARD1 = ["gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"]


def mig_node() -> dict[str, Any]:
    return {
        "fleet": [
            {
                "name": "n",
                "count": 1,
                "gpusPerNode": 2,
                "path": "dra",
                "draDriver": "nvidia",
                "product": "NVIDIA H100 80GB HBM3",
                "mig": {"profile": "3g.40gb", "partitions": 2},
            }
        ],
        "workloads": [{"name": "w", "replicas": 2, "gpusPerPod": 1}],
    }


@pytest.fixture
async def running() -> AsyncIterator[tuple[Fleet, Store]]:
    clock = ManualClock()
    store = Store(clock, seed=5)
    fleet = Fleet(from_dict(mig_node()), store, clock)
    await fleet.start()
    task = asyncio.create_task(fleet.follow_deletions())
    await asyncio.sleep(0)
    yield fleet, store
    fleet.stop()
    await task


def pods(store: Store) -> list[dict[str, Any]]:
    return [p for p in store.list("pods")[0] if p["metadata"]["namespace"] != DRA_PLUGIN_NAMESPACE]


def allocated(store: Store, pod: dict[str, Any]) -> list[str]:
    name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    claim = store.get(CLAIMS, name, pod["metadata"]["namespace"])
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def test_device_names_follow_the_drivers_profile_ids_and_placements() -> None:
    small = MigLayout(strategy="single", profile="1g.10gb", partitions=7)
    names = [dra_device_name(2, small, p) for p in (0, 6)]
    assert names == ["gpu-2-mig-1g10gb-19-0", "gpu-2-mig-1g10gb-19-6"]
    half = MigLayout(strategy="single", profile="3g.40gb", partitions=2)
    assert (profile_id(half), placement_start(half, 1)) == (9, 4)
    big = MigLayout(strategy="single", profile="4g.95gb", partitions=1)
    assert dra_device_name(2, big, 0) == "gpu-2-mig-4g95gb-5-0"


async def test_the_slice_publishes_each_cards_mig_devices_as_the_driver_does(
    running: tuple[Fleet, Store],
) -> None:
    _, store = running
    slice_ = the_slice(store)
    devices = slice_["spec"]["devices"]
    assert [d["name"] for d in devices] == CARD0 + CARD1
    card = gpu_uuid("n-0", 1)
    second = devices[3]
    assert second["attributes"] == {
        "type": {"string": "mig"},
        "uuid": {"string": partition_uuid(card, 1)},
        "parentUUID": {"string": card},
        "profile": {"string": "3g.40gb"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:28:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:27"},
    }
    assert second["capacity"] == {"memory": {"value": "40Gi"}}
    assert "taints" not in second
    store.validator.validate(store.registry.get(SLICES), slice_)


async def test_the_pods_get_a_mig_device_each_card_by_card(running: tuple[Fleet, Store]) -> None:
    fleet, store = running
    await fleet.advance(1)
    got = {}
    for pod in pods(store):
        (device,) = allocated(store, pod)
        claim_uid = store.get(
            CLAIMS, pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"], "default"
        )["metadata"]["uid"]
        (group,) = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"]
        assert [r["resourceID"] for r in group["resources"]] == [cdi_id(claim_uid, device)]
        got[pod["metadata"]["name"]] = device
    assert sorted(got.values()) == CARD0


async def test_a_cards_fatal_xid_taints_every_mig_device_of_the_card_and_a_lost_gpu_all(
    running: tuple[Fleet, Store],
) -> None:
    fleet, store = running
    fleet.inject(Fault(at=fleet.now(), kind="xid", device=DeviceRef("n-0", 0), xid=79))
    await fleet.advance(0)
    xid = [("gpu.nvidia.com/xid", "79", "NoSchedule")]
    assert taints(store) == {CARD0[0]: xid, CARD0[1]: xid, CARD1[0]: [], CARD1[1]: []}
    fleet.inject(Fault(at=fleet.now(), kind="gpu-lost", device=DeviceRef("n-0", 1)))
    await fleet.advance(0)
    lost = ("gpu.nvidia.com/gpu-lost", "", "NoSchedule")
    now = taints(store)
    assert all(lost in now[name] for name in CARD0 + CARD1)


async def test_a_replacement_gets_a_mig_device_no_rule_keeps_away_and_runs(
    running: tuple[Fleet, Store],
) -> None:
    fleet, store = running
    await fleet.advance(1)
    for device in CARD0:
        store.create(
            "devicetaintrules.resource.k8s.io",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceTaintRule",
                "metadata": {"name": f"quarantine-{device}"},
                "spec": {
                    "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n-0", "device": device},
                    "taint": {"key": "gpuhealth.io/quarantine", "value": "xid-79", "effect": "NoSchedule"},
                },
            },
        )
    before = {p["metadata"]["name"] for p in pods(store)}
    old = pods(store)[0]
    store.delete("pods", old["metadata"]["name"], "default")
    for _ in range(5):
        await asyncio.sleep(0)
    await fleet.advance(6)
    (new,) = [p for p in pods(store) if p["metadata"]["name"] not in before]
    (device,) = allocated(store, new)
    assert device in CARD1
    await fleet.advance(30)
    assert store.get("pods", new["metadata"]["name"], "default")["status"]["phase"] == "Running"
