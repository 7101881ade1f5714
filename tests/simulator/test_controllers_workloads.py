"""The workload controllers over a bare store: ReplicaSets, ReplicationControllers, Deployments.

Aspects: a ReplicaSet creates its missing pods (owned, labelled from the template, unbound,
Pending) and deletes the surplus (unready first); a deleted pod is replaced; status counts
replicas, ready and available pods (minReadySeconds in simulated time); ReplicationControllers
by the same machinery; a Deployment makes its ReplicaSet with the pod-template-hash, a template
change rolls out within maxSurge/maxUnavailable and scales the old set down, Recreate empties the
old set first; Deployment status and conditions; ScalingReplicaSet and SuccessfulCreate events
when Events are served; sets the fleet manages get status only.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.fleet.deployment_controller import DeploymentController
from simulator.fleet.replicaset_controller import REPLICATION_CONTROLLERS, ReplicaSetController
from simulator.fleet.workloads import MANAGED_BY_FLEET
from tests.support.controllers import Controllers, template


@pytest.fixture
async def world() -> AsyncIterator[Controllers]:
    world = Controllers()
    yield world
    await world.stop()


def _rs(name: str, replicas: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template(name),
            **spec,
        },
    }


def _deployment(
    name: str, replicas: int, image: str = "registry.example/app:1", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template(name, image),
            **spec,
        },
    }


def _start_sets(world: Controllers) -> ReplicaSetController:
    rsc = ReplicaSetController(world.store, world.timers, world.recorder, rand_suffix=world.suffix)
    world.start(rsc)
    return rsc


async def test_a_replica_set_keeps_its_pods(world: Controllers) -> None:
    _start_sets(world)
    rs = world.store.create("replicasets.apps", _rs("web", 3))
    await world.settle(lambda: len(world.pods()) == 3)
    for pod in world.pods():
        assert pod["metadata"]["name"].startswith("web-")
        assert pod["metadata"]["labels"] == {"app": "web"}
        assert pod["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web",
                "uid": rs["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert "nodeName" not in pod["spec"]
        assert pod["status"]["phase"] == "Pending"
    first = world.pods()[0]["metadata"]["name"]
    world.store.delete("pods", first, "default")
    await world.settle(
        lambda: len(world.pods()) == 3 and first not in {p["metadata"]["name"] for p in world.pods()}
    )
    names = [p["metadata"]["name"] for p in world.pods()]
    world.make_ready(names[0])
    world.make_ready(names[1])

    def status() -> dict[str, Any]:
        return world.store.get("replicasets.apps", "web", "default").get("status") or {}

    await world.settle(lambda: status().get("readyReplicas") == 2)
    assert status() == {"replicas": 3, "fullyLabeledReplicas": 3, "readyReplicas": 2, "availableReplicas": 2,
                        "observedGeneration": 1}  # fmt: skip

    def scale(to: int) -> None:
        world.store.patch(
            "replicasets.apps", "web", "default", {"spec": {"replicas": to}}, "application/merge-patch+json"
        )

    scale(2)
    await world.settle(lambda: len(world.pods()) == 2)
    # The unready pod went first.
    assert sorted(p["metadata"]["name"] for p in world.pods()) == sorted(names[:2])


async def test_min_ready_seconds_makes_pods_available_later(world: Controllers) -> None:
    _start_sets(world)
    world.store.create("replicasets.apps", _rs("slow", 1, minReadySeconds=30))
    await world.settle(lambda: len(world.pods()) == 1)
    world.make_ready(world.pods()[0]["metadata"]["name"])

    def status() -> dict[str, Any]:
        return world.store.get("replicasets.apps", "slow", "default").get("status") or {}

    await world.settle(lambda: status().get("readyReplicas") == 1)
    assert "availableReplicas" not in status()
    await world.advance(31)
    await world.settle(lambda: status().get("availableReplicas") == 1)


async def test_replication_controllers_by_the_same_machinery(world: Controllers) -> None:
    world.start(
        ReplicaSetController(
            world.store, world.timers, world.recorder, kind=REPLICATION_CONTROLLERS, rand_suffix=world.suffix
        )
    )
    body = {
        "apiVersion": "v1",
        "kind": "ReplicationController",
        "metadata": {"name": "legacy", "namespace": "default"},
        "spec": {"replicas": 2, "selector": {"app": "legacy"}, "template": template("legacy")},
    }
    world.store.create("replicationcontrollers", body)
    await world.settle(lambda: len(world.pods()) == 2)
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in world.pods()} == {"ReplicationController"}


async def test_a_fleet_managed_set_gets_status_only(world: Controllers) -> None:
    _start_sets(world)
    body = _rs("scenario", 2)
    body["metadata"]["annotations"] = {MANAGED_BY_FLEET: "true"}
    world.store.create("replicasets.apps", body)
    await world.settle(
        lambda: (
            (world.store.get("replicasets.apps", "scenario", "default").get("status") or {}).get(
                "observedGeneration"
            )
            == 1
        )
    )
    assert world.pods() == []


def _sets(world: Controllers) -> dict[str, int]:
    items = world.store.list("replicasets.apps", "default")[0]
    return {rs["metadata"]["name"]: rs["spec"]["replicas"] for rs in items}


async def _ready_all(world: Controllers) -> None:
    for pod in world.pods():
        if (pod.get("status") or {}).get("phase") != "Running":
            world.make_ready(pod["metadata"]["name"])


async def test_a_deployment_rolls_out_a_new_template(world: Controllers) -> None:
    _start_sets(world)
    world.start(DeploymentController(world.store, world.timers, world.recorder))
    world.store.create(
        "deployments.apps",
        _deployment(
            "api",
            4,
            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        ),
    )
    await world.settle(lambda: len(world.pods()) == 4)
    (first,) = _sets(world)
    hash_ = first.removeprefix("api-")
    assert {p["metadata"]["labels"]["pod-template-hash"] for p in world.pods()} == {hash_}
    rs = world.store.get("replicasets.apps", first, "default")
    assert rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "1"
    assert rs["spec"]["selector"]["matchLabels"] == {"app": "api", "pod-template-hash": hash_}
    await _ready_all(world)

    def status() -> dict[str, Any]:
        return world.store.get("deployments.apps", "api", "default").get("status") or {}

    await world.settle(lambda: status().get("availableReplicas") == 4)
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status()["conditions"]}
    assert conditions == {
        "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("True", "NewReplicaSetAvailable"),
    }
    new_image = {"containers": [{"name": "main", "image": "registry.example/app:2"}]}
    world.store.patch(
        "deployments.apps",
        "api",
        "default",
        {"spec": {"template": {"spec": new_image}}},
        "application/merge-patch+json",
    )
    # maxSurge 1, maxUnavailable 0: one new pod at a time, an old one goes only once it is available.
    await world.settle(lambda: len(_sets(world)) == 2)
    sets = _sets(world)
    second = next(name for name in sets if name != first)
    assert sets == {first: 4, second: 1}
    seen: list[int] = []
    for _ in range(4):
        await world.settle(lambda: len(world.pods()) == 5)
        await _ready_all(world)
        await world.settle(lambda: _sets(world)[first] < (seen[-1] if seen else 4))
        seen.append(_sets(world)[first])
        assert sum(_sets(world).values()) <= 5
    await _ready_all(world)
    await world.settle(lambda: _sets(world) == {first: 0, second: 4} and status().get("updatedReplicas") == 4)
    await world.settle(lambda: status().get("availableReplicas") == 4 and "replicas" in status())
    assert status()["replicas"] == 4
    assert (
        world.store.get("replicasets.apps", second, "default")["metadata"]["annotations"][
            "deployment.kubernetes.io/revision"
        ]
        == "2"
    )


async def test_recreate_empties_the_old_set_first(world: Controllers) -> None:
    _start_sets(world)
    world.start(DeploymentController(world.store, world.timers, world.recorder))
    world.store.create("deployments.apps", _deployment("batch", 2, strategy={"type": "Recreate"}))
    await world.settle(lambda: len(world.pods()) == 2)
    (first,) = _sets(world)
    world.store.patch(
        "deployments.apps", "batch", "default",
        {"spec": {"template": {"metadata": {"labels": {"app": "batch", "v": "2"}}}}},
        "application/merge-patch+json",
    )  # fmt: skip
    await world.settle(lambda: len(_sets(world)) == 2 and not world.pods())
    assert sorted(_sets(world).values()) == [0, 2] or _sets(world)[first] == 0
    await world.settle(lambda: len(world.pods()) == 2)
    assert all(p["metadata"]["labels"].get("v") == "2" for p in world.pods())


async def test_events_are_recorded(world: Controllers) -> None:
    _start_sets(world)
    world.start(DeploymentController(world.store, world.timers, world.recorder))
    world.store.create("deployments.apps", _deployment("evt", 1))
    await world.settle(lambda: len(world.pods()) == 1)

    def reasons() -> set[tuple[str, str, str]]:
        events = world.store.list("events", "default")[0]
        return {(e["source"]["component"], e["reason"], e["involvedObject"]["kind"]) for e in events}

    await world.settle(
        lambda: (
            {
                ("deployment-controller", "ScalingReplicaSet", "Deployment"),
                ("replicaset-controller", "SuccessfulCreate", "ReplicaSet"),
            }
            <= reasons()
        )
    )
    (scaled,) = [e for e in world.store.list("events", "default")[0] if e["reason"] == "ScalingReplicaSet"]
    assert scaled["message"].startswith("Scaled up replica set evt-") and scaled["message"].endswith(
        " from 0 to 1"
    )
    assert scaled["type"] == "Normal" and scaled["count"] == 1
