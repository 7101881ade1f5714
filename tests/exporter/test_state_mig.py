"""MIG cards in the exporter: a partition's health and pods belong to its card.

Aspects covered: in node mode, pods on the partitions of one card (device IDs are MIG UUIDs) are
held on the card once NVML lists the partitions under it, whichever came first (a partition
held before NVML named its card is superseded, never left behind as a device of its own); the
card reads as its worst partition; an idle MIG card the kubelet does not offer every partition
of reads Unhealthy, offered whole Healthy, under either of the plugin's strategies' resource
names; the partitions are exported as `gpu_nvml_mig_device_info` on the card's device; cluster
mode (no NVML) cannot tell a partition's card and keeps the partition as its own device.
"""

from __future__ import annotations

from exporter.exposition import render_metrics
from exporter.podresources import GPU_RESOURCE, Allocatable
from exporter.snapshot import SOURCE_NVML, SOURCE_POD
from exporter.state import POD_RESOURCES_UNLISTED, DeviceStateStore
from gpuhealth.clock import ManualClock
from gpuhealth.nvml import DeviceReading, MigDevice
from tests.exporter.fixtures.builders import container, gpu_uuid, pod, resource

CARD, OTHER = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
M0, M1, M2 = (f"MIG-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(3))
PARTS = tuple(
    MigDevice(uuid=m, gpu_instance_id=1 + i, compute_instance_id=0, profile="1g.10gb")
    for i, m in enumerate((M0, M1, M2))
)
READINGS = [
    DeviceReading(uuid=CARD, index=0, reachable=True, mig_devices=PARTS),
    DeviceReading(uuid=OTHER, index=1, reachable=True),
]


def _node_store(clock: ManualClock) -> DeviceStateStore:
    return DeviceStateStore(clock, node_name="node-1", nvml=True)


def _on_partition(name: str, mig: str, health: str = "Healthy") -> dict[str, object]:
    return pod(name, container("main", (GPU_RESOURCE, [resource(mig, health)])))


def test_pods_on_a_cards_partitions_are_held_on_the_card(clock: ManualClock) -> None:
    store = _node_store(clock)
    store.apply_nvml(READINGS, [])
    store.apply_pod("ADDED", _on_partition("a", M0))
    store.apply_pod("ADDED", _on_partition("b", M2))
    devices = store.snapshot().devices
    card = devices[("node-1", CARD)]
    assert (card.health, card.source, card.uuid) == ("Healthy", SOURCE_POD, CARD)
    assert sorted(a.pod for a in card.allocations) == ["a", "b"]
    assert not any(key[1].startswith("MIG-") for key in devices)


def test_a_partition_held_before_nvml_named_its_card_moves_to_the_card(clock: ManualClock) -> None:
    store = _node_store(clock)
    store.apply_pod("ADDED", _on_partition("a", M1))
    assert ("node-1", M1) in store.snapshot().devices  # nothing says yet which card it is on
    store.apply_nvml(READINGS, [])
    devices = store.snapshot().devices
    assert ("node-1", M1) not in devices
    assert [a.pod for a in devices[("node-1", CARD)].allocations] == ["a"]


def test_the_card_reads_as_its_worst_partition(clock: ManualClock) -> None:
    store = _node_store(clock)
    store.apply_nvml(READINGS, [])
    store.apply_pod("ADDED", _on_partition("a", M0, "Healthy"))
    store.apply_pod("ADDED", _on_partition("b", M1, "Unhealthy"))
    assert store.snapshot().devices[("node-1", CARD)].health == "Unhealthy"


def test_an_idle_card_is_offered_only_as_all_its_partitions(clock: ManualClock) -> None:
    store = _node_store(clock)
    mixed = "nvidia.com/mig-1g.10gb"  # the mixed strategy's resource: the same partitions
    store.apply_pod_resources(Allocatable({mixed: frozenset({M0, M1, M2}), GPU_RESOURCE: frozenset({OTHER})}))
    store.apply_nvml(READINGS, [])
    health = {k[1]: (d.health, d.source, d.message) for k, d in store.snapshot().devices.items()}
    assert health[CARD][:2] == ("Healthy", SOURCE_NVML)
    clock.advance(5)
    store.apply_pod_resources(Allocatable({mixed: frozenset({M0, M2}), GPU_RESOURCE: frozenset({OTHER})}))
    card = store.snapshot().devices[("node-1", CARD)]
    assert (card.health, card.message) == ("Unhealthy", POD_RESOURCES_UNLISTED)
    assert store.snapshot().devices[("node-1", OTHER)].health == "Healthy"


def test_the_partitions_are_exported_on_the_cards_device(clock: ManualClock) -> None:
    store = _node_store(clock)
    store.apply_nvml(READINGS, [])
    text = render_metrics(store.snapshot(), clock.now()).decode()
    lines = [line for line in text.splitlines() if line.startswith("gpu_nvml_mig_device_info{")]
    assert lines == [
        f'gpu_nvml_mig_device_info{{node="node-1",device="{CARD}",mig_uuid="{m.uuid}",'
        f'gpu_instance_id="{m.gpu_instance_id}",profile="1g.10gb"}} 1'
        for m in PARTS
    ]


def test_cluster_mode_keeps_a_partition_as_its_own_device(clock: ManualClock) -> None:
    store = DeviceStateStore(clock)
    store.apply_pod("ADDED", _on_partition("a", M0, "Unhealthy"))
    device = store.snapshot().devices[("node-1", M0)]
    assert (device.health, device.uuid) == ("Unhealthy", M0)
