"""What a node-cordon policy (NVSentinel's way) would have cost on the same alerts.

Pure. A device alert that asks for a quarantine cordons and drains its whole node while it fires;
the node returns when no such alert of it fires any more (the alert's resolve stands in for the
repair, as it does for gpuhealth's broken intervals: `responder.replay.history.broken`). Unknown
alerts (`restrict`) cordon nothing: a node-level policy waits for the node lifecycle controller.
What it withholds from work: every GPU of the node while cordoned, less the broken ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from responder.replay.history import merge


@dataclass(frozen=True, slots=True)
class Cordon:
    node: str
    start: float
    end: float
    gpus: int
    """GPUs of the node (what the cordon keeps from new work)."""
    healthy_gpu_seconds: float
    """GPU-seconds of the node's working cards that the cordon withheld."""
    pods: tuple[str, ...]
    """`namespace/pod` of the pods the drain evicts (those holding a GPU of the node at its start)."""


def cordons(
    broken: Mapping[tuple[str, str], list[tuple[float, float]]],
    gpus: Mapping[str, int],
    pods_on_node: Callable[[str, float], list[str]],
    *,
    end: float,
) -> list[Cordon]:
    """Every cordon, in time order: one per node and union of its cards' broken intervals (cut
    at the window's `end`). A node of unknown size counts the devices its alerts name."""
    by_node: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(dict)
    for (node, device), spans in broken.items():
        by_node[node][device] = [(a, min(b, end)) for a, b in spans if a < end]
    out = []
    for node, devices in by_node.items():
        size = max(gpus.get(node, 0), len(devices))
        for start, stop in merge(span for spans in devices.values() for span in spans):
            broken_seconds = sum(
                min(b, stop) - max(a, start)
                for spans in devices.values()
                for a, b in spans
                if a < stop and b > start
            )
            out.append(
                Cordon(
                    node,
                    start,
                    stop,
                    size,
                    size * (stop - start) - broken_seconds,
                    tuple(pods_on_node(node, start)),
                )
            )
    out.sort(key=lambda c: (c.start, c.node))
    return out
