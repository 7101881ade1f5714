"""The observer's list/watch protocol, against a scripted transport.

Aspects covered: list then watch of the resources (ready only once all are listed); resuming
from the last resourceVersion, bookmarks included; relist on 410 Gone as an HTTP status and as
an ERROR event inside the stream (the relist replaces what was known); a list in pages folded
as they come, replacing what was known only at its end; other failures back off and resume;
undecodable lines are counted and skipped; node mode selectors; a shard's lists and watches
cover the cluster and it keeps only its nodes' objects; self metrics; stopping ends the reader
threads at once and flushes the directory. The backoff helper and line splitting are covered in
`tests/core/test_kube_*`.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from exporter import parse
from exporter.directory import Directory, open_store
from exporter.observer import Observer, targets
from exporter.self_metrics import ExporterMetrics
from exporter.settings import DEFAULT_HEALTH_PRODUCERS, ObserverSettings
from exporter.sharding import Shard, shard_of
from exporter.state import CLAIMS, LEASES, NODES, PODS, SLICES, DeviceStateStore, producer_resource
from gpuhealth.clock import ManualClock
from gpuhealth.kube.backoff import Backoff, BackoffSettings
from gpuhealth.kube.errors import Gone, error_from_response
from tests.exporter.fixtures.builders import container, gpu_uuid, pod, resource

U0, U1 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1)
PATHS = {t.resource: t.path for t in targets(None, DEFAULT_HEALTH_PRODUCERS)}
CLOSED_PODS = {"resource": "pods", "reason": "closed"}
EXPIRED_PODS = {"resource": "pods", "reason": "expired"}
EXPIRED_CLAIMS = {"resource": "resourceclaims", "reason": "expired"}
ERROR_LEASES = {"resource": "leases", "reason": "error"}
FAST = ObserverSettings(
    backoff=BackoffSettings(initial_seconds=0.01, max_seconds=0.05), flush_interval_seconds=0.05
)


def dp_pod(name: str, uuid: str, health: str, rv: int) -> dict[str, Any]:
    return pod(
        name, container("main", ("nvidia.com/gpu", [resource(uuid, health)])), rv=rv, uid=f"uid-{name}"
    )


def event(event_type: str, obj: dict[str, Any]) -> bytes:
    return orjson.dumps({"type": event_type, "object": obj}) + b"\n"


def bookmark(rv: int) -> bytes:
    return event("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": str(rv)}})


class FakeResponse:
    def __init__(self, chunks: list[bytes], body: bytes = b"", hold: bool = False) -> None:
        self._chunks, self._body, self._hold = chunks, body, hold
        self.closed = threading.Event()

    def stream(self) -> Iterator[bytes]:
        yield from self._chunks
        if self._hold:
            # An idle watch: nothing until the observer closes it (as a real socket would).
            self.closed.wait(10)

    def read(self) -> bytes:
        return self._body

    def close(self) -> None:
        self.closed.set()


class FakeApi:
    """Scripted list and watch responses per path; an idle watch once a script runs out."""

    def __init__(self) -> None:
        self.lists: dict[str, deque[Any]] = {p: deque() for p in PATHS.values()}
        self.watches: dict[str, deque[Any]] = {p: deque() for p in PATHS.values()}
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.lock = threading.Lock()

    def list_of(self, resource: str, items: list[dict[str, Any]], rv: int) -> None:
        self.lists[PATHS[resource]].append({"items": items, "metadata": {"resourceVersion": str(rv)}})

    def request(
        self,
        method: str,
        path: str,
        params: Sequence[tuple[str, str]] = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: tuple[float, float],
    ) -> FakeResponse:
        assert method == "GET" and body is None
        query = dict(params)
        with self.lock:
            self.calls.append((path, query))
            if query.get("watch") == "true":
                script = self.watches[path].popleft() if self.watches[path] else None
            else:
                script = (
                    self.lists[path].popleft()
                    if self.lists[path]
                    else {"items": [], "metadata": {"resourceVersion": "1"}}
                )
        if isinstance(script, Exception):
            raise script
        if query.get("watch") == "true":
            return FakeResponse(script or [], hold=script is None)
        return FakeResponse([], body=orjson.dumps(script))

    def watch_calls(self, resource: str) -> list[dict[str, str]]:
        with self.lock:
            return [q for p, q in self.calls if p == PATHS[resource] and q.get("watch") == "true"]

    def list_calls(self, resource: str) -> list[dict[str, str]]:
        with self.lock:
            return [q for p, q in self.calls if p == PATHS[resource] and q.get("watch") != "true"]


async def until(predicate: Callable[[], bool]) -> None:
    """Poll `predicate` for up to 5 s (the reader threads run on their own)."""
    async with asyncio.timeout(5):
        while not predicate():  # noqa: ASYNC110 (state moved by reader threads, no event to await)
            await asyncio.sleep(0.01)


class Running:
    def __init__(self, api: FakeApi, store: DeviceStateStore, **kw: Any) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ExporterMetrics(self.registry)
        self.metrics.track(store)
        self.observer = Observer(
            api, store, clock=ManualClock(), settings=kw.pop("settings", FAST), metrics=self.metrics,
            rng=random.Random(1), **kw,
        )  # fmt: skip
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Running:
        self.task = asyncio.create_task(self.observer.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


async def test_lists_then_watches_and_applies_events(store: DeviceStateStore) -> None:
    api = FakeApi()
    api.list_of(PODS, [dp_pod("a", U0, "Healthy", 10)], 100)
    api.watches[PATHS[PODS]].append([event("MODIFIED", dp_pod("a", U0, "Unhealthy", 101)), bookmark(150)])
    async with Running(api, store) as running:
        await until(running.observer.ready)
        await until(lambda: len(api.watch_calls(PODS)) >= 2)
        first, second = api.watch_calls(PODS)[:2]
        assert (first["resourceVersion"], first["allowWatchBookmarks"]) == ("100", "true")
        assert second["resourceVersion"] == "150"  # resumed after the bookmark, no relist
        assert len(api.list_calls(PODS)) == 1
        # What the loop applies may trail what the reader threads did: wait for it.
        await until(lambda: store.snapshot().devices[("node-1", U0)].health == "Unhealthy")
        await until(lambda: running.sample("gpuhealth_exporter_watch_restarts_total", **CLOSED_PODS) == 1)
        assert running.sample("gpuhealth_exporter_watch_events_total", resource="pods", type="MODIFIED") == 1
        assert running.sample("gpuhealth_exporter_devices_tracked") == 1


async def test_410_as_http_status_relists_and_replaces(store: DeviceStateStore) -> None:
    api = FakeApi()
    api.list_of(PODS, [dp_pod("a", U0, "Healthy", 10), dp_pod("b", U1, "Healthy", 11)], 100)
    api.list_of(PODS, [dp_pod("b", U1, "Healthy", 11)], 300)  # pod a went away meanwhile
    api.watches[PATHS[PODS]].append(
        error_from_response(410, b'{"kind":"Status","reason":"Expired","code":410}')
    )
    async with Running(api, store) as running:
        await until(lambda: len(api.list_calls(PODS)) == 2 and len(api.watch_calls(PODS)) >= 2)
        await until(lambda: store.snapshot().devices[("node-1", U0)].allocations == ())
        assert api.watch_calls(PODS)[1]["resourceVersion"] == "300"
        await until(lambda: running.sample("gpuhealth_exporter_watch_restarts_total", **EXPIRED_PODS) == 1)


async def test_a_list_in_pages_is_folded_as_it_comes_and_replaces_at_its_end(store: DeviceStateStore) -> None:
    api = FakeApi()
    pods = api.lists[PATHS[PODS]]
    pods.append(
        {"items": [dp_pod("a", U0, "Healthy", 10)], "metadata": {"continue": "t1", "resourceVersion": "100"}}
    )
    pods.append({"items": [dp_pod("b", U1, "Healthy", 11)], "metadata": {"resourceVersion": "100"}})
    # The relist after a 410: pod a is gone, which only its last page can tell.
    pods.append(
        {"items": [dp_pod("b", U1, "Healthy", 11)], "metadata": {"continue": "t2", "resourceVersion": "300"}}
    )
    pods.append({"items": [], "metadata": {"resourceVersion": "300"}})
    api.watches[PATHS[PODS]].append(
        error_from_response(410, b'{"kind":"Status","reason":"Expired","code":410}')
    )
    async with Running(api, store):
        await until(lambda: len(api.list_calls(PODS)) == 4 and len(api.watch_calls(PODS)) >= 2)
        await until(lambda: store.snapshot().devices[("node-1", U0)].allocations == ())
        assert [q.get("continue") for q in api.list_calls(PODS)] == [None, "t1", None, "t2"]
        assert api.watch_calls(PODS)[1]["resourceVersion"] == "300"
        assert [a.pod for a in store.snapshot().devices[("node-1", U1)].allocations] == ["b"]


async def test_410_as_an_error_event_inside_the_stream_relists(store: DeviceStateStore) -> None:
    api = FakeApi()
    api.list_of(CLAIMS, [], 5)
    api.list_of(CLAIMS, [], 9)
    gone = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}
    api.watches[PATHS[CLAIMS]].append([event("ERROR", gone)])
    async with Running(api, store) as running:
        await until(lambda: len(api.list_calls(CLAIMS)) == 2 and len(api.watch_calls(CLAIMS)) >= 2)
        assert api.watch_calls(CLAIMS)[1]["resourceVersion"] == "9"
        await until(lambda: running.sample("gpuhealth_exporter_watch_restarts_total", **EXPIRED_CLAIMS) == 1)


async def test_watches_that_expire_at_once_relist_after_a_growing_pause(
    store: DeviceStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the pause, an apiserver whose watch cache lags its lists got full lists in a loop.
    failures_before: list[int] = []
    next_delay = Backoff.next_delay

    def recording(self: Backoff, minimum: float = 0.0) -> float:
        failures_before.append(self._failures)
        return next_delay(self, minimum)

    monkeypatch.setattr(Backoff, "next_delay", recording)
    api = FakeApi()
    api.watches[PATHS[SLICES]].extend([Gone(), Gone(), Gone()])
    async with Running(api, store):
        await until(lambda: len(api.list_calls(SLICES)) == 4 and len(api.watch_calls(SLICES)) == 4)
    assert failures_before == [0, 1, 2]


async def test_failures_back_off_and_resume_from_the_last_version(store: DeviceStateStore) -> None:
    api = FakeApi()
    api.list_of(LEASES, [], 40)
    api.watches[PATHS[LEASES]].extend(
        [ConnectionResetError("reset by peer"), error_from_response(500, b"boom")]
    )
    async with Running(api, store) as running:
        await until(lambda: len(api.watch_calls(LEASES)) >= 3)
        assert [q["resourceVersion"] for q in api.watch_calls(LEASES)[:3]] == ["40", "40", "40"]
        assert len(api.list_calls(LEASES)) == 1
        await until(lambda: running.sample("gpuhealth_exporter_watch_restarts_total", **ERROR_LEASES) == 2)


async def test_undecodable_lines_are_counted_and_skipped(store: DeviceStateStore) -> None:
    api = FakeApi()
    good = event("ADDED", dp_pod("a", U0, "Healthy", 10))
    # The good event arrives split across chunks, after two bad lines.
    api.watches[PATHS[PODS]].append([b"{not json\n", b'["an array"]\n', good[:50], good[50:]])
    async with Running(api, store):
        await until(lambda: ("node-1", U0) in store.snapshot().devices)
        await until(lambda: sum(store.stats.parse_errors.values()) == 2)
        assert store.stats.parse_errors == {parse.INVALID_JSON: 1, parse.MALFORMED_EVENT: 1}


async def test_an_event_that_fails_to_apply_is_skipped_and_the_observer_goes_on(
    store: DeviceStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = FakeApi()
    api.watches[PATHS[PODS]].append([event("ADDED", dp_pod("a", U0, "Healthy", 10))])
    api.watches[PATHS[PODS]].append([event("ADDED", dp_pod("b", U1, "Healthy", 11))])
    apply_event = store.apply_event
    failed: list[str] = []

    def failing_once(resource: str, event_type: str, obj: Any) -> None:
        if not failed:
            failed.append(resource)
            raise RuntimeError("a bug the parsers did not anticipate")
        apply_event(resource, event_type, obj)

    monkeypatch.setattr(store, "apply_event", failing_once)
    async with Running(api, store) as running:
        await until(lambda: ("node-1", U1) in store.snapshot().devices)
        assert running.task is not None and not running.task.done()
    assert failed == [PODS] and ("node-1", U0) not in store.snapshot().devices


async def test_node_mode_selects_the_nodes_objects(store: DeviceStateStore) -> None:
    api = FakeApi()
    settings = ObserverSettings(node_name="node-7", flush_interval_seconds=0.05)
    async with Running(api, store, settings=settings) as running:
        await until(running.observer.ready)
        selectors = {
            r: api.list_calls(r)[0].get("fieldSelector") for r in (PODS, SLICES, LEASES, CLAIMS, NODES)
        }
        producer = api.list_calls(producer_resource("gpu.nvidia.com"))[0]
    assert selectors == {
        PODS: "spec.nodeName=node-7",
        SLICES: "spec.nodeName=node-7",
        LEASES: "metadata.name=node-7",
        CLAIMS: None,
        NODES: "metadata.name=node-7",
    }
    # The DRA driver's kubelet plugin on this node: its namespace, its pods' label, this node.
    assert PATHS[producer_resource("gpu.nvidia.com")] == "/api/v1/namespaces/dra-driver-nvidia-gpu/pods"
    assert producer.get("labelSelector") == "dra-driver-nvidia-gpu-component=kubelet-plugin"
    assert producer.get("fieldSelector") == "spec.nodeName=node-7"


async def test_a_shard_keeps_only_its_nodes_objects_from_lists_and_watches(clock: ManualClock) -> None:
    # node-1 and node-2 hash to different shards of two; this exporter is node-1's.
    mine, theirs = gpu_uuid("node-1", 0), gpu_uuid("node-2", 0)
    shard = Shard(shard_of("node-1", 2), 2)
    assert not shard.owns("node-2")
    store = DeviceStateStore(clock, shard=shard)

    def on(node: str, name: str, uuid: str, health: str, rv: int) -> dict[str, Any]:
        return pod(name, container("main", ("nvidia.com/gpu", [resource(uuid, health)])), node=node, rv=rv)

    api = FakeApi()
    api.list_of(PODS, [on("node-1", "a", mine, "Healthy", 10), on("node-2", "b", theirs, "Healthy", 11)], 100)
    # The other shard's change comes first: once this shard's change is applied, so was it.
    api.watches[PATHS[PODS]].append(
        [
            event("MODIFIED", on("node-2", "b", theirs, "Unhealthy", 101)),
            event("MODIFIED", on("node-1", "a", mine, "Unhealthy", 102)),
        ]
    )
    settings = ObserverSettings(flush_interval_seconds=0.05, shard=shard)
    async with Running(api, store, settings=settings) as running:
        await until(lambda: store.snapshot().devices.get(("node-1", mine)) is not None)
        await until(lambda: store.snapshot().devices[("node-1", mine)].health == "Unhealthy")
        assert set(store.snapshot().devices) == {("node-1", mine)}
        # Both events were received (the watch carries the whole cluster); one was kept.
        assert running.sample("gpuhealth_exporter_watch_events_total", resource="pods", type="MODIFIED") == 2
        assert running.sample("gpuhealth_exporter_devices_tracked") == 1
        # The shard asks the API for everything: a hash is no selector.
        assert api.list_calls(PODS)[0].get("fieldSelector") is None


async def test_stopping_ends_reader_threads_and_flushes_the_directory(tmp_path: Path) -> None:
    clock = ManualClock()
    directory = Directory(str(tmp_path / "d.sqlite"), clock=clock)
    store = open_store(directory, clock)
    api = FakeApi()
    api.list_of(PODS, [dp_pod("a", U0, "Healthy", 10)], 100)
    before = threading.active_count()
    async with Running(api, store, directory=directory) as running:
        await until(running.observer.ready)
    # Every watch was idle, blocked in a read: closing the responses ended them all.
    assert threading.active_count() <= before  # the directory's writer was already running
    assert [d.device for d in directory.devices()] == [U0]
    directory.close()
