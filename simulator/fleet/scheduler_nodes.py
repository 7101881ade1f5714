"""Which nodes fit a pod, and which one it gets: kube-scheduler's Filter and Score over its cache.

One scheduling cycle's node search (`scheduler.Scheduler` runs the cycle and binds): every
filter of a node (`scheduler_filters.filter_node`, then DynamicResources' allocation of the pod's
claims on it, `dra_allocator`), the adaptive number of feasible nodes kube-scheduler looks for
(a pod asking for GPUs looks only at nodes with that many free, the freest first), the
FailedScheduling message counting every node's failing filters, and the pick: the best score
(least allocated, plus the extenders' priorities), ties broken by the fleet's seeded rng.
Reads the cache only; no writes, no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from gpuhealth.plugin_resources import GPU_RESOURCE
from simulator.fleet.dra_allocator import (
    REASON_CANNOT_ALLOCATE,
    ClaimPlan,
    Unfit,
    allocate_planned,
    devices_needed,
)
from simulator.fleet.scheduler_cache import SchedulerCache
from simulator.fleet.scheduler_filters import (
    PodInfo,
    failed_scheduling_message,
    feasible_nodes_to_find,
    filter_node,
    preemption_could_help,
    score_node,
)

Allocations = dict[str, dict[str, dict[str, Any]]]
"""node -> claim name -> the claim's allocation on that node."""


class DraCycle:
    """A DRA pod's claims as planned for one scheduling cycle."""

    __slots__ = ("needed", "plans", "rules")

    def __init__(self, plans: list[ClaimPlan], rules: list[dict[str, Any]]) -> None:
        self.plans = plans
        self.needed = devices_needed(plans)
        self.rules = rules


def node_fits(
    cache: SchedulerCache, pod: PodInfo, name: str, dra: DraCycle | None, ignored: frozenset[str]
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """(reasons the node fails, or none; the claims' allocations on it)."""
    info = cache.nodes[name]
    reasons = filter_node(pod, info, ignored)
    if reasons or dra is None:
        return reasons, {}
    if cache.free_devices(name) < dra.needed:
        return [REASON_CANNOT_ALLOCATE], {}
    try:
        allocations = allocate_planned(
            dra.plans, name, info.labels, cache.devices.get(name, ()), cache.in_use, dra.rules, cache.matches
        )
    except Unfit as exc:
        return [exc.reason], {}
    return [], allocations


def find_nodes(
    cache: SchedulerCache, pod: PodInfo, dra: DraCycle | None, ignored: frozenset[str]
) -> tuple[list[str], Allocations]:
    """Feasible nodes, up to kube-scheduler's adaptive number, and their claim allocations.

    A pod asking for GPUs looks only at nodes with that many free (the freest first)."""
    want = feasible_nodes_to_find(len(cache.nodes))
    gpus = pod.requests.get(GPU_RESOURCE, 0)
    if gpus > 0 and GPU_RESOURCE not in ignored:
        candidates = cache.gpu_candidates(-(-gpus // 1000))
    else:
        candidates = cache.all_candidates()
    feasible: list[str] = []
    allocations: Allocations = {}
    for name in candidates:
        reasons, allocation = node_fits(cache, pod, name, dra, ignored)
        if reasons:
            continue
        feasible.append(name)
        if allocation:
            allocations[name] = allocation
        if len(feasible) >= want:
            break
    return feasible, allocations


def explain(
    cache: SchedulerCache, pod: PodInfo, dra: DraCycle | None, ignored: frozenset[str], total: int
) -> str:
    """Why no node fits, every node's first failing filter counted (only on failure: it scans all)."""
    reasons: dict[str, int] = {}
    resolvable = 0
    for name in list(cache.nodes):
        found, _ = node_fits(cache, pod, name, dra, ignored)
        for reason in found:
            reasons[reason] = reasons.get(reason, 0) + 1
        resolvable += preemption_could_help(found)
    return failed_scheduling_message(total, reasons, resolvable)


def pick(
    cache: SchedulerCache, pod: PodInfo, feasible: list[str], extra: Mapping[str, int], rng: random.Random
) -> str:
    """The best-scored node; among equals, one chosen by the seeded rng (kube-scheduler
    picks uniformly among its top scores)."""
    best: list[str] = []
    top = -1
    for name in feasible:
        score = score_node(pod, cache.nodes[name]) + extra.get(name, 0)
        if score > top:
            top, best = score, [name]
        elif score == top:
            best.append(name)
    return best[0] if len(best) == 1 else rng.choice(best)
