"""The real kube-scheduler and our DeviceTaintRule, on 1.37 (resource.k8s.io/v1) and 1.36
(v1beta2 behind DRADeviceTaintRules).

Aspects: a Node and a ResourceSlice of four devices as a kubelet and a DRA driver publish
them; the responder's own enforcement code, acting as the responder's ServiceAccount (a
TokenRequest token, the shipped RBAC), writes the DeviceTaintRule for a quarantine record of
one device, in the version the cluster serves. The scheduler allocates the three other devices
to three claims and leaves a fourth claim unallocated (its pod unschedulable) rather than use
the tainted device; on the ramp (the rule's taint turned canary) a claim with the shipped opt-in
template's tolerations gets the device while the plain one still does not; once the enforcement
is lifted, a new claim gets that device. The
controller-manager runs the device-taint-eviction controller on both versions. On 1.37 a
DeviceClass with `extendedResourceName` (KEP-5004, GA) serves pods that request that extended
resource: the scheduler writes the special claim (annotated, owned by the pod, its request named
in the pod's `status.extendedResourceClaimStatus`), never with the device behind our rule, and
the responder's DRA backend finds each pod on its device through that claim.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.resources import POD, RESOURCE_CLAIM
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import TaintRules, discover
from responder.reconcile.policy import CANARY_TAINT, QUARANTINE_TAINT, Enforce
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import DEPLOY, NAMESPACE
from tests.support.controlplane import (
    DEVICE_CLASS,
    admin,
    allocated_device,
    as_service_account,
    claim_spec,
    dra_quarantine,
    dra_record,
    namespace_ready,
    pod_with_claim,
    publish_devices,
    ready_node,
    unschedulable,
    wait_for_object,
)

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

TIMEOUT = 60.0
OPT_IN = DEPLOY / "opt-in" / "canary-ok.yaml"


def _claim_and_pod(client: KubeClient, namespace: str, name: str, node: str, device_class: str) -> None:
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": claim_spec(device_class),
    }
    client.create(RESOURCE_CLAIM, claim)
    client.create(POD, pod_with_claim(namespace, name, node, {"resourceClaimName": name}))


def _opted_in_claim_and_pod(
    client: KubeClient, namespace: str, name: str, node: str, device_class: str
) -> None:
    """A claim whose request carries the tolerations of the shipped opt-in template."""
    shipped = next(d for d in yaml.safe_load_all(OPT_IN.read_text()) if d["kind"] == "ResourceClaimTemplate")
    tolerations = shipped["spec"]["spec"]["devices"]["requests"][0]["exactly"]["tolerations"]
    spec = claim_spec(device_class)
    spec["devices"]["requests"][0]["exactly"]["tolerations"] = tolerations
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
    client.create(RESOURCE_CLAIM, claim)
    client.create(POD, pod_with_claim(namespace, name, node, {"resourceClaimName": name}))


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


@pytest.fixture
def responder(request: pytest.FixtureRequest) -> Iterator[tuple[ControlPlane, KubeClient, KubeClient]]:
    plane: ControlPlane = request.getfixturevalue(request.param)
    client = admin(plane)
    account = as_service_account(plane, client, NAMESPACE, "gpuhealth-responder")
    try:
        yield plane, client, account
    finally:
        account.close()
        client.close()


@pytest.mark.parametrize("responder", ["installed", "installed_136"], indirect=True)
def test_the_scheduler_never_allocates_a_device_behind_our_device_taint_rule(
    responder: tuple[ControlPlane, KubeClient, KubeClient],
) -> None:
    plane, client, account = responder
    minor = plane.settings.kubernetes.replace(".", "")
    node, namespace = f"dra-{minor}", f"tenant-dra-{minor}"
    ready_node(client, node)
    device_class, devices = publish_devices(client, node, f"gpu.dra{minor}.gpuhealth.test", 4)
    namespace_ready(client, namespace)

    # The controller that would evict pods from a device under a NoExecute rule runs too.
    started = 'controller="device-taint-eviction-controller"'
    assert started in plane.log_path("kube-controller-manager").read_text()
    rules = discover(account)
    assert rules is not None and rules.version == plane.version.taint_rule_version
    enforcer = Enforcer(account, rules)
    record = dra_record(client, node, device_class, "gpu-1")
    enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "xid-79", "NoSchedule"))
    assert enforcer.present(record)

    for i in range(3):
        _claim_and_pod(client, namespace, f"work-{i}", node, device_class)
    allocated = sorted(_allocated(client, namespace, f"work-{i}") for i in range(3))
    assert allocated == ["gpu-0", "gpu-2", "gpu-3"]

    # A fourth claim: only the tainted device is free, and the scheduler will not use it.
    _claim_and_pod(client, namespace, "work-3", node, device_class)
    pod = wait_for_object(
        client,
        POD,
        "work-3",
        namespace=namespace,
        until=lambda p: unschedulable(p) is not None,
        what="the scheduler to find work-3 unschedulable",
        timeout=TIMEOUT,
    )
    assert not pod["spec"].get("nodeName")
    assert allocated_device(client.get(RESOURCE_CLAIM, "work-3", namespace=namespace)) is None

    # The ramp: the rule's taint turns canary. The plain claim work-3, retried on the rule's change,
    # still may not have the device; a claim as the shipped opt-in template makes it (its request
    # tolerates gpuhealth.io/canary) gets it.
    ramp = Enforce(CANARY_TAINT, "xid-79", "NoSchedule")
    enforcer.enforce(record, ramp)
    assert enforcer.present(record, ramp)
    _opted_in_claim_and_pod(client, namespace, "opted-in", node, device_class)
    assert _allocated(client, namespace, "opted-in") == "gpu-1"
    assert allocated_device(client.get(RESOURCE_CLAIM, "work-3", namespace=namespace)) is None
    client.delete(POD, "opted-in", namespace=namespace, grace_period_seconds=0)
    client.delete(RESOURCE_CLAIM, "opted-in", namespace=namespace)

    # Released: the rule goes, and the device can be allocated again.
    client.delete(POD, "work-3", namespace=namespace)
    enforcer.unenforce(record)
    assert not enforcer.present(record)
    _claim_and_pod(client, namespace, "work-4", node, device_class)
    assert _allocated(client, namespace, "work-4") == "gpu-1"
    assert devices == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


EXTENDED = "gpu.ext137.gpuhealth.test/gpu"
"""The extended resource a DeviceClass maps here (not `nvidia.com/gpu`: a DeviceClass's
extendedResourceName is cluster-wide, and the session's control plane is shared)."""


def _extended_pod(namespace: str, name: str, node: str) -> dict[str, object]:
    """A pod written for device plugins: one GPU as an extended resource request, no claim."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example/serve:1.0",
                    "resources": {"requests": {EXTENDED: "1"}, "limits": {EXTENDED: "1"}},
                }
            ],
        },
    }


@pytest.mark.parametrize("responder", ["installed"], indirect=True)
def test_the_scheduler_serves_an_extended_resource_through_dra_and_honours_our_rule(
    responder: tuple[ControlPlane, KubeClient, KubeClient],
) -> None:
    """KEP-5004 on 1.37 (GA): the scheduler's special claim, its record in the pod's status, our
    DeviceTaintRule keeping the quarantined device out of it, and the responder's backend finding
    the pod on its device through that claim."""
    _, client, account = responder
    node, namespace = "ext-137", "tenant-ext-137"
    ready_node(client, node)  # its allocatable has none of EXTENDED: only DRA can serve it
    device_class, _ = publish_devices(client, node, "gpu.ext137.gpuhealth.test", 4)
    client.patch(DEVICE_CLASS, device_class, {"spec": {"extendedResourceName": EXTENDED}})
    namespace_ready(client, namespace)
    rules = discover(account)
    assert rules is not None
    enforcer = Enforcer(account, rules)
    enforcer.enforce(
        dra_record(client, node, device_class, "gpu-1"), Enforce(QUARANTINE_TAINT, "xid-79", "NoSchedule")
    )

    served = []
    for i in range(3):
        client.create(POD, _extended_pod(namespace, f"serve-{i}", node))
    for i in range(3):
        pod = wait_for_object(
            client,
            POD,
            f"serve-{i}",
            namespace=namespace,
            until=lambda p: bool((p.get("status") or {}).get("extendedResourceClaimStatus")),
            what=f"the scheduler to serve serve-{i} through a special claim",
            timeout=TIMEOUT,
        )
        status = pod["status"]["extendedResourceClaimStatus"]
        (mapping,) = status["requestMappings"]
        assert (mapping["containerName"], mapping["resourceName"]) == ("server", EXTENDED)
        claim = wait_for_object(
            client,
            RESOURCE_CLAIM,
            status["resourceClaimName"],
            namespace=namespace,
            until=lambda c: allocated_device(c) is not None,
            what=f"the special claim of serve-{i} to be allocated",
            timeout=TIMEOUT,
        )
        meta = claim["metadata"]
        assert meta["annotations"]["resource.kubernetes.io/extended-resource-claim"] == "true"
        assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert result["request"] == mapping["requestName"]
        served.append((pod, result["device"]))
    assert sorted(device for _, device in served) == ["gpu-0", "gpu-2", "gpu-3"]

    # A fourth pod: only the quarantined device is left, and the scheduler will not use it.
    client.create(POD, _extended_pod(namespace, "serve-3", node))
    wait_for_object(
        client,
        POD,
        "serve-3",
        namespace=namespace,
        until=lambda p: unschedulable(p) is not None,
        what="the scheduler to find serve-3 unschedulable",
        timeout=TIMEOUT,
    )

    # The responder's backend finds the pod on a device through its special claim, and only it.
    node_pods = client.list(POD, namespace=namespace).items
    backend = TaintRules(account, rules)
    for pod, device in served:
        record = dra_quarantine(node, device_class, device)
        holders = backend.holders(record, node_pods)
        assert [h["metadata"]["name"] for h in holders] == [pod["metadata"]["name"]]
