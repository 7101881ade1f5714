"""The scheduler extender's filter (responder.extender.filter) with kube-scheduler's wire shapes.

Aspects: ExtenderArgs with Nodes (a NodeList) or NodeNames (nodeCacheCapable) parse, and the
result answers in the same form; a node fails only where the pod's GPUs do not fit once
quarantined devices are counted out, with the reason; devices on the ramp count in only for pods
labelled `gpuhealth.io/canary-ok: "true"` while the node has ramp slots left, and for every pod
once released (the load on a device grows in steps); pods without GPUs and nodes the
responder does not know pass; init containers count as kube-scheduler counts them; bad args
are ArgsError naming the field (property: junk never raises anything else).
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from responder.extender.filter import (
    ArgsError,
    NodeCapacity,
    error_result,
    filter_nodes,
    gpu_units,
    gpus_requested,
    parse_args,
    requested,
)


def pod(gpus: int, *, init: int = 0, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]
    }
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": init}}}]
    return {"metadata": {"name": "p", "namespace": "ns", "labels": labels or {}}, "spec": spec}


OPTED_IN = {"gpuhealth.io/canary-ok": "true"}


def node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}}


CAPACITY = {
    "full": NodeCapacity(allocatable=8, requested=0, quarantined_allocatable=0),
    "two-quarantined": NodeCapacity(allocatable=8, requested=4, quarantined_allocatable=2),
}


def test_names_in_names_out_with_reasons() -> None:
    args = parse_args({"Pod": pod(4), "NodeNames": ["full", "two-quarantined", "unknown"]})
    result = filter_nodes(args, CAPACITY.get)
    assert result["NodeNames"] == ["full", "unknown"] and result["Nodes"] is None
    assert result["FailedNodes"] == {
        "two-quarantined": "gpuhealth: 2 quarantined nvidia.com/gpu counted out; 2 free for a request of 4"
    }
    assert result["Error"] == "" and result["FailedAndUnresolvableNodes"] == {}


def test_node_objects_in_node_objects_out() -> None:
    args = parse_args({"Pod": pod(2), "Nodes": {"items": [node("full"), node("two-quarantined")]}})
    result = filter_nodes(args, CAPACITY.get)
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["full", "two-quarantined"]
    assert result["NodeNames"] is None


# A node of 4 GPUs, 3 running pods, its fourth device in three stages of its return.
STAGES = {
    "quarantined": NodeCapacity(allocatable=4, requested=3, quarantined_allocatable=1),
    "ramping": NodeCapacity(4, 3, 1, ramping_allocatable=1, ramp_slots=1),
    "ramp-full": NodeCapacity(4, 3, 1, ramping_allocatable=1, ramp_slots=0),
    "released": NodeCapacity(4, 3, 0),
}


@pytest.mark.parametrize(
    ("labels", "passes"),
    [
        ({}, ["released"]),
        (OPTED_IN, ["ramping", "released"]),
        ({"gpuhealth.io/canary-ok": "yes"}, ["released"]),  # only "true" opts in
    ],
)
def test_a_ramping_device_takes_opted_in_pods_up_to_the_bound_then_everyone(
    labels: dict[str, str], passes: list[str]
) -> None:
    args = parse_args({"Pod": pod(1, labels=labels), "NodeNames": list(STAGES)})
    assert args.opted_in == (labels == OPTED_IN)
    result = filter_nodes(args, STAGES.get)
    assert result["NodeNames"] == passes
    failed = result["FailedNodes"]
    assert (
        failed["quarantined"]
        == "gpuhealth: 1 quarantined nvidia.com/gpu counted out; 0 free for a request of 1"
    )
    if labels == OPTED_IN:
        assert failed["ramp-full"].endswith(
            "0 free for a request of 1 (1 on the ramp, 0 opted-in pod slots left)"
        )
    else:
        assert failed["ramping"].endswith("(1 on the ramp: only pods labelled gpuhealth.io/canary-ok=true)")


def test_an_opted_in_pod_still_needs_room_beyond_the_ramping_devices() -> None:
    view = {
        "n": NodeCapacity(
            allocatable=4, requested=2, quarantined_allocatable=1, ramping_allocatable=1, ramp_slots=1
        )
    }
    fits = parse_args({"Pod": pod(2, labels=OPTED_IN), "NodeNames": ["n"]})
    too_big = parse_args({"Pod": pod(3, labels=OPTED_IN), "NodeNames": ["n"]})
    assert filter_nodes(fits, view.get)["NodeNames"] == ["n"]
    assert filter_nodes(too_big, view.get)["NodeNames"] == []


def test_pods_without_gpus_pass_everywhere() -> None:
    args = parse_args({"Pod": {"spec": {"containers": [{"name": "c"}]}}, "NodeNames": ["two-quarantined"]})
    assert filter_nodes(args, CAPACITY.get)["NodeNames"] == ["two-quarantined"]


def test_init_containers_count_as_the_scheduler_counts_them() -> None:
    assert gpus_requested(pod(1, init=3)) == 3
    assert gpus_requested(pod(4, init=3)) == 4


def test_mig_profiles_resources_count_as_gpu_units() -> None:
    """Under MIG strategy mixed a pod asks for `nvidia.com/mig-<profile>`: as many GPU units."""
    mig = {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/mig-3g.40gb": "2"}}}]}}
    assert gpus_requested(mig) == 2
    assert requested(mig, "nvidia.com/mig-3g.40gb") == 2 and requested(mig, "nvidia.com/gpu") == 0
    assert (
        gpu_units({"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "7", "cpu": "8", "nvidia.com/x": "1"})
        == 9
    )
    assert gpu_units({"nvidia.com/mig-1g.10gb": "many"}) == 0 and gpu_units(None) == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "ExtenderArgs must be a JSON object"),
        ({"NodeNames": []}, "Pod: expected a Pod object"),
        ({"Pod": {}, "NodeNames": "n"}, "NodeNames: expected a list"),
        ({"Pod": {}, "Nodes": {"items": [{}]}}, "Nodes.items[0].metadata.name"),
        (
            {
                "Pod": pod(0)
                | {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "x"}}}]}},
                "NodeNames": [],
            },
            "not a whole number",
        ),
    ],
)
def test_bad_args_name_the_field(body: Any, message: str) -> None:
    with pytest.raises(ArgsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_args(body)


def test_an_error_result_fails_the_attempt_with_the_message() -> None:
    assert error_result("no node cache yet")["Error"] == "no node cache yet"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "Pod",
                    "Nodes",
                    "NodeNames",
                    "spec",
                    "containers",
                    "items",
                    "metadata",
                    "name",
                    "resources",
                    "limits",
                    "nvidia.com/gpu",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=15,
)


@given(json_values)
def test_junk_raises_only_args_error(body: Any) -> None:
    with contextlib.suppress(ArgsError):
        filter_nodes(parse_args(body), CAPACITY.get)
