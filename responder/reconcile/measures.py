"""Idle GPU time as time: which records keep capacity out of service, and for how long.

Pure: no I/O, no clock reads (the reconciler passes its clock's readings in). The reconciler's
accounting (`responder.reconcile.accounting`) turns what this module decides into the counter
`gpuhealth_quarantined_device_seconds_total{node,reason,phase}`.

A device's capacity is excluded while gpuhealth's enforcement is in place for it
(`status.enforced` set) and its record stands in Quarantined or on a rung of the release
ladder; Pending and Deferred records are recorded only, and a dry run enforces nothing (its
taints have effect None), so neither counts. Two of the excluding states get a phase of their
own, so a reader can tell them from a device that sits idle:
- `Ramp` (a rung already): the device carries the canary taint and takes opted-in work;
- `DeviceInUse`: Quarantined while a pod still holds the device (the policy's phase reason of
  the same name): its holder keeps working on it, nothing new is placed there.

The accounting rule (`ExclusionMeter.advance`): when a reconcile pass completes, the leader
adds the time between that pass's clock reading (taken as it starts, on the injected clock) and
its previous completed pass's to every record that the pass listed in an excluding phase. The
state as listed is the state that held since it was last written, which was at the latest
during the previous pass, so the interval goes to the phase the device stood in through it: a
record admitted in this pass adds nothing yet, and one released in it adds its last interval to
Ramp. A process that starts leading has no previous pass and adds nothing at its first; one that
stops leading forgets its last pass. Each process counts only what it observed while leading,
from 0 after a restart, and Prometheus sums the replicas' `increase()`; a takeover loses at
most the interval between the old leader's last pass and the new leader's first, and never
counts an interval twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from responder.ladder import LADDER, Ladder
from responder.reconcile.policy import DEVICE_IN_USE
from responder.records import Phase, Quarantine

__all__ = ["DEVICE_IN_USE", "ExclusionMeter", "Series", "excluded_phase", "measured_phases"]

Series = tuple[str, str, str]
"""(node, reason, phase): the labels of one series of the counter."""


def measured_phases(ladder: Ladder = LADDER) -> tuple[str, ...]:
    """Every `phase` label value the counter can carry, in the order a device meets them."""
    return (Phase.QUARANTINED, DEVICE_IN_USE, *ladder.phases)


def excluded_phase(record: Quarantine, *, ladder: Ladder = LADDER, dry_run: bool = False) -> str | None:
    """The phase under which `record`'s device counts as excluded capacity; None when it does not."""
    status = record.status
    if dry_run or not status.enforced:
        return None
    if status.phase == Phase.QUARANTINED:
        return DEVICE_IN_USE if status.phase_reason == DEVICE_IN_USE else str(Phase.QUARANTINED)
    return status.phase if ladder.rung(status.phase) is not None else None


def series_of(record: Quarantine, *, ladder: Ladder = LADDER, dry_run: bool = False) -> Series | None:
    phase = excluded_phase(record, ladder=ladder, dry_run=dry_run)
    return None if phase is None else (record.spec.node, record.spec.reason, phase)


@dataclass(slots=True)
class ExclusionMeter:
    """The leader's running account: when its last completed pass was (see the module docstring)."""

    ladder: Ladder = LADDER
    dry_run: bool = False
    last_pass: float | None = field(default=None)

    def advance(self, now: float, listed: Iterable[Quarantine]) -> dict[Series, float]:
        """Seconds to add per series for a pass completed at `now` over the records as `listed`.

        A clock that went backwards adds nothing (and `now` becomes the new mark)."""
        previous, self.last_pass = self.last_pass, now
        if previous is None or now <= previous:
            return {}
        elapsed = now - previous
        added: dict[Series, float] = {}
        for record in listed:
            series = series_of(record, ladder=self.ladder, dry_run=self.dry_run)
            if series is not None:
                added[series] = added.get(series, 0.0) + elapsed
        return added

    def forget(self) -> None:
        """The term ended: the next pass (of a later term) starts a new account."""
        self.last_pass = None
