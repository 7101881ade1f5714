"""MIG on DRA as the exporter sees it: the NVIDIA DRA driver's MIG devices are their card.

Aspects covered: a slice device with a `parentUUID` attribute (the driver's MIG device) keys to
its card's UUID, keeping its own MIG UUID aside; the pods on any of the card's MIG devices are
all holders of the one card; the card's health is its worst partition's, whichever MIG device
of the card carries the taint and in whichever order the slice lists them; the card is
tracked once, never once per partition; a whole GPU of the same slice is untouched by this.
"""

from __future__ import annotations

from typing import Any

from exporter.identity import parse_slice
from exporter.snapshot import SOURCE_SLICE
from exporter.state import DeviceStateStore
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import DRIVER, claim, container, pod, resource

CARD = "GPU-0c0c0c0c-0000-4000-8000-000000000000"
WHOLE = "GPU-1d1d1d1d-0000-4000-8000-000000000000"
MIGS = {"gpu-0-mig-3g40gb-9-0": "MIG-aaaaaaaa-0000-4000-8000-000000000000",
        "gpu-0-mig-3g40gb-9-4": "MIG-bbbbbbbb-0000-4000-8000-000000000000"}  # fmt: skip
FATAL = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
WARNING = {"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}


def mig_slice(taints: dict[str, list[dict[str, str]]] | None = None, reverse: bool = False) -> dict[str, Any]:
    """node-1's slice as the NVIDIA DRA driver publishes it: card 0 as two MIG devices, gpu-1 whole."""
    devices: list[dict[str, Any]] = [
        {
            "name": name,
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": mig},
                "parentUUID": {"string": CARD},
                "profile": {"string": "3g.40gb"},
            },
        }
        for name, mig in MIGS.items()
    ]
    devices.append({"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": WHOLE}}})
    for device in devices:
        if taints and device["name"] in taints:
            device["taints"] = taints[device["name"]]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "node-1-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": "node-1",
            "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices[::-1] if reverse else devices,
        },
    }


def mig_pod(name: str, device: str) -> dict[str, Any]:
    return pod(
        name,
        container(
            "main",
            ("claim:gpus", [resource(f"k8s.gpu.nvidia.com/claim=claim-uid-{name}-gpus-{device}", "Unknown")]),
        ),
        claim_statuses={"gpus": f"{name}-gpus"},
    )


def test_a_mig_device_is_its_card_and_keeps_its_own_uuid_aside() -> None:
    parsed = parse_slice(mig_slice())
    assert not isinstance(parsed, str)
    _, devices = parsed
    by_name = {d.device: d for d in devices}
    assert [(by_name[n].uuid, by_name[n].mig_uuid) for n in MIGS] == [(CARD, m) for m in MIGS.values()]
    assert (by_name["gpu-1"].uuid, by_name["gpu-1"].mig_uuid) == (WHOLE, "")


def test_the_card_takes_the_worst_taint_of_any_partition_in_any_order() -> None:
    first, second = MIGS
    for reverse in (False, True):
        parsed = parse_slice(mig_slice({first: [WARNING], second: [FATAL]}, reverse))
        assert not isinstance(parsed, str)
        healths = {d.device: d.health[0] for d in parsed[1]}
        assert healths == {first: "Unhealthy", second: "Unhealthy", "gpu-1": "Healthy"}


def test_pods_on_every_partition_hold_the_one_card_and_its_health_is_the_worst(clock: ManualClock) -> None:
    store = DeviceStateStore(clock, slice_health_drivers=[DRIVER])
    store.apply_slice("ADDED", mig_slice())
    first, second = MIGS
    for name, device in (("p", first), ("q", second)):
        store.apply_claim("ADDED", claim(f"{name}-gpus", [("gpus", DRIVER, "node-1", device)]))
        store.apply_pod("ADDED", mig_pod(name, device))
    devices = store.snapshot().devices
    assert sorted(k for k in devices if k[0] == "node-1") == sorted([("node-1", CARD), ("node-1", WHOLE)])
    card = devices[("node-1", CARD)]
    assert sorted(a.pod for a in card.allocations) == ["p", "q"]
    assert (card.health, card.source, card.uuid) == ("Healthy", SOURCE_SLICE, CARD)
    # The driver taints only the second partition (an event of its GPU instance): the card is broken.
    clock.advance(5)
    store.apply_slice("MODIFIED", mig_slice({second: [FATAL]}))
    card = store.snapshot().devices[("node-1", CARD)]
    assert (card.health, card.message) == (
        "Unhealthy",
        "ResourceSlice taint gpu.nvidia.com/xid=79:NoSchedule",
    )
    assert store.snapshot().devices[("node-1", WHOLE)].health == "Healthy"
