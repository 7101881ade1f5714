"""What the webhook records for an alert (responder.webhook.intake).

Aspects: a firing alert opens a Pending quarantine named after its device; duplicates,
replays and HA peers' copies change nothing (property: any sequence with duplicates inserted
ends in the same record as without them); a resolved alert marks its source resolved and
never releases; a resolved alert before any firing records nothing; restrict never becomes
quarantine by itself and quarantine is never downgraded (property); an alert without a
device or action is skipped; a released record is reopened by a new failure, history kept.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.meta import rfc3339
from gpuhealth.outcomes import Skipped, Unchanged
from responder.records import ACTIVE_PHASES, Phase, Quarantine, QuarantineStatus, record_name
from responder.webhook.alerts import Alert
from responder.webhook.intake import IntakeSettings, Write, decide, reason_of

SETTINGS = IntakeSettings()
NOW = 1_800_000_000.0


def alert(
    name: str = "GPUDeviceUnhealthy",
    action: str = "quarantine",
    status: str = "firing",
    *,
    node: str = "gpu-node-1",
    device: str = "GPU-4a1c",
    fingerprint: str = "",
    starts_at: float = NOW - 60,
    annotations: dict[str, str] | None = None,
    **labels: str,
) -> Alert:
    return Alert(
        status=status,
        labels={"alertname": name, "action": action, "node": node, "device": device, **labels},
        annotations=annotations or {},
        starts_at=starts_at,
        ends_at=None,
        fingerprint=fingerprint or f"fp-{name}-{starts_at}",
    )


def apply(record: Quarantine | None, a: Alert, now: float = NOW) -> Quarantine | None:
    decision = decide(record, a, now=now, settings=SETTINGS)
    if isinstance(decision, Write):
        assert decision.create == (record is None)
        # The recorder writes at the resourceVersion it read; here the record stays in memory.
        return decision.record
    return record


def test_a_firing_alert_opens_a_pending_quarantine_named_after_its_device() -> None:
    decision = decide(
        None, alert(driver="gpu.nvidia.com", pool="p", device_name="gpu-3"), now=NOW, settings=SETTINGS
    )
    assert isinstance(decision, Write) and decision.create
    record = decision.record
    assert record.name == record_name("gpu-node-1", "GPU-4a1c")
    assert record.status.phase == Phase.PENDING
    # What the alert says, and no path: the reconciler's first pass identifies the device.
    assert (record.spec.path, record.spec.driver, record.spec.device_name) == ("", "gpu.nvidia.com", "gpu-3")
    assert record.spec.reason == "Unhealthy" and record.spec.actor == "alert/GPUDeviceUnhealthy"
    assert record.spec.expires_at == rfc3339(NOW + SETTINGS.expiry_seconds)
    assert record.status.history[-1].message == "GPUDeviceUnhealthy fired: quarantine recorded"


def test_the_uuid_comes_from_its_label_or_from_a_device_named_by_its_uuid() -> None:
    # The exporter names a DRA device by its GPU UUID when its ResourceSlice publishes one, so
    # the alerts carry no `uuid` label; the probe and canary pin the device by that UUID.
    dra = {"driver": "gpu.nvidia.com", "pool": "gpu-node-1", "device_name": "gpu-3"}
    by_uuid = decide(None, alert(device="GPU-4a1c", **dra), now=NOW, settings=SETTINGS)
    by_name = decide(None, alert(device="gpu.nvidia.com/gpu-node-1/gpu-3", **dra), now=NOW, settings=SETTINGS)
    labelled = decide(
        None, alert(device="gpu.nvidia.com/n/gpu-3", uuid="GPU-77", **dra), now=NOW, settings=SETTINGS
    )
    assert isinstance(by_uuid, Write) and by_uuid.record.spec.uuid == "GPU-4a1c"
    assert isinstance(by_name, Write) and by_name.record.spec.uuid == ""
    assert isinstance(labelled, Write) and labelled.record.spec.uuid == "GPU-77"


def test_a_record_left_between_its_two_writes_is_opened_in_place() -> None:
    first = apply(None, alert())
    assert first is not None
    half = replace(first, status=QuarantineStatus(), resource_version="7")  # spec written, status not yet
    decision = decide(half, alert(), now=NOW + 1, settings=SETTINGS)
    assert isinstance(decision, Write) and not decision.create
    assert decision.record.resource_version == "7"
    assert [h.message for h in decision.record.status.history] == [
        "GPUDeviceUnhealthy fired: quarantine recorded"
    ]


def test_a_duplicate_changes_nothing() -> None:
    first = apply(None, alert())
    assert isinstance(decide(first, alert(), now=NOW + 5, settings=SETTINGS), Unchanged)


def test_resolved_marks_the_source_and_never_releases() -> None:
    record = apply(None, alert())
    resolved = apply(record, alert(status="resolved"), now=NOW + 100)
    assert resolved is not None
    assert resolved.status.phase == Phase.PENDING  # the reconciler starts probing; nothing released here
    assert not resolved.spec.source_alerts[0].firing
    assert resolved.spec.source_alerts[0].resolved_at == rfc3339(NOW + 100)


def test_resolved_before_any_firing_records_nothing() -> None:
    assert isinstance(decide(None, alert(status="resolved"), now=NOW, settings=SETTINGS), Unchanged)


def test_a_resolved_that_overtakes_its_firing_is_remembered() -> None:
    record = apply(None, alert("GPUDeviceEccUncorrectable", starts_at=NOW - 400))
    early = apply(record, alert("GPUDeviceFatalXid", status="resolved"), now=NOW + 1)
    assert early is not None and not early.spec.source_alerts[-1].firing
    late = decide(early, alert("GPUDeviceFatalXid"), now=NOW + 2, settings=SETTINGS)
    assert isinstance(late, Unchanged) and "already resolved" in late.detail


def test_alerts_without_a_device_or_an_action_are_skipped() -> None:
    assert isinstance(decide(None, alert(action="none"), now=NOW, settings=SETTINGS), Skipped)
    assert isinstance(decide(None, alert(device=""), now=NOW, settings=SETTINGS), Skipped)


def test_restrict_is_escalated_by_a_confirmed_failure_and_never_downgraded() -> None:
    restricted = apply(None, alert("GPUDeviceUnknownExpired", "restrict"))
    assert restricted is not None and (restricted.spec.action, restricted.spec.reason) == (
        "restrict",
        "Unknown",
    )
    escalated = apply(restricted, alert("GPUDeviceFatalXid", "quarantine"))
    assert escalated is not None and (escalated.spec.action, escalated.spec.reason) == (
        "quarantine",
        "FatalXid",
    )
    again = apply(escalated, alert("GPUDeviceUnknownFlapping", "restrict"))
    assert again is not None and again.spec.action == "quarantine"
    assert len(again.spec.source_alerts) == 3


def test_a_released_record_is_reopened_by_a_new_failure_with_its_history() -> None:
    record = apply(None, alert())
    assert record is not None
    released = record.with_phase(Phase.RELEASED, time="t", actor="responder", message="released")
    reopened = apply(released, alert(starts_at=NOW + 3600), now=NOW + 4000)
    assert reopened is not None and reopened.status.phase == Phase.PENDING
    assert [h.phase for h in reopened.status.history] == [Phase.PENDING, Phase.RELEASED, Phase.PENDING]


def test_reasons() -> None:
    assert reason_of(alert("GPUDeviceEccUncorrectable")) == "EccUncorrectable"
    assert reason_of(alert("GPUDeviceUnknownFlapping", "restrict")) == "Unknown"
    assert reason_of(alert("GPUDeviceUnhealthyFlapping")) == "UnhealthyFlapping"


def test_unhealthy_flapping_quarantines_through_its_action_label_alone() -> None:
    """No list of alert names to register: `action=quarantine` opens a quarantine (the
    reconciler then migrates checkpointed work) whose reason comes from the alert's name."""
    record = apply(None, alert("GPUDeviceUnhealthyFlapping", severity="critical"))
    assert record is not None and record.status.phase == Phase.PENDING
    assert (record.spec.action, record.spec.reason, record.spec.actor) == (
        "quarantine",
        "UnhealthyFlapping",
        "alert/GPUDeviceUnhealthyFlapping",
    )


def test_flapping_that_turns_into_a_long_unhealthy_keeps_one_quarantine_with_a_firing_source() -> None:
    """The rules hand a device over from GPUDeviceUnhealthyFlapping to GPUDeviceUnhealthy at
    one evaluation; whichever delivery comes first, the record stays one active quarantine
    with a source still firing, so the flapping alert's resolved starts no release."""
    flapping = alert("GPUDeviceUnhealthyFlapping", starts_at=NOW - 120)
    opened = apply(None, flapping)
    assert opened is not None
    quarantined = opened.with_phase(Phase.QUARANTINED, time="t", actor="responder", message="enforced")
    handover = [alert("GPUDeviceUnhealthyFlapping", status="resolved", starts_at=NOW - 120), alert()]
    for order in (handover, handover[::-1]):
        record: Quarantine | None = quarantined
        for delivery in order:
            record = apply(record, delivery, now=NOW + 1)
        assert record is not None and record.name == opened.name
        assert record.status.phase == Phase.QUARANTINED and record.spec.action == "quarantine"
        firing = [s.alertname for s in record.spec.source_alerts if s.firing]
        assert firing == ["GPUDeviceUnhealthy"]


# ----- properties over sequences of deliveries ------------------------------------------------------

EPISODES = [
    ("GPUDeviceUnhealthy", "quarantine", NOW - 300),
    ("GPUDeviceFatalXid", "quarantine", NOW - 200),
    ("GPUDeviceUnknownExpired", "restrict", NOW - 100),
    ("GPUDeviceUnknownFlapping", "restrict", NOW - 50),
]
deliveries = st.lists(
    st.tuples(st.sampled_from(range(len(EPISODES))), st.sampled_from(["firing", "resolved"])), max_size=12
)


OPEN = alert("GPUDeviceEccUncorrectable", starts_at=NOW - 400)
"""An open quarantine the sequences start from: with no record at all, a resolved that
overtakes its firing has nowhere to be remembered (tested on its own above)."""


def run(sequence: list[tuple[int, str]]) -> Quarantine | None:
    record = apply(None, OPEN)
    for i, status in sequence:
        name, action, starts = EPISODES[i]
        record = apply(record, alert(name, action, status, starts_at=starts))
    return record


def comparable(record: Quarantine | None) -> Any:
    return None if record is None else (record.spec, record.status.phase, set(record.status.processed_keys))


@given(deliveries, st.data())
def test_duplicates_anywhere_change_nothing(sequence: list[tuple[int, str]], data: st.DataObject) -> None:
    with_copies = list(sequence)
    for item in sequence:
        position = data.draw(st.integers(min_value=with_copies.index(item) + 1, max_value=len(with_copies)))
        with_copies.insert(position, item)  # a re-delivery after the original
    assert comparable(run(with_copies)) == comparable(run(sequence))


@given(deliveries)
def test_restrict_alone_never_quarantines_and_quarantine_is_never_downgraded(
    sequence: list[tuple[int, str]],
) -> None:
    record = None
    seen_quarantine = False
    resolved: set[int] = set()
    for i, status in sequence:
        name, action, starts = EPISODES[i]
        record = apply(record, alert(name, action, status, starts_at=starts))
        if record is not None and status == "resolved":
            resolved.add(i)  # remembered: a later firing of this episode changes nothing
        seen_quarantine |= action == "quarantine" and status == "firing" and i not in resolved
        if record is not None:
            assert record.status.phase in ACTIVE_PHASES  # intake never releases or abandons
            assert (record.spec.action == "quarantine") == seen_quarantine
            assert record.spec.node == "gpu-node-1" and record.spec.device == "GPU-4a1c"


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_settings_refuse_nonsense(bad: float) -> None:
    with pytest.raises(ValueError):
        IntakeSettings(expiry_seconds=bad)


def test_a_restriction_lasts_what_its_alert_says_and_a_repeat_only_lengthens_it() -> None:
    """The rules' restriction schedule (annotation restrict_for, seconds) is written to the record
    (status.retryAt) at intake, so a restarted responder holds the same restriction."""
    first = alert("GPUDeviceUnknownExpired", "restrict", annotations={"restrict_for": "600"})
    restricted = apply(None, first)
    assert restricted is not None and restricted.status.retry_at == rfc3339(NOW + 600)
    # A repeated Unknown of the open record, with the longer restriction of its repeat count.
    repeat = alert(
        "GPUDeviceUnknownExpired", "restrict", starts_at=NOW + 300, annotations={"restrict_for": "1200"}
    )
    longer = apply(restricted, repeat, now=NOW + 300)
    assert longer is not None and longer.status.retry_at == rfc3339(NOW + 1500)
    # A shorter one never shortens it.
    short = alert(
        "GPUDeviceUnknownFlapping", "restrict", starts_at=NOW + 400, annotations={"restrict_for": "60"}
    )
    kept = apply(longer, short, now=NOW + 400)
    assert kept is not None and kept.status.retry_at == rfc3339(NOW + 1500)


@pytest.mark.parametrize("value", ["", "soon", "-5", "0", "inf", "nan"])
def test_a_restriction_without_a_readable_length_holds_nothing(value: str) -> None:
    restricted = apply(
        None, alert("GPUDeviceUnknownExpired", "restrict", annotations={"restrict_for": value})
    )
    assert restricted is not None and restricted.status.retry_at == ""


def test_a_quarantine_ignores_a_restriction_length() -> None:
    record = apply(None, alert("GPUDeviceUnhealthy", annotations={"restrict_for": "600"}))
    assert record is not None and record.status.retry_at == ""
