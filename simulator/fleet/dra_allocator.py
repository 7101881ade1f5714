"""Device allocation for ResourceClaims on one node, pure: the DynamicResources filter's answer.

`allocate(...)` takes a pod's claims, the node's devices (from its ResourceSlices), the
DeviceClasses, the devices other claims hold and the DeviceTaintRules, and returns each
unallocated claim's `status.allocation` for that node, or `Unfit` with the reason the node
fails. A selector outside the CEL subset (`simulator.fleet.cel`) raises `CelUnsupported`:
no node can help, so the pod stays Pending with the expression named.

What is honoured: `exactly` requests with deviceClassName, count, allocationMode ExactCount or
All, CEL selectors of the request and of its DeviceClass, tolerations; device taints from the
slice and from DeviceTaintRules (NoSchedule/NoExecute keep a device out unless tolerated,
effect None does not); devices held by other claims; an allocated claim's node selector.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.fleet.cel import CelUnsupported, Device, compile_selector, device_view
from simulator.fleet.scheduler_filters import selector_matches, untolerated

REASON_CANNOT_ALLOCATE = "cannot allocate all claims"
REASON_CLAIM_ELSEWHERE = "resourceclaim not available on the node"

DeviceId = tuple[str, str, str]
"""(driver, pool, device)."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    """One device of a ResourceSlice, with what selectors and taint checks read."""

    driver: str
    pool: str
    name: str
    view: Device
    taints: tuple[dict[str, Any], ...]

    @property
    def id(self) -> DeviceId:
        return (self.driver, self.pool, self.name)


def slice_devices(slice_obj: dict[str, Any]) -> list[SliceDevice]:
    spec = slice_obj.get("spec") or {}
    driver = str(spec.get("driver", ""))
    pool = str((spec.get("pool") or {}).get("name", ""))
    out = []
    for device in spec.get("devices") or ():
        if not isinstance(device, dict) or not device.get("name"):
            continue
        taints = tuple(t for t in device.get("taints") or () if isinstance(t, dict))
        out.append(SliceDevice(driver, pool, str(device["name"]), device_view(driver, device), taints))
    return out


class Unfit(Exception):
    """The node cannot satisfy the pod's claims; `reason` as the filter words it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def claim_devices(claim: Mapping[str, Any]) -> list[DeviceId]:
    """The devices an allocated claim holds."""
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
    return [
        (str(r.get("driver", "")), str(r.get("pool", "")), str(r.get("device", "")))
        for r in results or ()
        if isinstance(r, dict)
    ]


def _rule_taints(rules: Sequence[Mapping[str, Any]], device: SliceDevice) -> list[dict[str, Any]]:
    out = []
    for rule in rules:
        spec = rule.get("spec") or {}
        selector = spec.get("deviceSelector") or {}
        if selector.get("driver") not in (None, device.driver):
            continue
        if selector.get("pool") not in (None, device.pool):
            continue
        if selector.get("device") not in (None, device.name):
            continue
        taint = spec.get("taint")
        if isinstance(taint, dict):
            out.append(taint)
    return out


def _selectors(block: Mapping[str, Any], where: str) -> list[str]:
    expressions = []
    for selector in block.get("selectors") or ():
        cel = (selector or {}).get("cel") if isinstance(selector, dict) else None
        if not isinstance(cel, dict) or not isinstance(cel.get("expression"), str):
            raise CelUnsupported(repr(selector), f"{where}: only cel selectors are supported")
        expressions.append(cel["expression"])
    return expressions


def _request_expressions(
    claim_name: str, request: Mapping[str, Any], classes: Mapping[str, Mapping[str, Any]]
) -> tuple[Mapping[str, Any], list[str]]:
    """The request's `exactly` block and the selector expressions of it and its class."""
    exactly = request.get("exactly")
    if not isinstance(exactly, dict):
        raise CelUnsupported(
            str(request.get("name")), f"claim {claim_name}: only requests with `exactly` are supported"
        )
    class_name = exactly.get("deviceClassName")
    device_class = classes.get(str(class_name))
    if device_class is None:
        raise Unfit(f'deviceclass "{class_name}" not found')
    expressions = _selectors(device_class.get("spec") or {}, f"DeviceClass {class_name}")
    expressions += _selectors(exactly, f"claim {claim_name}, request {request.get('name')}")
    return exactly, expressions


def allocate(
    claims: Sequence[Mapping[str, Any]],
    node_name: str,
    node_labels: Mapping[str, str],
    devices: Iterable[SliceDevice],
    classes: Mapping[str, Mapping[str, Any]],
    in_use: set[DeviceId],
    rules: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """Allocations (claim name -> `status.allocation`) for the claims not yet allocated on this node.

    `Unfit` when the node cannot serve them, `CelUnsupported` when a selector is outside the subset.
    """
    devices = list(devices)
    taken: set[DeviceId] = set()
    out: dict[str, dict[str, Any]] = {}
    for claim in claims:
        meta = claim.get("metadata") or {}
        name = str(meta.get("name", ""))
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or None
            if terms is not None and not selector_matches(terms, node_name, node_labels):
                raise Unfit(REASON_CLAIM_ELSEWHERE)
            continue
        results = []
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            exactly, expressions = _request_expressions(name, request, classes)
            selectors = [compile_selector(e) for e in expressions]
            tolerations = [t for t in exactly.get("tolerations") or () if isinstance(t, dict)]
            matching = []
            for device in devices:
                if not all(s.matches(device.view) for s in selectors):
                    continue
                matching.append(device)
            usable = [
                d
                for d in matching
                if d.id not in in_use
                and d.id not in taken
                and untolerated((*d.taints, *_rule_taints(rules, d)), tolerations) is None
            ]
            mode = exactly.get("allocationMode") or "ExactCount"
            if mode == "All":
                if not matching or len(usable) != len(matching):
                    raise Unfit(REASON_CANNOT_ALLOCATE)
                chosen = usable
            else:
                count = int(exactly.get("count") or 1)
                if len(usable) < count:
                    raise Unfit(REASON_CANNOT_ALLOCATE)
                chosen = usable[:count]
            for device in chosen:
                taken.add(device.id)
                results.append(
                    {"request": request.get("name"), "driver": device.driver, "pool": device.pool,
                     "device": device.name}
                )  # fmt: skip
        out[name] = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            },
        }
    return out
