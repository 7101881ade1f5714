"""The typed client, transport and reflector against the simulated cluster, over real HTTP.

Aspects: create, get, list (selectors, pages); AlreadyExists and NotFound; update at the
read resourceVersion and Conflict when stale (re-read, then it succeeds); merge patch, JSON
patch (a failing `test` op is Invalid and changes nothing), a resourceVersion in a merge
patch as a precondition; the status subresource (get, update, patch change only .status);
delete preconditions (uid, resourceVersion) and propagationPolicy; watch from a version
(replayed events, bookmarks advancing the version, Gone for an expired one); the transport's
Unauthorized and Unavailable; a reflector lists, streams events and stops at once.
Dry-run is covered in `test_kube_client.py` only: the simulated cluster refuses `dryRun`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.kube.client import KubeClient, PatchType
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import AlreadyExists, Conflict, Gone, Invalid, NotFound, Unauthorized, Unavailable
from gpuhealth.kube.reflector import Events, Listed, Message, Reflector
from gpuhealth.kube.resources import NODE, POD, STATUS
from gpuhealth.kube.transport import KubeTransport
from simulator.apiserver.app import ServerSettings
from simulator.apiserver.kubeconfig import write_kubeconfig
from tests.simulator.conftest import ServedCluster, pod_manifest

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Backoff:
    initial_seconds: float = 0.01
    max_seconds: float = 0.05
    factor: float = 2.0
    jitter: float = 0.5


@pytest.fixture
def make_client(tmp_path: Path) -> Iterator[Callable[..., tuple[ServedCluster, KubeClient]]]:
    started: list[ServedCluster] = []
    clients: list[KubeClient] = []
    api_clients: list[Any] = []

    def make(**served: Any) -> tuple[ServedCluster, KubeClient]:
        cluster = ServedCluster(tmp_path / f"kubeconfig-{len(started)}", **served)
        started.append(cluster)
        api = api_client(str(cluster.kubeconfig))
        api_clients.append(api)
        clients.append(KubeClient(KubeTransport(api), connect_timeout_seconds=5, read_timeout_seconds=10))
        return cluster, clients[-1]

    yield make
    for client in clients:
        client.close()
    for api in api_clients:
        api.close()
    for cluster in started:
        cluster.stop()


@pytest.fixture
def kube(make_client: Callable[..., tuple[ServedCluster, KubeClient]]) -> KubeClient:
    return make_client(settings=ServerSettings(bookmark_interval_seconds=0.2))[1]


def test_create_get_list_with_selectors_and_pages(kube: KubeClient) -> None:
    for name, app in (("a", "infer"), ("b", "infer"), ("c", "train")):
        created = kube.create(POD, pod_manifest(name, labels={"app": app}, node="gpu-0"), namespace="default")
        assert created["metadata"]["uid"]
    assert kube.get(POD, "b", namespace="default")["metadata"]["labels"] == {"app": "infer"}
    listed = kube.list(POD, label_selector="app=infer", page_size=1)
    assert [p["metadata"]["name"] for p in listed.items] == ["a", "b"]
    assert int(listed.resource_version) >= int(created["metadata"]["resourceVersion"])
    assert len(kube.list(POD, namespace="default", field_selector="spec.nodeName=gpu-0").items) == 3
    with pytest.raises(AlreadyExists):
        kube.create(POD, pod_manifest("a"), namespace="default")
    with pytest.raises(NotFound):
        kube.get(POD, "zzz", namespace="default")


def test_update_at_a_stale_version_conflicts_and_succeeds_after_a_re_read(kube: KubeClient) -> None:
    kube.create(POD, pod_manifest("p"), namespace="default")
    first = kube.get(POD, "p", namespace="default")
    second = kube.get(POD, "p", namespace="default")
    first["metadata"]["labels"] = {"by": "first"}
    kube.update(POD, first)
    second["metadata"]["labels"] = {"by": "second"}
    with pytest.raises(Conflict) as stale:
        kube.update(POD, second)
    assert stale.value.status == 409 and "modified" in stale.value.message
    fresh = kube.get(POD, "p", namespace="default")
    fresh["metadata"]["labels"]["also"] = "second"
    assert kube.update(POD, fresh)["metadata"]["labels"] == {"by": "first", "also": "second"}


def test_merge_and_json_patches(kube: KubeClient) -> None:
    kube.create(POD, pod_manifest("p", labels={"app": "infer", "tier": "gpu"}), namespace="default")
    merged = kube.patch(POD, "p", {"metadata": {"labels": {"tier": None, "x": "1"}}}, namespace="default")
    assert merged["metadata"]["labels"] == {"app": "infer", "x": "1"}
    ops = [
        {"op": "test", "path": "/metadata/labels/app", "value": "infer"},
        {"op": "replace", "path": "/metadata/labels/app", "value": "train"},
    ]
    patched = kube.patch(POD, "p", ops, namespace="default", patch_type=PatchType.JSON)
    assert patched["metadata"]["labels"]["app"] == "train"
    with pytest.raises(Invalid):
        kube.patch(POD, "p", ops, namespace="default", patch_type=PatchType.JSON)  # the test op fails now
    assert (
        kube.get(POD, "p", namespace="default")["metadata"]["resourceVersion"]
        == patched["metadata"]["resourceVersion"]
    )
    stale = {"metadata": {"resourceVersion": merged["metadata"]["resourceVersion"], "labels": {"y": "2"}}}
    with pytest.raises(Conflict):
        kube.patch(POD, "p", stale, namespace="default")


def test_the_status_subresource_changes_only_status(kube: KubeClient) -> None:
    kube.create(NODE, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"}})
    node = kube.get(NODE, "gpu-0", subresource=STATUS)
    node["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    node["metadata"]["labels"] = {"ignored": "true"}
    updated = kube.update(NODE, node, subresource=STATUS)
    assert updated["status"]["conditions"] == [{"type": "Ready", "status": "True"}]
    assert "labels" not in updated["metadata"]
    patched = kube.patch(NODE, "gpu-0", {"status": {"capacity": {"nvidia.com/gpu": "8"}}}, subresource=STATUS)
    assert patched["status"]["capacity"] == {"nvidia.com/gpu": "8"}
    assert patched["status"]["conditions"] == [{"type": "Ready", "status": "True"}]


def test_delete_only_what_was_meant(kube: KubeClient) -> None:
    created = kube.create(POD, pod_manifest("p"), namespace="default")
    meta = created["metadata"]
    with pytest.raises(Conflict, match="UID"):
        kube.delete(POD, "p", namespace="default", uid="another-pod-of-that-name")
    with pytest.raises(Conflict):
        kube.delete(POD, "p", namespace="default", resource_version=str(int(meta["resourceVersion"]) - 1))
    deleted = kube.delete(
        POD,
        "p",
        namespace="default",
        uid=meta["uid"],
        resource_version=meta["resourceVersion"],
        propagation_policy="Background",
    )
    assert deleted["metadata"]["uid"] == meta["uid"]
    with pytest.raises(NotFound):
        kube.delete(POD, "p", namespace="default")


def test_watch_replays_from_a_version_and_bookmarks_advance_it(kube: KubeClient) -> None:
    start = kube.list(POD).resource_version
    created = kube.create(POD, pod_manifest("p"), namespace="default")
    with kube.watch(POD, resource_version=start, timeout_seconds=5) as stream:
        seen = []
        for event in stream:
            seen.append(event.type)
            if event.type == "BOOKMARK":
                break
    assert seen[0] == "ADDED"
    assert stream.resource_version is not None
    assert int(stream.resource_version) >= int(created["metadata"]["resourceVersion"])


def test_watch_from_an_expired_version_raises_gone(
    make_client: Callable[..., tuple[ServedCluster, KubeClient]],
) -> None:
    _, kube = make_client(watch_window=2)
    start = kube.list(POD).resource_version
    for name in "abcd":
        kube.create(POD, pod_manifest(name), namespace="default")
    with pytest.raises(Gone), kube.watch(POD, resource_version=start, timeout_seconds=5) as stream:
        list(stream)


def test_the_transport_reports_unauthorized_and_unreachable(
    tmp_path: Path, make_client: Callable[..., tuple[ServedCluster, KubeClient]]
) -> None:
    cluster, _ = make_client(token="right")
    write_kubeconfig(tmp_path / "wrong", cluster.url, token="wrong")
    with api_client(str(tmp_path / "wrong")) as api, pytest.raises(Unauthorized):
        KubeClient(KubeTransport(api)).get(NODE, "gpu-0")
    cluster.stop()
    with api_client(str(cluster.kubeconfig)) as api, pytest.raises(Unavailable) as down:
        KubeClient(KubeTransport(api), connect_timeout_seconds=2).list(POD)
    assert down.value.status is None and down.value.temporary


def test_a_reflector_lists_then_streams_events_and_stops_at_once(kube: KubeClient) -> None:
    kube.create(POD, pod_manifest("before"), namespace="default")
    messages: queue.Queue[Message] = queue.Queue()
    stop = threading.Event()
    reflector = Reflector(
        kube,
        "pods",
        POD,
        namespace="default",
        emit=messages.put,
        stop=stop,
        page_size=10,
        watch_timeout_seconds=60,
        backoff=Backoff(),
    )
    thread = threading.Thread(target=reflector.run)
    thread.start()
    try:
        listed = messages.get(timeout=10)
        assert isinstance(listed, Listed) and [p["metadata"]["name"] for p in listed.items] == ["before"]
        kube.create(POD, pod_manifest("after"), namespace="default")
        deadline = time.monotonic() + 10
        while True:
            message = messages.get(timeout=max(0.0, deadline - time.monotonic()))
            if isinstance(message, Events):
                break
        assert [(t, o["metadata"]["name"]) for t, o in message.events] == [("ADDED", "after")]
    finally:
        stop.set()
        kube.close()  # ends the blocked watch read at once (the watch would run for a minute)
        thread.join(10)
    assert not thread.is_alive()
