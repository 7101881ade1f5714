"""Escalation to the node as a pure rule (responder.reconcile.escalation).

Aspects: a single failing card never escalates, whatever else the node shows (property-tested
over cards, reasons, times and the driver's node-wide gpu-lost taint); three cards of one node
failing within the window escalate with `cards-failing` and name each card as evidence, three
spread wider than the window do not; Unknown (`restrict`), a person's quarantine, a card
pending or on the release ladder never count; the driver's gpu-lost taint on every device
escalates only with at least two cards of the node under quarantine; a tripped breaker admits no
escalation (property-tested), and a node counts as its GPUs against the breaker's limits and
the bucket, also once standing (the guardrails a new leader rebuilds); the Node's annotation
is read back as the escalation it records.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.meta import rfc3339
from gpuhealth.kube.slices import DriverTaint, SliceDevice
from responder.reconcile.breaker import BreakerSettings, BreakerState, Counts
from responder.reconcile.escalation import (
    ANNOTATION,
    CARDS_FAILING,
    DRIVER_GPU_LOST,
    GPU_LOST_TAINT,
    TAINT_KEY,
    Escalation,
    EscalationSettings,
    admit,
    justify,
    node_gpus,
    read_annotation,
)
from responder.reconcile.limits import Bucket, BucketSettings
from responder.reconcile.reconciler import ReconcilerSettings, guardrails
from responder.records import HistoryEntry, Phase, Quarantine, QuarantineSpec, QuarantineStatus

NOW = 1_800_000_000.0
SETTINGS = EscalationSettings()


def card(
    device: str,
    since: float,
    *,
    node: str = "gpu-0",
    phase: str = Phase.QUARANTINED,
    action: str = "quarantine",
    actor: str = "alert/GPUDeviceUnhealthy",
    reason: str = "Unhealthy",
) -> Quarantine:
    history: tuple[HistoryEntry, ...] = (
        HistoryEntry(time=rfc3339(since - 1), phase=Phase.PENDING, actor="responder", message=""),
        HistoryEntry(time=rfc3339(since), phase=Phase.QUARANTINED, actor="responder", message=""),
    )
    if phase != Phase.QUARANTINED:
        history += (HistoryEntry(time=rfc3339(since + 1), phase=phase, actor="responder", message=""),)
    spec = QuarantineSpec(
        node=node, device=device, path="dra", reason=reason, actor=actor, expires_at="", action=action
    )
    return Quarantine(
        name=f"{node}-{device}", spec=spec, status=QuarantineStatus(phase=phase, history=history)
    )


def lost_slices(node: str = "gpu-0", gpus: int = 8, lost: int = 8) -> list[SliceDevice]:
    taint = (DriverTaint(GPU_LOST_TAINT, "NoSchedule", "true"),)
    return [
        SliceDevice(
            "gpu.nvidia.com", node, f"gpu-{i}", node, uuid=f"GPU-{i}", taints=taint if i < lost else ()
        )
        for i in range(gpus)
    ]


def test_three_cards_within_the_window_escalate_with_each_card_as_evidence() -> None:
    records = [card(f"GPU-{i}", NOW - 60 + 10 * i) for i in range(3)]
    got = justify("gpu-0", records, now=NOW, settings=SETTINGS)
    assert got is not None
    assert got.justification == CARDS_FAILING
    assert [line.split()[0] for line in got.evidence] == ["GPU-0", "GPU-1", "GPU-2"]
    assert got.since == NOW - 40


def test_three_cards_spread_wider_than_the_window_do_not() -> None:
    records = [
        card(f"GPU-{i}", NOW - 3 * SETTINGS.window_seconds + i * SETTINGS.window_seconds) for i in range(3)
    ]
    assert justify("gpu-0", records, now=NOW, settings=SETTINGS) is None


def test_two_cards_are_not_enough_and_another_node_s_cards_do_not_count() -> None:
    records = [card("GPU-0", NOW), card("GPU-1", NOW), card("GPU-2", NOW, node="gpu-1")]
    assert justify("gpu-0", records, now=NOW, settings=SETTINGS) is None


@pytest.mark.parametrize(
    "third",
    [
        card("GPU-2", NOW, action="restrict"),
        card("GPU-2", NOW, actor="person/alice"),
        card("GPU-2", NOW, phase="Probing"),
        card("GPU-2", NOW, phase=Phase.PENDING),
        card("GPU-2", NOW, phase=Phase.DEFERRED),
    ],
    ids=["unknown", "a-person", "on-the-ladder", "pending", "deferred"],
)
def test_only_automatic_enforced_quarantines_count(third: Quarantine) -> None:
    records = [card("GPU-0", NOW), card("GPU-1", NOW), third]
    assert justify("gpu-0", records, now=NOW, settings=SETTINGS) is None


def test_cards_walking_their_ladders_lift_the_justification() -> None:
    held = [card(f"GPU-{i}", NOW) for i in range(3)]
    assert justify("gpu-0", held, now=NOW, settings=SETTINGS) is not None
    walking = [*held[:2], card("GPU-2", NOW, phase="Probing")]
    assert justify("gpu-0", walking, now=NOW + 60, settings=SETTINGS) is None


def test_the_driver_s_gpu_lost_everywhere_escalates_with_two_cards_recorded() -> None:
    records = [card("GPU-0", NOW - 30, reason="FatalXid"), card("GPU-1", NOW, reason="FatalXid")]
    got = justify("gpu-0", records, lost_slices(), now=NOW, settings=SETTINGS)
    assert got is not None and got.justification == DRIVER_GPU_LOST
    assert got.evidence[-1] == f"{GPU_LOST_TAINT} on all 8 devices of the node's ResourceSlices"
    assert justify("gpu-0", records, lost_slices(lost=7), now=NOW, settings=SETTINGS) is None


def test_disabled_escalates_nothing() -> None:
    records = [card(f"GPU-{i}", NOW) for i in range(8)]
    assert justify("gpu-0", records, now=NOW, settings=EscalationSettings(enabled=False)) is None


@given(
    since=st.floats(min_value=NOW - 86400, max_value=NOW),
    reason=st.sampled_from(["Unhealthy", "FatalXid", "EccUncorrectable", "RowRemapFailure"]),
    phase=st.sampled_from([*Phase, "Probing", "Canary", "Stabilizing", "Ramp"]),
    lost=st.booleans(),
    cards=st.integers(min_value=2, max_value=8),
    lost_cards=st.integers(min_value=2, max_value=8),
)
def test_a_single_failing_card_never_escalates(
    since: float, reason: str, phase: str, lost: bool, cards: int, lost_cards: int
) -> None:
    settings = EscalationSettings(cards=cards, lost_cards=lost_cards)
    records = [card("GPU-0", since, reason=reason, phase=phase)]
    slices = lost_slices() if lost else []
    assert justify("gpu-0", records, slices, now=NOW, settings=settings) is None


@given(gpus=st.integers(min_value=0, max_value=64), quarantined=st.integers(min_value=0, max_value=100))
def test_a_tripped_breaker_admits_no_escalation(gpus: int, quarantined: int) -> None:
    bucket = Bucket.full(BucketSettings(burst=100, per_hour=100), NOW)
    counts = Counts(eligible=10_000, started_in_window=0, quarantined=quarantined)
    why, after = admit(gpus, BreakerState(tripped=True), counts, bucket, now=NOW, settings=BreakerSettings())
    assert why == "BreakerOpen"
    assert after == bucket


def test_a_node_counts_as_its_gpus_against_the_limits_and_the_bucket() -> None:
    settings = BreakerSettings(rate_floor=5, capacity_floor=8)
    bucket = Bucket.full(BucketSettings(burst=20, per_hour=120), NOW)
    small = Counts(eligible=16, started_in_window=3, quarantined=3)
    why, after = admit(5, BreakerState(), small, bucket, now=NOW, settings=settings)
    assert why.startswith("BreakerRate")
    roomy = BreakerSettings(rate_floor=10, capacity_floor=7)
    why, after = admit(5, BreakerState(), small, bucket, now=NOW, settings=roomy)
    assert why.startswith("BreakerCapacity")
    why, after = admit(
        5, BreakerState(), small, bucket, now=NOW, settings=BreakerSettings(rate_floor=10, capacity_floor=10)
    )
    assert why == "" and after.tokens == pytest.approx(15)
    low = Bucket.replay(BucketSettings(burst=20, per_hour=120), [NOW] * 17, NOW)
    why, _ = admit(
        5, BreakerState(), small, low, now=NOW, settings=BreakerSettings(rate_floor=10, capacity_floor=10)
    )
    assert why.startswith("RateLimited")


def test_the_node_s_gpus_from_its_capacity_or_its_slices() -> None:
    node = {"status": {"capacity": {"nvidia.com/gpu": "8"}}}
    assert node_gpus(node, [], "gpu-0") == 8
    assert node_gpus({}, lost_slices(gpus=4), "gpu-0") == 4


def test_the_annotation_reads_back_as_the_escalation() -> None:
    escalation = Escalation("gpu-0", CARDS_FAILING, ("GPU-0 Unhealthy since x",), NOW - 10)
    node = {
        "metadata": {"name": "gpu-0", "annotations": {ANNOTATION: escalation.annotation(NOW)}},
        "spec": {"taints": [{"key": TAINT_KEY, "value": CARDS_FAILING, "effect": "NoSchedule"}]},
    }
    assert read_annotation(node) == escalation
    assert json.loads(escalation.annotation(NOW))["at"] == rfc3339(NOW)
    assert read_annotation({"metadata": {"name": "gpu-0"}, "spec": {}}) is None
    bare = {"metadata": {"name": "gpu-0"}, "spec": {"taints": [{"key": TAINT_KEY, "value": DRIVER_GPU_LOST}]}}
    assert read_annotation(bare) == Escalation("gpu-0", DRIVER_GPU_LOST, (), 0.0)


def test_a_standing_escalation_weighs_on_the_guardrails_a_new_leader_rebuilds() -> None:
    settings = ReconcilerSettings()
    counts, bucket = guardrails(
        [], 1000, BreakerState(), now=NOW, settings=settings, escalated=[(NOW - 10, 5)]
    )
    assert (counts.quarantined, counts.started_in_window) == (5, 5)
    assert bucket.tokens == pytest.approx(settings.bucket.burst - 5 + 10 / settings.bucket.refill_seconds)
    counts, _ = guardrails([], 1000, BreakerState(), now=NOW + 3600, settings=settings, escalated=[(NOW, 5)])
    assert (counts.quarantined, counts.started_in_window) == (5, 0)  # out of the window, still out of service
