"""StatefulSets over a bare store: stable names, ordered or parallel creation, same-name recreation.

Aspects: OrderedReady creates `<set>-0` first and `<set>-1` only once `<set>-0` is Running and
Ready; pods carry the pod-name, pod-index and controller-revision-hash labels, hostname and
subdomain; a deleted pod comes back under its name; scaling down removes the highest ordinal;
Parallel creates all at once; a template change replaces pods from the highest ordinal; status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.fleet.statefulset_controller import StatefulSetController
from tests.support.controllers import Controllers, template


@pytest.fixture
async def world() -> AsyncIterator[Controllers]:
    world = Controllers()
    world.start(StatefulSetController(world.store, world.timers, world.recorder))
    yield world
    await world.stop()


def _sts(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": template(name),
            **spec,
        },
    }


def _names(world: Controllers) -> list[str]:
    return sorted(p["metadata"]["name"] for p in world.pods())


async def test_ordered_ready_creates_one_at_a_time(world: Controllers) -> None:
    world.store.create("statefulsets.apps", _sts("trainer", 3))
    await world.settle(lambda: _names(world) == ["trainer-0"])
    pod = world.pods()[0]
    labels = pod["metadata"]["labels"]
    assert labels["statefulset.kubernetes.io/pod-name"] == "trainer-0"
    assert labels["apps.kubernetes.io/pod-index"] == "0"
    assert labels["controller-revision-hash"].startswith("trainer-")
    assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("trainer-0", "trainer")
    world.make_ready("trainer-0")
    await world.settle(lambda: _names(world) == ["trainer-0", "trainer-1"])
    world.make_ready("trainer-1")
    await world.settle(lambda: _names(world) == ["trainer-0", "trainer-1", "trainer-2"])
    world.make_ready("trainer-2")
    uid = world.store.get("pods", "trainer-1", "default")["metadata"]["uid"]
    world.store.delete("pods", "trainer-1", "default")
    await world.settle(
        lambda: (
            "trainer-1" in _names(world)
            and world.store.get("pods", "trainer-1", "default")["metadata"]["uid"] != uid
        )
    )
    world.make_ready("trainer-1")
    status = lambda: world.store.get("statefulsets.apps", "trainer", "default").get("status") or {}  # noqa: E731
    await world.settle(lambda: status().get("readyReplicas") == 3)
    assert status()["currentRevision"] == status()["updateRevision"]
    world.store.patch(
        "statefulsets.apps", "trainer", "default", {"spec": {"replicas": 2}}, "application/merge-patch+json"
    )
    await world.settle(lambda: _names(world) == ["trainer-0", "trainer-1"])


async def test_parallel_and_rolling_update(world: Controllers) -> None:
    world.store.create("statefulsets.apps", _sts("shard", 3, podManagementPolicy="Parallel"))
    await world.settle(lambda: _names(world) == ["shard-0", "shard-1", "shard-2"])
    for name in _names(world):
        world.make_ready(name)
    old = world.store.get("pods", "shard-2", "default")["metadata"]["labels"]["controller-revision-hash"]
    change = {"spec": {"template": {"metadata": {"labels": {"app": "shard", "v": "2"}}}}}
    world.store.patch("statefulsets.apps", "shard", "default", change, "application/merge-patch+json")

    def revision(name: str) -> str | None:
        pods = {p["metadata"]["name"]: p for p in world.pods()}
        return pods[name]["metadata"]["labels"]["controller-revision-hash"] if name in pods else None

    await world.settle(lambda: revision("shard-2") not in (None, old))
    assert revision("shard-0") == old  # highest ordinal first, one at a time
