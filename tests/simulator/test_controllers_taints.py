"""Taint-based eviction over a bare store: node taints, cordon, DeviceTaintRules.

Aspects: a NoExecute node taint deletes pods that do not tolerate it at once and those with
tolerationSeconds when that has passed in simulated time (not before), and not at all when the
taint goes first; a cordoned node gets the unschedulable NoSchedule taint and loses it when
uncordoned; a NoExecute DeviceTaintRule deletes the pods whose allocated claim holds a matching
device unless the claim's request tolerates it, and reports EvictionInProgress; an effect-None
rule previews what NoExecute would do; the condition messages as the real controller words them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.apiserver.errors import ApiError
from simulator.fleet.taint_manager import TaintManager, UnschedulableTainter, rule_condition
from simulator.fleet.tolerations import toleration_seconds
from tests.support.controllers import Controllers


@pytest.fixture
async def world() -> AsyncIterator[Controllers]:
    world = Controllers()
    world.start(
        TaintManager(world.store, world.timers, world.recorder),
        UnschedulableTainter(world.store, world.timers),
    )
    world.store.create("nodes", {"metadata": {"name": "n1"}})
    yield world
    await world.stop()


def _pod(
    name: str, tolerations: list[dict[str, Any]] | None = None, claim: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": "n1",
        "containers": [{"name": "main", "image": "registry.example/app:1"}],
    }
    if tolerations:
        spec["tolerations"] = tolerations
    if claim:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": claim}]
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


def _exists(world: Controllers, name: str) -> bool:
    try:
        world.store.get("pods", name, "default")
    except ApiError:
        return False
    return True


def _taint_node(world: Controllers, taints: list[dict[str, Any]]) -> None:
    def apply(obj: dict[str, Any]) -> None:
        obj.setdefault("spec", {})["taints"] = taints

    world.store.mutate("nodes", "n1", None, apply)


BROKEN = {"key": "example.com/broken", "effect": "NoExecute"}


def test_toleration_seconds() -> None:
    assert toleration_seconds([], [BROKEN]) == 0
    assert toleration_seconds([{"operator": "Exists"}], [BROKEN]) is None
    assert (
        toleration_seconds(
            [{"key": "example.com/broken", "operator": "Exists", "tolerationSeconds": 30}], [BROKEN]
        )
        == 30
    )
    assert (
        toleration_seconds([{"key": "example.com/broken", "value": "x", "tolerationSeconds": 30}], [BROKEN])
        == 0
    )


async def test_node_taints_evict_untolerating_pods(world: Controllers) -> None:
    world.store.create("pods", _pod("plain"))
    world.store.create(
        "pods",
        _pod(
            "patient",
            [
                {
                    "key": "example.com/broken",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 60,
                }
            ],
        ),
    )
    world.store.create("pods", _pod("immune", [{"operator": "Exists"}]))
    _taint_node(world, [BROKEN])
    await world.settle(lambda: not _exists(world, "plain"))
    await world.advance(59)
    assert _exists(world, "patient")
    await world.advance(2)
    await world.settle(lambda: not _exists(world, "patient"))
    assert _exists(world, "immune")


async def test_a_taint_that_goes_in_time_evicts_nobody(world: Controllers) -> None:
    world.store.create(
        "pods",
        _pod(
            "patient",
            [
                {
                    "key": "example.com/broken",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 60,
                }
            ],
        ),
    )
    manager = world.running[0]
    _taint_node(world, [BROKEN])
    await world.settle(lambda: manager.scheduled == {("default", "patient"): 60.0})
    await world.advance(30)
    _taint_node(world, [])
    await world.settle(lambda: manager.scheduled == {})
    await world.advance(40)
    assert _exists(world, "patient")
    # Back again: the toleration counts from now, not from the first time.
    _taint_node(world, [BROKEN])
    await world.settle(lambda: manager.scheduled == {("default", "patient"): 130.0})
    await world.advance(59)
    assert _exists(world, "patient")
    await world.advance(2)
    await world.settle(lambda: not _exists(world, "patient"))


async def test_cordon_taints_the_node(world: Controllers) -> None:
    def cordon(value: bool) -> None:
        world.store.patch(
            "nodes", "n1", None, {"spec": {"unschedulable": value}}, "application/merge-patch+json"
        )

    def taints() -> list[dict[str, Any]]:
        return list(world.store.get("nodes", "n1")["spec"].get("taints") or [])

    cordon(True)
    await world.settle(
        lambda: (
            [(t["key"], t["effect"]) for t in taints()]
            == [("node.kubernetes.io/unschedulable", "NoSchedule")]
        )
    )
    cordon(False)
    await world.settle(lambda: taints() == [])


def _claim(
    world: Controllers, name: str, device: str, tolerations: list[dict[str, Any]] | None = None
) -> None:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com", "count": 1}
    if tolerations:
        exactly["tolerations"] = tolerations
    world.store.create(
        "resourceclaims.resource.k8s.io",
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
            "status": {
                "allocation": {"devices": {"results": [
                    {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n1", "device": device}
                ]}},
                "reservedFor": [{"resource": "pods", "name": name}],
            },
        },
        validate=False,
    )  # fmt: skip


def _rule(effect: str, device: str = "gpu-0") -> dict[str, Any]:
    return {
        "metadata": {"name": "quarantine"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": device},
            "taint": {"key": "gpuhealth.io/quarantine", "value": "xid-79", "effect": effect},
        },
    }


def _condition(world: Controllers) -> dict[str, Any]:
    rule = world.store.get("devicetaintrules.resource.k8s.io", "quarantine")
    conditions = (rule.get("status") or {}).get("conditions") or [{}]
    return dict(conditions[0])


async def test_a_device_taint_rule_evicts_pods_on_the_device(world: Controllers) -> None:
    for name, device, tolerations in (
        ("on-bad", "gpu-0", None),
        ("tolerant", "gpu-0", [{"key": "gpuhealth.io/quarantine", "operator": "Exists"}]),
        ("elsewhere", "gpu-1", None),
    ):
        _claim(world, name, device, tolerations)
        world.store.create("pods", _pod(name, claim=name))
    world.store.create("devicetaintrules.resource.k8s.io", _rule("None"))
    await world.settle(lambda: _condition(world).get("reason") == "NoEffect")
    assert _condition(world)["message"] == (
        "0 published devices selected. 2 allocated devices selected. 1 pod would be evicted in 1 namespace "
        "if the effect was NoExecute. This information will not be updated again. "
        "Recreate the DeviceTaintRule to trigger an update."
    )
    assert _exists(world, "on-bad")
    world.store.patch(
        "devicetaintrules.resource.k8s.io", "quarantine", None,
        {"spec": {"taint": {"effect": "NoExecute"}}}, "application/merge-patch+json",
    )  # fmt: skip
    await world.settle(lambda: not _exists(world, "on-bad"))
    await world.settle(lambda: _condition(world).get("reason") == "Completed")
    assert _condition(world)["status"] == "False"
    assert _condition(world)["message"] == "1 pod evicted since starting the controller."
    assert _exists(world, "tolerant") and _exists(world, "elsewhere")


def test_condition_wording() -> None:
    rule = _rule("NoExecute")
    assert rule_condition(rule, 2, 2, 1, 0, 0) == (
        "True",
        "PodsPendingEviction",
        "2 pods need to be evicted in 2 different namespaces. 1 pod evicted since starting the controller.",
    )
    assert rule_condition(rule, 0, 0, 0, 0, 0) == ("False", "NotStarted", "")
    assert rule_condition(_rule("NoSchedule"), 0, 0, 0, 0, 0) == (
        "False", "OtherEffect", "Eviction only happens for the NoExecute effect."
    )  # fmt: skip
