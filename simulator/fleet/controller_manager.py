"""kube-controller-manager's part of the simulated cluster: the controllers it runs, started together.

`ControllerManager` builds one object per real controller over the store and the fleet's timers
and runs their informers: the ReplicaSet controller (also serving ReplicationControllers), the
Deployment, StatefulSet and Job controllers for objects created through the API, the garbage
collector, the namespace controller, the disruption controller and the taint eviction
controller. While they run, deletes add the finalizers they remove
(`Store.finalizing_controllers`). Generated pod names draw from their own seeded generator, so
the scenario's names (the fleet's generator) stay what they were.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

from simulator.fleet.deployment_controller import DeploymentController
from simulator.fleet.disruption_controller import DisruptionController
from simulator.fleet.events_recorder import EventRecorder
from simulator.fleet.garbage_collector import GarbageCollector
from simulator.fleet.job_controller import JobApiController
from simulator.fleet.namespace_controller import NamespaceController
from simulator.fleet.replicaset_controller import REPLICATION_CONTROLLERS, ReplicaSetController
from simulator.fleet.statefulset_controller import StatefulSetController
from simulator.fleet.taint_manager import TaintManager, UnschedulableTainter
from simulator.fleet.timers import Timers

if TYPE_CHECKING:
    from simulator.apiserver.store import Store

_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class ControllerManager:
    """The controllers, built together and run on one event loop until `close()`."""

    def __init__(self, store: Store, timers: Timers, *, seed: int | None) -> None:
        self._store = store
        self._rng = random.Random(None if seed is None else f"{seed}/controllers")

        def recorder(component: str) -> EventRecorder:
            return EventRecorder(store, component, timers.wall)

        self.replica_sets = ReplicaSetController(store, timers, recorder, rand_suffix=self.suffix)
        self.replication_controllers = ReplicaSetController(
            store, timers, recorder, kind=REPLICATION_CONTROLLERS, rand_suffix=self.suffix
        )
        self.deployments = DeploymentController(store, timers, recorder)
        self.stateful_sets = StatefulSetController(store, timers, recorder)
        self.jobs = JobApiController(store, timers, recorder, rand_suffix=self.suffix)
        self.garbage_collector = GarbageCollector(store)
        self.namespaces = NamespaceController(store, timers)
        self.disruption = DisruptionController(store, timers)
        self.taints = TaintManager(store, timers, recorder)
        self.cordon = UnschedulableTainter(store, timers)
        self.all: list[Any] = [
            self.replica_sets,
            self.replication_controllers,
            self.deployments,
            self.stateful_sets,
            self.jobs,
            self.garbage_collector,
            self.namespaces,
            self.disruption,
            self.taints,
            self.cordon,
        ]
        self._closed = False

    def suffix(self) -> str:
        return "".join(self._rng.choice(_ALPHABET) for _ in range(5))

    async def run(self) -> None:
        if self._closed:
            return
        self._store.finalizing_controllers = True
        try:
            await asyncio.gather(*(informer.run() for c in self.all for informer in c.informers))
        finally:
            self._store.finalizing_controllers = False

    def close(self) -> None:
        self._closed = True
        for controller in self.all:
            controller.close()
