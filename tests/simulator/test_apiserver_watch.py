"""Conformance of WATCH on the simulated apiserver, through the official client's `watch.Watch`.

Aspects: from a resourceVersion, retained events are replayed in order and nothing older;
unset resourceVersion gives synthetic ADDED for current objects, then live events; BOOKMARK
events only when asked for; timeoutSeconds ends the stream cleanly; a resourceVersion older than
the retained window is an ERROR event with a 410 Expired Status, which the client raises as
ApiException(410), while one inside the window works; selectors turn objects leaving the
selection into DELETED; resource.k8s.io v1beta2 watches see v1beta2 objects; shutdown ends open
watches.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from simulator.apiserver.app import ServerSettings

if TYPE_CHECKING:
    from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration


def _cm(name: str, value: str = "1", labels: dict[str, str] | None = None) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data={"v": value})


def test_watch_from_resource_version_replays_newer_events_in_order(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", _cm("before"))
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.create_namespaced_config_map("default", _cm("x"))
    core.patch_namespaced_config_map("x", "default", {"data": {"v": "2"}})
    core.delete_namespaced_config_map("x", "default")
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
        )
    )
    seen = [(e["type"], e["object"].metadata.name, e["object"].data["v"]) for e in events]
    assert seen == [("ADDED", "x", "1"), ("MODIFIED", "x", "2"), ("DELETED", "x", "2")]
    rvs = [int(e["object"].metadata.resource_version) for e in events]
    assert rvs == sorted(rvs) and rvs[0] > int(start)


def test_watch_without_resource_version_lists_then_follows_live(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", _cm("existing"))
    w = watch.Watch()
    stream = w.stream(core.list_namespaced_config_map, "default", timeout_seconds=5)
    first = next(stream)
    assert (first["type"], first["object"].metadata.name) == ("ADDED", "existing")
    core.create_namespaced_config_map("default", _cm("live"))
    second = next(stream)
    assert (second["type"], second["object"].metadata.name) == ("ADDED", "live")
    w.stop()
    stream.close()


def test_bookmarks_only_when_allowed(cluster: ServedCluster, api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    rv = core.list_namespaced_config_map("default").metadata.resource_version
    with_bookmarks = list(
        watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
        )
    )
    assert with_bookmarks and {e["type"] for e in with_bookmarks} == {"BOOKMARK"}
    raw = with_bookmarks[0]["raw_object"]
    assert raw["kind"] == "ConfigMap" and set(raw["metadata"]) == {"resourceVersion"}
    without = list(
        watch.Watch().stream(
            core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=1
        )
    )
    assert without == []  # the stream ended on its own after timeoutSeconds, without events


def test_send_initial_events_ends_with_an_annotated_bookmark_at_the_initial_state_before_live_events(
    cluster: ServedCluster, api: client.ApiClient
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", _cm("one"))
    real_watch = cluster.store.watch
    initial_rv: list[int] = []

    def watch_then_write(*args: Any, **kwargs: Any) -> Any:
        # Writes land between taking the initial state and streaming it: live events are queued.
        started = real_watch(*args, **kwargs)
        initial_rv.append(cluster.store.resource_version)
        for name in ("live-a", "live-b"):
            cluster.store.create("configmaps", {"metadata": {"name": name}}, namespace="default")
        return started

    cluster.store.watch = watch_then_write
    w = watch.Watch()
    stream = w.stream(
        core.list_namespaced_config_map,
        "default",
        allow_watch_bookmarks=True,
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        timeout_seconds=2,
    )
    events = [next(stream) for _ in range(4)]
    w.stop()
    stream.close()
    seen = [(e["type"], e["raw_object"]["metadata"].get("name")) for e in events]
    assert seen == [("ADDED", "one"), ("BOOKMARK", None), ("ADDED", "live-a"), ("ADDED", "live-b")]
    assert events[1]["raw_object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    rvs = [int(e["raw_object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs[1] == initial_rv[0]
    assert rvs == sorted(rvs)


def test_too_old_resource_version_is_410_expired(
    make_cluster: Callable[..., ServedCluster],
) -> None:
    served = make_cluster(watch_window=3)
    with served.api_client() as api:
        core = client.CoreV1Api(api)
        start = core.list_namespaced_config_map("default").metadata.resource_version
        for i in range(3):
            core.create_namespaced_config_map("default", _cm(f"c{i}"))
        inside = list(
            watch.Watch().stream(
                core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
            )
        )
        assert [e["object"].metadata.name for e in inside] == ["c0", "c1", "c2"]
        core.create_namespaced_config_map("default", _cm("c3"))
        with pytest.raises(ApiException) as exc:
            list(
                watch.Watch().stream(
                    core.list_namespaced_config_map, "default", resource_version=start, timeout_seconds=1
                )
            )
        assert exc.value.status == 410
        assert "Expired" in str(exc.value.reason)


def test_expired_watch_stream_carries_an_error_event_with_a_status(
    make_cluster: Callable[..., ServedCluster],
) -> None:
    served = make_cluster(watch_window=1)
    with served.api_client() as api:
        core = client.CoreV1Api(api)
        for i in range(3):
            core.create_namespaced_config_map("default", _cm(f"c{i}"))
        http = urllib3.PoolManager()
        resp = http.request(
            "GET", f"{served.url}/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=2"
        )
        assert resp.status == 200
        event = json.loads(resp.data.decode().splitlines()[0])
        assert event["type"] == "ERROR"
        assert event["object"]["kind"] == "Status"
        assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")


def test_selectors_turn_objects_leaving_the_selection_into_deleted(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_config_map("default", _cm("m", labels={"gpuhealth.io/watched": "yes"}))
    start = core.list_namespaced_config_map("default").metadata.resource_version
    core.patch_namespaced_config_map("m", "default", {"metadata": {"labels": {"gpuhealth.io/watched": "no"}}})
    core.patch_namespaced_config_map("m", "default", {"data": {"v": "ignored"}})
    core.patch_namespaced_config_map(
        "m", "default", {"metadata": {"labels": {"gpuhealth.io/watched": "yes"}}}
    )
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map,
            "default",
            label_selector="gpuhealth.io/watched=yes",
            resource_version=start,
            timeout_seconds=1,
        )
    )
    assert [e["type"] for e in events] == ["DELETED", "ADDED"]


def test_v1beta2_watch_sees_v1beta2_objects(api: client.ApiClient) -> None:
    beta = client.ResourceV1beta2Api(api)
    rule = {
        "apiVersion": "resource.k8s.io/v1beta2",
        "kind": "DeviceTaintRule",
        "metadata": {"name": "quarantine-gpu-0"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-0"},
            "taint": {"key": "gpuhealth.io/quarantine", "value": "xid-79", "effect": "NoSchedule"},
        },
    }
    beta.create_device_taint_rule(rule)
    events = list(watch.Watch().stream(beta.list_device_taint_rule, timeout_seconds=1))
    assert [(e["type"], e["raw_object"]["apiVersion"]) for e in events] == [
        ("ADDED", "resource.k8s.io/v1beta2")
    ]


def test_server_shutdown_ends_open_watches(make_cluster: Callable[..., ServedCluster]) -> None:
    served = make_cluster(settings=ServerSettings(default_watch_timeout_seconds=60))
    api = served.api_client()
    core = client.CoreV1Api(api)
    ended = threading.Event()
    events: list[Any] = []

    def consume() -> None:
        # The connection may be cut rather than ended cleanly; both count as ended.
        with contextlib.suppress(Exception):
            events.extend(
                core.list_namespaced_config_map("default", watch=True, _preload_content=False).stream()
            )
        ended.set()

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    for _ in range(200):  # wait until the watch is registered on the server
        if served.call(served.store.watcher_count) == 1:
            break
        ended.wait(0.05)
    assert served.call(served.store.watcher_count) == 1
    served.stop()
    assert ended.wait(timeout=10)
    thread.join(timeout=5)
    api.close()
