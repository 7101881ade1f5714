"""Device allocation for ResourceClaims on one node, pure: the DynamicResources filter's answer.

`pod_claims(...)` resolves a pod's claims first (its PreFilter).

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

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.fleet.cel import CelUnsupported, Device, Selector, compile_selector, device_view
from simulator.fleet.scheduler_filters import PodInfo, selector_matches, untolerated

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
    id: DeviceId
    """(driver, pool, name), kept: the allocator looks it up for every device of every node it tries."""


def slice_devices(slice_obj: dict[str, Any]) -> list[SliceDevice]:
    spec = slice_obj.get("spec") or {}
    driver = str(spec.get("driver", ""))
    pool = str((spec.get("pool") or {}).get("name", ""))
    out = []
    for device in spec.get("devices") or ():
        if not isinstance(device, dict) or not device.get("name"):
            continue
        taints = tuple(t for t in device.get("taints") or () if isinstance(t, dict))
        name = str(device["name"])
        out.append(SliceDevice(driver, pool, name, device_view(driver, device), taints, (driver, pool, name)))
    return out


class Unfit(Exception):
    """The node cannot satisfy the pod's claims; `reason` as the filter words it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def pod_claims(
    obj: Mapping[str, Any],
    pod: PodInfo,
    claims: Mapping[tuple[str, str], dict[str, Any]],
    make: Callable[[str, str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The pod's ResourceClaims (DynamicResources' PreFilter), from `claims` by (namespace, name).

    A template's claim is the one `status.resourceClaimStatuses` names, else `make(pod claim,
    template)` asks the resource claim controller for it (in a real cluster it has made it by
    the time the pod is scheduled; LookupError when the template is missing). `Unfit`, for every
    node alike, when a claim is missing, was made for another pod or is reserved for 256 others.
    """
    if not pod.claims:
        return []
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (obj.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, dict)
    }
    out = []
    for entry in pod.claims:
        pod_claim = str(entry.get("name", ""))
        claim_name = entry.get("resourceClaimName")
        template = entry.get("resourceClaimTemplateName")
        if not claim_name and template:
            claim_name = statuses.get(pod_claim)
            if not claim_name:
                try:
                    claim_name = make(pod_claim, str(template))["metadata"]["name"]
                except LookupError as exc:
                    raise Unfit(str(exc)) from exc
        if not claim_name:
            raise Unfit(f'pod claim "{pod_claim}" names neither a claim nor a template')
        claim = claims.get((pod.namespace, str(claim_name)))
        if claim is None:
            raise Unfit(f'resourceclaim "{claim_name}" not found')
        reserved = (claim.get("status") or {}).get("reservedFor") or ()
        owner = [o for o in claim["metadata"].get("ownerReferences") or () if o.get("controller")]
        if template and owner and owner[0].get("uid") != pod.uid:
            raise Unfit(f'resourceclaim "{claim_name}" was not created for the pod')
        if len(reserved) >= 256 and not any(r.get("uid") == pod.uid for r in reserved):
            raise Unfit(f'resourceclaim "{claim_name}" is in use')
        out.append(claim)
    return out


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


@dataclass(frozen=True, slots=True)
class RequestPlan:
    """One device request, read once per scheduling cycle."""

    name: str
    all_devices: bool
    count: int
    selectors: tuple[Selector, ...]
    tolerations: tuple[dict[str, Any], ...]
    key: tuple[str, ...]
    """What decides which devices match: the selectors' expressions."""


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    name: str
    node_terms: tuple[dict[str, Any], ...] | None
    """An allocated claim's node selector terms (it only fits there); None: not allocated yet."""
    allocated: bool
    requests: tuple[RequestPlan, ...]


def plan(claims: Sequence[Mapping[str, Any]], classes: Mapping[str, Mapping[str, Any]]) -> list[ClaimPlan]:
    """The pod's claims read once: `CelUnsupported` for a selector outside the subset, `Unfit` for
    a DeviceClass that does not exist (no node can help either way)."""
    out = []
    for claim in claims:
        name = str((claim.get("metadata") or {}).get("name", ""))
        allocation = (claim.get("status") or {}).get("allocation")
        if allocation:
            terms = ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or None
            out.append(ClaimPlan(name, tuple(terms) if terms else None, True, ()))
            continue
        requests = []
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
            exactly, expressions = _request_expressions(name, request, classes)
            requests.append(
                RequestPlan(
                    name=str(request.get("name", "")),
                    all_devices=(exactly.get("allocationMode") or "ExactCount") == "All",
                    count=int(exactly.get("count") or 1),
                    selectors=tuple(compile_selector(e) for e in expressions),
                    key=tuple(expressions),
                    tolerations=tuple(t for t in exactly.get("tolerations") or () if isinstance(t, dict)),
                )
            )
        out.append(ClaimPlan(name, None, False, tuple(requests)))
    return out


def devices_needed(plans: Sequence[ClaimPlan]) -> int:
    """The fewest unallocated devices a node must have for these claims (All asks for one at least)."""
    return sum(1 if r.all_devices else r.count for p in plans if not p.allocated for r in p.requests)


MatchCache = dict[tuple[str, tuple[str, ...]], list[SliceDevice]]
"""(node, selector expressions) -> the node's devices they match; cleared when slices or classes change."""


def allocate_planned(
    plans: Sequence[ClaimPlan],
    node_name: str,
    node_labels: Mapping[str, str],
    devices: Sequence[SliceDevice],
    in_use: Container[DeviceId],
    rules: Sequence[Mapping[str, Any]],
    matches: MatchCache | None = None,
) -> dict[str, dict[str, Any]]:
    """Allocations (claim name -> `status.allocation`) for the planned claims not yet allocated.

    `Unfit` when the node cannot serve them.
    """
    taken: set[DeviceId] = set()
    out: dict[str, dict[str, Any]] = {}
    for claim in plans:
        if claim.allocated:
            if claim.node_terms is not None and not selector_matches(
                claim.node_terms, node_name, node_labels
            ):
                raise Unfit(REASON_CLAIM_ELSEWHERE)
            continue
        results = []
        for request in claim.requests:
            cache_key = (node_name, request.key)
            matching = matches.get(cache_key) if matches is not None else None
            if matching is None:
                matching = [d for d in devices if all(s.matches(d.view) for s in request.selectors)]
                if matches is not None:
                    matches[cache_key] = matching
            usable = [
                d
                for d in matching
                if d.id not in in_use
                and d.id not in taken
                and (
                    not (d.taints or rules)
                    or untolerated((*d.taints, *_rule_taints(rules, d)), request.tolerations) is None
                )
            ]
            if request.all_devices:
                if not matching or len(usable) != len(matching):
                    raise Unfit(REASON_CANNOT_ALLOCATE)
                chosen = usable
            else:
                if len(usable) < request.count:
                    raise Unfit(REASON_CANNOT_ALLOCATE)
                chosen = usable[: request.count]
            for device in chosen:
                taken.add(device.id)
                results.append(
                    {
                        "request": request.name,
                        "driver": device.driver,
                        "pool": device.pool,
                        "device": device.name,
                    }
                )
        out[claim.name] = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            },
        }
    return out


def allocate(
    claims: Sequence[Mapping[str, Any]],
    node_name: str,
    node_labels: Mapping[str, str],
    devices: Iterable[SliceDevice],
    classes: Mapping[str, Mapping[str, Any]],
    in_use: Container[DeviceId],
    rules: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """`plan` then `allocate_planned` for one node (what a test or a single look needs)."""
    return allocate_planned(plan(claims, classes), node_name, node_labels, list(devices), in_use, rules)
