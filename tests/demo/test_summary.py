"""The summary of a demo run, read from its journal.

Aspects covered: the detection chain of each fault (onset from NVML for XIDs, from the
kubelet's Unknown report for a silent device; alert, delivery, enforcement) and its floor,
per alert when given; faults that lead to nothing have no alert; what was done per fault;
quarantines true and false; releases through every phase; migrations with their evictions;
breaker events and process kills; pods started on a quarantined card (exposure) counted, named
and printed; the text names the verdict's violations; and, for any
journal whatever the order of its entries, summarize never fails, every latency component
is non-negative and the components add up to the total.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from demo.floors import alert_floors
from demo.journal import Entry, Journal, Kind
from demo.summary import FaultStory, Summary, percentile, summarize, write_text
from rules.render import DEFAULT_CONFIG, load_config, scaled
from tests.support import journals
from tests.support.journals import APP_XID_GPU, BLIP_GPU, LONG_UNKNOWN_GPU, XID_GPU, uuid


@dataclass(frozen=True)
class FakeVerdict:
    violations: tuple[str, ...] = ()


def story_of(summary: Summary, place: tuple[str, int], fault: str) -> FaultStory:
    (story,) = (
        s for s in summary.faults if s.detection and s.detection.device == uuid(place) and s.fault == fault
    )
    return story


def test_fatal_xid_detection_chain_starts_at_the_nvml_event() -> None:
    summary = summarize(journals.closed_loop())
    d = story_of(summary, XID_GPU, "xid").detection
    assert (d.onset_at, d.alert, d.action) == (30.0, "GPUDeviceFatalXid", "quarantine")
    assert (d.alert_at, d.delivered_at, d.enforced_at, d.recorded_at) == (72.0, 72.5, 73.4, 73.0)
    assert d.detect == pytest.approx(42.0)
    assert d.deliver == pytest.approx(0.5)
    assert d.enforce == pytest.approx(0.9)
    assert d.total == pytest.approx(43.4)
    assert d.floor == journals.FLOOR
    assert d.over_floor == pytest.approx(3.4)


def test_restrict_chain_starts_at_the_kubelets_unknown_report_and_takes_the_alerts_floor() -> None:
    summary = summarize(journals.closed_loop(), floors={"GPUDeviceUnknownExpired": 340.0})
    d = story_of(summary, LONG_UNKNOWN_GPU, "device-unknown").detection
    assert (d.fault_at, d.onset_at, d.alert, d.action) == (50.0, 85.0, "GPUDeviceUnknownExpired", "restrict")
    assert d.total == pytest.approx(427.0 - 85.0)
    assert d.floor == 340.0
    # Alerts without a floor of their own keep the journal's.
    assert story_of(summary, XID_GPU, "xid").detection.floor == journals.FLOOR


def test_faults_nothing_acted_on_have_no_alert_and_nothing_done() -> None:
    summary = summarize(journals.closed_loop())
    blip = story_of(summary, BLIP_GPU, "device-unknown")
    app = story_of(summary, APP_XID_GPU, "xid")
    for story in (blip, app):
        assert story.detection.alert == ""
        assert story.detection.total is None
        assert story.done == ()
    # Only actionable alerts count as detections: the blip's warning is not one.
    assert {d.label for d in summary.detections} == {"gpu-dra-0/gpu-3", "gpu-dra-2/gpu-6"}


def test_what_was_done_follows_each_fault_until_the_next_on_its_device() -> None:
    summary = summarize(journals.closed_loop())
    xid = story_of(summary, XID_GPU, "xid")
    assert xid.done == (
        "t+73s record Quarantined (FatalXid)",
        "t+73s quarantine enforced (DeviceTaintRule)",
        "t+90s evicted research/train-0 (job research/train)",
        "t+90s evicted research/train-1 (job research/train)",
        "t+96s migration succeeded (job research/train): checkpoint committed",
    )
    (recover,) = (s for s in summary.faults if s.fault == "recover")
    assert recover.done[0] == "t+333s record Probing"
    assert recover.done[-1] == "t+451s canary lifted"


def test_quarantines_true_and_false() -> None:
    journal = journals.closed_loop()
    # A quarantine of a device no fault touched is a false one.
    healthy = uuid(("gpu-dra-1", 5))
    journal.record(200.0, Kind.PHASE, "Quarantined", "gpu-dra-1", healthy, reason="FatalXid", record="dq-x")
    # So is one that only an application XID preceded.
    journal.record(
        210.0, Kind.PHASE, "Quarantined", "gpu-dp-0", uuid(APP_XID_GPU), reason="FatalXid", record="dq-y"
    )
    summary = summarize(journal)
    assert [(q.label, q.false) for q in summary.quarantines] == [
        ("gpu-dra-0/gpu-3", False),
        ("gpu-dra-1/gpu-5", True),
        ("gpu-dp-0/gpu-0", True),
        ("gpu-dra-2/gpu-6", False),
    ]
    assert len(summary.false_quarantines) == 2


def test_gpu_hours_lost_are_the_time_in_quarantined_and_on_the_ladder_in_simulated_time() -> None:
    journal = journals.closed_loop()
    # A record that waited in Pending for 30 s first: only its enforced minute counts.
    blip = uuid(BLIP_GPU)
    for at, phase in ((10.0, "Pending"), (40.0, "Quarantined"), (100.0, "Released")):
        journal.record(at, Kind.PHASE, phase, "gpu-dra-1", blip, reason="Unhealthy", record="dq-blip")
    summary = summarize(journal)
    lost = {q.label: q.lost_seconds for q in summary.quarantines}
    # Released at 451 after entering Quarantined at 73; the Unknown restriction is still on the
    # ladder when the run ends at 500.
    assert lost == {
        "gpu-dra-0/gpu-3": 451.0 - 73.0,
        "gpu-dra-1/gpu-1": 60.0,
        "gpu-dra-2/gpu-6": 500.0 - 426.5,
    }
    assert summary.gpu_hours_lost == pytest.approx((378.0 + 60.0 + 73.5) / 3600)


def test_each_verdict_is_set_beside_the_ground_truth_and_the_agreement_is_counted() -> None:
    journal = journals.closed_loop()
    # A quarantine no fault warranted, which its evidence left unconfirmed: they agree.
    healthy = uuid(("gpu-dra-1", 5))
    for at, phase, verdict in ((200.0, "Quarantined", ""), (260.0, "Released", "unconfirmed")):
        journal.record(
            at, Kind.PHASE, phase, "gpu-dra-1", healthy, reason="Unhealthy", record="dq-x", verdict=verdict
        )
    # Another the evidence confirmed although only an application XID preceded it: they disagree.
    app = uuid(APP_XID_GPU)
    for at, phase, verdict in ((210.0, "Quarantined", ""), (300.0, "Abandoned", "confirmed")):
        journal.record(
            at, Kind.PHASE, phase, "gpu-dp-0", app, reason="FatalXid", record="dq-y", verdict=verdict
        )
    summary = summarize(journal)
    assert [(q.label, q.warranted, q.verdict, q.agrees) for q in summary.quarantines] == [
        ("gpu-dra-0/gpu-3", True, "confirmed", True),
        ("gpu-dra-1/gpu-5", False, "unconfirmed", True),
        ("gpu-dp-0/gpu-0", False, "confirmed", False),
        ("gpu-dra-2/gpu-6", True, "", None),  # still open: no verdict yet
    ]
    assert summary.agreement == (
        "verdicts agree with the ground truth on 2 of 3 confirmed or unconfirmed quarantines; "
        "0 restricted-unknown (no failure claimed); 1 without a verdict"
    )


def test_releases_walk_every_phase_with_checks() -> None:
    summary = summarize(journals.closed_loop())
    full, partial = summary.releases
    assert full.label == "gpu-dra-0/gpu-3" and full.released
    assert [full.reached(p) for p in ("Probing", "Canary", "Stabilizing", "Ramp", "Released")] == [
        333.0, 341.0, 361.0, 421.0, 451.0,
    ]  # fmt: skip
    assert full.checks == (("probe", "passed", 340.0), ("canary", "passed", 360.0))
    assert partial.label == "gpu-dra-2/gpu-6" and not partial.released
    assert partial.reached("Stabilizing") is None


def test_a_record_quarantined_again_after_release_is_a_new_quarantine() -> None:
    journal = journals.closed_loop()
    xid = uuid(XID_GPU)
    journal.record(460.0, Kind.FAULT, "gpu-lost", "gpu-dra-0", xid)
    journal.record(
        470.0, Kind.PHASE, "Quarantined", "gpu-dra-0", xid, reason="GpuLost", record="dq-gpu-dra-0-gpu-3"
    )
    summary = summarize(journal)
    mine = [q for q in summary.quarantines if q.device == xid]
    assert [q.phases[0] for q in mine] == [("Quarantined", 73.0), ("Quarantined", 470.0)]
    assert mine[1].reason == "GpuLost" and not mine[1].false


def test_migrations_breaker_and_kills() -> None:
    journal = journals.closed_loop()
    journal.record(300.0, Kind.BREAKER, "tripped", trigger="rate")
    journal.record(320.0, Kind.BREAKER, "reset", actor="alice")
    summary = summarize(journal)
    (migration,) = summary.migrations
    assert (migration.job, migration.outcome, migration.evictions) == ("research/train", "succeeded", 2)
    assert migration.placed == (
        "gpu-dra-0/gpu-0", "gpu-dra-0/gpu-1", "gpu-dra-0/gpu-2", "gpu-dra-0/gpu-4",
        "gpu-dra-1/gpu-5", "gpu-dra-1/gpu-6", "gpu-dra-1/gpu-7", "gpu-dra-1/gpu-0",
    )  # fmt: skip
    assert [(e.what, e.detail) for e in summary.breaker] == [
        ("tripped", "trigger=rate"),
        ("reset", "actor=alice"),
    ]
    assert [e.detail for e in summary.processes if e.what == "killed"] == ["name=responder-0 role=leader"]
    assert summary.evictions == 2
    assert dict(summary.alerts_fired)["GPUDeviceUnknown"] == 2


def test_text_holds_the_story_and_the_verdict() -> None:
    summary = summarize(journals.closed_loop())
    out = io.StringIO()
    write_text(summary, FakeVerdict(), out)
    text = out.getvalue()
    for expected in (
        "gpu-dra-0/gpu-3",
        "GPUDeviceFatalXid",
        "quarantines: 2 true, 0 false",
        "migration succeeded",
        "Probing t+333s -> Canary t+341s -> Stabilizing t+361s -> Ramp t+421s -> Released t+451s",
        "Stabilizing not reached",
        "process kills: t+150s killed (name=responder-0 role=leader)",
        "safety: every invariant held",
        "[true, verdict confirmed] gpu-dra-0/gpu-3",
        "verdicts agree with the ground truth on 1 of 1 confirmed or unconfirmed quarantines",
        "GPU-hours lost to quarantine: 0.13 (simulated time)",
    ):
        assert expected in text, expected
    out = io.StringIO()
    write_text(summary, FakeVerdict(("restrict on gpu-dra-1/gpu-1 without a warrant",)), out)
    assert "SAFETY INVARIANT BROKEN:\n  restrict on gpu-dra-1/gpu-1 without a warrant" in out.getvalue()


def test_exposure_is_counted_and_printed() -> None:
    j = journals.closed_loop()
    out = io.StringIO()
    write_text(summarize(j), FakeVerdict(), out)
    assert "exposure (pods started on a quarantined card): 0" in out.getvalue()
    xid = uuid(XID_GPU)
    j.record(80.0, Kind.POD_STARTED, "inference/serve-2", "gpu-dra-0", xid, devices=xid)
    j.record(81.0, Kind.POD_STARTED, "gpuhealth-system/hold-0", "gpu-dra-0", xid, devices=xid, holder="r")
    summary = summarize(j)
    assert [(x.at, x.pod, x.label) for x in summary.exposures] == [
        (80.0, "inference/serve-2", "gpu-dra-0/gpu-3")
    ]
    out = io.StringIO()
    write_text(summary, FakeVerdict(), out)
    assert (
        "exposure (pods started on a quarantined card): 1\n  t+80s inference/serve-2 on gpu-dra-0/gpu-3"
        in (out.getvalue())
    )


def test_text_of_an_empty_journal() -> None:
    out = io.StringIO()
    write_text(summarize(journals.empty()), FakeVerdict(), out)
    assert "0 faults" in out.getvalue()
    assert "breaker: no change" in out.getvalue()


def test_percentile() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0], 0.99) == pytest.approx(1.99)
    assert math.isnan(percentile([], 0.5))


# Any ordering of the closed-loop story's entries, plus entries of any kind at any time.
_devices = list(journals.fleet())
_entries = st.builds(
    Entry,
    at=st.floats(-200, 1000, allow_nan=False),
    kind=st.sampled_from(list(Kind)),
    what=st.sampled_from(
        [
            "xid",
            "device-unknown",
            "Unhealthy",
            "Unknown",
            "Quarantined",
            "Released",
            "responder",
            "quarantine",
            "x",
        ]
    ),
    node=st.sampled_from(["", "gpu-dra-0", "gpu-dp-0"]),
    device=st.sampled_from(["", *_devices[:3], "GPU-unknown"]),
    detail=st.dictionaries(
        st.sampled_from(["action", "alertname", "status", "record", "reason", "xid", "job", "result"]),
        st.sampled_from(["quarantine", "restrict", "GPUDeviceFatalXid", "firing", "79", "13", "", "passed"]),
        max_size=4,
    ),
)


@settings(max_examples=150, deadline=None)
@given(st.permutations(journals.closed_loop().entries), st.lists(_entries, max_size=25), st.randoms())
def test_summarize_never_fails_and_latencies_add_up(
    story: list[Entry], noise: list[Entry], rnd: object
) -> None:
    entries = [*story, *noise]
    rnd.shuffle(entries)  # type: ignore[attr-defined]
    journal = journals.empty()
    journal.entries = entries
    summary = summarize(journal, floors={"GPUDeviceFatalXid": 40.0})
    write_text(summary, FakeVerdict(), io.StringIO())
    for story_ in summary.faults:
        d = story_.detection
        if d is None:
            continue
        parts = [d.detect, d.deliver, d.enforce]
        assert all(p is None or p >= 0 for p in parts)
        if d.total is not None:
            assert None not in parts
            assert sum(parts) == pytest.approx(d.total)  # type: ignore[arg-type]
            assert d.onset_at >= d.fault_at
    for q in summary.quarantines:
        assert [at for _, at in q.phases] == sorted(at for _, at in q.phases)


def test_the_story_as_recorded_is_summarized_the_same_after_a_json_round_trip() -> None:
    journal = journals.closed_loop()
    again = Journal.from_dict(journal.to_dict())
    assert summarize(again) == summarize(journal)


def test_alert_floors_come_from_the_rendered_rules() -> None:
    rules = scaled(load_config(DEFAULT_CONFIG), 10)
    floors = alert_floors(rules, 10)
    # scrape 1 s + evaluation 1 s + for + group_wait 0 s, in wall seconds, times the speed.
    assert floors["GPUDeviceFatalXid"] == pytest.approx(20.0)
    assert floors["GPUDeviceUnhealthy"] == pytest.approx((2 + rules.device.unhealthy_for.seconds) * 10)
    assert floors["GPUDeviceUnknownExpired"] == pytest.approx(
        (2 + rules.device.unknown_tolerance.seconds) * 10
    )


def test_a_later_stage_bounds_an_earlier_one_stamped_late() -> None:
    journal = journals.closed_loop()
    xid = uuid(XID_GPU)
    # The alert's watcher saw it after the webhook's did: the delivery proves it was firing.
    journal.entries = [
        e.__class__(75.0, e.kind, e.what, e.node, e.device, e.detail)
        if e.kind is Kind.ALERT_FIRING and e.device == xid
        else e
        for e in journal.entries
    ]
    d = story_of(summarize(journal), XID_GPU, "xid").detection
    assert d is not None
    assert (d.alert_at, d.delivered_at, d.enforced_at) == (72.5, 72.5, 73.4)
    assert d.deliver == 0.0
