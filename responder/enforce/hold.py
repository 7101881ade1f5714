"""Holder pods: a quarantined device-plugin card allocated to gpuhealth itself (an executor).

What to make, keep and delete is `responder.enforce.hold_plan.plan`'s; this reads what it needs
(the node, its pods, the record's holders), applies the plan and says where the hold stands.
Thin and idempotent: every pass plans again from what the API holds, so a crash between two
writes, a holder someone deleted or a kubelet that refused one is repaired by the next pass.

A holder is a pod of gpuhealth's own, in gpuhealth's namespace (never a tenant's, so it counts
against no tenant's quota): `spec.nodeName` set (no scheduler, no extender: the hold needs
neither), one unit of the card's resource, a pause image that never opens the GPU, no service
account token, no capabilities, gpuhealth's PriorityClass (so the scheduler's preemption does not
pick it for a tenant's pod), tolerating every taint, owned by the record (deleted with it),
labelled `gpuhealth.io/holder` and annotated so that cluster-autoscaler and the descheduler leave
it alone. `kubectl drain` refuses it without `--force` (no controller owns it) and a
PodDisruptionBudget of gpuhealth's (`deploy/base/holder-pdb.yaml`) refuses its eviction.

The node annotation `gpuhealth.io/device-holds` tells the scheduler extender where each hold
stands (`responder.extender.capacity`): `held` (the holder's own request counts the card, so it
is not counted out again) or `pending` (a fill or a move is under way: no new GPU pod may go to
the node until the hold stands, since the kubelet could hand it the card), `aside` (stepping
aside for a check: as `pending`, and no other card's fill starts) or `excluded@<N>`.

The window left, on a real node: a card its plugin excludes (`NotAllocatable`, no holder can
take it) is handed out by the kubelet's device manager the moment the plugin calls it Healthy
again, but the kubelet publishes the node's allocatable only with its next node status update
(`nodeStatusUpdateFrequency`, 10 s by default), and admits pods by the published count. Until
then nothing this or the extender reads says the card is back, and a pod bound to the node
meanwhile (it had free GPUs by that count) may be given the card; the record's move then takes
it off, as any pod found on a quarantined card. Once published, the extender keeps new GPU pods
off the node (`excluded@<N>`, allocatable above N) until the next pass (the reconciler looks
again within 5 s while a hold is `NotAllocatable`) fills; a pod that skips the scheduler
(`spec.nodeName`) is kept off only by that fill.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from gpuhealth.fields import SettingsError
from gpuhealth.kube.api import Api
from gpuhealth.kube.conflicts import retry_on_conflict
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NODE, POD
from gpuhealth.plugin_resources import GPU_RESOURCE
from responder.enforce.card_resources import hold_resources
from responder.enforce.hold_devices import AllocationSource, PodDevices
from responder.enforce.hold_plan import (
    FINISHED,
    HOLDER_LABEL,
    REPLICAS_LABEL,
    Card,
    Holder,
    HoldInput,
    HoldPlan,
    HoldState,
    plan,
    plugin_word,
)
from responder.extender.filter import gpu_units, requested
from responder.records import Quarantine, owner_reference

log = logging.getLogger(__name__)

HOLDS_NODE_ANNOTATION = "gpuhealth.io/device-holds"
"""Node annotation: a JSON object of device ID to `held`, `pending` or `aside`
(`responder.extender.capacity`)."""
ASIDE_MARK = "aside"
"""The card's hold steps aside for its check (from the pass that starts holding the node's other
GPUs until the check ends): as `pending` for the extender, and no other card's fill on the node
may start meanwhile (it would take the card from the check)."""
EXCLUDED_MARK = "excluded@"
"""`excluded@<N>`: no fill could get the card (`NotAllocatable`: its plugin excludes it) while
the node's allocatable GPUs were N. Once they rise above N the plugin let a device back, perhaps
this card, which the kubelet may then hand to any new pod: the extender treats it as `pending`
until the next pass fills again (`responder.extender.capacity`)."""
CHECK_LABEL = "gpuhealth.io/check"
"""Label of the pods of gpuhealth's own probe and canary Jobs (`responder.checks.jobs`)."""
RECORD_LABEL = "gpuhealth.io/record"
"""Label of a check's pods naming their record (as the holders' `HOLDER_LABEL` value does)."""


@dataclass(frozen=True, slots=True)
class HoldSettings:
    enabled: bool = True
    """Hold quarantined device-plugin cards with holder pods. Off: the extender's count alone,
    which cannot keep the kubelet from handing the card to a pod on a node that passes."""
    image: str = "registry.k8s.io/pause:3.10"
    """The holders' image: it must never open the GPU (the pause container sleeps)."""
    priority_class: str = "gpuhealth-holder"
    """The holders' PriorityClass (`deploy/base/holder-priorityclass.yaml`); empty: none."""
    fill_timeout_seconds: float = 60.0
    """How long a fill's holders may wait for the kubelet to start them and report their devices
    before the card is declared only counted out (`AllocationUnreadable`) or a holder made again."""
    refill_seconds: float = 60.0
    """How often a card that no fill could get (its plugin excludes it) is tried again: a plugin
    that restarts forgets its Unhealthy and hands the card out again."""
    ramp_fill_seconds: float = 120.0
    """Device plugins, with checks through the kubelet: at the start of the ramp the node's other
    free GPUs are held for at most this long, so that the first opted-in pods can only be given
    the card; once one is on it (or after this), everyone is let back."""

    def __post_init__(self) -> None:
        if not self.image.strip():
            raise SettingsError("hold.image must not be empty")
        for name in ("fill_timeout_seconds", "refill_seconds", "ramp_fill_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise SettingsError(f"hold.{name} must be a positive number of seconds, not {value!r}")


def holder_label(record: Quarantine) -> str:
    """The `gpuhealth.io/holder` value of the record's holders (a label value: 63 characters)."""
    return record.name[:63].rstrip("-.")


def device_ids(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Device IDs the kubelet reports the pod's containers got (`allocatedResourcesStatus`)."""
    return tuple(dict.fromkeys(d for d, _ in _reports(pod)))


class DeviceHold:
    """`sync(record, wanted, previous)`: one pass of the record's hold (None: the record is not
    held, and its holders are gone)."""

    def __init__(
        self,
        client: Api,
        namespace: str,
        settings: HoldSettings | None = None,
        allocations: AllocationSource | None = None,
        devices: PodDevices | None = None,
    ) -> None:
        """`allocations`: the node exporter's, read where the kubelet names no pod's devices
        (before Kubernetes 1.36: `responder.enforce.hold_devices`); None: the kubelet's word only.
        `devices`: such a reading already made (shared with the device-plugin backend, which
        says which pods hold a card); it takes the place of `allocations`."""
        self._client = client
        self._devices = devices or PodDevices(device_ids, allocations)
        self.namespace = namespace
        """Where the holders live (gpuhealth's own namespace)."""
        self.settings = settings or HoldSettings()
        self._seen: dict[str, dict[str, float]] = {}
        """Record name -> its holders' uids -> when this responder first saw each: a holder's age
        is judged on our own clock, never on its creationTimestamp (another machine's clock). In
        memory only: a new leader judges from when it first looked, which only delays a timeout."""
        self._units: dict[str, int] = {}
        """Record name -> the card's units when it was last held (for a check's step aside)."""
        self._unhealthy: dict[str, int] = {}
        """Records whose card the kubelet last reported Unhealthy (its plugin's word) -> the
        node's excluded GPUs then (`hold_plan.plugin_word`), until a fill asks again or that
        count changes: no fill is made while the plugin excludes it (in memory: a new leader
        makes one fill to find out)."""
        self.pods: dict[str, int] = {}
        """Record name -> its holder pods after its last pass (what `gpuhealth_holder_pods` sums)."""
        self._fill_allocatable: dict[str, int] = {}
        """Record name -> the node's allocatable units of the card's resources when its current
        fill began (`HoldInput.fill_allocatable`; in memory: a new leader's first fill sets it)."""
        self._allocatable: dict[str, int] = {}
        """Record name -> the node's allocatable GPUs when its card was last found not
        allocatable (in memory: a new leader tries a fill at once, which costs one fill)."""

    def sync(
        self,
        record: Quarantine,
        wanted: bool,
        now: float,
        previous: tuple[str, float] | None = None,
        *,
        aside: bool = False,
        ramp: bool = False,
    ) -> HoldPlan | None:
        """`previous`: the record's last `Held` reason and when it last changed. `aside`: a check
        of the card is due, through the kubelet: step aside (`hold_plan.step_aside`)."""
        holders = self._holders(record)
        seen = self._seen.get(record.name, {})
        self._seen[record.name] = {_uid(p): seen.get(_uid(p), now) for p in holders}
        if not wanted or not self.settings.enabled:
            for pod in holders:
                self._delete(pod)
            self._mark(record, None)
            self._seen.pop(record.name, None)
            self._allocatable.pop(record.name, None)
            self._fill_allocatable.pop(record.name, None)
            self._units.pop(record.name, None)
            self.pods.pop(record.name, None)
            return None
        try:
            node = self._client.get(NODE, record.spec.node)
        except NotFound:
            return None  # the node is gone, and its pods with it
        pods = self._client.list(POD, field_selector=f"spec.nodeName={record.spec.node}").items
        card = Card(
            uuid=record.spec.uuid or record.spec.device,
            partitions=record.spec.partitions,
            replicas=_int(((node.get("metadata") or {}).get("labels") or {}).get(REPLICAS_LABEL)),
        )
        named = self._devices.read(record.spec.node, [*pods, *holders], now, card)
        unfinished = [p for p in pods if (p.get("status") or {}).get("phase") not in FINISHED]
        # The resources the card's units are (a MIG card's profiles under strategy mixed): the
        # fill asks for those, and only the node's units of those can be the card.
        resources = hold_resources(record, node)
        # In use: by workload pods, and by another record's holders (a fill of a card on the same
        # node may hold this one for a moment; it lets it go when its fill completes).
        busy = tuple(
            d for p in unfinished if _uses(p, record) for d in named.of(p) if card.owns(d)
        )  # fmt: skip
        status = node.get("status") or {}
        allocatable_of = {r: _int((status.get("allocatable") or {}).get(r)) for r in resources}
        free_of = {r: max(0, allocatable_of[r] - sum(requested(p, r) for p in unfinished)) for r in resources}
        allocatable = sum(allocatable_of.values())
        capacity = max(allocatable, sum(_int((status.get("capacity") or {}).get(r)) for r in resources))
        excluded = max(0, capacity - allocatable)
        word = plugin_word(
            self._unhealthy.get(record.name),
            any(health == "Unhealthy" and card.owns(d) for p in unfinished for d, health in _reports(p)),
            excluded,
        )
        if word is None:
            self._unhealthy.pop(record.name, None)
        else:
            self._unhealthy[record.name] = word
        unknown = sum(
            1
            for p in unfinished
            if _uses(p, record) and not named.of(p) and any(requested(p, r) > 0 for r in resources)
        )
        # Units on devices the kubelet no longer counts allocatable (a pod stays on a card after
        # its plugin called it Unhealthy): they keep as many Healthy devices from any fill.
        stranded_on = [
            d for p in unfinished for d, health in _reports(p) if health != "Healthy" and not card.owns(d)
        ]  # fmt: skip
        checking = tuple(
            d for p in unfinished if _check_of(p, record) for d in named.of(p) if card.owns(d)
        )  # fmt: skip
        prior = None
        if previous is not None and previous[0] in HoldState.__members__.values():
            prior = HoldState(previous[0])
        decided = plan(
            HoldInput(
                card=card,
                holders=tuple(self._holder(p, now, self._seen[record.name], named.of) for p in holders),
                busy=busy,
                free=sum(free_of.values()),
                previous=prior,
                previous_age_seconds=now - previous[1] if previous is not None else 0.0,
                allocatable_rose=allocatable > self._allocatable.get(record.name, allocatable),
                fill_timeout_seconds=self.settings.fill_timeout_seconds,
                refill_seconds=self.settings.refill_seconds,
                aside=aside,
                ramp=ramp,
                checking=checking,
                unknown=unknown,
                plugin_excludes=record.name in self._unhealthy,
                excluded=excluded,
                known_units=self._units.get(record.name, 0),
                allocatable=allocatable,
                fill_allocatable=self._fill_allocatable.get(record.name),
                stranded=len(stranded_on),
                excluded_unreported=max(0, excluded - len(set(stranded_on))),
                device_sources=named.tried,
            )
        )
        if decided.state is HoldState.NOT_ALLOCATABLE:
            self._allocatable[record.name] = allocatable
        else:
            self._allocatable.pop(record.name, None)
        if decided.create and not aside:
            self._fill_allocatable[record.name] = allocatable  # a fill begins (or goes on) at this count
        elif decided.state is not HoldState.FILLING:
            self._fill_allocatable.pop(record.name, None)
        if decided.create or decided.state.standing:
            self._unhealthy.pop(record.name, None)  # a fill asks the kubelet anew
        if decided.state.standing:
            self._units[record.name] = decided.units
        others = {d: v for d, v in holds(node).items() if d not in _listed_ids(record)}
        if decided.create and not aside and ASIDE_MARK in others.values():
            # Another card of the node stepped aside for its check: a fill now would take that
            # card from its check pod. Its check is short; the extender keeps new pods off the
            # node meanwhile.
            waiting = ", ".join(d for d, v in others.items() if v == ASIDE_MARK)
            decided = replace(
                decided, state=HoldState.FILLING, create=0, message=f"waiting for the check of {waiting}"
            )
        # The node's annotation first: the extender must read a fill as under way (`pending`)
        # before its holders exist, or it could pass a pod to the node meanwhile.
        # `excluded@<N>` in the extender's measure: the node's GPU units of every resource.
        self._mark(record, _mark_of(decided.state, ramp, gpu_units(status.get("allocatable")), aside), node)
        by_name = {str((p.get("metadata") or {}).get("name")): p for p in holders}
        for name in decided.delete:
            if name in by_name:
                self._delete(by_name[name])
        # One holder per free unit of each of the card's resources (a fill's `create` is the
        # node's free units of them all).
        left = decided.create
        for resource in resources:
            for _ in range(min(left, free_of[resource])):
                self._client.create(POD, self.holder(record, resource), namespace=self.namespace)
                left -= 1
        self.pods[record.name] = len(holders) - len(decided.delete) + decided.create
        if decided.create or decided.delete:
            log.info(
                "%s: hold %s: %d holder(s) made, %d deleted (%s)",
                record.name, decided.state, decided.create, len(decided.delete), decided.message,
            )  # fmt: skip
        return decided

    def holder(self, record: Quarantine, resource: str = GPU_RESOURCE) -> dict[str, Any]:
        """A holder pod of the record: one unit of `resource` (one of the card's) on its node."""
        s = self.settings
        spec: dict[str, Any] = {
            "nodeName": record.spec.node,
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "hold",
                    "image": s.image,
                    "resources": {
                        "limits": {resource: "1", "cpu": "10m", "memory": "16Mi"},
                        "requests": {resource: "1", "cpu": "1m", "memory": "4Mi"},
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        }
        if s.priority_class:
            spec["priorityClassName"] = s.priority_class
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{record.name[:40].rstrip('-.')}-hold-",
                "namespace": self.namespace,
                "labels": {
                    HOLDER_LABEL: holder_label(record),
                    "app.kubernetes.io/managed-by": "gpuhealth",
                    "app.kubernetes.io/component": "holder",
                },
                "annotations": {
                    "gpuhealth.io/device": f"{record.spec.node}/{record.spec.device}",
                    # Leave it where it is: it holds a broken card, not a workload.
                    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "descheduler.alpha.kubernetes.io/prevent-eviction": "true",
                },
                "ownerReferences": [owner_reference(record)],
            },
            "spec": spec,
        }

    @staticmethod
    def _holder(
        pod: Mapping[str, Any],
        now: float,
        seen: Mapping[str, float],
        devices: Callable[[Mapping[str, Any]], tuple[str, ...]],
    ) -> Holder:
        meta = pod.get("metadata") or {}
        return Holder(
            name=str(meta.get("name")),
            phase=str((pod.get("status") or {}).get("phase") or "Pending"),
            devices=devices(pod),
            age_seconds=max(0.0, now - seen.get(_uid(pod), now)),
            deleting=bool(meta.get("deletionTimestamp")),
        )

    def _holders(self, record: Quarantine) -> list[dict[str, Any]]:
        return self._client.list(
            POD, namespace=self.namespace, label_selector=f"{HOLDER_LABEL}={holder_label(record)}"
        ).items

    def _delete(self, pod: Mapping[str, Any]) -> None:
        with contextlib.suppress(NotFound):
            self._client.delete(POD, str((pod.get("metadata") or {}).get("name")), namespace=self.namespace)

    def _mark(self, record: Quarantine, state: str | None, read: dict[str, Any] | None = None) -> None:
        """The record's devices in the node's `gpuhealth.io/device-holds` as `state` (None: absent).
        `read`: the node as this pass read it, used for the first attempt (a 409 reads it again)."""
        ids = _listed_ids(record)
        listed = record.spec.partitions or (record.spec.device,)
        given = [read] if read is not None else []

        def attempt() -> None:
            try:
                node = given.pop() if given else self._client.get(NODE, record.spec.node)
            except NotFound:
                return
            current = holds(node)
            wanted = {d: s for d, s in current.items() if d not in ids}
            if state is not None:
                wanted.update(dict.fromkeys(listed, state))
            if wanted == current:
                return
            meta = node.get("metadata") or {}
            annotations = dict(meta.get("annotations") or {})
            if wanted:
                annotations[HOLDS_NODE_ANNOTATION] = orjson.dumps(dict(sorted(wanted.items()))).decode()
            else:
                annotations.pop(HOLDS_NODE_ANNOTATION, None)
            self._client.update(NODE, {**node, "metadata": {**meta, "annotations": annotations}})

        retry_on_conflict(attempt, what=f"Node {record.spec.node}")


def holds(node: Mapping[str, Any]) -> dict[str, str]:
    """The node's `gpuhealth.io/device-holds`: device ID -> `held` | `pending` | `aside` |
    `excluded@<N>`; unreadable: none."""
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(HOLDS_NODE_ANNOTATION)
    if not raw or not isinstance(raw, str):
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("node annotation %s is not JSON: %r", HOLDS_NODE_ANNOTATION, raw[:200])
        return {}
    if not isinstance(value, dict):
        return {}
    return {
        str(d): str(s)
        for d, s in value.items()
        if s in ("held", "pending", ASIDE_MARK) or excluded_at(s) is not None
    }


def excluded_at(mark: Any) -> int | None:
    """N of an `excluded@<N>` mark (the node's allocatable GPUs when no fill could get the card);
    None for any other value."""
    if not isinstance(mark, str) or not mark.startswith(EXCLUDED_MARK):
        return None
    count = mark.removeprefix(EXCLUDED_MARK)
    return int(count) if count.isdigit() else None


def _reports(pod: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(device ID, health) of every device the kubelet reports for the pod."""
    found = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for entry in (status or {}).get("allocatedResourcesStatus") or []:
            for resource in (entry or {}).get("resources") or []:
                rid = str((resource or {}).get("resourceID") or "")
                if rid:
                    found.append((rid, str((resource or {}).get("health") or "")))
    return found


def _mark_of(state: HoldState, ramp: bool = False, allocatable: int = 0, aside: bool = False) -> str | None:
    """What the node's `gpuhealth.io/device-holds` says of a card in `state` (None: nothing).
    On the ramp nothing: the extender's ramp annotation admits the opted-in pods. `aside`: the
    hold is stepping aside for a check: `aside` from its first pass, not only once it stands
    aside, since the pass that deletes the card's holder frees the card before the next pass
    says so (another card's fill in between took it: release-request at 10x)."""
    if ramp:
        return None
    if state is HoldState.ASIDE or (aside and state is HoldState.FILLING):
        return ASIDE_MARK
    if state is HoldState.NOT_ALLOCATABLE:
        return f"{EXCLUDED_MARK}{allocatable}"
    return "held" if state.standing else "pending" if state.pending else None


def _listed_ids(record: Quarantine) -> set[str]:
    return set(record.spec.partitions or (record.spec.device,)) | {record.spec.device}


def _uses(pod: Mapping[str, Any], record: Quarantine) -> bool:
    """Whether the pod uses what it was given as far as the record's hold is concerned: any
    pod but gpuhealth's checks and the record's own holders."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if CHECK_LABEL in labels:
        return False
    return labels.get(HOLDER_LABEL, None) != holder_label(record)


def _check_of(pod: Mapping[str, Any], record: Quarantine) -> bool:
    """Whether the pod is one of the record's checks (`responder.checks.jobs` labels them)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return CHECK_LABEL in labels and labels.get(RECORD_LABEL) == holder_label(record)


def _uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _int(value: Any) -> int:
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0
