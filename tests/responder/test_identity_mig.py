"""A MIG card's identity on the device-plugin path (pure).

Aspects: a node that advertises only MIG resources (strategy mixed) is a device-plugin node; a
node advertising none is not; the partitions the evidence names are applied to the record, and a
pass whose evidence names none (a lost card lists no MIG devices) keeps the ones it knew.
"""

from __future__ import annotations

from responder.enforce.identity import Identity, resolve_capacity
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.records import QuarantineSpec

SPEC = QuarantineSpec(
    node="n1",
    device="GPU-card",
    path=DEVICE_PLUGIN,
    reason="Unhealthy",
    actor="alert/GPUDeviceUnhealthy",
    expires_at="2026-12-01T10:00:00Z",
    uuid="GPU-card",
)


def test_a_node_advertising_only_mig_resources_is_a_device_plugin_node() -> None:
    mixed = {"capacity": {"cpu": "8", "nvidia.com/mig-3g.40gb": "4"}}
    assert resolve_capacity(SPEC, mixed, DEVICE_PLUGIN) == Identity(DEVICE_PLUGIN, uuid="GPU-card")
    assert (
        resolve_capacity(SPEC, {"capacity": {"nvidia.com/mig-3g.40gb": "0", "cpu": "8"}}, DEVICE_PLUGIN)
        is None
    )
    assert resolve_capacity(SPEC, None, DEVICE_PLUGIN) is None


def test_partitions_are_applied_and_kept_through_a_pass_that_names_none() -> None:
    known = Identity(DEVICE_PLUGIN, uuid="GPU-card", partitions=("MIG-1", "MIG-2")).applied(SPEC)
    assert known.partitions == ("MIG-1", "MIG-2")
    lost = Identity(DEVICE_PLUGIN, uuid="GPU-card")
    assert lost.applied(known) == known and lost.of(known)
    assert not Identity(DEVICE_PLUGIN, uuid="GPU-card", partitions=("MIG-3",)).of(known)
