"""A MIG card on DRA as the responder names and reaches it (pure).

Aspects: the NVIDIA DRA driver publishes a MIG card as its MIG devices (each naming the card in
`parentUUID`) and not the card; a record of the card's UUID is identified as the card, a DRA
device with the names of its MIG devices in its pool as its partitions (sorted), whatever MIG
device name the alert carried, and only with the devices of its own node; a whole GPU is
identified as before, with no partitions. Its quarantine is one DeviceTaintRule per MIG device,
each named for the record and its place; a whole GPU's is one, named like the record. A check's
claim of a MIG card asks for all its MIG devices through the driver's MIG DeviceClass, by
`parentUUID`, tolerating gpuhealth's taints; a whole GPU's asks for one device by `uuid`.
"""

from __future__ import annotations

from dataclasses import replace

from gpuhealth.kube.slices import SliceDevice
from responder.enforce.identity import Identity, resolve_slice, slice_devices
from responder.enforce.taint_rules import DRA, MIG_DEVICE_CLASS, TaintRules, rule_devices
from responder.records import Quarantine, QuarantineSpec

CARD = "GPU-card"
NAMES = ("gpu-0-mig-3g40gb-9-0", "gpu-0-mig-3g40gb-9-4")
SPEC = QuarantineSpec(
    node="n1",
    device=CARD,
    path=DRA,
    reason="Unhealthy",
    actor="alert/GPUDeviceUnhealthy",
    expires_at="2026-12-01T10:00:00Z",
    uuid=CARD,
    driver="gpu.nvidia.com",
    pool="n1",
    device_name=NAMES[1],
)


def the_slice(node: str) -> dict:
    devices = [
        {
            "name": name,
            "attributes": {
                "type": {"string": "mig"},
                "uuid": {"string": f"MIG-{i}"},
                "parentUUID": {"string": CARD},
            },
        }
        for i, name in enumerate(reversed(NAMES))
    ]
    devices.append(
        {"name": "gpu-1", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-whole"}}}
    )
    return {
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node}, "devices": devices}
    }


def test_a_card_published_as_its_mig_devices_is_the_card_with_their_names_as_partitions() -> None:
    devices = [*slice_devices(the_slice("n1")), *slice_devices(the_slice("n2"))]
    assert SliceDevice("gpu.nvidia.com", "n1", NAMES[0], "n1", uuid="MIG-1", parent=CARD) in devices
    assert resolve_slice(SPEC, devices, DRA) == Identity(
        DRA, uuid=CARD, driver="gpu.nvidia.com", pool="n1", device_name=NAMES[0], partitions=NAMES
    )
    whole = replace(SPEC, device="GPU-whole", uuid="GPU-whole", device_name="gpu-1")
    assert resolve_slice(whole, devices, DRA) == Identity(
        DRA, uuid="GPU-whole", driver="gpu.nvidia.com", pool="n1", device_name="gpu-1"
    )
    assert resolve_slice(replace(SPEC, node="n3"), devices, DRA) is None


def test_a_mig_card_is_one_rule_per_mig_device_and_a_whole_gpu_one_rule() -> None:
    card = Quarantine(name="q-card", spec=replace(SPEC, partitions=NAMES), uid="u1")
    assert rule_devices(card) == [("q-card-0", NAMES[0]), ("q-card-1", NAMES[1])]
    whole = Quarantine(name="q-whole", spec=replace(SPEC, device_name="gpu-1"), uid="u2")
    assert rule_devices(whole) == [("q-whole", "gpu-1")]


def test_a_checks_claim_of_a_mig_card_asks_for_every_mig_device_of_it() -> None:
    backend = TaintRules(None, None)  # type: ignore[arg-type]  # building the template reads nothing
    card = Quarantine(name="q-card", spec=replace(SPEC, partitions=NAMES), uid="u1")
    template = backend.claim_template(card, "q-card-probe-1", "gpuhealth")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    exactly = request["exactly"]
    assert exactly["deviceClassName"] == MIG_DEVICE_CLASS == "mig.nvidia.com"
    assert exactly["allocationMode"] == "All" and "count" not in exactly
    assert exactly["selectors"] == [
        {"cel": {"expression": f'device.attributes["gpu.nvidia.com"].parentUUID == "{CARD}"'}}
    ]
    assert {t["key"] for t in exactly["tolerations"]} == {"gpuhealth.io/quarantine", "gpuhealth.io/canary"}
    whole = Quarantine(name="q-whole", spec=replace(SPEC, device_name="gpu-1"), uid="u2")
    (plain,) = backend.claim_template(whole, "q-whole-probe-1", "gpuhealth")["spec"]["spec"]["devices"][
        "requests"
    ]
    assert (plain["exactly"]["deviceClassName"], plain["exactly"]["count"]) == ("gpu.nvidia.com", 1)
