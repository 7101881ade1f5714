"""A sharded cluster-mode exporter's state: the same events, split by node across M shards.

Aspects covered: fed the same lists and watch events (device-plugin and DRA nodes, claims,
slices, Leases, Nodes, health producer pods, a Pending pod that is later bound, a deleted pod),
three shards' expositions together hold exactly the unsharded exposition's device and node
series, each device and each node in one shard only; a Pending pod is kept by no shard (it holds
nothing yet) and lands in its node's shard when bound; claims and slices of no single node reach
every shard; after the shard count goes from 2 to 3 and the shards restart from their device
directories, no shard restores a node it no longer owns, and after the relist the shards again
cover every device exactly once; the exporter's self metrics say which shard it is.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from exporter.directory import Directory, open_store
from exporter.exposition import render_metrics
from exporter.observer import persist
from exporter.self_metrics import ExporterMetrics
from exporter.sharding import Shard, shard_of
from exporter.state import (
    CLAIMS,
    LEASES,
    NODES,
    PODS,
    SLICES,
    DeviceStateStore,
    in_shard,
    producer_resource,
)
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import (
    DRIVER,
    claim,
    container,
    gpu_uuid,
    lease,
    plugin_pod,
    pod,
    resource,
    slice_,
)

NODE_NAMES = [f"gpu-node-{i:02d}" for i in range(12)]
PRODUCERS = producer_resource(DRIVER)
Sample = tuple[str, frozenset[tuple[str, str]]]


def node_object(name: str, capacity: int, allocatable: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "capacity": {"nvidia.com/gpu": str(capacity)},
            "allocatable": {"nvidia.com/gpu": str(allocatable)},
        },
    }


def pending(name: str) -> dict[str, Any]:
    unbound = pod(name, container("main"), uid=f"uid-{name}")
    del unbound["spec"]["nodeName"]
    return unbound


def network_slice() -> dict[str, Any]:
    """A slice of devices reachable from many nodes (no `spec.nodeName`)."""
    shared = slice_("fabric", "unused", {"nic-0": None}, driver="net.example.com", pool="fabric")
    del shared["spec"]["nodeName"]
    return shared


def fleet_lists() -> dict[str, list[dict[str, Any]]]:
    """Even nodes: device-plugin GPUs held by a pod; odd nodes: DRA GPUs, one held through a claim."""
    lists: dict[str, list[dict[str, Any]]] = {CLAIMS: [], SLICES: [network_slice()], LEASES: [], NODES: []}
    lists[PRODUCERS], lists[PODS] = [], [pending("queued")]
    for i, node in enumerate(NODE_NAMES):
        lists[LEASES].append(lease(node))
        u0, u1 = gpu_uuid(node, 0), gpu_uuid(node, 1)
        if i % 2 == 0:
            lists[NODES].append(node_object(node, 2, 1))
            health = "Unhealthy" if i % 4 == 0 else "Healthy"
            group = ("nvidia.com/gpu", [resource(u0, health, "XID 79"), resource(u1)])
            lists[PODS].append(pod(f"serve-{i}", container("main", group), node=node, uid=f"u-serve-{i}"))
            continue
        taints = {"gpu-1": [{"key": "gpu.nvidia.com/xid", "value": "48", "effect": "NoSchedule"}]}
        lists[SLICES].append(slice_(f"{node}-gpus", node, {"gpu-0": u0, "gpu-1": u1}, taints=taints))
        lists[CLAIMS].append(claim(f"train-{i}", [("gpus", DRIVER, node, "gpu-0")]))
        lists[PRODUCERS].append(plugin_pod(i % 3 != 0, 1_799_999_000.0, name=f"plugin-{i}", node=node))
        group = ("claim:gpus", [resource(f"{DRIVER}/{node}/gpu-0", "Healthy")])
        lists[PODS].append(
            pod(
                f"train-{i}",
                container("worker", group),
                node=node,
                uid=f"u-train-{i}",
                claim_statuses={"gpus": f"train-{i}"},
            )
        )
    return lists


def watch_events() -> list[tuple[str, str, dict[str, Any]]]:
    """After the lists: a health change, the Pending pod bound with a GPU, a pod deleted."""
    node = NODE_NAMES[2]
    changed = (
        "nvidia.com/gpu",
        [resource(gpu_uuid(node, 0), "Unhealthy", "XID 79"), resource(gpu_uuid(node, 1))],
    )
    bound = pod(
        "queued",
        container("main", ("nvidia.com/gpu", [resource(gpu_uuid(NODE_NAMES[7], 5), "Healthy")])),
        node=NODE_NAMES[7],
        uid="uid-queued",
        rv=2,
    )
    return [
        (PODS, "MODIFIED", pod("serve-2", container("main", changed), node=node, uid="u-serve-2", rv=2)),
        (PODS, "MODIFIED", bound),
        (PODS, "DELETED", pod("serve-6", container("main"), node=NODE_NAMES[6], uid="u-serve-6", rv=3)),
    ]


def feed(store: DeviceStateStore) -> DeviceStateStore:
    for resource_name, items in fleet_lists().items():
        store.relist(resource_name, items)
    for resource_name, event_type, obj in watch_events():
        store.apply_event(resource_name, event_type, obj)
    return store


def samples(store: DeviceStateStore, clock: ManualClock) -> dict[Sample, float]:
    """Every sample of the store's exposition that names a node (device and node series)."""
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(render_metrics(store.snapshot(), clock.now()).decode()):
        for s in family.samples:
            if "node" in s.labels:
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def owners(stores: Iterable[DeviceStateStore]) -> Iterator[tuple[str, str]]:
    for store in stores:
        yield from store.snapshot().devices


def assert_partition(
    shards: list[DeviceStateStore],
    whole: DeviceStateStore,
    clock: ManualClock,
    *,
    moved: AbstractSet[str] = frozenset(),
    fresh: DeviceStateStore | None = None,
) -> None:
    """The shards' series are the unsharded exporter's, each in one shard; a node in `moved`
    (new to its shard) reads as it does to `fresh`, an exporter that starts with no directory."""
    parts = [samples(s, clock) for s in shards]
    union: dict[Sample, float] = {}
    for part in parts:
        assert not union.keys() & part.keys(), "a series in two shards"
        union.update(part)
    expected = samples(whole, clock)
    if fresh is not None:
        first_seen = samples(fresh, clock)
        expected = {k: first_seen[k] if dict(k[1])["node"] in moved else v for k, v in expected.items()}
    assert union == expected
    keys = list(owners(shards))
    assert len(keys) == len(set(keys)) and set(keys) == set(whole.snapshot().devices)
    for index, store in enumerate(shards):
        assert all(shard_of(node, len(shards)) == index for node, _ in store.snapshot().devices)
        assert all(shard_of(node, len(shards)) == index for node in store.snapshot().nodes)


def test_three_shards_together_export_exactly_the_unsharded_series(clock: ManualClock) -> None:
    whole = feed(DeviceStateStore(clock))
    shards = [feed(DeviceStateStore(clock, shard=Shard(i, 3))) for i in range(3)]
    assert_partition(shards, whole, clock)
    # The fleet exercises what it claims: both kinds of device, a fault, the bound pod's GPU.
    devices = whole.snapshot().devices
    assert len(devices) == 25 and {d.health for d in devices.values()} >= {"Healthy", "Unhealthy"}
    assert (NODE_NAMES[7], gpu_uuid(NODE_NAMES[7], 5)) in devices
    assert all(store.snapshot().devices for store in shards), "every shard holds devices"


def test_what_names_no_node_goes_to_no_shard_or_to_every_shard() -> None:
    shards = [Shard(i, 3) for i in range(3)]
    assert not any(in_shard(s.owns, PODS, pending("queued")) for s in shards)
    assert not any(in_shard(s.owns, PRODUCERS, plugin_pod(True, 0.0, node=None)) for s in shards)
    assert all(in_shard(s.owns, SLICES, network_slice()) for s in shards)
    assert all(
        in_shard(s.owns, CLAIMS, claim("c", [("gpus", DRIVER, "gpu-node-01", "gpu-0")])) for s in shards
    )
    # Too malformed to name a node: passed on, so each shard's store counts it as a parse error.
    assert all(in_shard(s.owns, LEASES, {"metadata": {}}) for s in shards)
    assert all(in_shard(s.owns, PODS, {"metadata": {"name": "p"}, "spec": "x"}) for s in shards)


def test_a_pending_pod_lands_in_its_node_s_shard_once_bound(clock: ManualClock) -> None:
    node = NODE_NAMES[7]
    shards = [DeviceStateStore(clock, shard=Shard(i, 3)) for i in range(3)]
    bound = watch_events()[1][2]
    for store in shards:
        store.apply_event(PODS, "ADDED", pending("queued"))
        store.apply_event(PODS, "MODIFIED", bound)
    held = [store.snapshot().devices.get((node, gpu_uuid(node, 5))) for store in shards]
    assert [i for i, d in enumerate(held) if d is not None] == [shard_of(node, 3)]
    assert [a.pod for a in held[shard_of(node, 3)].allocations] == ["queued"]  # type: ignore[union-attr]


def _run_and_stop(path: str, shard: Shard, clock: ManualClock) -> None:
    """An exporter that lists the fleet, writes its directory and stops."""
    directory = Directory(path, clock=clock)
    store = feed(open_store(directory, clock, shard=shard))
    persist(store, directory, force=True)
    directory.close()


def test_after_the_shard_count_changes_the_restarted_shards_cover_every_device_once(
    tmp_path: Path, clock: ManualClock
) -> None:
    # The yardstick restarts too (a restart keeps persisted observation times): one unsharded
    # exporter on its own directory, run and restarted at the same moments as the shards.
    whole_path = str(tmp_path / "whole.sqlite")
    paths = [str(tmp_path / f"shard-{i}.sqlite") for i in range(3)]
    _run_and_stop(whole_path, Shard(), clock)
    for i in range(2):  # M = 2, each shard with its own directory
        _run_and_stop(paths[i], Shard(i, 2), clock)
    clock.advance(30)
    # M = 3: shards 0 and 1 restart on their directories, shard 2 starts on an empty one.
    directories = [Directory(p, clock=clock) for p in [*paths, whole_path]]
    restarted = [open_store(d, clock, shard=Shard(i, 3)) for i, d in enumerate(directories[:3])]
    whole = open_store(directories[3], clock)
    try:
        restored = [set(s.snapshot().devices) for s in restarted]
        assert restored[0] and restored[1] and not restored[2]
        for index, keys in enumerate(restored):
            assert all(shard_of(node, 3) == index for node, _ in keys), "restored a node of another shard"
        moved = {k for k in whole.snapshot().devices if shard_of(k[0], 2) != shard_of(k[0], 3)}
        assert moved and not moved & (restored[0] | restored[1])
        for store in [*restarted, whole]:
            feed(store)
        # A node that moved is new to its shard: its pods' reports are observed afresh there (its
        # history stays in the old shard's directory); every other series is the unsharded one.
        moved_nodes = {node for node, _ in moved}
        assert_partition(restarted, whole, clock, moved=moved_nodes, fresh=feed(DeviceStateStore(clock)))
    finally:
        for directory in directories:
            directory.close()


def test_the_self_metrics_say_which_shard_this_is() -> None:
    registry = CollectorRegistry()
    ExporterMetrics(registry, Shard(2, 5))
    assert registry.get_sample_value("gpuhealth_exporter_shard_ordinal") == 2
    assert registry.get_sample_value("gpuhealth_exporter_total_shards") == 5
    unsharded = CollectorRegistry()
    ExporterMetrics(unsharded)
    assert unsharded.get_sample_value("gpuhealth_exporter_shard_ordinal") == 0
    assert unsharded.get_sample_value("gpuhealth_exporter_total_shards") == 1
