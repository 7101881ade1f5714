"""A simulated cluster for synchronous tests: runs in a background thread with its own loop.

    with running_cluster("xid-and-unknown", speed=50) as cluster:
        api = kubernetes.client.CoreV1Api(api_client(str(cluster.kubeconfig_path)))
        cluster.inject({"fault": "gpu-lost", "device": {"node": "gpu-dp-0", "gpu": 1}})
        cluster.wait_for(lambda c: c.fleet.gpu("gpu-dp-0", 1).lost)

The store and the fleet live on the cluster's event loop thread and are not thread-safe:
reach them only through `call()` (or the helpers built on it), which runs a function there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from simulator.runner import SimulatedCluster
from simulator.scenario import Scenario, fault_from_dict

T = TypeVar("T")

_START_TIMEOUT = 120.0


class ClusterHandle:
    """A SimulatedCluster running in a background thread."""

    def __init__(
        self, scenario: str | Path | Mapping[str, Any] | Scenario, *, speed: float, token: str | None
    ) -> None:
        self._scenario = dict(scenario) if isinstance(scenario, Mapping) else scenario
        self._speed = speed
        self._token = token
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cluster: SimulatedCluster | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpuhealth-sim", daemon=True)

    # -- lifecycle

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT):
            raise TimeoutError("the simulated cluster did not start")
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        loop, stop_event = self._loop, self._stop_event
        if loop is not None and stop_event is not None and not loop.is_closed():
            loop.call_soon_threadsafe(stop_event.set)
        self._thread.join(30)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        async with SimulatedCluster(
            self._scenario,
            speed=self._speed,
            token=self._token,
        ) as cluster:
            self._cluster = cluster
            self._ready.set()
            await self._stop_event.wait()

    # -- access

    @property
    def cluster(self) -> SimulatedCluster:
        if self._cluster is None:
            raise RuntimeError("the simulated cluster is not running")
        return self._cluster

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def kubeconfig_path(self) -> Path:
        return self.cluster.kubeconfig_path

    def call(self, fn: Callable[[SimulatedCluster], T], timeout: float = 30.0) -> T:
        """Run `fn(cluster)` on the cluster's loop thread and return its result."""
        if self._loop is None:
            raise RuntimeError("the simulated cluster is not running")
        cluster = self.cluster

        async def run() -> T:
            return fn(cluster)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.call(lambda c: c.store.get(resource, name, namespace))

    def list(self, resource: str, namespace: str | None = None, **selectors: Any) -> list[dict[str, Any]]:
        return self.call(lambda c: c.store.list(resource, namespace, **selectors)[0])

    def inject(self, fault: Mapping[str, Any]) -> dict[str, Any]:
        """Inject one timeline entry (as in a scenario file; `at` optional, default now)."""

        def apply(c: SimulatedCluster) -> dict[str, Any]:
            parsed = fault_from_dict(fault, c.scenario, now=c.fleet.now())
            c.fleet.inject(parsed)
            return parsed.to_json()

        return self.call(apply)

    def status(self) -> dict[str, Any]:
        return self.call(lambda c: c.fleet.status())

    def simulated_seconds(self) -> float:
        return self.call(lambda c: c.fleet.now())

    def wait_for(
        self, predicate: Callable[[SimulatedCluster], bool], timeout: float = 30.0, interval: float = 0.05
    ) -> None:
        """Poll `predicate(cluster)` on the loop thread until it is true (TimeoutError after `timeout`)."""
        deadline = time.monotonic() + timeout
        while not self.call(predicate):
            if time.monotonic() > deadline:
                raise TimeoutError("the simulated cluster did not reach the expected state")
            time.sleep(interval)


@contextmanager
def running_cluster(
    scenario: str | Path | Mapping[str, Any] | Scenario, *, speed: float = 1.0, token: str | None = None
) -> Iterator[ClusterHandle]:
    """Serve `scenario` (built-in name, path, dict) on loopback for the duration of the block."""
    handle = ClusterHandle(scenario, speed=speed, token=token)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
