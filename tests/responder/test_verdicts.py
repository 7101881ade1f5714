"""The verdict of an ended quarantine (responder.verdicts), as a pure function of its record.

Aspects: no verdict while a quarantine runs or if it never was enforced; a failed check, a relapse
(back to Quarantined from a rung, or an alert firing again), the device's own error record (even
as the trigger) and a corroborating Unhealthy report confirm; an Unhealthy report alone, passed
at the first attempt, is unconfirmed; a restriction for Unknown with nothing more is
restricted-unknown; only the current quarantine of a reused record counts; more evidence never
un-confirms (properties).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from responder.ladder import CANARY, LADDER, PROBING, RAMP, STABILIZING
from responder.records import (
    CheckOutcome,
    HistoryEntry,
    Phase,
    Quarantine,
    QuarantineSpec,
    QuarantineStatus,
    SourceAlert,
    Verdict,
)
from responder.verdicts import (
    HARDWARE_ALERTS,
    REPORT_ALERTS,
    Evidence,
    QuarantineVerdict,
    evidence_of,
    judge,
    verdict_of,
)

CONFIRMED, UNCONFIRMED, RESTRICTED = (
    QuarantineVerdict.CONFIRMED,
    QuarantineVerdict.UNCONFIRMED,
    QuarantineVerdict.RESTRICTED_UNKNOWN,
)
RELEASED_WALK = (Phase.PENDING, Phase.QUARANTINED, *LADDER.phases, Phase.RELEASED)


def record(
    phases: Sequence[str],
    alerts: Sequence[str] = ("GPUDeviceUnhealthy",),
    *,
    action: str = "quarantine",
    actor: str = "",
    fingerprints: Sequence[str] = (),
    last_check: CheckOutcome | None = None,
    attempt: int = 0,
) -> Quarantine:
    history = tuple(
        HistoryEntry(
            time=f"2027-01-15T08:{i // 60:02d}:{i % 60:02d}Z", phase=p, actor="responder", message=""
        )
        for i, p in enumerate(phases)
    )
    sources = tuple(
        SourceAlert(
            alertname=name,
            fingerprint=fingerprints[i] if i < len(fingerprints) else f"fp-{i}",
            starts_at=f"2027-01-15T07:00:{i:02d}Z",
            resolved_at="2027-01-15T07:30:00Z",
        )
        for i, name in enumerate(alerts)
    )
    reason = (
        "Unknown" if action == "restrict" else (alerts[0].removeprefix("GPUDevice") if alerts else "Manual")
    )
    spec = QuarantineSpec(
        node="gpu-node-1",
        device="GPU-4a1c",
        path="device-plugin",
        reason=reason,
        actor=actor or (f"alert/{alerts[0]}" if alerts else "person/alice"),
        expires_at="2027-01-16T08:00:00Z",
        action=action,
        source_alerts=sources,
    )
    status = QuarantineStatus(
        phase=phases[-1] if phases else Phase.PENDING,
        history=history,
        last_check=last_check,
        attempt=attempt,
    )
    return Quarantine(name="gpu-node-1-gpu-4a1c-0123456789", spec=spec, status=status)


def test_no_verdict_while_it_runs_or_when_nothing_was_ever_enforced() -> None:
    assert verdict_of(record((Phase.PENDING, Phase.QUARANTINED, PROBING))) is None
    assert verdict_of(record((Phase.PENDING, Phase.DEFERRED, Phase.RELEASED))) is None  # dismissed
    assert verdict_of(record(())) is None


def test_an_unhealthy_report_alone_passed_at_the_first_attempt_is_unconfirmed() -> None:
    assert verdict_of(record(RELEASED_WALK, attempt=1)) == UNCONFIRMED
    # Given up by a person before any attempt, with nothing but the report: unconfirmed too.
    assert verdict_of(record((Phase.PENDING, Phase.QUARANTINED, Phase.ABANDONED))) == UNCONFIRMED


def test_the_devices_own_error_record_confirms_even_as_the_trigger() -> None:
    for name in sorted(HARDWARE_ALERTS):
        assert verdict_of(record(RELEASED_WALK, (name,))) == CONFIRMED


def test_an_unhealthy_report_confirms_what_something_else_opened() -> None:
    escalated = record(RELEASED_WALK, ("GPUDeviceUnknownExpired", "GPUDeviceUnhealthy"))
    assert verdict_of(escalated) == CONFIRMED
    by_person = record(RELEASED_WALK, ("GPUDeviceUnhealthyFlapping",), actor="person/alice")
    assert verdict_of(by_person) == CONFIRMED
    assert verdict_of(record(RELEASED_WALK, (), actor="person/alice")) == UNCONFIRMED


def test_a_failed_check_or_a_relapse_confirms() -> None:
    failed_then_released = (Phase.PENDING, Phase.QUARANTINED, PROBING, Phase.QUARANTINED, *RELEASED_WALK[2:])
    assert verdict_of(record(failed_then_released, attempt=2)) == CONFIRMED
    fell_back = (
        Phase.PENDING,
        Phase.QUARANTINED,
        PROBING,
        CANARY,
        STABILIZING,
        Phase.QUARANTINED,
        Phase.ABANDONED,
    )
    assert verdict_of(record(fell_back)) == CONFIRMED
    # The same alert fired again after it resolved: two episodes of one fingerprint.
    again = record(RELEASED_WALK, ("GPUDeviceUnhealthy", "GPUDeviceUnhealthy"), fingerprints=("fp", "fp"))
    assert verdict_of(again) == CONFIRMED
    # The last probe failed in this quarantine's attempt (a person then gave it up).
    probe_failed = record(
        (Phase.PENDING, Phase.QUARANTINED, PROBING, Phase.ABANDONED),
        last_check=CheckOutcome("probe", 3, Verdict.FAILED),
        attempt=3,
    )
    assert verdict_of(probe_failed) == CONFIRMED


def test_a_restriction_for_unknown_that_recovered_is_restricted_unknown() -> None:
    restricted = record(RELEASED_WALK, ("GPUDeviceUnknownExpired",), action="restrict")
    assert verdict_of(restricted) == RESTRICTED
    relapsed = record(
        (*RELEASED_WALK[:3], Phase.QUARANTINED, *RELEASED_WALK[2:]),
        ("GPUDeviceUnknownExpired",),
        action="restrict",
    )
    assert verdict_of(relapsed) == CONFIRMED


def test_only_the_current_quarantine_of_a_reused_record_counts() -> None:
    earlier = (Phase.PENDING, Phase.QUARANTINED, PROBING, Phase.QUARANTINED, PROBING, *RELEASED_WALK[3:])
    reused = record(
        (*earlier, *RELEASED_WALK), last_check=CheckOutcome("probe", 1, Verdict.FAILED), attempt=3
    )
    # The earlier quarantine's failed probe (attempt 1) is not this one's (attempt 3).
    assert verdict_of(reused) == UNCONFIRMED
    assert evidence_of(reused).relapsed is False


names = st.sampled_from(
    sorted(
        HARDWARE_ALERTS | REPORT_ALERTS | {"GPUDeviceUnknownExpired", "GPUDeviceUnknownFlapping", "Custom"}
    )
)
evidence = st.builds(
    Evidence,
    action=st.sampled_from(("quarantine", "restrict")),
    trigger=st.one_of(st.just(""), names),
    alerts=st.lists(names, max_size=4).map(tuple),
    enforced=st.booleans(),
    ended=st.booleans(),
    relapsed=st.booleans(),
    check_failed=st.booleans(),
)


@given(evidence, st.lists(names, max_size=3), st.booleans(), st.booleans())
def test_more_evidence_never_unconfirms(e: Evidence, more: list[str], relapse: bool, failed: bool) -> None:
    richer = replace(
        e, alerts=(*e.alerts, *more), relapsed=e.relapsed or relapse, check_failed=e.check_failed or failed
    )
    if judge(e) == CONFIRMED:
        assert judge(richer) == CONFIRMED


@given(evidence)
def test_every_ended_enforced_quarantine_gets_exactly_the_verdict_its_evidence_gives(e: Evidence) -> None:
    verdict = judge(e)
    if not (e.enforced and e.ended):
        assert verdict is None
        return
    assert verdict is not None
    hardware = any(n in HARDWARE_ALERTS for n in (e.trigger, *e.alerts))
    corroborated = any(n in REPORT_ALERTS for n in e.alerts)
    if e.relapsed or e.check_failed or hardware or corroborated:
        assert verdict == CONFIRMED
    else:
        assert verdict == (RESTRICTED if e.action == "restrict" else UNCONFIRMED)


walks = st.lists(st.sampled_from((Phase.QUARANTINED, PROBING, CANARY, STABILIZING, RAMP)), max_size=8)


@given(walks, walks, st.sampled_from((Phase.RELEASED, Phase.ABANDONED)))
def test_an_earlier_quarantine_in_the_same_object_never_changes_the_verdict(
    before: list[str], now: list[str], end: str
) -> None:
    current = [Phase.PENDING, Phase.QUARANTINED, *now, end]
    alone = record(current)
    reused = record([Phase.PENDING, Phase.QUARANTINED, *before, Phase.RELEASED, *current])
    assert verdict_of(reused) == verdict_of(alone)
