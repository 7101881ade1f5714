"""Garbage collection and namespace deletion over a bare store with the controllers running.

Aspects: a dependent whose owner is gone is deleted, one with another owner left only loses the
dangling reference; background deletion of a ReplicaSet takes its pods; Orphan (and the batch/v1
Job default) strips the owner reference and keeps the pods; Foreground keeps the owner with a
deletionTimestamp and the foregroundDeletion finalizer until its blocking dependents are gone;
a bad propagationPolicy is 422; deleting a namespace makes it Terminating (spec.finalizers
kubernetes), creating in it is 403 with the real wording, re-creating it 409, and it goes once
emptied, waiting for objects with finalizers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from simulator.apiserver.errors import ApiError
from simulator.apiserver.propagation import deletion_policy
from simulator.fleet.garbage_collector import GarbageCollector
from simulator.fleet.namespace_controller import NamespaceController
from simulator.fleet.replicaset_controller import ReplicaSetController
from tests.support.controllers import Controllers, template


@pytest.fixture
async def world() -> AsyncIterator[Controllers]:
    world = Controllers()
    world.store.finalizing_controllers = True
    world.start(
        GarbageCollector(world.store),
        NamespaceController(world.store, world.timers),
        ReplicaSetController(world.store, world.timers, world.recorder, rand_suffix=world.suffix),
    )
    yield world
    await world.stop()


def _exists(world: Controllers, resource: str, name: str, namespace: str | None = "default") -> bool:
    try:
        world.store.get(resource, name, namespace)
    except ApiError as exc:
        assert exc.code == 404
        return False
    return True


def _pod(name: str, owners: list[dict[str, Any]], namespace: str = "default") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "ownerReferences": owners},
        "spec": {"containers": [{"name": "main", "image": "registry.example/app:1"}]},
    }


def _ref(obj: dict[str, Any], block: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "blockOwnerDeletion": block,
    }


def _config_map(world: Controllers, name: str, namespace: str = "default") -> dict[str, Any]:
    return world.store.create("configmaps", {"metadata": {"name": name, "namespace": namespace}})


async def test_dependents_of_a_missing_owner_are_deleted(world: Controllers) -> None:
    owner = _config_map(world, "owner")
    other = _config_map(world, "other")
    ghost = {**_ref(owner), "name": "ghost", "uid": "00000000-0000-4000-8000-000000000000"}
    world.store.create("pods", _pod("orphaned", [ghost]))
    world.store.create("pods", _pod("shared", [_ref(owner), _ref(other)]))
    await world.settle(lambda: not _exists(world, "pods", "orphaned"))
    world.store.delete("configmaps", "other", "default")
    await world.settle(
        lambda: (
            [r["name"] for r in world.store.get("pods", "shared", "default")["metadata"]["ownerReferences"]]
            == ["owner"]
        )
    )


def _rs(name: str, replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": template(name),
        },
    }


async def test_background_orphan_and_foreground_deletion(world: Controllers) -> None:
    for name in ("bg", "orph", "fg"):
        world.store.create("replicasets.apps", _rs(name, 2))
    await world.settle(lambda: len(world.pods()) == 6)
    world.store.delete("replicasets.apps", "bg", "default")
    await world.settle(lambda: not world.pods(selector="app=bg"))

    world.store.delete("replicasets.apps", "orph", "default", policy="Orphan")
    await world.settle(lambda: not _exists(world, "replicasets.apps", "orph"))
    kept = world.pods(selector="app=orph")
    assert len(kept) == 2 and all("ownerReferences" not in p["metadata"] for p in kept)

    # A finalizer on one pod holds it (being deleted) and with it the foreground owner.
    held = world.pods(selector="app=fg")[0]["metadata"]["name"]
    world.store.patch(
        "pods",
        held,
        "default",
        {"metadata": {"finalizers": ["example.com/hold"]}},
        "application/merge-patch+json",
    )
    world.store.delete("replicasets.apps", "fg", "default", policy="Foreground")
    owner = world.store.get("replicasets.apps", "fg", "default")
    assert owner["metadata"]["deletionTimestamp"] and owner["metadata"]["finalizers"] == [
        "foregroundDeletion"
    ]
    await world.settle(lambda: [p["metadata"]["name"] for p in world.pods(selector="app=fg")] == [held])
    assert _exists(world, "replicasets.apps", "fg")
    world.store.patch(
        "pods", held, "default", {"metadata": {"finalizers": []}}, "application/merge-patch+json"
    )
    await world.settle(lambda: not _exists(world, "replicasets.apps", "fg"))


def test_propagation_policy_is_checked() -> None:
    assert deletion_policy({"propagationPolicy": "Foreground"}, {}) == "Foreground"
    assert deletion_policy({}, {"propagationPolicy": "Orphan"}) == "Orphan"
    assert deletion_policy({"orphanDependents": True}, {}) == "Orphan"
    with pytest.raises(ApiError) as exc:
        deletion_policy({"propagationPolicy": "Sideways"}, {})
    assert exc.value.code == 422
    assert 'Unsupported value: "Sideways"' in exc.value.message


async def test_jobs_orphan_their_pods_by_default(world: Controllers) -> None:
    job = world.store.create(
        "jobs.batch",
        {"metadata": {"name": "j", "namespace": "default"}, "spec": {"template": {**template("j"), "spec": {
            "containers": [{"name": "main", "image": "registry.example/app:1"}], "restartPolicy": "Never"}}}},
    )  # fmt: skip
    world.store.create("pods", _pod("j-pod", [_ref(job)]))
    world.store.delete("jobs.batch", "j", "default")
    await world.settle(lambda: not _exists(world, "jobs.batch", "j"))
    assert "ownerReferences" not in world.store.get("pods", "j-pod", "default")["metadata"]


async def test_a_deleted_namespace_terminates_then_goes(world: Controllers) -> None:
    world.store.create("namespaces", {"metadata": {"name": "team"}})
    assert world.store.get("namespaces", "team")["spec"] == {"finalizers": ["kubernetes"]}
    _config_map(world, "plain", "team")
    held = world.store.create(
        "configmaps", {"metadata": {"name": "held", "namespace": "team", "finalizers": ["example.com/hold"]}}
    )
    world.store.delete("namespaces", "team")
    ns = world.store.get("namespaces", "team")
    assert ns["status"]["phase"] == "Terminating" and ns["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiError) as exc:
        _config_map(world, "late", "team")
    assert exc.value.code == 403
    assert exc.value.message == (
        'configmaps "late" is forbidden: '
        "unable to create new content in namespace team because it is being terminated"
    )
    with pytest.raises(ApiError) as exc:
        world.store.create("namespaces", {"metadata": {"name": "team"}})
    assert exc.value.code == 409
    await world.settle(lambda: not _exists(world, "configmaps", "plain", "team"))
    await world.settle(
        lambda: any(
            c["type"] == "NamespaceFinalizersRemaining"
            for c in world.store.get("namespaces", "team")["status"].get("conditions", [])
        )
    )
    assert _exists(world, "namespaces", "team", None)
    world.store.patch(
        "configmaps",
        held["metadata"]["name"],
        "team",
        {"metadata": {"finalizers": []}},
        "application/merge-patch+json",
    )
    await world.advance(3)
    await world.settle(lambda: not _exists(world, "namespaces", "team", None))
