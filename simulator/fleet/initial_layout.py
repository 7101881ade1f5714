"""The scenario's initial layout as a fixture for node agents beside a control plane the fleet does not own.

A scenario is written against the state its timeline starts from: which GPU each initial pod of
its workloads runs on (`simulator.model.place_workloads`, first fit), named by its faults and its
`expect:` section (a fault on `gpu-dp-0` GPU 1 is written to hit a pod). On the simulated control
plane the fleet writes those pods itself, already where the layout puts them. Beside another
control plane (a real kube-apiserver, or the simulated one over HTTP) the workloads are Jobs and
Deployments that its controllers turn into pods and its scheduler binds (`api_workloads`, which
asks for the layout's nodes by a preferred node affinity); the devices of a device-plugin pod are
then the kubelet's choice (`device_manager`), random, so without this module the story would start
from a different state on every seed.

`InitialLayout.claim` gives a pod its layout slots when all of these hold, from what the API says
and what the kubelet knows:

- the pod belongs to a scenario workload: its namespace and `gpuhealth.io/workload` label name
  the workload, and its controller is that workload's own (the Job of that name; for a Deployment
  the ReplicaSet `<name>-<pod-template-hash>`), and it asks for the workload's GPU count;
- the layout has a slot set of that workload on this node that no pod has claimed yet (the
  layout's ordinals on a node are taken in the order the node admits the workload's pods), and
  every one of its devices is free and reported Healthy by the plugin;
- the scenario's timeline has not started (no fault applied yet, scheduled or injected).

Otherwise (replacements, new pods, gpuhealth's holder, probe and canary pods, anything admitted
once the timeline has started) the device manager chooses, as before. A claim is never returned:
a replacement of an initial pod is a new pod, placed by the device manager.

Why this is no shortcut the product could lean on: the product never places the initial pods
and never runs before them; they are the cluster's state when the story begins, as the nodes
and their GPUs are. Every slot handed out is one the real device manager could have drawn (free,
reported Healthy, on the node the scheduler chose), so the fixture is a possible history of a
real cluster, picked instead of drawn. Nothing here reads anything gpuhealth writes, and once the
first fault is applied no pod is ever steered, so how the product's own pods (and the workloads'
replacements it causes) land is the device manager's alone. DRA devices are the scheduler's
allocation, never chosen by a kubelet: this applies to device-plugin nodes only.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from simulator.fleet.objects import WORKLOAD_LABEL
from simulator.model import DEVICE_PLUGIN, PodPlacement, Scenario, Slot, Workload, place_workloads

POD_TEMPLATE_HASH = "pod-template-hash"
"""The label the Deployment controller puts on its ReplicaSet's pods (and in the set's name)."""


def scenario_workload(workloads: Sequence[Workload], pod: Mapping[str, Any]) -> int | None:
    """The index of the scenario workload `pod` belongs to, from its namespace, labels and
    controller; None for any other pod (a client's, gpuhealth's, a look-alike of another owner)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    owner = next((o for o in meta.get("ownerReferences") or () if o.get("controller")), None)
    if owner is None:
        return None
    for index, workload in enumerate(workloads):
        if labels.get(WORKLOAD_LABEL) != workload.name or meta.get("namespace") != workload.namespace:
            continue
        if workload.kind == "Job":
            expected = ("Job", workload.name)
        else:
            expected = ("ReplicaSet", f"{workload.name}-{labels.get(POD_TEMPLATE_HASH, '')}")
        if (owner.get("kind"), owner.get("name")) == expected:
            return index
    return None


class InitialLayout:
    """The layout's slot sets on device-plugin nodes not yet claimed, by (node, workload index)."""

    def __init__(self, scenario: Scenario, started: Callable[[], bool]) -> None:
        """`started`: whether the scenario's timeline has started (a fault was applied)."""
        self._workloads = scenario.workloads
        self._started = started
        paths = {name: group.path for group in scenario.fleet for name in group.node_names()}
        self._unclaimed: dict[tuple[str, int], list[PodPlacement]] = {}
        for placement in place_workloads(scenario):
            if paths[placement.node] == DEVICE_PLUGIN:
                self._unclaimed.setdefault((placement.node, placement.workload), []).append(placement)

    def claim(
        self, node: str, pod: Mapping[str, Any], count: int, usable: Collection[Slot]
    ) -> tuple[Slot, ...] | None:
        """The layout's slots for `pod` (asking for `count` devices) on `node`, where `usable` are
        the node's free devices the plugin reports Healthy; None: the device manager chooses."""
        if not self._unclaimed or self._started():
            return None
        index = scenario_workload(self._workloads, pod)
        if index is None or count != self._workloads[index].gpus_per_pod:
            return None
        waiting = self._unclaimed.get((node, index), [])
        for position, placement in enumerate(waiting):
            if set(placement.slots) <= set(usable):
                del waiting[position]
                if not waiting:
                    del self._unclaimed[(node, index)]
                return placement.slots
        return None

    def unclaimed(self) -> list[PodPlacement]:
        """The placements no pod has claimed yet, in the layout's order (for tests and status)."""
        waiting = (p for placements in self._unclaimed.values() for p in placements)
        return sorted(waiting, key=lambda p: (p.workload, p.ordinal))
