"""The simulated fleet: wires one object per real component around shared node and pod state.

`Fleet` owns the store, the timers (simulated time) and the shared records (`nodes`, `pods`,
`pending`), builds the fleet a scenario describes and hands each component what it writes:

- `Kubelet` (`kubelet`): Node registration, Leases, pod status and allocatedResourcesStatus;
- `PodRunner` (`pod_runner`): the kubelets' pod workers: pods bound through the API, graceful
  deletion of every pod; `CheckpointAgent` (`checkpoint_agent`): the workloads' checkpoints;
- `DevicePlugin` (`device_plugin`) and `DraDriver` (`dra_driver`): devices and their health;
- `Scheduler` (`scheduler`): where pods go, binding and claim allocation;
- `JobController` (`job_controller`): the workloads' Jobs, replacements of deleted pods;
- `ResourceClaimController` (`claim_controller`): claims from templates for clients' pods;
- `NodeLifecycleController` (`node_lifecycle`): Ready=Unknown after the grace period;
- `Janitor` (`janitor`): NVSentinel's GPU resets, where the scenario installs it;
- `Timeline` (`timeline`): the scenario's faults in simulated time, and a person's actions
  (`Person`, `person`) through the API;
- `controllers`: kube-controller-manager's part (`controller_manager`), on the store's watches.

The node agents (kubelet, pod runner, device plugin, DRA driver, checkpoint agent) reach the
API only through `node_api` (`NodeApi`; here the in-process `StoreNodeApi`); the scheduler and
the controllers are the simulated control plane and use the store itself. Components never
import each other: what one needs from another is a constructor argument (a callable or a
`Protocol`), bound here. This is the fleet's public face for the runner,
the CLI, the NVML view, the demo and the tests.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from gpuhealth.clock import Clock
from simulator.apiserver.store import format_timestamp
from simulator.fleet import mig, objects
from simulator.fleet.checkpoint_agent import CheckpointAgent
from simulator.fleet.claim_controller import ResourceClaimController
from simulator.fleet.controller_manager import ControllerManager
from simulator.fleet.device_manager import kubelet_rng
from simulator.fleet.device_plugin import DevicePlugin
from simulator.fleet.dra_driver import DraDriver, NvidiaDraDriver
from simulator.fleet.events import FaultApplied, FleetEvent
from simulator.fleet.extender_client import ExtenderConfig
from simulator.fleet.health import Gpu
from simulator.fleet.initial_layout import InitialLayout
from simulator.fleet.janitor import Janitor
from simulator.fleet.job_controller import JobController
from simulator.fleet.kubelet import Kubelet
from simulator.fleet.node_api import NodeApi, PodEntry, StoreNodeApi
from simulator.fleet.node_lifecycle import NodeLifecycleController
from simulator.fleet.person import Person
from simulator.fleet.pod_runner import PodRunner
from simulator.fleet.scheduler import Scheduler
from simulator.fleet.state import DeviceDriver, PendingPod, SimNode, SimPod
from simulator.fleet.timeline import Timeline
from simulator.fleet.timers import Timers
from simulator.fleet.writes import PodStatusWriter, create_ignore_exists
from simulator.model import DEVICE_PLUGIN, DRA, NVIDIA_DRIVER, Fault, Scenario, node_slots, place_workloads

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

log = logging.getLogger(__name__)

_BATCH = 500  # objects written between yields to the event loop while building


class Fleet:
    """Simulated nodes with their kubelets, GPUs, drivers and controllers, writing into `store`."""

    def __init__(
        self,
        scenario: Scenario,
        store: Store | None,
        clock: Clock,
        *,
        speed: float = 1.0,
        extenders: Sequence[ExtenderConfig] = (),
        node_api: NodeApi | None = None,
    ) -> None:
        """`store`: the simulated control plane's store, the fleet's nodes its nodes (agents on
        `StoreNodeApi`). None: the nodes are agents of a control plane the fleet does not own,
        reached through `node_api` (HTTP); the simulator's scheduler and controllers are off."""
        if store is not None and node_api is None:
            api: NodeApi = StoreNodeApi(store)
        elif store is None and node_api is not None:
            api = node_api
        else:
            raise ValueError(
                "a fleet takes either the simulated control plane's store or the node_api of another one"
            )
        if store is None and scenario.janitor is not None:
            # The janitor's CRD and resets are the simulated control plane's (`janitor`).
            raise ValueError(
                f"scenario {scenario.name}: janitor: the simulated janitor runs only on the simulated "
                "control plane, not beside another one"
            )
        self.scenario = scenario
        self.settings = scenario.settings
        self.store = store
        self.clock = clock
        self.timers = Timers(clock, speed)
        self.speed = speed
        self.nodes: dict[str, SimNode] = {}
        self.pods: dict[str, SimPod] = {}
        self.pending: dict[str, PendingPod] = {}
        """Replacement pods waiting for a node with usable GPUs, by namespace/name."""
        self.listeners: list[Callable[[FleetEvent], None]] = []
        self._started = False
        self.node_api = api
        """How the node agents reach the API server (`node_api`)."""
        # One generator for every generated name, so a seed builds the same objects each run.
        rng = random.Random(scenario.settings.seed)
        settings = scenario.settings
        timers = self.timers

        pod_status = PodStatusWriter(api, timers.wall, self.pod_deleted)
        drivers: dict[str, DeviceDriver] = {}
        self.kubelet = Kubelet(
            api, settings, timers, self.nodes, self.pods, drivers, pod_status, self._emit,
            pod_finished=self._pod_finished,
            synced=lambda node: self.pod_runner.node_synced(node),
        )  # fmt: skip
        self.checkpoints = CheckpointAgent(api, timers)
        # Beside a control plane the fleet does not own, its controllers make the scenario's initial
        # pods: they get the layout's devices until the timeline starts (`initial_layout`).
        layout = None if store is not None else InitialLayout(scenario, lambda: bool(self.timeline.applied))
        self.pod_runner = PodRunner(
            api, settings, timers, self.nodes, self.pods, self.pending, drivers, pod_status,
            self.checkpoints, self.kubelet.allocated, terminating=self._pod_terminating, layout=layout,
        )  # fmt: skip
        self.device_plugin = DevicePlugin(self.kubelet.push)
        # One DRA driver install per cluster: the fleet's profile (`NodeGroup.dra_driver`) picks it.
        dra_driver = NvidiaDraDriver if scenario.dra_driver() == NVIDIA_DRIVER else DraDriver
        self.dra_driver = dra_driver(api, settings, timers.wall, rng, self.kubelet.push)
        drivers[DEVICE_PLUGIN] = self.device_plugin
        drivers[DRA] = self.dra_driver
        self._control: SimulatedControlPlane | None = None
        if store is not None:
            # Deleting a pod of a simulated node is graceful: its kubelet stops it, then removes it.
            store.pod_runs = self.pod_runner.runs
            self._control = SimulatedControlPlane(self, store, rng, extenders)
        self.timeline = Timeline(
            scenario.timeline,
            timers,
            self.nodes,
            drivers,
            self.kubelet,
            self._kubelet_back,
            self._emit,
            plugin_failing=lambda node, failing: self.pod_runner.fail(
                self.dra_driver.plugin_key(node), failing
            ),
            plugin_restart=lambda node: (
                self.dra_driver.restart_plugin(node) if node.is_dra else self.device_plugin.restart(node)
            ),
            act=Person(api).act,
        )

    # ------------------------------------------------------------------ time

    def now(self) -> float:
        """Simulated seconds since the fleet finished building (its timeline's zero)."""
        return self.timers.now()

    def wall(self) -> float:
        return self.timers.wall()

    def call_at(self, sim_time: float, fn: Callable[[], None]) -> None:
        """Run `fn` on the fleet's timer loop once simulated time reaches `sim_time`."""
        self.timers.at(sim_time, fn)
        self.timers.wake()

    def next_due(self) -> float | None:
        return self.timers.next_due()

    def tick(self, limit: int | None = None) -> int:
        """Run every timer that is due now; returns how many ran (at most `limit`)."""
        return self.timers.tick(limit)

    async def advance(self, seconds: float) -> None:
        """ManualClock only: move simulated time forward, running each timer at its due time."""
        await self.timers.advance(seconds)

    async def run(self) -> None:
        """Run timers in real time (scaled by speed) until `stop()`."""
        await self.timers.run()

    def stop(self) -> None:
        self.timers.stop()
        if self._control is not None:
            self._control.scheduler.stop()
            self._control.controllers.close()
        self.node_api.close()

    def _emit(self, event: FleetEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                log.exception("fleet listener failed")

    # ------------------------------------------------------------------ building

    async def start(self) -> None:
        """Write namespaces, nodes, leases, slices, jobs and pods; schedule timers and the timeline."""
        if self._started:
            return
        self._started = True
        sc = self.scenario
        wall = self.wall()
        control = self._control
        if control is not None:
            for ns in sorted({"default", "kube-node-lease", *(w.namespace for w in sc.workloads)}):
                create_ignore_exists(self.node_api, "namespaces", objects.namespace(ns))
        written = 0
        index = 0
        for group in sc.fleet:
            for name in group.node_names():
                uuids = [objects.gpu_uuid(name, i) for i in range(group.gpus_per_node)]
                gpus = [
                    Gpu(name, i, uuid, group.path, partitions=mig.partition_uuids(uuid, group.mig))
                    for i, uuid in enumerate(uuids)
                ]
                node = SimNode(name, index, group, gpus, device_order=kubelet_rng(sc.settings.seed, name))
                node.free = node_slots(group)
                self.nodes[name] = node
                self.kubelet.register(node, wall)
                if node.is_dra:
                    self.dra_driver.publish(node)
                index += 1
                written += 1
                if written % _BATCH == 0:
                    await asyncio.sleep(0)
        if any(g.path == DRA for g in sc.fleet):
            self.dra_driver.install(any(g.extended_resource for g in sc.fleet))
            for node in self.nodes.values():
                created = self.dra_driver.start_plugin(node) if node.is_dra else None
                if created is not None:
                    self.pod_runner.created(node, created)
                    written += 1
                    if written % _BATCH == 0:
                        await asyncio.sleep(0)
        if any(g.path != DRA for g in sc.fleet):
            # The GPU Operator's container toolkit, installed with the device plugin: the
            # RuntimeClass that pods reaching a GPU by NVIDIA_VISIBLE_DEVICES name.
            create_ignore_exists(self.node_api, "runtimeclasses.node.k8s.io", objects.runtime_class())
        if control is not None:
            # The scenario's own pods, laid out by the simulated control plane. Elsewhere the
            # workloads are API objects (`api_workloads`) that its controllers run.
            control.jobs.create(sc.workloads, sc.fleet)
            for placement in place_workloads(sc):
                control.scheduler.start_pod(sc.workloads[placement.workload], placement, wall)
                written += 1
                if written % _BATCH == 0:
                    await asyncio.sleep(0)
            control.jobs.update()
        # Simulated time starts once the fleet stands: building 10,000 nodes takes seconds.
        self.timers.start_time()
        for node in self.nodes.values():
            node.renewed_at = 0.0
        if control is not None:
            control.jobs.run_pods()
        self._schedule_periodic()
        self.timeline.schedule()
        self.timers.wake()

    def _schedule_periodic(self) -> None:
        n = max(1, len(self.nodes))
        lease = self.settings.lease_renew_interval
        sync = self.settings.status_sync_interval
        now = self.now()
        for node in self.nodes.values():
            # Spread over the period, so 10,000 nodes renew ~1,000 Leases a second, not all at once.
            phase = (node.index + 0.5) / n
            self.timers.at(now + phase * lease, self._lease_tick, node)
            self.timers.at(now + phase * sync, self.kubelet.sync_tick, node)

    def _lease_tick(self, node: SimNode) -> None:
        """One Lease period of a node: its kubelet renews, or the node lifecycle controller looks.

        One timer serves both, so 10,000 nodes cost one heap entry each per period: the
        controller only has something to see on a node whose kubelet is not writing.
        """
        self.timers.at(self.now() + self.settings.lease_renew_interval, self._lease_tick, node)
        if node.writes:
            self.kubelet.renew(node)
        elif self._control is not None:
            self._control.node_lifecycle.monitor(node)

    def _kubelet_back(self, node: SimNode) -> None:
        """The node's kubelet writes again: Ready comes back.

        Simulated control plane: its node lifecycle controller writes Ready=True (when it had
        written Unknown). Another control plane: the kubelet posts its status, as a real one does.
        """
        if self._control is None:
            self.kubelet.post_ready(node)
        elif node.ready != "True":
            self._control.node_lifecycle.write_ready(node, "True")

    # ------------------------------------------------------------------ pods deleted through the API

    async def follow_deletions(self) -> None:
        """Follow pods deleted through the API (delete, eviction) until `stop()`.

        One watch for the whole fleet, events left unparsed except deletions. A deleted pod
        leaves its node: its devices are freed, its generated ResourceClaim goes (garbage
        collection), and its Deployment or Job gets a replacement pod after
        `replacement_delay` simulated seconds, placed on usable devices only. The controllers
        (`self.controllers`) run alongside, on their own watches.
        """
        if self._control is None:
            await self._follow_pod_deletions()  # the pods bound to the fleet's nodes, nothing else
            return
        controllers = asyncio.ensure_future(self._control.controllers.run())
        try:
            await self._follow_pod_deletions()
        finally:
            self._control.controllers.close()
            await controllers

    async def _follow_pod_deletions(self) -> None:
        await self.node_api.follow_pods(
            self.nodes, self._pod_event, self._resync_pods, lambda: self.timers.stopped
        )

    def _pod_event(self, etype: str, entry: PodEntry) -> None:
        if etype == "DELETED":
            self.pod_deleted(entry.namespace, entry.name)
        else:
            self.pod_runner.observe(etype, entry)

    def _resync_pods(self, nodes: Collection[str] | None, entries: list[PodEntry]) -> None:
        present = {f"{e.namespace}/{e.name}" for e in entries}
        covered = [k for k, p in self.pods.items() if nodes is None or p.node in nodes]
        for key in [k for k in covered if k not in present]:
            namespace, name = key.split("/", 1)
            self.pod_deleted(namespace, name)
        self.pod_runner.resync(entries)

    def pod_deleted(self, namespace: str, name: str) -> None:
        """A pod of the fleet is gone from the API."""
        key = f"{namespace}/{name}"
        if self.pending.pop(key, None) is not None:
            return
        pod = self.pods.get(key)
        if pod is None:
            return
        self.kubelet.forget(pod)
        self.pod_runner.gone(pod)
        if not pod.api and not pod.replaced and self._control is not None:
            self._control.jobs.pod_gone(pod)

    def _pod_terminating(self, pod: SimPod) -> None:
        """A scenario pod got its deletionTimestamp: its ReplicaSet or Job replaces it now.

        Both controllers count a Terminating pod as gone, so a pod whose kubelet cannot stop it
        (stopped, partitioned) is still replaced while it lingers.
        """
        if pod.api or pod.replaced or self._control is None:
            return
        pod.replaced = True
        self._control.jobs.pod_gone(pod)

    def _pod_finished(self, _pod: SimPod) -> None:
        if self._control is not None:
            self._control.jobs.update()  # a scenario Job's status counts its pods

    # ------------------------------------------------------------------ faults and views

    def inject(self, fault: Fault) -> None:
        """Apply `fault` at its `at` (simulated seconds since start); now if that has passed."""
        self.timeline.inject(fault)

    def timeline_progress(self) -> tuple[int, int]:
        return self.timeline.progress()

    @property
    def replacement_delay(self) -> float:
        """Simulated seconds from a pod's deletion to its replacement's creation."""
        return self.jobs.replacement_delay

    @replacement_delay.setter
    def replacement_delay(self, seconds: float) -> None:
        self.jobs.replacement_delay = seconds

    # ------------------------------------------------------------------ the simulated control plane

    @property
    def simulated_control_plane(self) -> bool:
        """Whether the fleet runs the simulated control plane (False: its nodes are another's agents)."""
        return self._control is not None

    def _simulated(self) -> SimulatedControlPlane:
        if self._control is None:
            raise RuntimeError(
                "the simulated control plane is off: this fleet's nodes are agents of another control plane"
            )
        return self._control

    @property
    def scheduler(self) -> Scheduler:
        return self._simulated().scheduler

    @property
    def jobs(self) -> JobController:
        return self._simulated().jobs

    @property
    def claims(self) -> ResourceClaimController:
        return self._simulated().claims

    @property
    def controllers(self) -> ControllerManager:
        return self._simulated().controllers

    @property
    def node_lifecycle(self) -> NodeLifecycleController:
        return self._simulated().node_lifecycle

    @property
    def applied(self) -> list[FaultApplied]:
        return self.timeline.applied

    def sync_node(self, node: SimNode) -> None:
        """The node's kubelet syncs pod status now."""
        self.kubelet.sync_node(node)

    def gpu(self, node: str, index: int) -> Gpu:
        return self.nodes[node].gpus[index]

    def xid_events(self, node: str, since: int = 0) -> list[tuple[int, str, int, float]]:
        return [e for e in self.nodes[node].xids if e[0] > since]

    @property
    def xid_seq(self) -> int:
        return self.timeline.xid_seq

    def status(self) -> dict[str, Any]:
        done, total = self.timeline_progress()
        return {
            "scenario": self.scenario.name,
            "simulatedSeconds": round(self.now(), 3),
            "wallTime": format_timestamp(self.wall()),
            "speed": self.speed,
            "nodes": len(self.nodes),
            "gpus": sum(len(n.gpus) for n in self.nodes.values()),
            "pods": len(self.pods),
            "timeline": {"applied": done, "total": total},
            "faultsApplied": [{"time": round(a.time, 3), **a.fault.to_json()} for a in self.applied],
            "jobs": self.checkpoints.status(),
        }


class SimulatedControlPlane:
    """The simulator's scheduler and controllers over the store, bound to the fleet's records.

    Used only when the fleet owns the control plane: they share the fleet's node and pod
    records with its agents (the fast path: the scenario's own pods are laid out and replaced
    without an API round trip). Against another control plane none of them exists.
    """

    def __init__(
        self, fleet: Fleet, store: Store, rng: random.Random, extenders: Sequence[ExtenderConfig]
    ) -> None:
        settings, timers = fleet.settings, fleet.timers
        pod_status = PodStatusWriter(fleet.node_api, timers.wall, fleet.pod_deleted)
        self.node_lifecycle = NodeLifecycleController(store, settings, timers, pod_status, fleet._emit)
        self.jobs = JobController(
            store, timers, fleet.pods, fleet.pending, rng,
            submit=lambda pending: self.scheduler.try_bind(pending),
            complete=fleet.kubelet.complete,
        )  # fmt: skip
        self.claims = ResourceClaimController(store, rng, fleet_pod=lambda key: key in fleet.pods)
        self.scheduler = Scheduler(
            store, settings, timers, fleet.nodes, fleet.pods, fleet.pending, self.jobs.job_uids, rng,
            admit=fleet.kubelet.admit, bound=self.jobs.pod_bound, emit=fleet._emit,
            claim_for=self.claims.claim_for, pod_gone=self.claims.pod_gone, extenders=extenders,
        )  # fmt: skip
        self.controllers = ControllerManager(store, timers, seed=settings.seed)
        # It follows the scenario Deployments' spec.replicas (a person's `kubectl scale`).
        self.controllers.all.append(self.jobs)
        self.janitor: Janitor | None = None
        if fleet.scenario.janitor is not None:
            # NVSentinel's janitor, installed beside the cluster: it runs with the controllers.
            self.janitor = Janitor(store, timers, fleet.nodes, fleet.scenario.janitor, fleet._emit)
            self.controllers.all.append(self.janitor)
