"""What an ended quarantine's evidence says: confirmed, unconfirmed, or a restricted Unknown.

Pure: no I/O. `verdict_of(record)` is a function of the record alone (its spec's reason, action
and source alerts, its history, its last check), so every replica, the demo and a person reading
the object reach the same verdict. The definition, and why it is this one, is in
docs/quarantine.md ("Verdicts: the false-quarantine rate"); in short, for a quarantine that was
enforced and has ended (Released or Abandoned):
- `confirmed`: something beyond a single report showed the device at fault: a check of the
  release ladder failed, the device relapsed (it fell back to Quarantined from a rung, or one of
  its alerts fired again after it resolved), the device's own error record (a fatal XID, an
  uncorrectable ECC error, a row-remap failure), or an Unhealthy report from the device plugin
  or DRA driver that corroborates a quarantine something else opened;
- `restricted-unknown`: a restriction for Unknown (never escalated) with none of that;
- `unconfirmed`: a quarantine with none of that: its triggering alert was the only evidence, and
  the device passed its checks at the first attempt (or a person gave it up).
The false-quarantine rate is unconfirmed / ended. A quarantine that never was enforced
(dismissed after the breaker, a backlog discarded) gets no verdict: no capacity was taken.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from itertools import pairwise

from responder.ladder import KNOWN, Ladder
from responder.records import ENDED_PHASES, HistoryEntry, Phase, Quarantine

RESTRICT = "restrict"
"""`spec.action` of a restriction for Unknown (it never evicts)."""

HARDWARE_ALERTS = frozenset({"GPUDeviceFatalXid", "GPUDeviceEccUncorrectable", "GPUDeviceRowRemapFailure"})
"""Alerts on the device's own error record (NVML events): a healthy card logs none of them, so
they confirm even as the alert that opened the quarantine. The rules never raise a fatal XID
alert for an application XID (`rules/render.py` refuses them)."""
REPORT_ALERTS = frozenset({"GPUDeviceUnhealthy", "GPUDeviceUnhealthyFlapping"})
"""Alerts on an Unhealthy report of the device plugin or DRA driver (through the kubelet): they
confirm a quarantine that something else opened; as its only evidence a report is what a false
quarantine looks like (a driver's skip list, a health-stream glitch)."""


class QuarantineVerdict(StrEnum):
    """The `verdict` label of `gpuhealth_quarantines_ended_total`."""

    CONFIRMED = "confirmed"
    UNCONFIRMED = "unconfirmed"
    RESTRICTED_UNKNOWN = "restricted-unknown"


@dataclass(frozen=True, slots=True)
class Evidence:
    """What one quarantine gathered, from a record (`evidence_of`) or a demo's journal."""

    action: str
    """`quarantine` or `restrict`, as the quarantine ended."""
    trigger: str
    """The alert that opened it ('' when a person did)."""
    alerts: tuple[str, ...] = ()
    """Every other alert that fired for it, one entry per episode."""
    enforced: bool = True
    """Its enforcement was ever in place (it reached Quarantined)."""
    ended: bool = True
    relapsed: bool = False
    """It fell back to Quarantined from a rung, or an alert of it fired again after it resolved."""
    check_failed: bool = False


def judge(evidence: Evidence) -> QuarantineVerdict | None:
    """The verdict of an ended, enforced quarantine; None for any other."""
    if not (evidence.enforced and evidence.ended):
        return None
    everything = (evidence.trigger, *evidence.alerts)
    if (
        evidence.relapsed
        or evidence.check_failed
        or any(name in HARDWARE_ALERTS for name in everything)
        or any(name in REPORT_ALERTS for name in evidence.alerts)
    ):
        return QuarantineVerdict.CONFIRMED
    if evidence.action == RESTRICT:
        return QuarantineVerdict.RESTRICTED_UNKNOWN
    return QuarantineVerdict.UNCONFIRMED


def verdict_of(record: Quarantine, ladder: Ladder = KNOWN) -> QuarantineVerdict | None:
    """The verdict of the record's current quarantine (None while it runs, or if never enforced)."""
    return judge(evidence_of(record, ladder))


def evidence_of(record: Quarantine, ladder: Ladder = KNOWN) -> Evidence:
    """The evidence the record's current quarantine gathered.

    The record's object is reused for a device's next quarantine, with the history kept: only
    the entries since the last one that ended count. Its source alerts are the current
    quarantine's (a new quarantine starts them afresh); the first is the one that opened it,
    unless a person did (`spec.actor` `person/...`; their quarantine has no triggering alert)."""
    episode = current(record.status.history)
    phases = [entry.phase for entry in episode]
    sources = record.spec.source_alerts
    by_person = record.spec.actor.startswith("person/")
    names = [s.alertname for s in sources]
    trigger, others = ("", names) if by_person or not names else (names[0], names[1:])
    episodes = Counter(s.fingerprint for s in sources)
    fell_back = any(
        now == Phase.QUARANTINED and ladder.rung(before) is not None for before, now in pairwise(phases)
    )
    # An attempt begins where a record steps from off the ladder onto it (its first rung: the
    # reset where the responder has it, else the probe).
    attempts = sum(
        1 for before, now in pairwise(phases) if ladder.rung(now) is not None and ladder.rung(before) is None
    )
    check = record.status.last_check
    check_failed = (
        check is not None
        and check.failed
        and attempts > 0
        and check.attempt > record.status.attempt - attempts
    )
    return Evidence(
        action=record.spec.action,
        trigger=trigger,
        alerts=tuple(others),
        enforced=any(p == Phase.QUARANTINED or ladder.rung(p) is not None for p in phases),
        ended=bool(phases) and phases[-1] in ENDED_PHASES,
        relapsed=fell_back or any(n > 1 for n in episodes.values()),
        check_failed=check_failed,
    )


def current(history: Sequence[HistoryEntry]) -> tuple[HistoryEntry, ...]:
    """The entries of the record's current (or last) quarantine: from the first entry after the
    last ended one that a later quarantine followed, to the end."""
    start = 0
    for i in range(1, len(history)):
        if history[i - 1].phase in ENDED_PHASES and history[i].phase not in ENDED_PHASES:
            start = i
    return tuple(history[start:])
