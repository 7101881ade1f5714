"""The cluster a demo run acts on: the simulated one, or a real control plane whose nodes are
the simulator's node agents.

Both are a `Target`, all the pipeline (`demo.pipeline`) asks of a cluster: a kubeconfig for the
exporters and the responders, the URL of the fleet's NVML routes (the node-mode exporters'
`--nvml sim:<url>`), the fleet's clock, what it sees (fed into `Observations`: fleet events,
object changes, evictions), fault injection and the records at the end.

- `simulated(...)`: the in-process simulated apiserver with the fleet inside it (`make demo`'s
  fast default). Changes come from its store's watches and evictions from its eviction
  listener, stamped on the cluster's loop the moment they are served.
- `real(...)`: etcd, kube-apiserver, kube-controller-manager and kube-scheduler built from
  upstream (`simulator.controlplane`), the scenario's nodes as node agents over HTTP
  (`simulator.runner.NodeAgents`), its workloads real Jobs and Deployments run by the real
  controllers, placed by the real scheduler (which calls the responders' extender through the
  shipped KubeSchedulerConfiguration, its URL pointed at the run's webhook front). Changes
  come from watches over HTTP; an eviction is a pod whose `DisruptionTarget` condition says
  `EvictionByEvictionAPI`, which kube-apiserver adds before it deletes an evicted pod. The
  control plane's own timers (grace periods, backoffs, Lease durations) run in real time
  whatever the speed: `docs/simulator.md`, "Time".
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from demo.observer import CLAIMS, PODS, RULES, WATCHED
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import ApiError, Gone
from gpuhealth.kube.resources import POD, RESOURCE_CLAIM, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.kube.watch import BOOKMARK, ERROR
from gpuhealth.testing.loopback import LoopbackError, wait_until
from responder.records import QUARANTINES
from simulator.fleet import FleetEvent
from simulator.fleet.objects import gpu_uuid
from simulator.model import Fault
from simulator.runner import SimulatedCluster
from simulator.scenario import Scenario
from simulator.testing import AgentsHandle, ClusterHandle, running_cluster, started

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER_SNIPPET = ROOT / "deploy" / "scheduler" / "kube-scheduler-config.yaml"
WORKLOADS_TIMEOUT_SECONDS = 120.0
"""Wall seconds for the real controllers and scheduler to run the scenario's workloads."""
EVICTED_REASON = "EvictionByEvictionAPI"
"""The `DisruptionTarget` reason kube-apiserver writes on a pod it evicts (policy/v1 Eviction)."""

Change = tuple[float, str, str, dict[str, Any], tuple[str, ...]]
"""(fleet seconds, resource, watch event type, object, the pod's device uuids) of one change."""
Eviction = tuple[float, str, str, tuple[str, ...], str]
"""(fleet seconds, namespace/name, node, the pod's device uuids, namespace/workload) of one eviction."""


@dataclass
class Observations:
    """What a target sees, for the pipeline's thread to drain (queues: targets feed them from
    their own threads)."""

    fleet_events: queue.SimpleQueue[FleetEvent] = dataclasses.field(default_factory=queue.SimpleQueue)
    changes: queue.SimpleQueue[Change] = dataclasses.field(default_factory=queue.SimpleQueue)
    evictions: queue.SimpleQueue[Eviction] = dataclasses.field(default_factory=queue.SimpleQueue)


class Target(Protocol):
    description: str
    """What it is, for the narration ("the simulated cluster", "Kubernetes 1.37 ...")."""

    @property
    def url(self) -> str: ...
    @property
    def kubeconfig_path(self) -> Path: ...
    @property
    def nvml_url(self) -> str: ...

    def now(self) -> float:
        """The fleet's simulated seconds."""
        ...

    def observe(self, sink: Observations) -> None:
        """Feed `sink` from now until the target is left."""
        ...

    def inject(self, faults: Sequence[Fault]) -> None: ...

    def records(self) -> list[dict[str, Any]]:
        """The DeviceQuarantine objects as they are now."""
        ...

    def check(self) -> None:
        """LoopbackError when a part of the cluster has died."""
        ...


def _job_of(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    name = labels.get("job-name") or labels.get("app") or ""
    return f"{meta.get('namespace', '')}/{name}"


def _key(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


# ----- the simulated cluster -----------------------------------------------------------------------


class SimulatedTarget:
    """The in-process simulated cluster (`simulator.runner.SimulatedCluster`) in its thread."""

    description = "the simulated cluster"

    def __init__(self, handle: ClusterHandle) -> None:
        self.handle = handle
        self._hooked: list[Any] = []

    @property
    def url(self) -> str:
        return self.handle.url

    @property
    def kubeconfig_path(self) -> Path:
        return self.handle.kubeconfig_path

    @property
    def nvml_url(self) -> str:
        return self.handle.url

    def call(self, fn: Callable[[SimulatedCluster], Any], timeout: float = 30.0) -> Any:
        """Run `fn(cluster)` on the cluster's loop (the chaos executor's API faults and clock)."""
        return self.handle.call(fn, timeout)

    def now(self) -> float:
        return self.handle.simulated_seconds()

    def observe(self, sink: Observations) -> None:
        def on_eviction(c: SimulatedCluster, pod: dict[str, Any]) -> None:
            key = _key(pod)
            sim = c.fleet.pods.get(key)
            node = sim.node if sim else str((pod.get("spec") or {}).get("nodeName") or "")
            uuids = tuple(gpu_uuid(node, s.gpu) for s in sim.slots) if sim else ()
            sink.evictions.put((c.fleet.now(), key, node, uuids, _job_of(pod)))

        def hook_up(c: SimulatedCluster) -> list[Any]:
            c.fleet.listeners.append(sink.fleet_events.put)
            c.store.eviction_listeners.append(lambda pod: on_eviction(c, pod))
            loop = asyncio.get_running_loop()
            watches = [c.store.watch(resource) for resource in WATCHED]
            pumps = [
                loop.create_task(_pump(c, resource, watch, sink.changes))
                for resource, watch in zip(WATCHED, watches, strict=True)
            ]
            return [*watches, *pumps]

        self._hooked.extend(self.handle.call(hook_up))

    def inject(self, faults: Sequence[Fault]) -> None:
        def apply(c: SimulatedCluster) -> None:
            for fault in faults:
                c.fleet.inject(fault)

        self.handle.call(apply)

    def records(self) -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = self.handle.call(
            lambda c: c.store.list("devicequarantines.gpuhealth.io")[0]
        )
        return listed

    def check(self) -> None:
        return None  # in this process: were it dead, so would be the run

    def close(self) -> None:
        hooked, self._hooked = self._hooked, []
        if hooked:
            self.handle.call(lambda _c: [w.close() if hasattr(w, "close") else w.cancel() for w in hooked])


async def _pump(c: SimulatedCluster, resource: str, watch: Any, changes: queue.SimpleQueue[Change]) -> None:
    """Forward one store watch's events, stamped (the fleet's time) on the cluster's loop as
    they are served."""
    async for etype, obj in watch:
        devices: tuple[str, ...] = ()
        if resource == PODS:
            sim = c.fleet.pods.get(_key(obj))
            if sim is not None:
                devices = tuple(gpu_uuid(sim.node, s.gpu) for s in sim.slots)
        changes.put((c.fleet.now(), resource, etype, obj, devices))


@contextmanager
def simulated(
    scenario: Scenario, speed: float, *, extender_url: str | None = None, workdir: Path | None = None
) -> Iterator[SimulatedTarget]:
    """The simulated cluster for `scenario`, without its timeline (the pipeline injects it once
    every part is up). With `extender_url` (and `workdir` for its file) its scheduler calls the
    responders' extender through the shipped KubeSchedulerConfiguration, as a real one does."""
    config = None
    if extender_url is not None and workdir is not None:
        config = scheduler_config(extender_url, workdir / "kube-scheduler-config.yaml")
    stripped = dataclasses.replace(scenario, timeline=())
    with running_cluster(stripped, speed=speed, scheduler_config=config) as handle:
        target = SimulatedTarget(handle)
        try:
            yield target
        finally:
            target.close()


# ----- a real control plane ------------------------------------------------------------------------


class RealTarget:
    """A real control plane (`simulator.controlplane.ControlPlane`) with the scenario's fleet as
    its node agents (`simulator.testing.AgentsHandle`)."""

    def __init__(self, plane: Any, agents: AgentsHandle) -> None:
        self.plane = plane
        """The running `simulator.controlplane.ControlPlane` (its components, logs, audit log)."""
        self.agents = agents
        self.description = f"Kubernetes {plane.settings.kubernetes} (real control plane, node agents)"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._streams: set[Any] = set()
        self._lock = threading.Lock()
        self._rules = self._served_rules()

    @property
    def url(self) -> str:
        return str(self.plane.url)

    @property
    def kubeconfig_path(self) -> Path:
        return Path(self.plane.kubeconfig_path)

    @property
    def nvml_url(self) -> str:
        url = self.agents.agents.url
        if url is None:
            raise RuntimeError("the node agents serve no simulator routes")
        return url

    def client(self) -> KubeClient:
        return KubeClient(KubeTransport(api_client(str(self.kubeconfig_path))))

    def now(self) -> float:
        # The fleet's clock is monotonic time scaled by its speed: reading it from this thread
        # touches no state its loop changes, and the loop may be busy with a blocking request.
        return self.agents.agents.fleet.now()

    def observe(self, sink: Observations) -> None:
        self.agents.call(lambda a: a.fleet.listeners.append(sink.fleet_events.put))
        for name in WATCHED:
            resource = self._resource(name)
            if resource is None:
                continue
            thread = threading.Thread(
                target=self._follow, args=(name, resource, sink), name=f"demo-watch-{name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def inject(self, faults: Sequence[Fault]) -> None:
        def apply(a: Any) -> None:
            for fault in faults:
                a.fleet.inject(fault)

        self.agents.call(apply)

    def records(self) -> list[dict[str, Any]]:
        client = self.client()
        try:
            return client.list(QUARANTINES).items
        finally:
            client.close()

    def wait_running(self, pods: int, timeout: float = WORKLOADS_TIMEOUT_SECONDS) -> None:
        """Wait until `pods` pods run (the scenario's workloads, made by the real controllers and
        placed by the real scheduler): a fault injected before its pod runs would hit no one."""
        client = self.client()
        try:

            def running() -> bool:
                listed = client.list(POD).items
                return sum((p.get("status") or {}).get("phase") == "Running" for p in listed) >= pods

            wait_until(f"the scenario's {pods} workload pods to run", running, timeout=timeout, interval=0.5)
        finally:
            client.close()

    def check(self) -> None:
        from simulator.controlplane import ControlPlaneError

        try:
            self.plane.check_running()
        except ControlPlaneError as exc:
            raise LoopbackError(str(exc)) from exc

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            streams = list(self._streams)
        for stream in streams:
            stream.close()
        for thread in self._threads:
            thread.join(10)
        self._threads.clear()

    # ----- watches over HTTP --------------------------------------------------------------------

    def _served_rules(self) -> Resource | None:
        client = self.client()
        try:
            versions = client.served_versions("resource.k8s.io", "devicetaintrules")
        finally:
            client.close()
        if not versions:
            return None
        return Resource("resource.k8s.io", versions[0], "devicetaintrules", namespaced=False)

    def _resource(self, name: str) -> Resource | None:
        if name == RULES:
            return self._rules
        return WATCHED_RESOURCES[name]

    def _follow(self, name: str, resource: Resource, sink: Observations) -> None:
        """List, then watch from the list's version; list again after a 410 or a dropped stream.
        A relist reports every object as ADDED again: the observer diffs against what it saw."""
        client = self.client()
        evicted: set[str] = set()
        try:
            version: str | None = None
            while not self._stop.is_set():
                try:
                    if version is None:
                        listed = client.list(resource)
                        for obj in listed.items:
                            self._seen(name, "ADDED", obj, sink, evicted)
                        version = listed.resource_version
                    stream = client.watch(resource, resource_version=version, timeout_seconds=60)
                    with self._lock:
                        self._streams.add(stream)
                    try:
                        for event in stream:
                            if event.type == BOOKMARK:
                                version = _version(event.object) or version
                                continue
                            if event.type == ERROR:
                                version = None
                                break
                            self._seen(name, event.type, event.object, sink, evicted)
                            version = _version(event.object) or version
                    finally:
                        with self._lock:
                            self._streams.discard(stream)
                        stream.close()
                except Gone:
                    version = None
                except (ApiError, OSError, ValueError) as exc:
                    if self._stop.is_set():
                        return
                    log.info("watch of %s broke (%s); resuming", name, exc)
                    self._stop.wait(0.5)
                except Exception:  # a closed stream while stopping raises whatever its socket says
                    if self._stop.is_set():
                        return
                    raise
        finally:
            client.close()

    def _seen(
        self, name: str, etype: str, obj: dict[str, Any], sink: Observations, evicted: set[str]
    ) -> None:
        at = self.now()
        devices: tuple[str, ...] = ()
        if name == PODS:
            devices = self._devices(_key(obj))
            key = _key(obj)
            if key not in evicted and _evicted(obj):
                evicted.add(key)
                node = str((obj.get("spec") or {}).get("nodeName") or "")
                sink.evictions.put((at, key, node, devices, _job_of(obj)))
        sink.changes.put((at, name, etype, obj, devices))

    def _devices(self, key: str) -> tuple[str, ...]:
        # A dict read is atomic, and a pod's slots are set once when its worker starts it.
        sim = self.agents.agents.fleet.pods.get(key)
        return tuple(gpu_uuid(sim.node, s.gpu) for s in sim.slots) if sim is not None else ()


WATCHED_RESOURCES: dict[str, Resource | None] = {
    "devicequarantines.gpuhealth.io": QUARANTINES,
    RULES: None,  # the version the apiserver serves (`RealTarget._served_rules`)
    "nodes": Resource("", "v1", "nodes", namespaced=False),
    "jobs.batch": Resource("batch", "v1", "jobs", namespaced=True),
    "events": Resource("", "v1", "events", namespaced=True),
    PODS: Resource("", "v1", "pods", namespaced=True),
    "leases.coordination.k8s.io": Resource("coordination.k8s.io", "v1", "leases", namespaced=True),
    "configmaps": Resource("", "v1", "configmaps", namespaced=True),
    CLAIMS: RESOURCE_CLAIM,
}


def _version(obj: dict[str, Any]) -> str | None:
    return (obj.get("metadata") or {}).get("resourceVersion") or None


def _evicted(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(
        (c.get("type"), c.get("reason"), c.get("status")) == ("DisruptionTarget", EVICTED_REASON, "True")
        for c in conditions
        if isinstance(c, dict)
    )


def scheduler_config(extender_url: str, path: Path) -> Path:
    """The shipped KubeSchedulerConfiguration snippet with the extender at `extender_url` (the run's
    responders, where a cluster has their Service), written to `path`."""
    config = yaml.safe_load(SCHEDULER_SNIPPET.read_text())
    for extender in config.get("extenders") or []:
        extender["urlPrefix"] = extender_url
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@contextmanager
def real(
    scenario: Scenario, speed: float, *, kubernetes: str, workdir: Path, extender_url: str
) -> Iterator[RealTarget]:
    """A real control plane of `kubernetes` (1.37, 1.36) in `workdir`, the scenario's fleet as its
    node agents (their workloads created, their timeline left for the pipeline to inject)."""
    from simulator.controlplane import ControlPlane, ControlPlaneSettings

    workdir.mkdir(parents=True, exist_ok=True)
    settings = ControlPlaneSettings(
        kubernetes=kubernetes,
        workdir=workdir,
        scheduler_config=scheduler_config(extender_url, workdir / "kube-scheduler-config.yaml"),
    )
    with ExitStack() as stack:
        plane = stack.enter_context(ControlPlane(settings))
        agents = stack.enter_context(
            started(
                AgentsHandle(
                    dataclasses.replace(scenario, timeline=()),
                    Path(plane.kubeconfig_path),
                    speed,
                    listen="127.0.0.1:0",
                )
            )
        )
        target = RealTarget(plane, agents)
        stack.callback(target.close)
        target.wait_running(sum(w.replicas for w in scenario.workloads))
        yield target


__all__ = [
    "Observations",
    "RealTarget",
    "SimulatedTarget",
    "Target",
    "real",
    "scheduler_config",
    "simulated",
]
