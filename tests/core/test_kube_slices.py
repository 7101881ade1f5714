"""The one ResourceSlice parser (gpuhealth.kube.slices).

Aspects: v1 (attributes and taints on the device) and v1beta1 (under `basic`) read alike; a MIG
device names its card (`parentUUID`), plain or domain-qualified; a slice without a driver, a
pool or a device list is None; a device entry that is not an object with a name is left out and
counted, the others kept; a slice without a name or a node is read, its name and node empty.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuhealth.kube.slices import DriverTaint, ResourceSlice, SliceDevice, parse_resource_slice

DRIVER = "gpu.nvidia.com"


def device(name: str, uuid: str, parent: str = "", taints: list[Any] | None = None) -> dict[str, Any]:
    attributes = {f"{DRIVER}/uuid": {"string": uuid}}
    if parent:
        attributes["parentUUID"] = {"string": parent}
    return {"name": name, "attributes": attributes, "taints": taints or []}


def slice_(devices: Any, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "n1-gpu"},
        "spec": {"driver": DRIVER, "pool": {"name": "n1"}, "nodeName": "n1", "devices": devices} | spec,
    }


def test_v1_and_v1beta1_devices_read_alike() -> None:
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    v1 = device("gpu-0", "MIG-a", parent="GPU-card", taints=[taint, {"key": 1}])
    beta = {"name": "gpu-0", "basic": {k: v for k, v in v1.items() if k != "name"}}
    expected = ResourceSlice(
        "n1-gpu",
        DRIVER,
        "n1",
        "n1",
        (
            SliceDevice(
                DRIVER,
                "n1",
                "gpu-0",
                "n1",
                "MIG-a",
                "GPU-card",
                (DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),),
            ),
        ),
    )
    assert parse_resource_slice(slice_([v1])) == expected
    assert parse_resource_slice(slice_([beta])) == expected
    assert expected.devices[0].ref == (DRIVER, "n1", "gpu-0")


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        {"metadata": {"name": "s"}},
        slice_([], driver=""),
        slice_([], pool={}),
        slice_({"gpu-0": {}}),
    ],
)
def test_a_slice_without_driver_pool_or_device_list_is_none(obj: Any) -> None:
    assert parse_resource_slice(obj) is None


def test_a_malformed_device_entry_is_left_out_and_counted() -> None:
    parsed = parse_resource_slice(slice_([device("gpu-0", "GPU-a"), "gpu-1", {"name": ""}, {"name": 3}]))
    assert parsed is not None
    assert [d.device for d in parsed.devices] == ["gpu-0"] and parsed.malformed_devices == 3


def test_a_slice_without_name_or_node_is_read() -> None:
    obj = slice_([device("gpu-0", "GPU-a")])
    del obj["metadata"], obj["spec"]["nodeName"]
    parsed = parse_resource_slice(obj)
    assert parsed is not None and (parsed.name, parsed.node) == ("", "")
    assert parsed.devices == (SliceDevice(DRIVER, "n1", "gpu-0", "", "GPU-a"),)
