"""Where each workload pod goes at start: deterministic first-fit over plain data.

Pure functions over the scenario: no store, no clock. The same plan is computed when a
scenario is validated (so a fleet too small for its workloads is a `ScenarioError` naming
the workload) and when the fleet is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.scenario import NodeGroup, Scenario, Workload


@dataclass(frozen=True, slots=True)
class Slot:
    """One allocatable unit: a whole GPU, or one time-slicing replica of it."""

    gpu: int
    replica: int | None = None


@dataclass(frozen=True, slots=True)
class PodPlacement:
    workload: int
    """Index of the workload in the scenario."""
    ordinal: int
    """The pod's number within its workload (0..replicas-1)."""
    node: str
    slots: tuple[Slot, ...]


class PlacementError(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


def node_slots(group: NodeGroup) -> list[Slot]:
    """A node's slots in allocation order.

    Shared replicas are ordered replica-major, so consecutive pods land on different GPUs
    before a GPU is shared (what time-slicing users expect from a balanced plugin).
    """
    if group.shared_replicas:
        return [Slot(g, r) for r in range(group.shared_replicas) for g in range(group.gpus_per_node)]
    return [Slot(g) for g in range(group.gpus_per_node)]


def eligible(workload: Workload, group: NodeGroup) -> bool:
    if workload.node_group is not None and workload.node_group != group.name:
        return False
    return workload.path is None or workload.path == group.path


def place_workloads(scenario: Scenario) -> list[PodPlacement]:
    """First-fit placement of every workload pod, in scenario order; PlacementError when one does not fit."""
    nodes: list[tuple[str, NodeGroup]] = [(name, g) for g in scenario.fleet for name in g.node_names()]
    slots_of = {g.name: node_slots(g) for g in scenario.fleet}
    used = dict.fromkeys((name for name, _ in nodes), 0)
    out: list[PodPlacement] = []
    for wi, workload in enumerate(scenario.workloads):
        candidates = [(name, g) for name, g in nodes if eligible(workload, g)]
        if workload.replicas and not candidates:
            raise PlacementError(wi, "no node in the fleet matches the workload's path or nodeGroup")
        cursor = 0  # free slots only shrink, so the first node that fits moves forward
        for ordinal in range(workload.replicas):
            while cursor < len(candidates):
                name, group = candidates[cursor]
                if len(slots_of[group.name]) - used[name] >= workload.gpus_per_pod:
                    break
                cursor += 1
            else:
                free = sum(len(slots_of[g.name]) - used[n] for n, g in candidates)
                raise PlacementError(
                    wi,
                    f"{workload.replicas} pods of {workload.gpus_per_pod} GPUs do not fit: "
                    f"only {ordinal} placed ({free} GPU slots left on matching nodes)",
                )
            start = used[name]
            used[name] = start + workload.gpus_per_pod
            out.append(PodPlacement(wi, ordinal, name, tuple(slots_of[group.name][start : used[name]])))
    return out
