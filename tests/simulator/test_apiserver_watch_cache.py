"""The watch cache: per-resource windows by count and by age, and what they serve.

Aspects: a watch from a version inside the window replays it, one whose events left the window
by count or by age is 410 "too old resource version: R (F)"; a version from before the store
started (a client outliving a restart) is 410 as well; a future version is 504
ResourceVersionTooLarge with retryAfterSeconds, in the store and as an ERROR event in a watch
stream; one resource's churn does not expire another's window; an exact list rebuilds the state
at an older version (objects added, changed and deleted since are undone); the settings refuse
nonsense. Through the official client: a watch of a shrunk cache makes `watch.Watch` raise 410,
and a relist then watching from the list's version works.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from gpuhealth.clock import ManualClock
from simulator.apiserver.errors import ApiError
from simulator.apiserver.store import Store
from simulator.apiserver.watch_cache import WatchCacheSettings

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster


def _cm(name: str, value: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default"}, "data": {"v": value}}


def _names(store: Store, at: int | None = None) -> dict[str, str]:
    entries, _ = store.list_entries("configmaps", "default", at=at)
    return {e.name: e.load()["data"]["v"] for e in entries}


def test_events_leaving_the_window_by_count_make_older_versions_410() -> None:
    store = Store(ManualClock(), watch_cache=WatchCacheSettings(capacity_events=2))
    start = store.resource_version
    store.create("configmaps", _cm("a"), validate=False)
    store.create("configmaps", _cm("b"), validate=False)
    assert [e[3].name for e in store.events_since("configmaps", start)] == ["a", "b"]
    store.create("configmaps", _cm("c"), validate=False)
    with pytest.raises(ApiError) as exc:
        store.watch("configmaps", resource_version=str(start))
    assert (exc.value.code, exc.value.reason) == (410, "Expired")
    assert exc.value.message == f"too old resource version: {start} ({start + 1})"
    store.watch("configmaps", resource_version=str(start + 1)).close()


def test_events_leaving_the_window_by_age_make_older_versions_410() -> None:
    clock = ManualClock()
    store = Store(clock, watch_cache=WatchCacheSettings(max_age_seconds=60))
    start = store.resource_version
    store.create("configmaps", _cm("a"), validate=False)
    clock.advance(59)
    store.watch("configmaps", resource_version=str(start)).close()
    clock.advance(2)
    with pytest.raises(ApiError) as exc:
        store.watch("configmaps", resource_version=str(start))
    assert exc.value.code == 410
    # Nothing newer left the window: a watch from the evicted event's version still works.
    store.watch("configmaps", resource_version=str(start + 1)).close()


def test_a_version_from_before_the_store_started_is_410() -> None:
    store = Store(ManualClock())
    assert store.resource_version > 1  # the bootstrap namespaces
    with pytest.raises(ApiError) as exc:
        store.watch("namespaces", resource_version="1")
    assert exc.value.message == f"too old resource version: 1 ({store.resource_version})"


def test_a_future_version_is_504_too_large() -> None:
    store = Store(ManualClock())
    current = store.resource_version
    with pytest.raises(ApiError) as exc:
        store.watch("configmaps", resource_version=str(current + 5))
    err = exc.value
    assert (err.code, err.reason) == (504, "Timeout")
    assert err.message == f"Too large resource version: {current + 5}, current: {current}"
    assert err.details == {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }


def test_one_resources_churn_leaves_another_resources_window_alone() -> None:
    store = Store(ManualClock(), watch_cache=WatchCacheSettings(capacity_events=2))
    start = store.resource_version
    store.create("configmaps", _cm("a"), validate=False)
    for i in range(5):
        store.create("namespaces", {"metadata": {"name": f"ns{i}"}}, validate=False)
    assert [e[3].name for e in store.events_since("configmaps", start)] == ["a"]


def test_an_exact_list_undoes_what_happened_since() -> None:
    store = Store(ManualClock())
    store.create("configmaps", _cm("keep", "1"), validate=False)
    store.create("configmaps", _cm("gone", "1"), validate=False)
    then = store.resource_version
    store.mutate("configmaps", "keep", "default", lambda o: {**o, "data": {"v": "2"}})
    store.delete("configmaps", "gone", "default")
    store.create("configmaps", _cm("new"), validate=False)
    assert _names(store) == {"keep": "2", "new": "1"}
    assert _names(store, at=then) == {"keep": "1", "gone": "1"}
    _, rv = store.list_entries("configmaps", "default", at=then)
    assert rv == str(then)


def test_settings_refuse_an_empty_window() -> None:
    with pytest.raises(ValueError, match="capacity_events"):
        WatchCacheSettings(capacity_events=0)
    with pytest.raises(ValueError, match="max_age_seconds"):
        WatchCacheSettings(max_age_seconds=0)


@pytest.mark.integration
def test_client_watch_of_a_shrunk_cache_raises_410_and_a_relist_recovers(
    make_cluster: Callable[..., ServedCluster],
) -> None:
    served = make_cluster(watch_cache=WatchCacheSettings(capacity_events=2, max_age_seconds=30))
    with served.api_client() as api:
        core = client.CoreV1Api(api)
        start = core.list_namespaced_config_map("default").metadata.resource_version
        for i in range(3):
            core.create_namespaced_config_map("default", client.V1ConfigMap(metadata={"name": f"c{i}"}))
        with pytest.raises(ApiException) as exc:
            list(
                watch.Watch().stream(
                    core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
                )
            )
        assert exc.value.status == 410
        relisted = core.list_namespaced_config_map("default")
        assert [c.metadata.name for c in relisted.items] == ["c0", "c1", "c2"]
        core.create_namespaced_config_map("default", client.V1ConfigMap(metadata={"name": "c3"}))
        events = list(
            watch.Watch().stream(
                core.list_namespaced_config_map,
                "default",
                resource_version=relisted.metadata.resource_version,
                timeout_seconds=1,
            )
        )
        assert [e["object"].metadata.name for e in events] == ["c3"]
        # Age: the window forgets everything after 30 s of the store's clock.
        served.call(lambda: served.clock.advance(31))
        with pytest.raises(ApiException) as exc:
            list(
                watch.Watch().stream(
                    core.list_namespaced_config_map,
                    "default",
                    resource_version=relisted.metadata.resource_version,
                    timeout_seconds=1,
                )
            )
        assert exc.value.status == 410


@pytest.mark.integration
def test_watch_from_a_future_version_is_an_error_event_with_504(
    make_cluster: Callable[..., ServedCluster],
) -> None:
    served = make_cluster()
    future = served.store.resource_version + 100
    resp = urllib3.PoolManager().request(
        "GET", f"{served.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={future}"
    )
    assert resp.status == 200
    event = json.loads(resp.data.decode().splitlines()[0])
    assert event["type"] == "ERROR"
    status = event["object"]
    assert (status["code"], status["reason"]) == (504, "Timeout")
    assert status["details"]["causes"][0]["reason"] == "ResourceVersionTooLarge"
    assert status["details"]["retryAfterSeconds"] == 1
