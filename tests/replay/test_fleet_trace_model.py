"""The fleet benchmark's trace and policies (bench.fleet_causes, bench.fleet_policies).

Aspects: the trace places exactly the table's interruptions per cause, deterministically under a
seed; the causes no policy can see are those the pipeline sees nothing of; one card fault costs
node-cordon the node's seven healthy cards until the repair, and gpuhealth only the ladder after
it; the none policy runs work on the broken card until its repair; naive evicts nothing without
Unknown spells, and gpuhealth never evicts for Unknown; each mix places a pod on every card at
every moment, the training job's replaced at each restart of the job, a service's at its
redeploys and its node's outages, the cards of one service held by the same pod; a restricted
card's pod goes on running on it, so a fault gpuhealth does not act on costs work there.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter

import pytest

from backtest.inputs import replay_settings, rule_timings
from bench.fleet_causes import CAUSES, GPUS_PER_NODE, Incident, Knobs, Sight, Trace, trace
from bench.fleet_policies import account, inference, training
from responder.replay.engine import replay
from responder.replay.timeline import CheckTruth, Fault, Timeline, UnknownSpell

T0 = 1_800_000_000.0
QUIET = Knobs(unknown_per_node_day=0.0, relapse=0.0)


def test_the_trace_places_the_tables_interruptions_deterministically() -> None:
    first, again, other = (
        trace(QUIET, T0),
        trace(QUIET, T0),
        trace(Knobs(unknown_per_node_day=0.0, seed=7), T0),
    )
    placed = Counter(i.cause.name for i in first.incidents if not i.relapse)
    assert placed == {c.name: c.count for c in CAUSES}
    assert first == again
    assert [i.at for i in first.incidents] != [i.at for i in other.incidents]
    assert all(first.timeline.start <= i.at < first.timeline.end for i in first.incidents)


def test_causes_nobody_sees_are_those_that_show_nothing() -> None:
    blind = {c.name for c in CAUSES if c.sight == Sight.NOTHING}
    assert "Silent data corruption" in blind
    drawn = trace(QUIET, T0)
    assert len(drawn.timeline.faults) == sum(c.count for c in CAUSES if c.card)
    hosts = sum(c.count for c in CAUSES if c.sight == Sight.NODE_LEASE)
    assert len(drawn.timeline.lost) == hosts
    silent = [f for f in drawn.timeline.faults if f.signal.value == "none"]
    assert len(silent) == sum(c.count for c in CAUSES if c.card and c.sight == Sight.NOTHING)


def _one_fault(cause_name: str, hours: float) -> Trace:
    cause = next(c for c in CAUSES if c.name == cause_name)
    at, until = T0 + 3600.0, T0 + 3600.0 + hours * 3600.0
    incident = Incident(cause, at, "node-0000", "GPU-0000-3", until)
    timeline = Timeline(
        start=T0,
        end=T0 + 10 * 86400.0,
        eligible=2048 * GPUS_PER_NODE,
        checks=CheckTruth(120.0, 300.0),
        faults=(Fault(at, incident.node, incident.device, cause.signal, until, cause.detail),),
    )
    return Trace(timeline, (incident,), (), 0, 0)


def test_one_card_fault_costs_node_cordon_the_node_and_gpuhealth_the_ladder() -> None:
    drawn = _one_fault("Faulty GPU", 48.0)
    played = replay(drawn.timeline, rule_timings(), replay_settings())
    tallies = account(drawn, training(), played, detection_seconds=60.0)
    cordoned = 48.0 - 60.0 / 3600.0
    assert tallies["node-cordon"].withheld_healthy_hours == pytest.approx((GPUS_PER_NODE - 1) * cordoned)
    # After the repair: the ladder, and the rest of the backoff that the quarantine's expiries
    # while the card was still broken (each counted a failure) built up.
    ladder = replay_settings().policy
    after_repair = tallies["gpuhealth"].withheld_healthy_hours
    assert (ladder.stability_seconds + ladder.ramp_seconds) / 3600.0 <= after_repair
    assert after_repair < tallies["node-cordon"].withheld_healthy_hours / 20
    assert tallies["none"].failing_work_hours == pytest.approx(48.0)
    assert tallies["gpuhealth"].failing_work_hours <= (60.0 + drawn.timeline.move_seconds) / 3600.0
    assert tallies["gpuhealth"].interruptions == tallies["node-cordon"].interruptions == 1


def test_nobody_evicts_for_unknown_without_spells_and_gpuhealth_never_does() -> None:
    drawn = trace(QUIET, T0)
    mix = inference(QUIET.seed)
    played = replay(drawn.timeline, rule_timings(), replay_settings(), mix.placement(drawn))
    tallies = account(drawn, mix, played, detection_seconds=60.0)
    assert tallies["naive"].unknown_evictions == 0
    assert tallies["gpuhealth"].unknown_evictions == 0
    assert played.moves


def test_each_mix_keeps_every_card_held_by_its_own_pods() -> None:
    drawn = trace(QUIET, T0)
    start, end = drawn.timeline.start, drawn.timeline.end
    restarts = sorted({i.at for i in drawn.incidents} | {at for at, _ in drawn.planned})
    job = training().placement(drawn)[("node-0005", "GPU-0005-3")]
    assert [b for _, b, _ in job[:-1]] == restarts
    assert job[0][0] == start and job[-1][1] == end
    assert all(b == a for (_, b, _), (a, _, _) in itertools.pairwise(job))
    mix = inference(QUIET.seed, redeploy_days=7.0)
    served = mix.placement(drawn)
    card = 0
    for size in mix.sizes["node-0005"]:
        cards = [served[("node-0005", f"GPU-0005-{card + i}")] for i in range(size)]
        assert all(c == cards[0] for c in cards)  # one pod holds all of its service's cards
        assert cards[0][0][0] == start and cards[0][-1][1] == end
        assert max(b - a for a, b, _ in cards[0]) <= 7.0 * 86400.0
        card += size
    assert card == GPUS_PER_NODE
    with pytest.raises(KeyError):
        served[("node-0005", "GPU-0006-0")]


def test_a_restricted_card_keeps_its_pod_working_on_a_fault_gpuhealth_does_not_act_on() -> None:
    rules = rule_timings()
    drawn = _one_fault("GPU thermal interface + sensor", 48.0)
    (incident,) = drawn.incidents
    spell = UnknownSpell(T0, incident.node, (incident.device,), rules.unknown_window(0) + 600.0)
    drawn = dataclasses.replace(drawn, timeline=dataclasses.replace(drawn.timeline, spells=(spell,)))
    key = (incident.node, incident.device)
    unheld = replay(drawn.timeline, rules, replay_settings())
    held = replay(drawn.timeline, rules, replay_settings(), {key: [(T0, T0 + 5 * 86400.0, "serve/tenant-0")]})
    assert held.holds[0].action == "restrict" and held.holds[0].start < incident.at
    # Without pods, the restriction seems to keep all work off the card; its tenant's pod in fact
    # stays on it and runs on the failing card until the repair, as under none.
    assert account(drawn, training(), unheld, 60.0)["gpuhealth"].failing_work_hours == 0.0
    tallies = account(drawn, training(), held, 60.0)
    assert tallies["gpuhealth"].failing_work_hours == pytest.approx(tallies["none"].failing_work_hours)
    assert tallies["gpuhealth"].unknown_evictions == 0
