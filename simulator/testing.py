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
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

from simulator.runner import NodeAgents, SimulatedCluster
from simulator.scenario import Scenario, fault_from_dict, resolve

T = TypeVar("T")
R = TypeVar("R", bound=AbstractAsyncContextManager[Any])
H = TypeVar("H", bound="_InThread[Any]")

_START_TIMEOUT = 120.0


class _InThread(Generic[R]):
    """An async context manager (`make()`) entered and held on its own loop in a background thread."""

    def __init__(self, make: Callable[[], R], name: str) -> None:
        self._make = make
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: R | None = None
        self._stop_event: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

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
        async with self._make() as running:
            self._running = running
            self._ready.set()
            await self._stop_event.wait()

    def _call(self, fn: Callable[[R], T], timeout: float) -> T:
        if self._loop is None or self._running is None:
            raise RuntimeError("not running")
        running = self._running

        async def run() -> T:
            return fn(running)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)


class ClusterHandle(_InThread[SimulatedCluster]):
    """A SimulatedCluster running in a background thread."""

    def __init__(
        self,
        scenario: str | Path | Mapping[str, Any] | Scenario,
        *,
        speed: float,
        token: str | None,
        remote_nodes: bool = False,
        scheduler_config: Path | None = None,
    ) -> None:
        spec = dict(scenario) if isinstance(scenario, Mapping) else scenario
        super().__init__(
            lambda: SimulatedCluster(
                spec, speed=speed, token=token, remote_nodes=remote_nodes, scheduler_config=scheduler_config
            ),
            "gpuhealth-sim",
        )

    # -- access

    @property
    def cluster(self) -> SimulatedCluster:
        if self._running is None:
            raise RuntimeError("the simulated cluster is not running")
        return self._running

    @property
    def url(self) -> str:
        return self.cluster.url

    @property
    def kubeconfig_path(self) -> Path:
        return self.cluster.kubeconfig_path

    def call(self, fn: Callable[[SimulatedCluster], T], timeout: float = 30.0) -> T:
        """Run `fn(cluster)` on the cluster's loop thread and return its result."""
        return self._call(fn, timeout)

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


class AgentsHandle(_InThread[NodeAgents]):
    """A scenario's `NodeAgents` (HTTP to a kubeconfig's control plane) running in a background thread."""

    def __init__(
        self,
        scenario: str | Path | Mapping[str, Any] | Scenario,
        kubeconfig: Path,
        speed: float,
        *,
        listen: str | None = None,
    ) -> None:
        """`listen`: also serve the simulator's routes (status, NVML, faults) for the agents' fleet."""
        spec = dict(scenario) if isinstance(scenario, Mapping) else scenario
        super().__init__(
            lambda: NodeAgents(spec, kubeconfig, speed=speed, listen=listen), "gpuhealth-sim-agents"
        )

    @property
    def agents(self) -> NodeAgents:
        if self._running is None:
            raise RuntimeError("the node agents are not running")
        return self._running

    def call(self, fn: Callable[[NodeAgents], T], timeout: float = 30.0) -> T:
        """Run `fn(agents)` on the agents' loop thread (where their fleet lives)."""
        return self._call(fn, timeout)

    def inject(self, fault: Mapping[str, Any]) -> dict[str, Any]:
        """Inject one timeline entry into the agents' fleet (`at` optional, default now)."""

        def apply(a: NodeAgents) -> dict[str, Any]:
            parsed = fault_from_dict(fault, a.scenario, now=a.fleet.now())
            a.fleet.inject(parsed)
            return parsed.to_json()

        return self.call(apply)


@contextmanager
def running_agents(
    scenario: str | Path | Mapping[str, Any] | Scenario, *, speed: float = 1.0
) -> Iterator[tuple[ClusterHandle, AgentsHandle]]:
    """The simulated control plane on loopback, and the scenario's nodes as its agents over HTTP.

    Two threads, two event loops: the agents' HTTP calls block theirs, never the API server's.
    """
    resolved = resolve(dict(scenario) if isinstance(scenario, Mapping) else scenario)
    with started(ClusterHandle(resolved, speed=speed, token=None, remote_nodes=True)) as cluster:
        agents = AgentsHandle(resolved, cluster.kubeconfig_path, speed)
        with started(agents):
            yield cluster, agents


@contextmanager
def started(handle: H) -> Iterator[H]:
    """Start a handle for the block, stop it after."""
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()


@contextmanager
def running_cluster(
    scenario: str | Path | Mapping[str, Any] | Scenario,
    *,
    speed: float = 1.0,
    token: str | None = None,
    scheduler_config: Path | None = None,
) -> Iterator[ClusterHandle]:
    """Serve `scenario` (built-in name, path, dict) on loopback for the duration of the block;
    `scheduler_config`: a KubeSchedulerConfiguration whose extenders the scheduler calls."""
    handle = ClusterHandle(scenario, speed=speed, token=token, scheduler_config=scheduler_config)
    handle.start()
    try:
        yield handle
    finally:
        handle.stop()
