"""Unit tests of the in-process Store API that the simulated fleet writes through.

Aspects: mutate writes nothing for a no-op and one event for a change; the status subresource
takes only status; internal creates keep status while API-client creates reset it; emptying the
finalizers of a deleting object removes it; a dry-run delete answers what a delete would do (a
namespace Terminating, a finalizer added) and changes nothing; watches replay, follow live, end
on close, end after overflowing their queue, and end when their CRD goes; a resourceVersion
older than the window is 410; the clock stamps creation and deletion times; eviction listeners
hear each served eviction (with the pod as it was), never a dry run or a plain deletion.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store, format_timestamp


def _cm(name: str, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", **extra}, "data": {"v": "1"}}


async def _drain(watch: Any, count: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    async with asyncio.timeout(5):
        for _ in range(count):
            etype, obj = await anext(aiter(watch))
            out.append((etype, obj["metadata"]["name"]))
    return out


async def test_mutate_no_op_writes_nothing_and_change_writes_once() -> None:
    store = Store(ManualClock())
    created = store.create("configmaps", _cm("a"), validate=False)
    rv = store.resource_version
    watch = store.watch("configmaps", "default", resource_version=str(rv))
    same = store.mutate("configmaps", "a", "default", lambda obj: None)
    assert same == created and store.resource_version == rv
    changed = store.mutate("configmaps", "a", "default", lambda obj: {**obj, "data": {"v": "2"}})
    assert changed["data"] == {"v": "2"} and store.resource_version == rv + 1
    assert await _drain(watch, 1) == [("MODIFIED", "a")]
    assert not watch.pending()
    watch.close()


async def test_status_subresource_takes_only_status() -> None:
    store = Store(ManualClock())
    store.create("pods", {"metadata": {"name": "p", "namespace": "default"}, "spec": {}}, validate=False)

    def both(obj: dict[str, Any]) -> None:
        obj["status"] = {"phase": "Running"}
        obj["metadata"]["labels"] = {"ignored": "yes"}

    after = store.mutate("pods", "p", "default", both, subresource="status")
    assert after["status"] == {"phase": "Running"} and "labels" not in after["metadata"]


def test_internal_create_keeps_status_and_client_create_resets_it() -> None:
    store = Store(ManualClock())
    body = {
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "m", "image": "i"}]},
        "status": {"phase": "Running"},
    }
    assert store.create("pods", body, validate=False)["status"] == {"phase": "Running"}
    body["metadata"]["name"] = "q"
    assert store.create("pods", body)["status"] == {"phase": "Pending", "qosClass": "BestEffort"}


def test_emptying_finalizers_of_a_deleting_object_removes_it() -> None:
    clock = ManualClock()
    store = Store(clock)
    store.create("configmaps", _cm("held", finalizers=["x/y"]), validate=False)
    clock.advance(3)
    deleting = store.delete("configmaps", "held", "default")
    assert deleting["metadata"]["deletionTimestamp"] == format_timestamp(clock.now())
    assert store.delete("configmaps", "held", "default") == deleting  # a second delete changes nothing

    def clear(obj: dict[str, Any]) -> None:
        obj["metadata"]["finalizers"] = []

    store.mutate("configmaps", "held", "default", clear)
    with pytest.raises(ApiError) as exc:
        store.get("configmaps", "held", "default")
    assert exc.value.code == 404


def test_a_dry_run_delete_changes_nothing_whatever_holds_the_object() -> None:
    store = Store(ManualClock())
    store.finalizing_controllers = True  # a namespace then turns Terminating, others get a finalizer
    store.create("namespaces", {"metadata": {"name": "team"}}, validate=False)
    store.create("configmaps", _cm("held", finalizers=["x/y"]), validate=False)
    before = store.resource_version
    answered = store.delete("namespaces", "team", dry_run=True)
    assert answered["status"]["phase"] == "Terminating" and answered["metadata"]["deletionTimestamp"]
    held = store.delete("configmaps", "held", "default", dry_run=True, policy="Orphan")
    assert held["metadata"]["finalizers"] == ["x/y", "orphan"] and held["metadata"]["deletionTimestamp"]
    assert store.resource_version == before
    assert store.get("namespaces", "team")["status"]["phase"] == "Active"
    assert "deletionTimestamp" not in store.get("configmaps", "held", "default")["metadata"]


async def test_watch_replays_synthetic_adds_then_follows_live_and_ends_on_close() -> None:
    store = Store(ManualClock())
    store.create("configmaps", _cm("old"), validate=False)
    watch = store.watch("configmaps", "default")
    store.create("configmaps", _cm("new"), validate=False)
    store.create("configmaps", {**_cm("elsewhere"), "metadata": {"name": "x", "namespace": "kube-system"}})
    assert await _drain(watch, 2) == [("ADDED", "old"), ("ADDED", "new")]
    watch.close()
    assert [e async for e in watch] == []
    assert store.watcher_count() == 0


async def test_slow_watcher_overflowing_its_queue_is_ended_after_what_it_holds() -> None:
    store = Store(ManualClock(), watch_queue_size=2)
    watch = store.watch("configmaps", "default", resource_version=str(store.resource_version))
    for i in range(4):
        store.create("configmaps", _cm(f"c{i}"), validate=False)
    assert watch.overflowed
    assert [name for _, name in await _drain(watch, 2)] == ["c0", "c1"]
    async with asyncio.timeout(5):
        assert await watch.next_entry() is None


def test_resource_version_older_than_the_window_is_410() -> None:
    store = Store(ManualClock(), watch_window=2)
    start = store.resource_version
    store.create("configmaps", _cm("a"), validate=False)
    store.create("configmaps", _cm("b"), validate=False)
    store.watch("configmaps", resource_version=str(start)).close()  # both events still retained
    store.create("configmaps", _cm("c"), validate=False)
    with pytest.raises(ApiError) as exc:
        store.watch("configmaps", resource_version=str(start))
    assert (exc.value.code, exc.value.reason) == (410, "Expired")


async def test_deleting_a_crd_ends_its_watches_and_stops_serving_it() -> None:
    store = Store(ManualClock())
    crd = {
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True}],
        },
    }
    store.create("customresourcedefinitions.apiextensions.k8s.io", crd)
    store.create("widgets.example.com", {"metadata": {"name": "w"}})
    watch = store.watch("widgets.example.com", resource_version=str(store.resource_version))
    store.delete("customresourcedefinitions.apiextensions.k8s.io", "widgets.example.com")
    assert await _drain(watch, 1) == [("DELETED", "w")]
    async with asyncio.timeout(5):
        assert await watch.next_entry() is None
    with pytest.raises(ApiError) as exc:
        store.list("widgets.example.com")
    assert exc.value.code == 404


def test_eviction_without_budget_deletes() -> None:
    store = Store(ManualClock())
    store.create("pods", {"metadata": {"name": "p", "namespace": "default"}, "spec": {}}, validate=False)
    assert store.evict("p", "default")["status"] == "Success"
    assert store.list("pods", "default")[0] == []


def test_eviction_listeners_hear_served_evictions_only() -> None:
    store = Store(ManualClock())
    heard: list[str] = []
    store.eviction_listeners.append(lambda pod: heard.append(pod["metadata"]["name"]))
    for name in ("a", "b", "c"):
        store.create("pods", {"metadata": {"name": name, "namespace": "default"}, "spec": {}}, validate=False)
    store.evict("a", "default", dry_run=True)
    store.delete("pods", "b", "default")
    store.evict("c", "default")
    assert heard == ["c"]


def test_a_namespace_created_with_null_status_is_active() -> None:
    store = Store(ManualClock())
    created = store.create("namespaces", {"metadata": {"name": "tenant-a"}, "status": None})
    assert created["status"] == {"phase": "Active"}


def test_every_crd_schema_update_takes_effect_for_the_next_write() -> None:
    store = Store(ManualClock())
    crds = "customresourcedefinitions.apiextensions.k8s.io"
    spec_schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    schema = {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}}
    store.create(
        crds,
        {
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com",
                "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": schema,
                    }
                ],
            },
        },
    )
    for i in range(20):
        wanted = "integer" if i % 2 == 0 else "string"
        crd = store.get(crds, "widgets.example.com")
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["a"] = {
            "type": wanted
        }
        store.update(crds, crd)
        widget = {"metadata": {"name": f"w{i}"}, "spec": {"a": "text"}}
        if wanted == "string":
            store.create("widgets.example.com", widget, namespace="default")
        else:
            with pytest.raises(ApiError) as exc:
                store.create("widgets.example.com", widget, namespace="default")
            assert exc.value.code == 422
