"""Holding a quarantined device-plugin card: which holder pods to make, keep and delete (pure).

No device-plugin API lets anyone outside the plugin keep one named device from new pods, and
the kubelet hands a GPU request any free device its plugin calls Healthy, from an unordered set
(the NVIDIA plugin's preferred allocation for one GPU returns the first of it). The kubelet does
keep, across plugin and kubelet restarts, which device it gave to which container. So the one
upstream-only way to keep a card from every new pod is to have it allocated to a pod of
gpuhealth's own: a *holder* (`responder.enforce.hold` makes them). Which card a holder gets
cannot be steered either, so a hold is made by occupancy, a *fill*: one holder for every free
GPU of the node; the kubelet reports each holder's device (`allocatedResourcesStatus`, 1.36+);
the holders on the card are kept, the others deleted.

`plan` decides one pass of that from what the API says now (level-triggered: whatever a
crash, a lost write or someone else left behind, the next pass plans from it):
- finished or failed holders (refused at admission because a tenant pod took the unit first,
  evicted, preempted) are deleted; a holder deleted by someone is simply missing, so the card is
  filled again;
- while holders of the last fill have not been told their device, nothing else happens
  (`Filling`), up to `fill_timeout_seconds`: a holder running that long with no device
  reported means the kubelet does not report devices (before 1.36, or the feature off) and the
  node exporter's series name none either (`responder.enforce.hold_devices`):
  `AllocationUnreadable`, the holders go and the card is only counted out (the extender's count);
- a fill is complete when every holder has its device and the node has no free GPU left (a
  pod that ended meanwhile freed one: the fill goes on); then holders on other cards are deleted;
- the card is `Held` when every unit of it (the GPU, each MIG partition, each time-sliced
  replica) is held by a holder; `CardBusy` while some unit is still used by a workload pod (its
  move is under way; the hold of that unit starts when it is free, with the next fill);
  `NotAllocatable` when a complete fill got none of it and no pod uses it: its plugin reports it
  Unhealthy, so the kubelet gives it to nobody. Only a fill that reached every Healthy free GPU
  proves that: a pod staying on a card its plugin excludes still counts against allocatable
  (which no longer counts that card), so the kubelet admits that many holders fewer than the
  node has Healthy free GPUs; when the node's excluded count is those pods' cards (so the card
  is not excluded) the hold stays `Filling`, its holders kept, and the fill goes on once those
  pods have left. An excluded GPU no pod reports is taken to be the card (as the extender's count
  does): an unrelated card excluded while the card is back and a pod still on an excluded card
  is the case this misjudges. A new fill is tried as soon as the node's
  allocatable GPUs rise (a plugin that restarts forgets its Unhealthy), and every
  `refill_seconds` anyway (the card is counted out meanwhile).

A card's units: 1 for a whole GPU, its partitions for a MIG card, for time-slicing the replicas
(`<uuid>::<n>`): as the node's `nvidia.com/gpu.replicas` label (GPU feature discovery) says, at
least as many as the highest replica seen. A complete fill sees every replica (each free one
got a holder, the others are in use), so the highest seen is the count after the first fill.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

HOLDER_LABEL = "gpuhealth.io/holder"
"""Label of gpuhealth's holder pods; its value names the record (as `gpuhealth.io/record` does)."""
REPLICAS_LABEL = "nvidia.com/gpu.replicas"
"""GPU feature discovery's node label: time-slicing replicas per GPU."""

FINISHED = frozenset({"Succeeded", "Failed"})


class HoldState(StrEnum):
    """Where the hold of one card stands (the reason of the record's `Held` condition)."""

    HELD = "Held"
    FILLING = "Filling"
    CARD_BUSY = "CardBusy"
    NOT_ALLOCATABLE = "NotAllocatable"
    UNREADABLE = "AllocationUnreadable"
    ASIDE = "SteppedAside"
    """For a check: the card is free and every other free GPU of the node held, so a check pod's
    one-GPU request can only be given the card."""
    RAMPING = "Ramping"
    """On the ramp: the card took its opted-in work (or the ramp's fill ended), so the node's
    other GPUs are let back to everyone."""

    @property
    def standing(self) -> bool:
        return self is HoldState.HELD

    @property
    def pending(self) -> bool:
        """The hold is being made (or stepped aside for a check): the extender passes no new GPU
        pod to the node meanwhile."""
        return self in (HoldState.FILLING, HoldState.CARD_BUSY, HoldState.ASIDE)


@dataclass(frozen=True, slots=True)
class Card:
    """The quarantined card as the device plugin names its units."""

    uuid: str
    partitions: tuple[str, ...] = ()
    """A MIG card's partitions (MIG UUIDs, each one unit); empty: a whole GPU."""
    replicas: int = 0
    """Time-slicing replicas per GPU as the node's label says (0: not labelled)."""

    def owns(self, device_id: str) -> bool:
        replica = device_id.startswith(self.uuid + "::")
        return device_id == self.uuid or replica or device_id in self.partitions


@dataclass(frozen=True, slots=True)
class Holder:
    """One holder pod of the record, as listed."""

    name: str
    phase: str
    """The pod's `status.phase` (Pending until the kubelet admitted and started it)."""
    devices: tuple[str, ...]
    """Device IDs the kubelet reports it got (empty: not reported yet)."""
    age_seconds: float
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class HoldInput:
    card: Card
    holders: tuple[Holder, ...]
    busy: tuple[str, ...]
    """Device IDs of the card that workload pods (not finished) use now."""
    free: int
    """The node's GPUs no unfinished pod requests: allocatable less requests (holders included)."""
    previous: HoldState | None = None
    """The record's `Held` condition reason from the last pass (None: none)."""
    previous_age_seconds: float = 0.0
    """Seconds since that condition last changed."""
    allocatable_rose: bool = False
    """The node's allocatable GPUs rose since that condition last changed: a device its plugin
    excluded is back (a plugin that restarted forgets its Unhealthy), so a fill is tried at once."""
    fill_timeout_seconds: float = 60.0
    refill_seconds: float = 60.0
    aside: bool = False
    """A check of the card is due: step aside (`step_aside`) instead of holding."""
    ramp: bool = False
    """With `aside`: the card's ramp, for opted-in work rather than a check: once a workload pod
    is on the card, every holder goes."""
    unknown: int = 0
    """Pods on the node (not this record's holders) that ask for GPUs but whose devices the
    kubelet has not reported yet (starting; another record's fill): one may be on the card."""
    plugin_excludes: bool = False
    """The kubelet last reported the card Unhealthy (its plugin's word, in a pod's
    `allocatedResourcesStatus`) and the node's excluded count has not changed since
    (`plugin_word`): the kubelet gives it to nobody while the node's allocatable stays short of
    its capacity by at least the card."""
    excluded: int = 0
    """The node's GPUs its plugin excludes: capacity less allocatable."""
    known_units: int = 0
    """The card's units as an earlier pass saw them (its replicas held or in use): a check's step
    aside deletes the card's holders, and with them what says how many replicas it has."""
    checking: tuple[str, ...] = ()
    """Device IDs of the card that gpuhealth's check pods (not finished) use now."""
    allocatable: int = 0
    """The node's allocatable units of the card's resources now."""
    fill_allocatable: int | None = None
    """Those units when the last fill began (None: no fill under way). A fill that got none of the
    card proves its plugin excludes it only if the count did not move meanwhile: a plugin that let
    the card back during the fill (a recovery, a restart) gave it to nobody yet, and concluding
    `NotAllocatable` at the new count would leave it to the next pod."""
    stranded: int = 0
    """GPU units that the node's pods hold on devices the kubelet reports not Healthy (other than
    the card's). Each still counts against the node's allocatable, which no longer counts its
    device, so the kubelet admits that many fewer pods than the node has Healthy free devices: a
    complete fill leaves as many of them without a holder, and one that got none of the card does
    not show that its plugin excludes it."""
    excluded_unreported: int = 0
    """Of the node's excluded GPUs (`excluded`), those no pod's kubelet report names as not
    Healthy: the card can only be one of these. With `stranded`, a fill that got none of the card
    judges it excluded only if these are at least its units (as the extender does, the excluded
    devices nobody names are taken to be quarantined ones)."""
    device_sources: tuple[str, ...] = ("the kubelet's allocatedResourcesStatus (Kubernetes 1.36+)",)
    """Where the holders' devices were looked for this pass, each with what came of it (what
    `AllocationUnreadable` says was tried: `responder.enforce.hold_devices`)."""


@dataclass(frozen=True, slots=True)
class HoldPlan:
    state: HoldState
    message: str
    create: int = 0
    """New holders to make (a fill of the node's free GPUs)."""
    delete: tuple[str, ...] = ()
    keep: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Holders on the card: (name, the card's device IDs it holds)."""
    units: int = 0
    """The card's units as known now (0: unknown)."""


def card_units(card: Card, seen: Sequence[str]) -> int:
    """How many units the card has before a fill said: its partitions, its time-sliced replicas
    (the node's label, at least as many as the highest replica seen), else 1 (a whole GPU)."""
    if card.partitions:
        return len(card.partitions)
    replicas = [int(d.rsplit("::", 1)[1]) for d in seen if "::" in d and d.rsplit("::", 1)[1].isdigit()]
    return max(card.replicas, max(replicas, default=0) + 1)


def plugin_word(seen_at: int | None, reported_unhealthy: bool, excluded: int) -> int | None:
    """Whether the card's plugin still excludes it, as far as anyone outside it can tell: the
    node's excluded GPUs (capacity less allocatable) when a pod's kubelet report last said the
    card Unhealthy, or None (no such word). A report is only as good as the count it was read
    with: once the pod that told it has left, nothing says the card is still the excluded one,
    so any change of that count voids it (the plugin let a device back, and another card of the
    node may be the one excluded now), and the next fill asks the kubelet instead. Looked at on
    every pass: a count that changed and changed back between two passes is missed."""
    if reported_unhealthy:
        return excluded
    return seen_at if seen_at is not None and seen_at == excluded else None


def plan(given: HoldInput) -> HoldPlan:
    if given.aside:
        return step_aside(given)
    card = given.card
    delete = [h.name for h in given.holders if not h.deleting and h.phase in FINISHED]
    active = [h for h in given.holders if not h.deleting and h.phase not in FINISHED]
    unreported = [h for h in active if not h.devices]
    if unreported:
        running = [h for h in unreported if h.phase == "Running"]
        if running and max(h.age_seconds for h in running) >= given.fill_timeout_seconds:
            return HoldPlan(
                HoldState.UNREADABLE,
                f"holder {running[0].name} runs but no device is named for it by "
                f"{'; nor by '.join(given.device_sources)}: the card is only counted out",
                delete=tuple(delete + [h.name for h in active]),
            )
        stuck = [h.name for h in unreported if h.age_seconds >= given.fill_timeout_seconds]
        return HoldPlan(
            HoldState.FILLING,
            f"{len(unreported)} holder(s) waiting for their devices"
            + (f"; {len(stuck)} not started in time, made again" if stuck else ""),
            delete=tuple(delete + stuck),
        )
    on_card = [h for h in active if any(card.owns(d) for d in h.devices)]
    off_card = [h for h in active if h not in on_card]
    held = sorted({d for h in on_card for d in h.devices if card.owns(d)})
    busy = sorted(set(given.busy) - set(held))
    units = card_units(card, [*held, *busy])
    expected = units
    if given.free > 0 and (len(held) + len(busy) < units or off_card):
        excluded_by_plugin = given.plugin_excludes and given.excluded >= units
        if (
            not off_card
            and not held
            and not busy
            and not given.allocatable_rose
            and (
                excluded_by_plugin
                or (
                    given.previous is HoldState.NOT_ALLOCATABLE
                    and given.previous_age_seconds < given.refill_seconds
                )
            )
        ):
            return HoldPlan(
                HoldState.NOT_ALLOCATABLE,
                "its device plugin reports the card Unhealthy: the kubelet gives it to nobody"
                if excluded_by_plugin
                else "the last fill got none of the card: its device plugin excludes it",
                delete=tuple(delete),
            )
        # A fill, or one still going on: a pod ended meanwhile and freed a GPU of the node.
        return HoldPlan(
            HoldState.FILLING,
            f"filling the node's {given.free} free GPU(s) with holders",
            create=given.free,
            delete=tuple(delete),
            keep=_kept(card, on_card),
            units=units,
        )
    if off_card:
        # A fill just completed: every GPU of the node is held or in use, so the card's units
        # are those held and those in use (a unit its plugin excludes is neither), unless a pod
        # not yet told its devices may have one: then no fewer than known before.
        seen_units = len(held) + len(busy)
        units = max(units, seen_units) if given.unknown else seen_units
    finished = tuple(delete)
    delete += [h.name for h in off_card]
    keep = _kept(card, on_card)
    if held and not busy and len(held) < units and given.unknown:
        # Part of the card held, and a pod bound to the node not yet told its devices (admitted
        # meanwhile): it may be on the rest of the card. Not Held until that is known.
        return HoldPlan(
            HoldState.FILLING,
            f"{len(held)} of the card's {units} unit(s) held; waiting for {given.unknown} pod(s) "
            "on the node to be told their devices",
            delete=tuple(delete),
            keep=keep,
            units=units,
        )
    if held and not busy:
        return HoldPlan(
            HoldState.HELD, f"held by {', '.join(h.name for h in on_card)}", delete=tuple(delete),
            keep=keep, units=units,
        )  # fmt: skip
    if busy:
        return HoldPlan(
            HoldState.CARD_BUSY,
            f"{len(busy)} of the card's {units} unit(s) in use by workload pods, {len(held)} held: "
            "the rest is held once its pods have left",
            delete=tuple(delete),
            keep=keep,
            units=units,
        )
    if not off_card and given.unknown:
        # No fill of ours saw the node: some pod's devices are not known yet, and it may be on
        # the card (another record's fill, a pod starting). Look again when they are.
        return HoldPlan(
            HoldState.FILLING,
            f"waiting for {given.unknown} pod(s) on the node to be told their devices",
            delete=tuple(delete),
            units=units,
        )
    if given.stranded and given.excluded_unreported < expected:
        # The kubelet admitted no holder beyond allocatable less requests, and pods on excluded
        # devices count in those requests: as many Healthy devices had none, and the node's
        # excluded count is those pods' devices, so the card is Healthy and one of them. Its
        # holders stay (the node's other GPUs are not given back meanwhile) and the node takes no
        # new GPU pod until those pods leave and a fill reaches the rest.
        return HoldPlan(
            HoldState.FILLING,
            f"no holder got the card, and pods on {given.stranded} excluded GPU unit(s) still count "
            "against the node's allocatable: as many Healthy GPUs got no holder, the card among "
            "them; filling on once those pods have left",
            delete=finished,
            units=units,
        )
    fill_ended = bool(off_card or delete)  # this pass ends a fill of ours: what it found is judged
    if fill_ended and given.fill_allocatable is not None and given.fill_allocatable != given.allocatable:
        return HoldPlan(
            HoldState.FILLING,
            f"the node's allocatable GPUs went from {given.fill_allocatable} to {given.allocatable} "
            "while the fill ran: filling again",
            create=given.free,
            delete=tuple(delete),
            units=units,
        )
    return HoldPlan(
        HoldState.NOT_ALLOCATABLE,
        "a fill of the node got none of the card: its device plugin excludes it",
        delete=tuple(delete),
        units=units,
    )


def _kept(card: Card, on_card: Sequence[Holder]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((h.name, tuple(d for d in h.devices if card.owns(d))) for h in on_card)


def step_aside(given: HoldInput) -> HoldPlan:
    """For a check: the card free, every other free GPU of the node held (the same occupancy as
    a fill, the other way round). Holders fill the node's free GPUs; once every GPU is held or in
    use, those on the card are deleted, so the card's units are the only free ones: a check pod's
    request can then only be given the card. A GPU that frees meanwhile is filled again first.
    After the check the hold comes back with the next fill (`plan`)."""
    card = given.card
    delete = [h.name for h in given.holders if not h.deleting and h.phase in FINISHED]
    active = [h for h in given.holders if not h.deleting and h.phase not in FINISHED]
    unreported = [h for h in active if not h.devices]
    if unreported:
        stuck = [h.name for h in unreported if h.age_seconds >= given.fill_timeout_seconds]
        return HoldPlan(
            HoldState.FILLING,
            f"stepping aside for a check: {len(unreported)} holder(s) waiting for their devices",
            delete=tuple(delete + stuck),
        )
    on_card = [h for h in active if any(card.owns(d) for d in h.devices)]
    held = sorted({d for h in on_card for d in h.devices if card.owns(d)})
    busy = sorted(set(given.busy) - set(held))
    checking = sorted(set(given.checking) - set(held) - set(busy))
    units = max(card_units(card, [*held, *busy, *checking]), given.known_units)
    card_free = max(0, units - len(held) - len(busy) - len(checking))
    if busy and given.ramp:
        return HoldPlan(
            HoldState.RAMPING,
            f"the card took its opted-in work ({len(busy)} of {units} unit(s)): "
            "the node's other GPUs let back",
            delete=tuple(delete + [h.name for h in active]),
            units=units,
        )
    if busy:
        return HoldPlan(
            HoldState.CARD_BUSY,
            f"{len(busy)} of the card's {units} unit(s) in use by workload pods: no check yet",
            delete=tuple(delete),
            units=units,
        )
    if given.free > card_free:
        # A GPU other than the card is free: held first, or the check could be given it. Every
        # free unit gets a holder, the card's too (which unit a holder gets is the kubelet's
        # choice: time-slicing puts a replica on the least-used card, often this one), and those
        # on the card are deleted once the fill is complete.
        return HoldPlan(
            HoldState.FILLING,
            f"stepping aside for a check: holding the node's {given.free} free GPU(s), "
            f"{given.free - card_free} of them other cards'",
            create=given.free,
            delete=tuple(delete),
            units=units,
        )
    if on_card:
        return HoldPlan(
            HoldState.FILLING,
            "stepping aside for a check: every other GPU held, the card's holder(s) deleted",
            delete=tuple(delete + [h.name for h in on_card]),
            units=units,
        )
    what = "its ramp's opted-in work" if given.ramp else "a check"
    return HoldPlan(
        HoldState.ASIDE,
        f"stepped aside for {what}: the card free, {len(active)} holder(s) on the node's other GPUs",
        delete=tuple(delete),
        units=units,
    )
