"""The demo observer's enforcement: what gpuhealth puts on devices and nodes. Pure.

`EnforcementWatch` journals gpuhealth's DeviceTaintRules (ENFORCED quarantine or canary, LIFTED
when the rule goes or switches), the node annotations of the device-plugin path (the quarantined
devices, the devices on the ramp) and any cordon or `gpuhealth.io/` taint of a node (NODE_ACTION:
the simulated cluster never cordons a node itself, so one here is gpuhealth's).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from demo.journal import Kind
from demo.observer_names import DELETED, DeviceNames, meta

NODE_ANNOTATION = "gpuhealth.io/quarantined-devices"
RAMP_ANNOTATION = "gpuhealth.io/ramping-devices"
QUARANTINE_TAINT = "gpuhealth.io/quarantine"


class EnforcementWatch:
    """DeviceTaintRules and Nodes, as journal entries."""

    def __init__(self, names: DeviceNames) -> None:
        self.names = names
        self.journal = names.journal
        self._rules: dict[str, tuple[str, str, str]] = {}
        """rule name -> (taint key meaning, node, uuid)."""
        self._annotated: dict[str, set[str]] = {}
        """node -> devices its quarantine annotation lists."""
        self._ramping: dict[str, set[str]] = {}
        """node -> devices its ramp annotation lists (device-plugin devices on the ramp)."""
        self._node_state: dict[str, tuple[bool, frozenset[str]]] = {}
        """node -> (cordoned, gpuhealth taint keys)."""

    def rule(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        """A DeviceTaintRule's watch event (gpuhealth's only: owned by a record)."""
        m = meta(obj)
        name = str(m.get("name", ""))
        owners = m.get("ownerReferences") or []
        if not any(isinstance(o, Mapping) and o.get("kind") == "DeviceQuarantine" for o in owners):
            return  # not gpuhealth's
        spec = obj.get("spec") or {}
        selector = spec.get("deviceSelector") or {}
        taint = spec.get("taint") or {}
        node = str(selector.get("pool", ""))
        selected = str(selector.get("device", ""))
        uuid = self.names.slice_card(node, selected)
        meaning = "quarantine" if taint.get("key") == QUARANTINE_TAINT else "canary"
        before = self._rules.get(name)
        detail = {
            "rule": name,
            "taint": str(taint.get("key", "")),
            "effect": str(taint.get("effect", "")),
            "deviceName": selected,
        }
        if etype == DELETED:
            if before is not None:
                self.journal.record(
                    at, Kind.LIFTED, before[0], before[1], before[2], rule=name, deviceName=selected
                )
                del self._rules[name]
            return
        if before is not None and before[0] == meaning:
            return
        if before is not None:
            self.journal.record(
                at, Kind.LIFTED, before[0], before[1], before[2], rule=name, deviceName=selected
            )
        self.journal.record(at, Kind.ENFORCED, meaning, node, uuid, **detail)
        self._rules[name] = (meaning, node, uuid)

    def node(self, at: float, etype: str, obj: Mapping[str, Any]) -> None:
        """A Node's watch event: its quarantine and ramp annotations, its cordon and taints."""
        m = meta(obj)
        node = str(m.get("name", ""))
        annotations = (m.get("annotations") or {}) if etype != DELETED else {}
        listed = self._cards(at, node, annotations.get(NODE_ANNOTATION), list)
        ramping = self._cards(at, node, annotations.get(RAMP_ANNOTATION), dict)
        before = self._annotated.get(node, set())
        ramped = self._ramping.get(node, set())
        # What leaves a list is lifted before what enters the other is enforced, as a DeviceTaintRule's
        # taint switched between quarantine and canary is journaled.
        for device in sorted(before - listed):
            self.journal.record(at, Kind.LIFTED, "quarantine", node, device, annotation=NODE_ANNOTATION)
        for device in sorted(ramped - ramping):
            self.journal.record(at, Kind.LIFTED, "canary", node, device, annotation=RAMP_ANNOTATION)
        for device in sorted(listed - before):
            self.journal.record(at, Kind.ENFORCED, "quarantine", node, device, annotation=NODE_ANNOTATION)
        for device in sorted(ramping - ramped):
            self.journal.record(at, Kind.ENFORCED, "canary", node, device, annotation=RAMP_ANNOTATION)
        self._annotated[node] = listed
        self._ramping[node] = ramping
        spec = obj.get("spec") or {}
        cordoned = bool(spec.get("unschedulable"))
        taints = frozenset(
            str(t.get("key"))
            for t in spec.get("taints") or ()
            if isinstance(t, Mapping) and str(t.get("key", "")).startswith("gpuhealth.io/")
        )
        was_cordoned, was_tainted = self._node_state.get(node, (False, frozenset()))
        if cordoned and not was_cordoned:
            # The simulated cluster never cordons a node itself: a cordon here is gpuhealth's.
            self.journal.record(at, Kind.NODE_ACTION, "cordon", node, key="spec.unschedulable")
        for key in sorted(taints - was_tainted):
            self.journal.record(at, Kind.NODE_ACTION, "taint", node, key=key)
        for key in sorted(was_tainted - taints):
            # A lift is no action on the node: a note, so the run shows when an escalation ended.
            self.journal.record(at, Kind.NOTE, "node-taint-lifted", node, key=key)
        self._node_state[node] = (cordoned, taints)

    def _cards(
        self, at: float, node: str, raw: Any, shape: type[list[Any]] | type[dict[str, Any]]
    ) -> set[str]:
        """The cards a node annotation of device IDs lists (a JSON list, or a dict keyed by them);
        an unreadable one lists none and is journaled."""
        if not raw:
            return set()
        try:
            parsed = json.loads(raw)
        except ValueError:
            self.journal.record(at, Kind.NOTE, "unreadable annotation", node, annotation=str(raw)[:200])
            return set()
        return {self.names.card(str(d)) for d in parsed} if isinstance(parsed, shape) else set()
