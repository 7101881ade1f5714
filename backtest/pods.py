"""Which pods held which device, from the exporter's `gpu_device_allocation_info` series.

Pure. One series per (node, device, namespace, pod) while the pod holds the device; its samples,
read at the backtest's step, become the intervals it held it (`history.runs`). A pod holds a
device at `t` when a run covers `t` or ended less than a step before it (the last sample before a
move or a cordon is the freshest word on who was there).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

from responder.replay.history import runs

DeviceKey = tuple[str, str]


class Holders:
    def __init__(self, series: Iterable[tuple[Mapping[str, str], Sequence[float]]], step: float) -> None:
        stamps: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        for labels, timestamps in series:
            node, device, pod = labels.get("node", ""), labels.get("device", ""), labels.get("pod", "")
            if node and device and pod:
                stamps[(node, device, f"{labels.get('namespace', '')}/{pod}")].extend(timestamps)
        self._step = step
        self._held: dict[DeviceKey, list[tuple[str, float, float]]] = defaultdict(list)
        self._devices: dict[str, set[str]] = defaultdict(set)
        for (node, device, pod), found in stamps.items():
            self._devices[node].add(device)
            self._held[(node, device)].extend((pod, a, b) for a, b in runs(found, step))

    def on_device(self, node: str, device: str, at: float) -> list[str]:
        """`namespace/pod` of every pod holding the device at `at`, sorted."""
        return sorted({pod for pod, a, b in self._held.get((node, device), ()) if a <= at <= b + self._step})

    def on_node(self, node: str, at: float) -> list[str]:
        """Every pod holding a device of the node at `at`, sorted."""
        return sorted({p for d in self._devices.get(node, ()) for p in self.on_device(node, d, at)})
