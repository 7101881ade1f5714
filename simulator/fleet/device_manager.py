"""Which free devices a device-plugin pod gets: the kubelet's device manager and the NVIDIA device
plugin's preferred allocation, pure and seeded.

On a real node the kubelet's device manager keeps a plugin's healthy, unallocated devices in a
set (a Go map: its iteration order is random), hands that list to the plugin's
GetPreferredAllocation and allocates what the plugin prefers. The NVIDIA device plugin prefers:

- whole GPUs and MIG partitions: the first devices of the list, so for one device an arbitrary
  free healthy one (for several GPUs it prefers NVLink-connected sets, not modelled here: still
  arbitrary among the free healthy ones);
- time-slicing replicas (`<uuid>::<n>`): replicas of the least-used GPUs, so a pod's replicas and
  consecutive pods spread over distinct cards; among equally used GPUs the list's order decides,
  which is the map's, so at random.

Nothing outside the kubelet is consulted (no annotation, no label, no extender), and nobody can
steer a named card to a pod except by occupying the others. The map's order is modelled by a
random order drawn from one generator per node, seeded from the scenario's seed and the node's
name (`kubelet_rng`): a run with the same seed and the same admissions repeats exactly.

Who goes through this choice: every pod a simulated kubelet admits on a device-plugin node once
the fleet stands — pods created or bound through the API (`pod_runner`: clients' pods,
gpuhealth's holder and check pods, and on a control plane the fleet does not own the scenario's
workload pods that its controllers make once the timeline has started, replacements included)
and the scenario's replacement pods that the simulated scheduler binds (`scheduler`). Not the
scenario's initial pods: the state the scenario starts from, which its faults and expectations
name by GPU index. On the simulated control plane they are written already running where the
model's first-fit layout puts them (`simulator.model.place_workloads`); beside another control
plane its controllers make them and the kubelet gives them the layout's slots until the timeline
starts (`initial_layout`: a fixture, never a kubelet's behaviour). DRA devices are the
scheduler's allocation (`dra_allocator`), never chosen here.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from simulator.fleet.state import SimNode
from simulator.model import Slot


def kubelet_rng(seed: int, node: str) -> random.Random:
    """The node's device manager's source of order: the same seed and node give the same draws."""
    return random.Random(f"{seed}/kubelet/{node}")


def preferred_allocation(
    available: Iterable[Slot], count: int, rng: random.Random, *, replicas: int = 0
) -> tuple[Slot, ...] | None:
    """`count` of the `available` devices (free and reported Healthy) as the kubelet and the
    plugin choose them; None when fewer are available. `replicas`: time-slicing replicas per GPU
    (0: whole GPUs or MIG partitions, where any free healthy device will do)."""
    # A canonical order first, so only the rng's draws decide, never the caller's list order.
    pool = sorted(set(available), key=lambda s: (s.gpu, -1 if s.replica is None else s.replica))
    if count <= 0:
        return ()
    if len(pool) < count:
        return None
    rng.shuffle(pool)  # the device manager's set, iterated in a Go map's order
    if not replicas:
        return tuple(pool[:count])
    return _spread(pool, count, replicas)


def _spread(pool: list[Slot], count: int, replicas: int) -> tuple[Slot, ...]:
    """Replicas of the least-used GPUs, one at a time; a GPU's use counts the replicas picked."""
    used: dict[int, int] = {}
    for slot in pool:
        used[slot.gpu] = used.get(slot.gpu, replicas) - 1  # in use: those not in the available list
    first: dict[int, int] = {}
    for position, slot in enumerate(pool):
        first.setdefault(slot.gpu, position)  # ties between equally used GPUs: the list's order
    left = list(pool)
    picked: list[Slot] = []
    for _ in range(count):
        gpu = min({s.gpu for s in left}, key=lambda g: (used[g], first[g]))
        slot = next(s for s in left if s.gpu == gpu)
        left.remove(slot)
        picked.append(slot)
        used[gpu] += 1
    return tuple(picked)


def allocate(node: SimNode, usable: Iterable[Slot], count: int) -> tuple[Slot, ...] | None:
    """The node's kubelet allocates `count` of `usable` (its free slots the plugin reports
    Healthy) for a pod, drawing from the node's own generator (`SimNode.device_order`)."""
    group = node.group
    replicas = group.shared_replicas if group.mig is None else 0
    return preferred_allocation(usable, count, node.device_order, replicas=replicas)
