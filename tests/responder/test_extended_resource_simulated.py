"""DRA-backed `nvidia.com/gpu` (KEP-5004) as the responder meets it in the simulated cluster.

Aspects: on a DRA-only cluster whose DeviceClass maps `nvidia.com/gpu`, a pod written for device
plugins holds its GPU through the scheduler's special claim; the responder's backends name that
GPU a DRA device from the node's ResourceSlice (whatever the alert guessed: the node advertises
no `nvidia.com/gpu`), so it is quarantined by a DeviceTaintRule; the pods holding it are found
through the special claim (its `reservedFor`, and the name in the pod's
`status.extendedResourceClaimStatus` once the reservation is gone), and no other pod is; a
check's pod reaches exactly that device through a claim, as on any DRA device.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import NODE, POD, RESOURCE_SLICE
from gpuhealth.kube.transport import KubeTransport
from responder.enforce.backends import Evidence
from responder.enforce.identity import Identity, slice_devices
from responder.enforce.taint_rules import DRA, TaintRules
from responder.records import Quarantine
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.testing import ClusterHandle, running_cluster
from tests.responder.test_intake import alert

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterHandle]:
    # Speed 1: the scenario's first fault (30 s) is after every read here.
    with running_cluster("dra-extended-resource", speed=1.0) as handle:
        yield handle


@pytest.fixture
def client(cluster: ClusterHandle) -> Iterator[KubeClient]:
    kube = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
    try:
        yield kube
    finally:
        kube.close()


def _record(node: str, uuid: str) -> Quarantine:
    """The record a GPUDeviceFatalXid alert opens: it names the GPU by UUID, no driver label."""
    fired = alert("GPUDeviceFatalXid", node=node, device=uuid)
    decision = decide(None, fired, now=1_800_000_000.0, settings=IntakeSettings())
    assert isinstance(decision, Write)
    return replace(decision.record, uid="0f3c-record")  # as stored: it owns what is made for it


def _gpu0(client: KubeClient) -> tuple[str, str]:
    """(node, UUID) of gpu-dra-0's GPU 0, from its ResourceSlice."""
    for obj in client.list(RESOURCE_SLICE).items:
        for device in slice_devices(obj):
            if (device.node, device.device) == ("gpu-dra-0", "gpu-0"):
                return device.node, device.uuid
    raise AssertionError("gpu-dra-0/gpu-0 is in no ResourceSlice")


def _node_pods(client: KubeClient, node: str) -> list[dict[str, Any]]:
    return client.list(POD, field_selector=f"spec.nodeName={node}").items


def _identified(client: KubeClient) -> tuple[TaintRules, Quarantine, Identity | None]:
    node, uuid = _gpu0(client)
    record = _record(node, uuid)
    backend = TaintRules(client, None)
    slices = [d for obj in client.list(RESOURCE_SLICE).items for d in slice_devices(obj)]
    return (
        backend,
        record,
        backend.identify(record, Evidence(slices=slices, node=lambda: client.get(NODE, node))),
    )


def test_the_device_is_a_dra_device_a_check_reaches_through_a_claim(client: KubeClient) -> None:
    assert "nvidia.com/gpu" not in client.get(NODE, "gpu-dra-0")["status"]["allocatable"]
    backend, record, identity = _identified(client)
    assert identity is not None
    assert (identity.path, identity.driver, identity.pool, identity.device_name) == (
        DRA, "gpu.nvidia.com", "gpu-dra-0", "gpu-0",
    )  # fmt: skip
    record = replace(record, spec=identity.applied(record.spec))
    request = backend.device_request(record, "check", "gpuhealth-system")
    assert request.pod["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "check"}]
    ((_, template),) = request.objects
    wanted = template["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert wanted["count"] == 1
    assert wanted["selectors"] == [
        {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].uuid == "{identity.uuid}"'}}
    ]


def test_the_pod_on_the_device_is_found_through_the_special_claim(
    cluster: ClusterHandle, client: KubeClient
) -> None:
    backend, record, identity = _identified(client)
    assert identity is not None
    record = replace(record, spec=identity.applied(record.spec))
    pods = _node_pods(client, "gpu-dra-0")
    assert len(pods) > 1
    held = backend.holders(record, pods)
    assert len(held) == 1
    (holder,) = held
    # Written for device plugins: no claim of its own, the GPU through the scheduler's claim.
    assert "resourceClaims" not in holder["spec"]
    assert holder["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert "allocatedResourcesStatus" not in holder["status"]["containerStatuses"][0]
    special = holder["status"]["extendedResourceClaimStatus"]["resourceClaimName"]
    assert special.startswith(holder["metadata"]["name"] + "-extended-resources-")

    # The reservation cleared (what the claim controller does once the pod finishes): the name in
    # the pod's status still ties it to the device, and still no other pod.
    def unreserve(obj: dict[str, Any]) -> dict[str, Any]:
        obj["status"].pop("reservedFor", None)
        return obj

    cluster.call(
        lambda c: c.store.mutate(
            "resourceclaims.resource.k8s.io", special, "inference", unreserve, subresource="status"
        )
    )
    assert [p["metadata"]["name"] for p in backend.holders(record, pods)] == [holder["metadata"]["name"]]
