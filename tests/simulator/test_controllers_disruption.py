"""The disruption controller keeps PodDisruptionBudget status true between evictions.

Aspects: status appears for a new budget (expectedPods from the ReplicaSet's scale, healthy
pods, desired, allowed, observedGeneration, the DisruptionAllowed condition); it follows pods
becoming Ready; an eviction's disruptedPods entry is dropped once the pod is being deleted and
the replacement counts once Ready; a percentage budget rounds up; the entry of an evicted pod
that never goes stops counting after two minutes of simulated time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import format_timestamp
from simulator.fleet.disruption_controller import DisruptionController
from simulator.fleet.garbage_collector import GarbageCollector
from simulator.fleet.replicaset_controller import ReplicaSetController
from tests.support.controllers import Controllers, template

PDBS = "poddisruptionbudgets.policy"


@pytest.fixture
async def world() -> AsyncIterator[Controllers]:
    world = Controllers()
    world.store.finalizing_controllers = True
    world.start(
        GarbageCollector(world.store),
        DisruptionController(world.store, world.timers),
        ReplicaSetController(world.store, world.timers, world.recorder, rand_suffix=world.suffix),
    )
    yield world
    await world.stop()


def _status(world: Controllers, name: str = "budget") -> dict[str, Any]:
    return world.store.get(PDBS, name, "default").get("status") or {}


def _counts(world: Controllers, name: str = "budget") -> tuple[int, int, int, int]:
    s = _status(world, name)
    return (s.get("expectedPods", -1), s.get("currentHealthy", -1), s.get("desiredHealthy", -1),
            s.get("disruptionsAllowed", -1))  # fmt: skip


async def _six_ready(world: Controllers) -> list[str]:
    world.store.create(
        "replicasets.apps",
        {
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}}, "template": template("web")},
        },
    )
    await world.settle(lambda: len(world.pods()) == 6)
    names = [p["metadata"]["name"] for p in world.pods()]
    for name in names:
        world.make_ready(name)
    return names


def _pdb(name: str = "budget", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec},
    }


async def test_status_follows_pods_and_evictions(world: Controllers) -> None:
    names = await _six_ready(world)
    world.store.create(PDBS, _pdb(maxUnavailable=1))
    await world.settle(lambda: _counts(world) == (6, 6, 5, 1))
    status = _status(world)
    assert status["observedGeneration"] == 1
    assert [(c["type"], c["status"], c["reason"]) for c in status["conditions"]] == [
        ("DisruptionAllowed", "True", "SufficientPods")
    ]
    world.store.evict(names[0], "default")
    with pytest.raises(ApiError) as exc:
        world.store.evict(names[1], "default")
    assert exc.value.code == 429
    # The ReplicaSet replaces the evicted pod; once the replacement is Ready one more may go.
    await world.settle(lambda: len(world.pods()) == 6 and _counts(world) == (6, 5, 5, 0))
    assert _status(world)["conditions"][0]["reason"] == "InsufficientPods"
    new = next(p["metadata"]["name"] for p in world.pods() if p["metadata"]["name"] not in names)
    world.make_ready(new)
    await world.settle(lambda: _counts(world) == (6, 6, 5, 1))
    world.store.evict(names[1], "default")


async def test_percentages_round_up(world: Controllers) -> None:
    await _six_ready(world)
    world.store.create(PDBS, _pdb("pct", minAvailable="50%"))
    world.store.create(
        PDBS,
        {
            **_pdb("other", maxUnavailable="10%"),
            "spec": {"selector": {"matchLabels": {"x": "y"}}, "maxUnavailable": "10%"},
        },
    )
    await world.settle(lambda: _counts(world, "pct") == (6, 6, 3, 3))
    world.store.patch(
        PDBS, "pct", "default", {"spec": {"minAvailable": "51%"}}, "application/merge-patch+json"
    )
    await world.settle(
        lambda: _counts(world, "pct") == (6, 6, 4, 2) and _status(world, "pct")["observedGeneration"] == 2
    )


async def test_an_unconfirmed_eviction_expires(world: Controllers) -> None:
    names = await _six_ready(world)
    world.store.create(PDBS, _pdb(minAvailable=5))
    await world.settle(lambda: _counts(world) == (6, 6, 5, 1))
    # An eviction recorded whose pod was never deleted (its deletion failed after the record).
    stamp = format_timestamp(world.clock.now())

    def record(obj: dict[str, Any]) -> None:
        obj["status"]["disruptedPods"] = {names[0]: stamp}

    world.store.mutate(PDBS, "budget", "default", record, subresource="status")
    await world.settle(lambda: _counts(world) == (6, 5, 5, 0))
    assert _status(world)["disruptedPods"] == {names[0]: stamp}
    await world.advance(119)
    assert _counts(world) == (6, 5, 5, 0)
    await world.advance(2)
    await world.settle(lambda: _counts(world) == (6, 6, 5, 1) and "disruptedPods" not in _status(world))


def _ready_pod(name: str, ready: bool = True, phase: str = "Running") -> dict[str, Any]:
    status = "True" if ready else "False"
    return {
        "metadata": {"name": name},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": status}]},
    }


def _budget(current: int, desired: int, allowed: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "b", "generation": 1},
        "spec": spec,
        "status": {"observedGeneration": 1, "currentHealthy": current, "desiredHealthy": desired,
                   "disruptionsAllowed": allowed},
    }  # fmt: skip


def test_eviction_verdicts() -> None:
    from simulator.apiserver.disruption import eviction_verdict

    # Pending, terminal and deleting pods ignore the budget.
    assert eviction_verdict(_budget(0, 1, 0), _ready_pod("p", ready=False, phase="Pending")).allowed
    assert eviction_verdict(_budget(0, 1, 0), _ready_pod("p", phase="Succeeded")).allowed
    # An unready Running pod may go while the budget is met and wants someone healthy ...
    verdict = eviction_verdict(_budget(2, 2, 0), _ready_pod("p", ready=False))
    assert verdict.allowed and not verdict.record
    # ... but not under a budget that wants nobody (a single replica under maxUnavailable 1).
    assert eviction_verdict(_budget(0, 0, 0), _ready_pod("p", ready=False)).code == 429
    assert eviction_verdict(
        _budget(0, 0, 0, unhealthyPodEvictionPolicy="AlwaysAllow"), _ready_pod("p", ready=False)
    ).allowed
    # A healthy pod spends an allowed disruption, which is recorded.
    verdict = eviction_verdict(_budget(3, 2, 1), _ready_pod("p"))
    assert verdict.allowed and verdict.record
    # A budget whose spec changed since its status was computed is still being processed.
    stale = _budget(3, 2, 1)
    stale["metadata"]["generation"] = 2
    verdict = eviction_verdict(stale, _ready_pod("p"))
    assert (verdict.code, verdict.cause) == (
        429,
        "The disruption budget b is still being processed by the server.",
    )
