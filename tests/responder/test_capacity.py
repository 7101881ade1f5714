"""The extender's capacity cache (responder.extender.capacity), fed reflector messages by hand.

Aspects: a node's quarantined devices count out less as many as allocatable already dropped below
capacity, never more than the annotation lists; bound, unfinished GPU pods count on their node,
finished, unbound and deleted ones do not, a pod moving phase or node moves its count; a relist
replaces what was known; the Node object the scheduler sent overrides the cached one; unknown nodes
and nodes with no device-plugin GPU (capacity and allocatable 0: DRA nodes) answer None; devices on
the ramp count among those excluded, with the ramp annotation's bound less the opted-in pods bound
to the node as the slots left (a finished or deleted opted-in pod gives its slot back); property:
after any event sequence the per-node sums equal a recount from the pods' last states; a card
a holder holds is not counted out again, and a hold being made keeps every new GPU pod off the
node; GPU pods kube-scheduler binds are counted once (what the extender should be asked about).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.reflector import Events, Listed
from responder.enforce.hold import HOLDS_NODE_ANNOTATION
from responder.enforce.node_annotation import NODE_ANNOTATION, RAMP_ANNOTATION
from responder.extender.capacity import NODES, PODS, CapacityCache, node_gpus, pod_gpus
from responder.extender.filter import NodeCapacity


def node(
    name: str,
    *,
    capacity: int = 8,
    allocatable: int = 8,
    listed: int = 0,
    ramping: dict[str, int] | None = None,
) -> dict[str, Any]:
    annotations = {NODE_ANNOTATION: json.dumps([f"GPU-{i}" for i in range(listed)])} if listed else {}
    if ramping:
        annotations[RAMP_ANNOTATION] = json.dumps(ramping)
    return {
        "metadata": {"name": name, "annotations": annotations},
        "status": {
            "capacity": {"nvidia.com/gpu": str(capacity)},
            "allocatable": {"nvidia.com/gpu": str(allocatable)},
        },
    }


def pod(
    name: str, node_name: str | None, gpus: int, phase: str = "Running", *, opted_in: bool = False
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    labels = {"gpuhealth.io/canary-ok": "true"} if opted_in else {}
    meta = {"name": name, "namespace": "ns", "labels": labels}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_quarantined_devices_count_out_less_what_the_kubelet_already_dropped() -> None:
    assert node_gpus(node("n", listed=2)).quarantined_allocatable == 2
    assert node_gpus(node("n", allocatable=7, listed=2)).quarantined_allocatable == 1
    assert node_gpus(node("n", allocatable=5, listed=2)).quarantined_allocatable == 0
    assert node_gpus(node("n")).quarantined_allocatable == 0
    unreadable = node("n")
    unreadable["metadata"]["annotations"] = {NODE_ANNOTATION: "not json"}
    assert node_gpus(unreadable).quarantined == 0


def test_ramping_devices_are_excluded_and_carry_their_bound() -> None:
    gpus = node_gpus(node("n", listed=1, ramping={"GPU-7": 2, "GPU-8": 1}))
    assert (gpus.quarantined, gpus.ramping, gpus.ramp_pods) == (3, 2, 3)
    assert (gpus.quarantined_allocatable, gpus.ramping_allocatable) == (3, 2)
    # The kubelet dropped two devices: assumed the quarantined one and one of the ramp's.
    dropped = node_gpus(node("n", allocatable=6, listed=1, ramping={"GPU-7": 2, "GPU-8": 1}))
    assert (dropped.quarantined_allocatable, dropped.ramping_allocatable) == (1, 1)
    # A device listed in both counts once; an unreadable bound counts one pod; junk lists none.
    both = node("n", listed=1, ramping={"GPU-0": 0})
    assert (node_gpus(both).quarantined, node_gpus(both).ramp_pods) == (1, 1)
    junk = node("n")
    junk["metadata"]["annotations"] = {RAMP_ANNOTATION: "[1, 2]"}
    assert node_gpus(junk).ramping == 0


def test_opted_in_pods_use_up_the_ramp_slots_and_give_them_back() -> None:
    cache = CapacityCache()
    cache.apply(Listed(NODES, [node("n", capacity=4, allocatable=4, ramping={"GPU-3": 1})]))
    cache.apply(Listed(PODS, [pod("a", "n", 1), pod("b", "n", 1), pod("c", "n", 1)]))
    assert cache.capacity("n") == NodeCapacity(4, 3, 1, ramping_allocatable=1, ramp_slots=1)
    cache.apply(Events(PODS, [("ADDED", pod("canary", "n", 1, opted_in=True))]))
    assert cache.capacity("n") == NodeCapacity(4, 4, 1, ramping_allocatable=1, ramp_slots=0)
    cache.apply(Events(PODS, [("MODIFIED", pod("canary", "n", 1, "Succeeded", opted_in=True))]))
    assert cache.capacity("n") == NodeCapacity(4, 3, 1, ramping_allocatable=1, ramp_slots=1)
    cache.apply(Events(PODS, [("ADDED", pod("other", "m", 1, opted_in=True))]))  # another node's
    assert cache.capacity("n") == NodeCapacity(4, 3, 1, ramping_allocatable=1, ramp_slots=1)
    cache.apply(Events(NODES, [("MODIFIED", node("n", capacity=4, allocatable=4))]))  # released
    assert cache.capacity("n") == NodeCapacity(4, 3, 0)


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


def test_a_node_without_device_plugin_gpus_is_left_to_the_scheduler() -> None:
    # A DRA node whose DeviceClass serves nvidia.com/gpu (KEP-5004) advertises none of it, while
    # the pods on it request it: counting them against 0 would refuse every such pod (seen on
    # the real 1.37 control plane: a moved pod's replacement was never scheduled).
    cache = CapacityCache()
    dra = {"metadata": {"name": "dra", "annotations": {}}, "status": {"capacity": {}, "allocatable": {}}}
    cache.apply(Listed(NODES, [dra, node("dp", listed=1)]))
    cache.apply(Listed(PODS, [pod("a", "dra", 1), pod("b", "dp", 1)]))
    assert cache.capacity("dra") is None and cache.capacity("dra", dra) is None
    assert cache.capacity("dp") == NodeCapacity(8, 1, 1)
    # A device-plugin node whose plugin has every device Unhealthy still has capacity: counted.
    cache.apply(Events(NODES, [("MODIFIED", node("dp", allocatable=0, listed=1))]))
    assert cache.capacity("dp") == NodeCapacity(0, 1, 0)


pod_states = st.tuples(
    st.sampled_from(["a", "b", "c", "d"]),
    st.sampled_from([None, "n1", "n2"]),
    st.integers(0, 4),
    st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]),
    st.sampled_from(["ADDED", "MODIFIED", "DELETED"]),
    st.booleans(),
)


@given(st.lists(st.lists(pod_states, max_size=6), max_size=8))
def test_the_sums_always_equal_a_recount(batches: list[list[tuple[Any, ...]]]) -> None:
    cache = CapacityCache()
    bound = 4
    cache.apply(Listed(NODES, [node("n1", ramping={"GPU-1": bound}), node("n2", ramping={"GPU-1": bound})]))
    last: dict[str, dict[str, Any] | None] = {}
    for batch in batches:
        events = []
        for name, node_name, gpus, phase, event_type, opted_in in batch:
            obj = pod(name, node_name, gpus, phase, opted_in=opted_in)
            events.append((event_type, obj))
            last[name] = None if event_type == "DELETED" else obj
        cache.apply(Events(PODS, events))
    for name in ("n1", "n2"):
        expected, opted = 0, 0
        for obj in last.values():
            held = pod_gpus(obj) if obj is not None else None
            if held is not None and held[0] == name:
                expected += held[1]
                opted += obj is not None and obj["metadata"]["labels"] != {}
        view = cache.capacity(name)
        assert view is not None and view.requested == expected
        assert view.ramp_slots == max(0, bound - opted)


def test_a_held_card_is_not_counted_out_twice_and_a_hold_being_made_keeps_new_pods_off() -> None:
    listed = node("n1", listed=2)
    listed["metadata"]["annotations"][HOLDS_NODE_ANNOTATION] = json.dumps({"GPU-0": "held"})
    gpus = node_gpus(listed)
    # GPU-0's holder requests it (counted with the pods); only GPU-1 is counted out here.
    assert gpus.quarantined == 1 and gpus.holding == 0
    listed["metadata"]["annotations"][HOLDS_NODE_ANNOTATION] = json.dumps(
        {"GPU-0": "held", "GPU-1": "pending"}
    )
    cache = CapacityCache()
    cache.apply(Listed(NODES, [listed]))
    holder = pod("gpuhealth-hold", "n1", 1)
    holder["metadata"]["labels"]["gpuhealth.io/holder"] = "rec-0"
    cache.apply(Listed(PODS, [holder]))
    view = cache.capacity("n1")
    assert view is not None and view.holding == 1
    assert view.free == 0 and view.free_for(opted_in=True) == 0
    # GPU-1's hold stands too; then someone deletes GPU-0's holder: until the responder's next
    # pass says so, the annotation still says held, and the node passes no GPU pod meanwhile.
    holds = {"GPU-0": "held", "GPU-1": "held"}
    listed["metadata"]["annotations"][HOLDS_NODE_ANNOTATION] = json.dumps(holds)
    other = pod("gpuhealth-hold-2", "n1", 1)
    other["metadata"]["labels"]["gpuhealth.io/holder"] = "rec-1"
    cache.apply(Events(NODES, [("MODIFIED", listed)]))
    cache.apply(Events(PODS, [("ADDED", other)]))
    standing = cache.capacity("n1")
    assert standing is not None and standing.holding == 0 and standing.free == 8 - 2
    cache.apply(Events(PODS, [("DELETED", holder)]))
    deleted = cache.capacity("n1")
    assert deleted is not None and deleted.holding == 1 and deleted.free == 0


def test_gpu_pods_the_scheduler_binds_are_counted_once_and_no_other() -> None:
    scheduled: list[int] = []
    cache = CapacityCache(on_scheduled=lambda: scheduled.append(1))
    cache.apply(Listed(NODES, [node("n1")]))
    cache.apply(Listed(PODS, []))
    unbound = pod("a", None, 1)
    bound = pod("a", "n1", 1)
    cache.apply(Events(PODS, [("ADDED", unbound), ("MODIFIED", bound), ("MODIFIED", bound)]))
    assert scheduled == [1]
    # Made with its node set (a holder, a DaemonSet's pod), another scheduler's, or no GPU: not counted.
    other = pod("b", None, 1)
    other["spec"]["schedulerName"] = "volcano"
    cache.apply(
        Events(
            PODS,
            [
                ("ADDED", pod("h", "n1", 1)),
                ("ADDED", other),
                ("MODIFIED", {**other, "spec": {**other["spec"], "nodeName": "n1"}}),
                ("ADDED", pod("c", None, 0)),
                ("MODIFIED", pod("c", "n1", 0)),
            ],
        )
    )
    assert scheduled == [1]


def test_a_card_no_fill_could_get_keeps_new_pods_off_once_the_node_s_allocatable_rises() -> None:
    # No fill got GPU-0 while its plugin excluded it (7 of 8 allocatable): counted out by the
    # count, and the node passes pods (the kubelet gives the card to nobody).
    excluded = node("n1", allocatable=7, listed=1)
    excluded["metadata"]["annotations"][HOLDS_NODE_ANNOTATION] = json.dumps({"GPU-0": "excluded@7"})
    gpus = node_gpus(excluded)
    assert gpus.holding == 0 and gpus.quarantined_allocatable == 0
    # The plugin lets a device back (8 allocatable), perhaps the card: the kubelet could hand it
    # to the next pod, so none passes until the responder's next pass holds it (CI saw a
    # replacement given a card recovered from XID 79 this way, the hold only counting it out).
    back = node("n1", allocatable=8, listed=1)
    back["metadata"]["annotations"][HOLDS_NODE_ANNOTATION] = json.dumps({"GPU-0": "excluded@7"})
    assert node_gpus(back).holding == 1
    cache = CapacityCache()
    cache.apply(Listed(NODES, [back]))
    cache.apply(Listed(PODS, []))
    view = cache.capacity("n1")
    assert view is not None and view.free == 0
    # A mark that does not read as one is ignored (nothing invented from it).
    back["metadata"]["annotations"][HOLDS_NODE_ANNOTATION] = json.dumps({"GPU-0": "excluded@x"})
    assert node_gpus(back).holding == 0


def test_a_mixed_mig_node_counts_its_profiles_units() -> None:
    """Strategy mixed: the node advertises `nvidia.com/mig-<profile>` instead of `nvidia.com/gpu`;
    every partition is a GPU unit, so quarantined partitions count out of them."""
    mixed = node("m", listed=2)
    mixed["status"] = {
        "capacity": {"nvidia.com/mig-3g.40gb": "4", "cpu": "64"},
        "allocatable": {"nvidia.com/mig-3g.40gb": "4", "cpu": "64"},
    }
    gpus = node_gpus(mixed)
    assert (gpus.capacity, gpus.allocatable, gpus.quarantined_allocatable) == (4, 4, 2)
