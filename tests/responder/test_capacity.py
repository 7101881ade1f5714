"""The extender's capacity cache (responder.extender.capacity), fed reflector messages by hand.

Aspects: a node's quarantined devices count out less as many as allocatable already dropped
below capacity, never more than the annotation lists; bound, unfinished GPU pods count on their
node, finished, unbound and deleted ones do not, a pod moving phase or node moves its count; a
relist replaces what was known; the Node object the scheduler sent overrides the cached one;
unknown nodes answer None; property: after any event sequence the per-node sums equal a
recount from the pods' last states.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.reflector import Events, Listed
from responder.enforce.node_annotation import NODE_ANNOTATION
from responder.extender.capacity import NODES, PODS, CapacityCache, node_gpus, pod_gpus
from responder.extender.filter import NodeCapacity


def node(name: str, *, capacity: int = 8, allocatable: int = 8, listed: int = 0) -> dict[str, Any]:
    annotations = {NODE_ANNOTATION: json.dumps([f"GPU-{i}" for i in range(listed)])} if listed else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {
            "capacity": {"nvidia.com/gpu": str(capacity)},
            "allocatable": {"nvidia.com/gpu": str(allocatable)},
        },
    }


def pod(name: str, node_name: str | None, gpus: int, phase: str = "Running") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec, "status": {"phase": phase}}


def test_quarantined_devices_count_out_less_what_the_kubelet_already_dropped() -> None:
    assert node_gpus(node("n", listed=2)).quarantined_allocatable == 2
    assert node_gpus(node("n", allocatable=7, listed=2)).quarantined_allocatable == 1
    assert node_gpus(node("n", allocatable=5, listed=2)).quarantined_allocatable == 0
    assert node_gpus(node("n")).quarantined_allocatable == 0
    unreadable = node("n")
    unreadable["metadata"]["annotations"] = {NODE_ANNOTATION: "not json"}
    assert node_gpus(unreadable).quarantined == 0


def test_only_bound_unfinished_gpu_pods_hold_devices() -> None:
    assert pod_gpus(pod("a", "n", 2)) == ("n", 2)
    assert pod_gpus(pod("a", None, 2)) is None
    assert pod_gpus(pod("a", "n", 2, "Succeeded")) is None
    assert pod_gpus(pod("a", "n", 2, "Failed")) is None
    assert pod_gpus(pod("a", "n", 0)) is None
    assert pod_gpus(pod("a", "n", 2, "Pending")) == ("n", 2)


def test_the_cache_follows_lists_and_events() -> None:
    cache = CapacityCache()
    assert cache.capacity("n") is None and not cache.ready()
    cache.apply(Listed(NODES, [node("n", listed=1)]))
    cache.apply(Listed(PODS, [pod("a", "n", 2), pod("b", "n", 1, "Succeeded")]))
    assert cache.ready()
    assert cache.capacity("n") == NodeCapacity(allocatable=8, requested=2, quarantined_allocatable=1)
    cache.apply(Events(PODS, [("ADDED", pod("c", "n", 3)), ("MODIFIED", pod("a", "n", 2, "Succeeded"))]))
    assert cache.capacity("n") == NodeCapacity(8, 3, 1)
    cache.apply(Events(PODS, [("DELETED", pod("c", "n", 3))]))
    cache.apply(Events(NODES, [("MODIFIED", node("n", allocatable=7, listed=1))]))
    assert cache.capacity("n") == NodeCapacity(7, 0, 0)
    # The object the scheduler sent wins over the cached one; the pods still come from the cache.
    cache.apply(Events(PODS, [("ADDED", pod("d", "n", 1))]))
    assert cache.capacity("n", node("n", listed=3)) == NodeCapacity(8, 1, 3)
    cache.apply(Listed(PODS, []))
    cache.apply(Events(NODES, [("DELETED", node("n"))]))
    assert cache.capacity("n") is None
    assert cache.capacity("m", node("m")) == NodeCapacity(8, 0, 0)


pod_states = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from([None, "n1", "n2"]),
    st.integers(0, 4),
    st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
    st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
)


@given(st.lists(st.lists(pod_states, max_size=6), max_size=8))
def test_the_sums_always_equal_a_recount(batches: list[list[tuple[Any, ...]]]) -> None:
    cache = CapacityCache()
    cache.apply(Listed(NODES, [node("n1"), node("n2")]))
    last: dict[str, dict[str, Any] | None] = {}
    for batch in batches:
        events = []
        for name, node_name, gpus, phase, event_type in batch:
            obj = pod(name, node_name, gpus, phase)
            events.append((event_type, obj))
            last[name] = None if event_type == "DELETED" else obj
        cache.apply(Events(PODS, events))
    for name in ("n1", "n2"):
        expected = 0
        for obj in last.values():
            held = pod_gpus(obj) if obj is not None else None
            if held is not None and held[0] == name:
                expected += held[1]
        view = cache.capacity(name)
        assert view is not None and view.requested == expected
