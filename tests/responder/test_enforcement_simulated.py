"""Enforcement in the simulated cluster (responder.enforce.shipped).

Aspects: the served DeviceTaintRule version is discovered; a DRA quarantine is one rule owned
by its record, selecting driver/pool/device, with the quarantine taint (NoSchedule, or None
in dry-run), switched to the canary taint and back, deleted on release, and repeated calls
change nothing; a rule of that name the record does not own is never touched; a device-plugin
quarantine is an entry in the node annotation, other annotations and devices untouched, no
taint and no cordon; its ramp moves the entry to the ramp annotation with the bound of opted-in
pods, a failure on the ramp moves it back and the release lifts both; `present` tells what is
there; beside the NVIDIA DRA driver's own slice taints our rule is a rule of its own, and lifting
it writes nothing to the driver's slice.
there; a MIG card is listed as its partitions (each one unit of the node's GPU resource), taking
the place of the card's own entry, ramps and lifts as a whole, is held by the pods on any
partition and is checked through all of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import NODE, RESOURCE_SLICE, Resource
from gpuhealth.kube.transport import KubeTransport
from responder.enforce.node_annotation import NODE_ANNOTATION, RAMP_ANNOTATION
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import NotOurs, NotServed, discover
from responder.reconcile.policy import CANARY_TAINT, QUARANTINE_TAINT, Enforce
from responder.records import QUARANTINES, Quarantine, from_object, to_object
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.apiserver.versions import KubernetesVersion
from tests.responder.test_intake import alert
from tests.simulator.conftest import ServedCluster
from tests.support.backends import identified

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)


@pytest.fixture
def client(tmp_path: Path) -> Iterator[KubeClient]:
    served = ServedCluster(tmp_path / "kubeconfig")
    kube = KubeClient(KubeTransport(api_client(str(served.kubeconfig))))
    kube.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
    kube.create(
        NODE,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-node-1", "annotations": {"team": "ml"}},
        },
    )
    try:
        yield kube
    finally:
        kube.close()
        served.stop()


def stored(client: KubeClient, **labels: str) -> Quarantine:
    decision = decide(None, alert(**labels), now=1_800_000_000.0, settings=IntakeSettings())
    assert isinstance(decision, Write)
    obj = to_object(identified(decision.record))
    obj.pop("status")
    return from_object(client.create(QUARANTINES, obj))


DRA_LABELS = {
    "device": "gpu.nvidia.com/gpu-node-1/gpu-3",
    "driver": "gpu.nvidia.com",
    "pool": "gpu-node-1",
    "device_name": "gpu-3",
}


def test_a_dra_quarantine_is_one_rule_owned_by_its_record(client: KubeClient) -> None:
    rules = discover(client)
    assert rules is not None and rules.version == "v1"
    enforcer = Enforcer(client, rules)
    record = stored(client, **DRA_LABELS)
    assert not enforcer.present(record)
    enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))  # idempotent
    rule: dict[str, Any] = client.get(rules, record.name)
    assert rule["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com",
        "pool": "gpu-node-1",
        "device": "gpu-3",
    }
    taint = rule["spec"]["taint"]
    assert (taint["key"], taint["value"], taint["effect"]) == (QUARANTINE_TAINT, "Unhealthy", "NoSchedule")
    assert rule["metadata"]["ownerReferences"][0]["uid"] == record.uid
    version = rule["metadata"]["resourceVersion"]
    assert enforcer.present(record)

    enforcer.enforce(record, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))
    ramp = client.get(rules, record.name)
    assert ramp["spec"]["taint"]["key"] == CANARY_TAINT and ramp["metadata"]["resourceVersion"] != version
    # Present as the phase wants it only with that taint: the ramp's, not the quarantine's.
    assert enforcer.present(record, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))
    assert not enforcer.present(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.unenforce(record)
    enforcer.unenforce(record)  # idempotent
    assert not enforcer.present(record)


def test_dry_run_writes_effect_none(client: KubeClient) -> None:
    rules = discover(client)
    enforcer = Enforcer(client, rules)
    record = stored(client, **DRA_LABELS)
    enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "None"))
    assert rules is not None and client.get(rules, record.name)["spec"]["taint"]["effect"] == "None"


def test_a_rule_the_record_does_not_own_is_left_alone(client: KubeClient) -> None:
    rules = discover(client)
    assert rules is not None
    record = stored(client, **DRA_LABELS)
    foreign = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": record.name},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com"},
            "taint": {"key": "ops/maintenance", "effect": "NoSchedule"},
        },
    }
    client.create(rules, foreign)
    enforcer = Enforcer(client, rules)
    assert not enforcer.present(record)
    with pytest.raises(NotOurs):
        enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    with pytest.raises(NotOurs):
        enforcer.unenforce(record)
    assert client.get(rules, record.name)["spec"]["taint"]["key"] == "ops/maintenance"


def test_a_device_plugin_quarantine_is_a_node_annotation_entry_only(client: KubeClient) -> None:
    enforcer = Enforcer(client, discover(client))
    first = stored(client, device="GPU-aaaa")
    second = stored(client, device="GPU-bbbb")
    enforcer.enforce(first, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.enforce(second, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.enforce(second, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    node = client.get(NODE, "gpu-node-1")
    assert node["metadata"]["annotations"] == {"team": "ml", NODE_ANNOTATION: '["GPU-aaaa","GPU-bbbb"]'}
    spec = node.get("spec") or {}
    assert not spec.get("taints") and not spec.get("unschedulable")
    assert enforcer.present(first) and enforcer.present(second)
    enforcer.unenforce(first)
    assert not enforcer.present(first) and enforcer.present(second)
    enforcer.unenforce(second)
    assert client.get(NODE, "gpu-node-1")["metadata"]["annotations"] == {"team": "ml"}


def test_a_device_plugin_ramp_moves_the_entry_to_the_ramp_annotation_with_its_bound(
    client: KubeClient,
) -> None:
    enforcer = Enforcer(client, discover(client), ramp_pods=2)
    first = stored(client, device="GPU-aaaa")
    second = stored(client, device="GPU-bbbb")
    for record in (first, second):
        enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.enforce(first, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.enforce(first, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))  # no change
    annotations = client.get(NODE, "gpu-node-1")["metadata"]["annotations"]
    assert annotations == {"team": "ml", NODE_ANNOTATION: '["GPU-bbbb"]', RAMP_ANNOTATION: '{"GPU-aaaa":2}'}
    assert enforcer.present(first) and enforcer.present(second)
    # As the phase wants it: the ramp with its bound, the other still quarantined.
    ramp, quarantine = (Enforce(key, "Unhealthy", "NoSchedule") for key in (CANARY_TAINT, QUARANTINE_TAINT))
    assert enforcer.present(first, ramp) and not enforcer.present(first, quarantine)
    assert enforcer.present(second, quarantine) and not enforcer.present(second, ramp)
    assert not Enforcer(client, discover(client), ramp_pods=1).present(first, ramp)  # another bound
    # A failure on the ramp: back to the quarantine list, the ramp annotation gone with its last entry.
    enforcer.enforce(first, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    annotations = client.get(NODE, "gpu-node-1")["metadata"]["annotations"]
    assert annotations == {"team": "ml", NODE_ANNOTATION: '["GPU-aaaa","GPU-bbbb"]'}
    # Ramp again, then the release lifts the device from wherever it is listed.
    enforcer.enforce(first, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))
    enforcer.unenforce(first)
    enforcer.unenforce(second)
    assert client.get(NODE, "gpu-node-1")["metadata"]["annotations"] == {"team": "ml"}
    assert not enforcer.present(first)
    # Dry-run writes nothing on this path, the ramp included.
    enforcer.enforce(first, Enforce(CANARY_TAINT, "Unhealthy", "None"))
    assert client.get(NODE, "gpu-node-1")["metadata"]["annotations"] == {"team": "ml"}


def test_a_mig_card_is_quarantined_as_all_its_partitions(client: KubeClient) -> None:
    enforcer = Enforcer(client, discover(client))
    bare = stored(client, device="GPU-cccc")
    enforcer.enforce(bare, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))  # partitions not known yet
    card = from_object(
        client.update(
            QUARANTINES, to_object(replace(bare, spec=replace(bare.spec, partitions=("MIG-1", "MIG-2"))))
        )
    )
    assert card.spec.partitions == ("MIG-1", "MIG-2")  # the CRD keeps them
    quarantine = Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule")
    assert not enforcer.present(card, quarantine)
    enforcer.enforce(card, quarantine)
    annotations = client.get(NODE, "gpu-node-1")["metadata"]["annotations"]
    assert annotations == {"team": "ml", NODE_ANNOTATION: '["MIG-1","MIG-2"]'}
    assert enforcer.present(card, quarantine)
    enforcer.enforce(card, Enforce(CANARY_TAINT, "Unhealthy", "NoSchedule"))
    annotations = client.get(NODE, "gpu-node-1")["metadata"]["annotations"]
    assert annotations == {"team": "ml", RAMP_ANNOTATION: '{"MIG-1":1,"MIG-2":1}'}
    enforcer.unenforce(card)
    assert client.get(NODE, "gpu-node-1")["metadata"]["annotations"] == {"team": "ml"}
    backend = enforcer.of(card)

    def on(name: str, rid: str) -> dict[str, Any]:
        entry = {"name": "nvidia.com/gpu", "resources": [{"resourceID": rid, "health": "Healthy"}]}
        return {
            "metadata": {"name": name},
            "status": {"containerStatuses": [{"allocatedResourcesStatus": [entry]}]},
        }

    pods = [on("a", "MIG-2"), on("b", "MIG-9"), on("c", "GPU-cccc")]
    assert [p["metadata"]["name"] for p in backend.holders(card, pods)] == ["a", "c"]
    env = {e["name"]: e["value"] for e in backend.device_request(card, "probe", "gpuhealth").container["env"]}
    # The node's MIG strategy unknown (no GPU feature discovery label): the runtime's route.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-1,MIG-2"
    # Strategy single: every partition is one nvidia.com/gpu, so the check asks the kubelet for
    # as many as the card has (with the hold stepped aside they are the only free ones).
    node = client.get(NODE, "gpu-node-1")
    node["metadata"].setdefault("labels", {})["nvidia.com/mig.strategy"] = "single"
    client.update(NODE, node)
    assert backend.through_kubelet(card)
    request = backend.device_request(card, "probe", "gpuhealth").container
    assert request["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in request["env"]}
    # Strategy mixed: the partitions are nvidia.com/mig-<profile> units. With a profile unknown
    # the check cannot name them: the runtime's route.
    node = client.get(NODE, "gpu-node-1")
    node["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    client.update(NODE, node)
    assert not backend.through_kubelet(card)
    partial = replace(card, spec=replace(card.spec, profiles=(("MIG-1", "3g.40gb"),)))
    assert not backend.through_kubelet(partial)
    # Every profile known (NVML's, kept by the CRD): the kubelet's route, as many units of each
    # profile's resource as the card has.
    profiled = from_object(
        client.update(
            QUARANTINES,
            to_object(
                replace(card, spec=replace(card.spec, profiles=(("MIG-1", "3g.40gb"), ("MIG-2", "3g.40gb"))))
            ),
        )
    )
    assert profiled.spec.profiles == (("MIG-1", "3g.40gb"), ("MIG-2", "3g.40gb"))
    assert backend.through_kubelet(profiled)
    request = backend.device_request(profiled, "probe", "gpuhealth").container
    assert request["resources"]["requests"] == {"nvidia.com/mig-3g.40gb": "2"}
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in request["env"]}
    mixed = replace(
        profiled, spec=replace(profiled.spec, profiles=(("MIG-1", "4g.40gb"), ("MIG-2", "3g.40gb")))
    )
    units = backend.device_request(mixed, "probe", "gpuhealth").container["resources"]["limits"]
    assert units == {"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-4g.40gb": "1"}


@pytest.mark.parametrize(
    ("gates", "expected"),
    [({"DRADeviceTaintRules": True}, "v1beta2"), ({}, None)],
)
def test_the_served_version_is_discovered_on_1_36(
    tmp_path: Path, gates: dict[str, bool], expected: str | None
) -> None:
    served = ServedCluster(tmp_path / "kubeconfig", kubernetes_version=KubernetesVersion("1.36", gates))
    kube = KubeClient(KubeTransport(api_client(str(served.kubeconfig))))
    try:
        rules = discover(kube)
        assert (rules.version if rules else None) == expected
        if rules is None:
            record = Quarantine(name="q", uid="u", spec=opened_spec())
            with pytest.raises(NotServed, match="serves no DeviceTaintRule version"):
                Enforcer(kube, rules).enforce(record, Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule"))
    finally:
        kube.close()
        served.stop()


def opened_spec() -> Any:
    decision = decide(None, alert(**DRA_LABELS), now=1_800_000_000.0, settings=IntakeSettings())
    assert isinstance(decision, Write)
    return identified(decision.record).spec


def nvidia_slice(taints: list[dict[str, str]]) -> dict[str, Any]:
    """gpu-node-1's slice as the NVIDIA DRA driver publishes it, its gpu-3 tainted by the driver."""
    devices = []
    for i in range(4):
        device: dict[str, Any] = {"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i:04d}"}}}
        if i == 3:
            device["taints"] = taints
        devices.append(device)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "gpu-node-1-gpu.nvidia.com-x7k2p"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "gpu-node-1",
            "pool": {"name": "gpu-node-1", "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def test_our_rule_coexists_with_the_drivers_taints_and_lifting_it_leaves_theirs(client: KubeClient) -> None:
    """The NVIDIA DRA driver taints the slice device itself and never lifts its taint: our
    quarantine is a rule of its own beside it, and the release deletes only that rule."""
    driver_taints = [
        {
            "key": "gpu.nvidia.com/xid",
            "value": "48",
            "effect": "NoSchedule",
            "timeAdded": "2027-01-15T08:00:00Z",
        },
        {"key": "gpu.nvidia.com/unmonitored", "effect": "None", "timeAdded": "2027-01-15T08:00:00Z"},
    ]
    published = client.create(RESOURCE_SLICE, nvidia_slice(driver_taints))
    rules = discover(client)
    assert rules is not None
    enforcer = Enforcer(client, rules)
    record = stored(client, **DRA_LABELS)
    enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "FatalXid", "NoSchedule"))
    enforcer.enforce(record, Enforce(CANARY_TAINT, "FatalXid", "NoSchedule"))
    assert enforcer.present(record, Enforce(CANARY_TAINT, "FatalXid", "NoSchedule"))
    enforcer.unenforce(record)
    assert not enforcer.present(record)
    assert client.list(rules).items == []
    # The driver's slice is as it published it: not one write of ours reached it.
    after = client.get(RESOURCE_SLICE, published["metadata"]["name"])
    assert after["metadata"]["resourceVersion"] == published["metadata"]["resourceVersion"]
    assert after["spec"]["devices"][3]["taints"] == driver_taints
