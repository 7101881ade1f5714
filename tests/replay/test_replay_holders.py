"""The modelled replay with the workload's pods on its devices (responder.replay.engine's `holders`).

Aspects: a restricted device whose tenant's pod stays on it is not released while the pod holds
it (the release attempt waits, DeviceInUse) and is released after it leaves, whereas without
holders the same device is released as soon as its ladder allows; the time the pod held the
restricted device is not counted as healthy time withheld; a fault on a restricted device moves
its tenant's pod (without pods, nothing is moved); a quarantine's move ends the pod's
holding, so the quarantined device is released without waiting for the pod's planned end; a pod
the workload would place while the device is excluded lands elsewhere.
"""

from __future__ import annotations

import pytest

from backtest.inputs import replay_settings, rule_timings
from responder.records import Phase
from responder.replay.alerting import RuleTimings
from responder.replay.engine import Holding, ReplaySettings, replay
from responder.replay.outcomes import Replay
from responder.replay.timeline import CheckTruth, Fault, Signal, Timeline, UnknownSpell

T0 = 1_800_000_000.0
HOUR = 3600.0
DAY = 86400.0
KEY = ("n1", "GPU-a")


@pytest.fixture(scope="module")
def rules() -> RuleTimings:
    return rule_timings()


@pytest.fixture(scope="module")
def shipped() -> ReplaySettings:
    return replay_settings()


def _timeline(**events: object) -> Timeline:
    return Timeline(start=T0, end=T0 + 4 * DAY, eligible=64, checks=CheckTruth(120.0, 300.0), **events)  # type: ignore[arg-type]


def _restricted(
    rules: RuleTimings, shipped: ReplaySettings, holders: dict[tuple[str, str], list[Holding]]
) -> Replay:
    spell = UnknownSpell(T0 + HOUR, "n1", ("GPU-a",), rules.unknown_window(0) + 10 * 60.0)
    return replay(_timeline(spells=(spell,)), rules, shipped, holders)


def test_a_restricted_device_with_its_tenant_on_it_waits_for_the_pod_to_leave(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    leaves = T0 + 2 * DAY
    without = _restricted(rules, shipped, {})
    assert without.records[KEY].spec.action == "restrict"
    assert without.records[KEY].status.phase == Phase.RELEASED
    (free,) = without.holds
    assert free.end < leaves - DAY  # released within hours of the spell: nothing held it

    held = _restricted(rules, shipped, {KEY: [(T0, leaves, "serve/tenant-0")]})
    assert held.records[KEY].status.phase == Phase.RELEASED
    (kept,) = held.holds
    assert kept.start == free.start
    assert kept.end > leaves  # the attempt began only once the pod had left, then walked the ladder
    # While the pod held it the device ran the tenant's work: not healthy time withheld.
    assert held.in_use_seconds({}) == pytest.approx(leaves - kept.start)
    assert held.withheld_healthy_seconds({}) == pytest.approx(kept.end - leaves)


def test_a_restricted_device_waits_with_device_in_use_while_held(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    spell = UnknownSpell(T0 + HOUR, "n1", ("GPU-a",), rules.unknown_window(0) + 10 * 60.0)
    timeline = Timeline(start=T0, end=T0 + DAY, eligible=64, checks=CheckTruth(120.0, 300.0), spells=(spell,))
    record = replay(timeline, rules, shipped, {KEY: [(T0, T0 + 2 * DAY, "serve/tenant-0")]}).records[KEY]
    assert record.status.phase == Phase.QUARANTINED
    assert record.status.phase_reason == "DeviceInUse"


def test_a_quarantines_move_ends_the_pods_holding(rules: RuleTimings, shipped: ReplaySettings) -> None:
    fault = Fault(T0 + HOUR, "n1", "GPU-a", Signal.FATAL_XID, T0 + 6 * HOUR, "79")
    holders = {KEY: [(T0, T0 + 3 * DAY, "train/worker-0")]}
    moved = replay(_timeline(faults=(fault,)), rules, shipped, holders)
    assert len(moved.moves) == 1
    assert moved.records[KEY].status.phase == Phase.RELEASED
    (hold,) = moved.holds
    assert hold.end < T0 + DAY  # released after the repair and the ladder, not at the pod's planned end
    # The pod the workload would place after the move lands elsewhere while the device is excluded.
    again = {KEY: [(T0, T0 + 2 * HOUR, "train/worker-0"), (T0 + 2 * HOUR, T0 + 3 * DAY, "train/worker-1")]}
    assert replay(_timeline(faults=(fault,)), rules, shipped, again).holds == moved.holds


def test_a_fault_on_a_restricted_device_moves_the_tenants_pod(
    rules: RuleTimings, shipped: ReplaySettings
) -> None:
    spell = UnknownSpell(T0 + HOUR, "n1", ("GPU-a",), rules.unknown_window(0) + 10 * 60.0)
    fault = Fault(T0 + 1.5 * HOUR, "n1", "GPU-a", Signal.FATAL_XID, T0 + 6 * HOUR, "79")
    timeline = _timeline(spells=(spell,), faults=(fault,))
    unheld = replay(timeline, rules, shipped)
    assert unheld.holds[0].start < fault.at < unheld.holds[0].end
    assert unheld.moves == ()  # no pods: the restricted device, on its ladder, ran nothing
    moved = replay(timeline, rules, shipped, {KEY: [(T0, T0 + 3 * DAY, "serve/tenant-0")]})
    assert [(m.at, m.reason) for m in moved.moves] == [(moved.moves[0].at, "FatalXid")]
    assert fault.at <= moved.moves[0].at
    assert moved.records[KEY].status.phase == Phase.RELEASED  # the move freed it: no wait for day 3
