"""Which of a node's devices new pods must not get: the scheduler's device filters, pure.

Plain data in (the node's state and the DeviceTaintRules), a set of GPU indexes out; no store,
no clock. The first-fit layout of a scenario's initial pods is part of the
model (`simulator.model.place_workloads`), since scenario validation needs it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from simulator.fleet import mig, objects
from simulator.fleet.health import HEALTHY, device_plugin_health
from simulator.fleet.state import SimNode
from simulator.fleet.tolerations import tolerates

_KEEPS_AWAY = ("NoSchedule", "NoExecute")


def blocked_devices(
    node: SimNode, rules: list[dict[str, Any]], tolerations: Sequence[dict[str, Any]] = ()
) -> set[int]:
    """GPU indexes new pods must not get on `node`.

    Device plugin: the devices the plugin reports Unhealthy (all of them while its stream is
    broken), which the kubelet's device manager never hands out. Nothing else: a real kubelet
    hands a pod any free device its plugin reports Healthy, and never reads the responder's
    quarantine annotation on the node; only a scheduler extender that counts the annotated
    devices out of the node's capacity keeps pods off such a node.
    DRA: devices with a NoSchedule/NoExecute taint, from the slice or a DeviceTaintRule, that
    `tolerations` (the claim request's) do not tolerate; health alone does not keep the DRA
    scheduler away, as in a real cluster. On a MIG-partitioned DRA node a rule naming one MIG
    device keeps its whole card away here (a simplification: the real scheduler would still
    hand out the card's other MIG devices; gpuhealth's rules name every one of them).
    """
    blocked: set[int] = set()
    if not node.is_dra:
        return {g.index for g in node.gpus if device_plugin_health(g, node.stream_ok) != HEALTHY}

    def keeps_away(taint: dict[str, Any]) -> bool:
        return taint.get("effect") in _KEEPS_AWAY and not any(tolerates(t, taint) for t in tolerations)

    for gpu in node.gpus:
        if any(keeps_away(t) for t in gpu.taints):
            blocked.add(gpu.index)
    for rule in rules:
        selector = (rule.get("spec") or {}).get("deviceSelector") or {}
        taint = (rule.get("spec") or {}).get("taint") or {}
        if not keeps_away(taint):
            continue
        if selector.get("driver") not in (None, objects.DRA_DRIVER):
            continue
        if selector.get("pool") not in (None, node.name):
            continue
        for name, slot in mig.dra_slots(node.group.mig, len(node.gpus)).items():
            if selector.get("device") in (None, name):
                blocked.add(slot.gpu)
    return blocked
