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
controller-manager runs the device-taint-eviction controller on both versions.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.resources import POD, RESOURCE_CLAIM
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import discover
from responder.reconcile.policy import CANARY_TAINT, QUARANTINE_TAINT, Enforce
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import DEPLOY, NAMESPACE
from tests.support.controlplane import (
    admin,
    allocated_device,
    as_service_account,
    claim_spec,
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
