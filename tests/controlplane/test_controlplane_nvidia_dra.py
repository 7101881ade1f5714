"""The NVIDIA DRA driver's own device taints beside our DeviceTaintRule, on the real 1.37 control plane.

Aspects: the real kube-apiserver accepts the slice the simulator's `nvidia` driver profile
publishes (its attributes with their value kinds, the driver's taints: `gpu.nvidia.com/xid=<n>`
NoSchedule and None, `gpu.nvidia.com/gpu-lost` and `gpu.nvidia.com/unmonitored` without a value)
and stamps each taint's `timeAdded`; the real kube-scheduler allocates the devices whose driver
taints have effect None and none whose taint is NoSchedule; the responder's own enforcement code,
as its ServiceAccount, writes and lifts its rule for a device the driver taints without writing to
the driver's slice, and with our rule gone the device is still kept out by the driver's taint:
lifting ours releases nothing the driver holds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.errors import AlreadyExists
from gpuhealth.kube.resources import POD, RESOURCE_CLAIM, RESOURCE_SLICE, Resource
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.reconcile.policy import CANARY_TAINT, QUARANTINE_TAINT, Enforce
from simulator.controlplane import ControlPlane
from simulator.fleet.dra_driver import nvidia_attributes
from simulator.fleet.health import Gpu
from simulator.fleet.state import SimNode
from simulator.model import DRA, NVIDIA_DRIVER, NodeGroup
from tests.deploy.manifests import NAMESPACE
from tests.support.controlplane import (
    admin,
    allocated_device,
    as_service_account,
    claim_spec,
    dra_record,
    namespace_ready,
    pod_with_claim,
    ready_node,
    unschedulable,
    wait_for_object,
)

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

TIMEOUT = 60.0
DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = Resource("resource.k8s.io", "v1", "deviceclasses", namespaced=False)
NODE = "nvidia-dra-137"
TAINTS = {
    "gpu-0": [{"key": "gpu.nvidia.com/xid", "value": "13", "effect": "None"}],
    "gpu-1": [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}],
    "gpu-2": [{"key": "gpu.nvidia.com/gpu-lost", "effect": "NoSchedule"}],
    "gpu-3": [{"key": "gpu.nvidia.com/unmonitored", "effect": "None"}],
}
"""What the driver's health monitor sets: it leaves `timeAdded` to the API server."""


def nvidia_slice() -> dict[str, Any]:
    product = "NVIDIA H100 80GB HBM3"
    group = NodeGroup("nv", 1, "nv-", 4, DRA, 0, product, "80Gi", {}, dra_driver=NVIDIA_DRIVER)
    gpus = [Gpu(NODE, i, f"GPU-{i:08d}-0000-0000-0000-000000000000", DRA) for i in range(4)]
    node = SimNode(NODE, 0, group, gpus)
    devices = [
        {
            "name": gpu.name,
            "attributes": nvidia_attributes(node, gpu),
            "capacity": {"memory": {"value": "81559Mi"}},
            "taints": TAINTS[gpu.name],
        }
        for gpu in gpus
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-{DRIVER}-q8x2m"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture
def responder(installed: ControlPlane) -> Iterator[tuple[KubeClient, KubeClient]]:
    client = admin(installed)
    account = as_service_account(installed, client, NAMESPACE, "gpuhealth-responder")
    try:
        yield client, account
    finally:
        account.close()
        client.close()


def _claim(client: KubeClient, namespace: str, name: str) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": claim_spec(DRIVER),
    }
    client.create(RESOURCE_CLAIM, claim)
    client.create(POD, pod_with_claim(namespace, name, NODE, {"resourceClaimName": name}))


def _allocated(client: KubeClient, namespace: str, name: str) -> str:
    claim = wait_for_object(
        client,
        RESOURCE_CLAIM,
        name,
        namespace=namespace,
        until=lambda c: allocated_device(c) is not None,
        what=f"the scheduler to allocate claim {namespace}/{name}",
        timeout=TIMEOUT,
    )
    device = allocated_device(claim)
    assert device is not None
    return device


def _unschedulable(client: KubeClient, namespace: str, name: str) -> None:
    wait_for_object(
        client,
        POD,
        name,
        namespace=namespace,
        until=lambda p: unschedulable(p) is not None,
        what=f"the scheduler to find {name} unschedulable",
        timeout=TIMEOUT,
    )
    assert allocated_device(client.get(RESOURCE_CLAIM, name, namespace=namespace)) is None


def test_our_rule_and_the_nvidia_drivers_taints_on_the_real_control_plane(
    responder: tuple[KubeClient, KubeClient],
) -> None:
    client, account = responder
    namespace = "tenant-nvidia-dra"
    ready_node(client, NODE)
    with contextlib.suppress(AlreadyExists):  # another test of the session installed the driver's class
        client.create(
            DEVICE_CLASS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": DRIVER},
                "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
            },
        )
    published = client.create(RESOURCE_SLICE, nvidia_slice())
    stored = {d["name"]: d for d in published["spec"]["devices"]}
    assert stored["gpu-1"]["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert [(t["key"], t.get("value"), t["effect"]) for t in stored["gpu-2"]["taints"]] == [
        ("gpu.nvidia.com/gpu-lost", None, "NoSchedule")
    ]
    # The driver leaves `timeAdded` to the API server, which stamps every taint.
    assert all(t.get("timeAdded") for d in stored.values() for t in d["taints"])
    namespace_ready(client, namespace)

    rules = discover(account)
    assert rules is not None and rules.version == "v1"
    enforcer = Enforcer(account, rules)
    record = dra_record(client, NODE, DRIVER, "gpu-1")
    enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "FatalXid", "NoSchedule"))
    assert enforcer.present(record)

    # The scheduler uses the devices whose driver taints say None (a warning, an unmonitored GPU),
    # never one the driver or we keep out.
    _claim(client, namespace, "work-0")
    _claim(client, namespace, "work-1")
    assert sorted([_allocated(client, namespace, "work-0"), _allocated(client, namespace, "work-1")]) == [
        "gpu-0",
        "gpu-3",
    ]
    _claim(client, namespace, "work-2")
    _unschedulable(client, namespace, "work-2")

    # Our ramp, then our release: the rule goes, and the driver's taint still keeps gpu-1 out.
    enforcer.enforce(record, Enforce(CANARY_TAINT, "FatalXid", "NoSchedule"))
    enforcer.unenforce(record)
    assert not enforcer.present(record)
    client.delete(POD, "work-2", namespace=namespace, grace_period_seconds=0)
    client.delete(RESOURCE_CLAIM, "work-2", namespace=namespace)
    _claim(client, namespace, "work-3")
    _unschedulable(client, namespace, "work-3")
    after = client.get(RESOURCE_SLICE, published["metadata"]["name"])
    assert after["metadata"]["resourceVersion"] == published["metadata"]["resourceVersion"]
    assert after["spec"]["devices"] == published["spec"]["devices"]
