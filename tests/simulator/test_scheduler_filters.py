"""The scheduler's pure decisions: quantities, filters, messages, the CEL subset, DRA allocation.

Aspects: quantities in thousandths; taints and tolerations (Equal, Exists, empty key, effects);
node affinity operators and matchFields; resource fit with the kube-scheduler reason words and
the aggregated FailedScheduling message; adaptive feasible-node count; CEL selectors (driver,
attributes by domain, &&, literals) and the expressions refused; DRA allocation honouring
counts, All, selectors, device taints and DeviceTaintRules, devices in use and tolerations.
"""

from __future__ import annotations

from typing import Any

import pytest

from simulator.fleet.cel import CelUnsupported, compile_selector, device_view
from simulator.fleet.dra_allocator import Unfit, allocate, slice_devices
from simulator.fleet.extender_client import SchedulerConfigError, parse_scheduler_config
from simulator.fleet.scheduler_filters import (
    QuantityError,
    failed_scheduling_message,
    feasible_nodes_to_find,
    filter_node,
    milli,
    node_info,
    pod_info,
    score_node,
    tolerates,
)


def node(name: str = "n", *, taints: list[dict[str, Any]] | None = None, gpus: str = "8", **spec: Any) -> Any:
    return node_info(
        {
            "metadata": {"name": name, "labels": {"zone": "a", "rank": "5"}},
            "spec": {"taints": taints or [], **spec},
            "status": {
                "allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": gpus},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def pod(**spec: Any) -> Any:
    containers = [{"name": "c", "resources": {"requests": {"cpu": "500m"}, "limits": {"nvidia.com/gpu": 2}}}]
    return pod_info(
        {"metadata": {"name": "p", "namespace": "d", "uid": "u"}, "spec": {"containers": containers, **spec}}
    )


def test_quantities_are_thousandths_rounded_up() -> None:
    assert milli("500m") == 500
    assert milli("2") == 2000
    assert milli(3) == 3000
    assert milli("1Ki") == 1024_000
    assert milli("1.5G") == 1_500_000_000_000
    assert milli("1e3") == 1_000_000
    with pytest.raises(QuantityError):
        milli("lots")


def test_limits_stand_in_for_missing_requests_and_resources_fit() -> None:
    p = pod()
    assert p.requests == {"cpu": 500, "nvidia.com/gpu": 2000}
    assert filter_node(p, node()) == []
    assert filter_node(p, node(gpus="1")) == ["Insufficient nvidia.com/gpu"]
    assert filter_node(p, node(gpus="1"), frozenset({"nvidia.com/gpu"})) == []


def test_taints_need_tolerations() -> None:
    taint = {"key": "gpu", "value": "bad", "effect": "NoSchedule"}
    assert filter_node(pod(), node(taints=[taint])) == ["node(s) had untolerated taint {gpu: bad}"]
    assert filter_node(pod(tolerations=[{"key": "gpu", "operator": "Exists"}]), node(taints=[taint])) == []
    assert filter_node(pod(tolerations=[{"operator": "Exists"}]), node(taints=[taint])) == []
    assert tolerates({"key": "gpu", "operator": "Equal", "value": "bad", "effect": "NoSchedule"}, taint)
    assert not tolerates({"key": "gpu", "value": "good"}, taint)
    assert not tolerates({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, taint)
    assert filter_node(pod(), node(taints=[{"key": "x", "effect": "PreferNoSchedule"}])) == []


def test_cordoned_and_not_ready_nodes() -> None:
    assert filter_node(pod(), node(unschedulable=True)) == ["node(s) were unschedulable"]
    tolerant = pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}])
    assert filter_node(tolerant, node(unschedulable=True)) == []
    unknown = node_info(
        {"metadata": {"name": "u"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    )
    assert filter_node(pod(), unknown) == ["node(s) had untolerated taint {node.kubernetes.io/unreachable: }"]


@pytest.mark.parametrize(
    ("expression", "fits"),
    [
        ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
        ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
        ({"key": "zone", "operator": "Exists"}, True),
        ({"key": "gone", "operator": "DoesNotExist"}, True),
        ({"key": "rank", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "rank", "operator": "Lt", "values": ["5"]}, False),
    ],
)
def test_required_node_affinity(expression: dict[str, Any], fits: bool) -> None:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expression]}]}}}  # fmt: skip
    reasons = filter_node(pod(affinity=affinity), node())
    assert reasons == ([] if fits else ["node(s) didn't match Pod's node affinity/selector"])


def test_match_fields_and_node_selector() -> None:
    by_name = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["m"]}]}]}}}  # fmt: skip
    assert filter_node(pod(affinity=by_name), node("m")) == []
    assert filter_node(pod(affinity=by_name), node("n")) != []
    assert filter_node(pod(nodeSelector={"zone": "b"}), node()) != []


def test_failed_scheduling_message_sorts_and_counts() -> None:
    text = failed_scheduling_message(
        3, {"Insufficient nvidia.com/gpu": 2, "node(s) were unschedulable": 1}, 2
    )
    assert text == (
        "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient nvidia.com/gpu. "
        "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, "
        "2 No preemption victims found for incoming pod."
    )


def test_feasible_nodes_to_find_is_adaptive() -> None:
    assert feasible_nodes_to_find(50) == 50
    assert feasible_nodes_to_find(10_000) == 500
    assert feasible_nodes_to_find(1000) == 420


def test_least_allocated_prefers_the_emptier_node() -> None:
    busy = node("busy")
    busy.requested = {"nvidia.com/gpu": 6000}
    assert score_node(pod(), node("idle")) > score_node(pod(), busy)


DEVICE = {
    "name": "gpu-0",
    "attributes": {"uuid": {"string": "GPU-1"}, "index": {"int": 0}, "productName": {"string": "H100"}},
}


def test_cel_subset() -> None:
    view = device_view("gpu.nvidia.com", DEVICE)
    assert compile_selector('device.driver == "gpu.nvidia.com"').matches(view)
    assert compile_selector("device.attributes['gpu.nvidia.com'].uuid == 'GPU-1'").matches(view)
    assert compile_selector(
        'device.driver == "gpu.nvidia.com" && (device.attributes["gpu.nvidia.com"].index == 0)'
    ).matches(view)
    assert not compile_selector('device.attributes["gpu.nvidia.com"].productName != "H100"').matches(view)
    assert not compile_selector('device.attributes["gpu.nvidia.com"].index == "0"').matches(view)
    assert not compile_selector('device.attributes["other.io"].uuid == "GPU-1"').matches(view)


@pytest.mark.parametrize(
    "expression",
    [
        "device.driver == 'a' || device.driver == 'b'",
        "device.capacity['x'].memory.compareTo(quantity('1Gi')) >= 0",
        "size(device.attributes) > 0",
        "",
    ],
)
def test_cel_outside_the_subset_is_refused_by_name(expression: str) -> None:
    with pytest.raises(CelUnsupported) as info:
        compile_selector(expression)
    assert repr(expression) in str(info.value)


def _slice(taints: list[dict[str, Any]] | None = None) -> list[Any]:
    devices = [
        {**DEVICE, "name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{i}"}}} for i in range(3)
    ]
    if taints:
        devices[0]["taints"] = taints
    return slice_devices({"spec": {"driver": "gpu.nvidia.com", "pool": {"name": "n"}, "nodeName": "n",
                                   "devices": devices}})  # fmt: skip


CLASSES = {
    "gpu.nvidia.com": {"spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}
}


def claim(**exactly: Any) -> dict[str, Any]:
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", **exactly}}
    return {"metadata": {"name": "c", "namespace": "d"}, "spec": {"devices": {"requests": [request]}}}


def devices_of(result: dict[str, Any]) -> list[str]:
    return [r["device"] for r in result["c"]["devices"]["results"]]


def test_allocation_counts_selectors_and_in_use() -> None:
    out = allocate([claim(count=2)], "n", {}, _slice(), CLASSES, set(), [])
    assert devices_of(out) == ["gpu-0", "gpu-1"]
    assert out["c"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n"]
    out = allocate([claim(count=2)], "n", {}, _slice(), CLASSES, {("gpu.nvidia.com", "n", "gpu-0")}, [])
    assert devices_of(out) == ["gpu-1", "gpu-2"]
    sel = [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].uuid == "GPU-2"'}}]
    assert devices_of(allocate([claim(selectors=sel)], "n", {}, _slice(), CLASSES, set(), [])) == ["gpu-2"]
    assert devices_of(allocate([claim(allocationMode="All")], "n", {}, _slice(), CLASSES, set(), [])) == [
        "gpu-0", "gpu-1", "gpu-2"]  # fmt: skip
    with pytest.raises(Unfit):
        allocate([claim(count=4)], "n", {}, _slice(), CLASSES, set(), [])


def test_device_taints_keep_devices_out_unless_tolerated() -> None:
    taint = {"key": "gpuhealth.io/xid", "value": "79", "effect": "NoSchedule"}
    out = allocate([claim(count=1)], "n", {}, _slice([taint]), CLASSES, set(), [])
    assert devices_of(out) == ["gpu-1"]
    tolerant = claim(count=1, tolerations=[{"key": "gpuhealth.io/xid", "operator": "Exists"}])
    assert devices_of(allocate([tolerant], "n", {}, _slice([taint]), CLASSES, set(), [])) == ["gpu-0"]
    none_effect = {**taint, "effect": "None"}
    assert devices_of(allocate([claim(count=1)], "n", {}, _slice([none_effect]), CLASSES, set(), [])) == [
        "gpu-0"
    ]
    rule = {"spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-1"},
                     "taint": {"key": "q", "effect": "NoExecute"}}}  # fmt: skip
    assert devices_of(allocate([claim(count=1)], "n", {}, _slice([taint]), CLASSES, set(), [rule])) == [
        "gpu-2"
    ]
    with pytest.raises(Unfit):
        allocate([claim(count=2)], "n", {}, _slice([taint]), CLASSES, set(), [rule])


def test_scheduler_configuration_extenders() -> None:
    doc = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "extenders": [{"urlPrefix": "http://127.0.0.1:1/ext", "filterVerb": "filter",
                       "prioritizeVerb": "prio", "weight": 2, "nodeCacheCapable": True,
                       "httpTimeout": "2s", "ignorable": True,
                       "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": True}]}],
    }  # fmt: skip
    (ext,) = parse_scheduler_config(doc)
    assert ext.http_timeout == 2.0 and ext.weight == 2 and ext.node_cache_capable
    assert ext.ignored_resources() == {"nvidia.com/gpu"}
    assert ext.interested({"nvidia.com/gpu": 1000}) and not ext.interested({"cpu": 1000})
    assert parse_scheduler_config({**doc, "extenders": [{"urlPrefix": "http://x"}]})[0].http_timeout == 5.0
    with pytest.raises(SchedulerConfigError, match=r"extenders\[0\].enableHTTPS"):
        parse_scheduler_config({**doc, "extenders": [{"urlPrefix": "http://x", "enableHTTPS": True}]})
    with pytest.raises(SchedulerConfigError, match="apiVersion"):
        parse_scheduler_config({**doc, "apiVersion": "v1"})
