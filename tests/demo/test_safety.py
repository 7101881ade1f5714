"""The safety verdict of a run, judged over its journal (demo.safety).

Aspects covered: which actions a scenario's faults warrant (confirmed failures: quarantine;
an Unknown: restrict only when it lasts the whole tolerance window as played, a recover
cutting it short, overlapping faults making one spell; an application XID, a short Unknown
and an unreachable node: nothing). Over a journal: a clean story passes and lists what was
acted on; each invariant broken alone is one violation naming it (an action or record without
a warrant or before it, an eviction or migration for Unknown or for nothing, a node-wide
action, a second rule or record for a device, a pod evicted twice, a migration finished twice,
a release without a passed probe or canary, a warranted quarantine missing, the breaker sending
a release back, a GPU reset of a card no quarantine held or under a workload's running pod; a
reset of a quarantined card only a check's pod uses breaks nothing); a fixed-topology job's pods
on healthy devices may be evicted by a quarantine's migration; a warrant too late in the run, or
under a tripped breaker, is missed, not violated.
Unhealthy flapping: a flap is due at the episode that completes the rule's count within its
window (not one episode fewer, not spread over exactly the window, not episodes too short to be
seen, not a long episode, overlapping spells one episode); its quarantine is warranted, and
missing it is a violation, where flaps the rule does not catch are only missed.
The invariants of issue 17, over a full story (pods on the device, the move's start, checks with
the devices they ran on and their attempt, a person's release request, alerts, a health-source
outage) that breaks none of them, each then broken alone: a release while the driver reports the device
Unhealthy as the simulator plays the timeline, seen by no one or not (not a fault that begins
within the observation before the release; the spans follow timed spells, later spells, fatal
XIDs and lost GPUs until recover, flaps and a device-plugin node's broken stream);
a pod left on a quarantined device past its move's deadline (not when its move ended
Unrecoverable, nor under a tripped breaker, nor while the node's one move in flight holds it
back, nor once the device ramps); a check that ran on another device, or passed on none; a
requested release without every check passed in its own attempt; a delivered quarantine left
unenforced past the reaction while its alert fires and the breaker is closed (not when the alert
resolved, the breaker tripped or the rate limit holds it); a step up the ladder while the
health source is down (not one within a pass of the outage's start). A device with a firm
failure besides its transient ones must be quarantined from that failure on.
Properties: a release is a violation exactly when a passed probe or canary is missing since the
record was last quarantined; an eviction is a violation exactly when no quarantine (not a
restrict) held one of the pod's devices and no quarantine's move of its job was under way.
Exposure: a pod that started on a card inside its quarantine window (also as one of several cards
it got) is a violation naming the pod, the card, the record and the time, and is counted; a
holder's or a check's pod there, a pod started before the quarantine (or seen starting at its very
moment), once the card ramps or after its release, or on a restricted card, is not; a second
episode's window opens again when the record returns to Quarantined from the ramp.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from demo.journal import Device, Entry, Journal, Kind
from demo.safety import (
    Exposure,
    UnhealthyFlapping,
    UnknownBackoff,
    exposures,
    flapping_due,
    judge,
    reported_unhealthy,
    warranted_from,
    warrants,
)
from responder.ladder import CANARY, LADDER, PROBING, RAMP, STABILIZING, Rung
from responder.ladder import Kind as RungKind
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import resolve
from tests.support.ladders import check_names

SCENARIO = resolve(Path(__file__).with_name("safety-scenario.yaml"))
FATAL = (48, 79)
TOLERANCE = 300.0
GRACE = 120.0


def uuid(node: str, gpu: int) -> str:
    return gpu_uuid(node, gpu)


QUARANTINED = uuid("gpu-dp-0", 0)  # the fatal XID at 10 s
RESTRICTED = uuid("gpu-dra-0", 1)  # the 8-minute Unknown from 20 s: restrict from 320 s
SHORT = uuid("gpu-dra-0", 0)  # the 60-second Unknown
APP_XID = uuid("gpu-dp-0", 1)


def journal(ended_at: float = 500.0) -> Journal:
    devices = {
        uuid(node, i): Device(uuid(node, i), node, i, group.path)
        for node, group in SCENARIO.nodes.items()
        for i in range(group.gpus_per_node)
    }
    return Journal("demo-safety", "", 10.0, devices, ended_at=ended_at)


STORY_AT = {PROBING: 200.0, CANARY: 220.0, STABILIZING: 240.0, RAMP: 300.0}
"""When each shipped rung begins in the stories below (Released at 360 s)."""
STORY_PASSED = {PROBING: 210.0, CANARY: 230.0}
"""When each shipped check is journalled in the stories."""


def climbed(
    j: Journal,
    phase: Callable[[Rung, float], dict[str, str]],
    check: Callable[[Rung], dict[str, str] | None],
    starts: dict[str, float] = STORY_AT,
) -> None:
    """The quarantined card walks every rung of LADDER: a shipped rung begins at its time in
    `starts`, its check journalled at its STORY_PASSED time; a rung the shipped ladder does not
    have begins a second after the one before it ended, its check journalled a second in.
    `phase(rung, at)` gives a phase entry's details, `check(rung)` a check's (None: no check
    journalled)."""
    at = 0.0
    for rung in LADDER.rungs:
        at = starts.get(rung.phase, at + 1)
        j.record(at, Kind.PHASE, rung.phase, "gpu-dp-0", QUARANTINED, **phase(rung, at))
        if rung.kind == RungKind.CHECK:
            at = STORY_PASSED.get(rung.phase, at + 1)
            detail = check(rung)
            if detail is not None:
                j.record(at, Kind.CHECK, rung.name, "gpu-dp-0", QUARANTINED, **detail)


def story(j: Journal, *, checks: tuple[str, ...] | None = None) -> Journal:
    """The clean run: quarantine, migration, release through every phase; restrict, no eviction.
    `checks`: the checks that pass (all of the ladder's unless given)."""
    q, r = "rec-q", "rec-r"
    passing = check_names() if checks is None else checks
    j.record(80, Kind.DELIVERY, "responder", "gpu-dp-0", QUARANTINED, status="firing", action="quarantine")
    j.record(81, Kind.PHASE, "Pending", "gpu-dp-0", QUARANTINED, record=q, action="quarantine")
    j.record(81, Kind.ENFORCED, "quarantine", "gpu-dp-0", QUARANTINED, annotation="a")
    j.record(81, Kind.PHASE, "Quarantined", "gpu-dp-0", QUARANTINED, record=q, action="quarantine")
    j.record(85, Kind.NOTE, "move-started", "gpu-dp-0", QUARANTINED, record=q, job="ns/serve")
    j.record(100, Kind.EVICTION, "ns/serve-1", "gpu-dp-0", QUARANTINED, job="ns/serve", devices=QUARANTINED)
    j.record(101, Kind.MIGRATION, "succeeded", "gpu-dp-0", QUARANTINED, record=q, job="ns/serve")
    climbed(
        j,
        lambda rung, at: {"record": q, "action": "quarantine"},
        lambda rung: {"record": q, "result": "passed"} if rung.name in passing else None,
    )
    j.record(360, Kind.PHASE, "Released", "gpu-dp-0", QUARANTINED, record=q, action="quarantine")
    j.record(360, Kind.LIFTED, "quarantine", "gpu-dp-0", QUARANTINED, annotation="a")
    j.record(330, Kind.DELIVERY, "responder", "gpu-dra-0", RESTRICTED, status="firing", action="restrict")
    j.record(331, Kind.PHASE, "Pending", "gpu-dra-0", RESTRICTED, record=r, action="restrict")
    j.record(331, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-r")
    j.record(331, Kind.PHASE, "Quarantined", "gpu-dra-0", RESTRICTED, record=r, action="restrict")
    return j


def verdict(j: Journal):  # type: ignore[no-untyped-def]
    return judge(j, SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE, grace=GRACE)


def test_faults_warrant_quarantine_for_failures_and_restrict_only_for_long_unknowns() -> None:
    assert warrants(SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE) == {
        ("gpu-dp-0", 0): {"quarantine"},
        ("gpu-dra-0", 1): {"restrict"},
    }
    assert ("gpu-dra-0", 1) not in warrants(SCENARIO, fatal_xids=FATAL, tolerance=600.0)


def test_an_unknown_cut_short_by_a_recover_warrants_nothing_and_overlaps_add_up() -> None:
    scenario = resolve(
        {
            "name": "spells",
            "fleet": [{"name": "gpu-dra", "count": 2, "gpusPerNode": 2, "path": "dra"}],
            "timeline": [
                {
                    "at": "0s",
                    "fault": "device-unknown",
                    "device": {"node": "gpu-dra-0", "gpu": 0},
                    "duration": "8m",
                },
                {"at": "30s", "fault": "recover", "device": {"node": "gpu-dra-0", "gpu": 0}},
                {
                    "at": "0s",
                    "fault": "device-unknown",
                    "device": {"node": "gpu-dra-0", "gpu": 1},
                    "duration": "200s",
                },
                {
                    "at": "150s",
                    "fault": "device-unknown",
                    "device": {"node": "gpu-dra-0", "gpu": 1},
                    "duration": "200s",
                },
                {"at": "0s", "fault": "health-stream-broken", "node": "gpu-dra-1"},
                {"at": "1m", "fault": "recover", "node": "gpu-dra-1"},
            ],
        }
    )
    # gpu-1 stayed Unknown from 0 s to 350 s: two faults, one spell past the tolerance.
    assert warrants(scenario, fatal_xids=FATAL, tolerance=TOLERANCE) == {("gpu-dra-0", 1): {"restrict"}}


def test_a_repeated_unknown_is_warranted_a_restriction_after_its_halved_window_only() -> None:
    def unknown(at: str, gpu: int, duration: str) -> dict[str, object]:
        device = {"node": "gpu-dra-0", "gpu": gpu}
        return {"at": at, "fault": "device-unknown", "device": device, "duration": duration}

    scenario = resolve(
        {
            "name": "repeats",
            "fleet": [{"name": "gpu-dra", "count": 1, "gpusPerNode": 3, "path": "dra"}],
            "timeline": [
                # gpu-0: 3m, then 3m again 2m later: the second window is 150 s, so from 300+150 s.
                unknown("0s", 0, "3m"),
                unknown("5m", 0, "3m"),
                # gpu-1: the same, but the repeat comes after the 1h repeat window: never warranted.
                unknown("0s", 1, "3m"),
                unknown("64m", 1, "3m"),
                # gpu-2: one 3m spell: no restriction, whatever the backoff.
                unknown("0s", 2, "3m"),
            ],
        }
    )
    backoff = UnknownBackoff(factor=0.5, floor=150.0, repeat_window=3600.0)
    assert warranted_from(scenario, fatal_xids=FATAL, tolerance=TOLERANCE, backoff=backoff) == {
        (("gpu-dra-0", 0), "restrict"): 450.0
    }
    # Without the backoff every spell gets the whole window: nothing is warranted.
    assert warrants(scenario, fatal_xids=FATAL, tolerance=TOLERANCE) == {}


def test_a_clean_story_passes_and_says_what_was_acted_on() -> None:
    result = verdict(story(journal()))
    assert result.violations == () and result.ok
    assert result.acted == (("gpu-dp-0/gpu-0", "quarantine"), ("gpu-dra-0/gpu-1", "restrict"))
    assert result.missed == ()


Mutation = Callable[[Journal], object]

BROKEN: list[tuple[str, Mutation, str]] = [
    (
        "an eviction for Unknown",
        lambda j: j.record(
            340, Kind.EVICTION, "lab/nb-0", "gpu-dra-0", RESTRICTED, job="lab/nb", devices=RESTRICTED
        ),
        "evicted for an Unknown (restrict)",
    ),
    (
        "an eviction for nothing",
        lambda j: j.record(90, Kind.EVICTION, "lab/x-0", "gpu-dra-0", SHORT, job="lab/x", devices=SHORT),
        "evicted for no quarantine",
    ),
    (
        "a migration for Unknown",
        lambda j: j.record(
            340, Kind.MIGRATION, "succeeded", "gpu-dra-0", RESTRICTED, record="rec-r", job="lab/nb"
        ),
        "for an Unknown (restrict)",
    ),
    (
        "a node-wide action",
        lambda j: j.record(90, Kind.NODE_ACTION, "cordon", "gpu-dp-0", key="x"),
        "node-wide cordon",
    ),
    (
        "a second rule for a device",
        lambda j: j.record(335, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-r2"),
        "a second DeviceTaintRule rule-r2",
    ),
    (
        "a second record for a device",
        lambda j: j.record(
            332, Kind.PHASE, "Pending", "gpu-dra-0", RESTRICTED, record="rec-r2", action="restrict"
        ),
        "a second record rec-r2",
    ),
    (
        "a pod evicted twice",
        lambda j: j.record(105, Kind.EVICTION, "ns/serve-1", "gpu-dp-0", QUARANTINED, job="ns/serve"),
        "evicted a second time",
    ),
    (
        "a migration finished twice",
        lambda j: j.record(
            150, Kind.MIGRATION, "succeeded", "gpu-dp-0", QUARANTINED, record="rec-q", job="ns/serve"
        ),
        "finished twice",
    ),
    (
        "a record the faults do not warrant",
        lambda j: j.record(
            90, Kind.PHASE, "Pending", "gpu-dp-0", APP_XID, record="rec-x", action="quarantine"
        ),
        "record rec-x would quarantine gpu-dp-0/gpu-1, but no fault on it",
    ),
    (
        "a restrict before the tolerance ran",
        lambda j: j.record(
            100, Kind.PHASE, "Pending", "gpu-dra-0", RESTRICTED, record="rec-early", action="restrict"
        ),
        "nothing warranted it yet",
    ),
    (
        "a quarantine where only restrict is warranted",
        lambda j: j.record(
            340, Kind.DELIVERY, "responder", "gpu-dra-0", RESTRICTED, status="firing", action="quarantine"
        ),
        "its faults warrant restrict",
    ),
    (
        "an enforcement without a warrant",
        lambda j: j.record(90, Kind.ENFORCED, "quarantine", "gpu-dra-0", SHORT, rule="rule-s"),
        "gpu-dra-0/gpu-0 was quarantined, but no fault warranted it",
    ),
    (
        "a GPU reset of a card no quarantine held",
        lambda j: j.record(90, Kind.RESET, "started", "gpu-dra-0", SHORT, request="r-1"),
        "a GPU reset of gpu-dra-0/gpu-0, which no quarantine held",
    ),
    (
        "a GPU reset under running work",
        lambda j: (
            j.record(
                150, Kind.POD, "running", "gpu-dp-0", QUARANTINED, pod="ns/other-0", devices=QUARANTINED
            ),
            j.record(190, Kind.RESET, "started", "gpu-dp-0", QUARANTINED, request="r-2"),
        ),
        "a GPU reset of gpu-dp-0/gpu-0 under running work (ns/other-0)",
    ),
    (
        "the breaker sending a release back",
        lambda j: (
            j.record(225, Kind.BREAKER, "tripped", trigger="rate"),
            j.record(226, Kind.PHASE, "Deferred", "gpu-dp-0", QUARANTINED, record="rec-q", why="BreakerOpen"),
        ),
        "the breaker sent gpu-dp-0/gpu-0's release back",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "message"), BROKEN, ids=[b[0] for b in BROKEN])
def test_each_broken_invariant_is_one_violation_naming_it(case: str, mutate: Mutation, message: str) -> None:
    j = story(journal())
    mutate(j)
    violations = verdict(j).violations
    assert len(violations) >= 1 and any(message in v for v in violations), (case, violations)


def test_a_reset_of_a_quarantined_card_nothing_runs_on_breaks_nothing() -> None:
    # The reset hand-off's rung: the card is Quarantined and free (its pod moved off at 100 s);
    # a check's pod on it is no workload.
    j = story(journal())
    j.record(
        150, Kind.POD, "running", "gpu-dp-0", QUARANTINED, pod="x/probe-0", devices=QUARANTINED, check="probe"
    )
    j.record(190, Kind.RESET, "started", "gpu-dp-0", QUARANTINED, request="r-1")
    j.record(195, Kind.RESET, "succeeded", "gpu-dp-0", QUARANTINED, request="r-1", reason="GPUResetSucceeded")
    assert verdict(j).violations == ()


def test_a_release_without_its_canary_and_a_missing_warranted_quarantine_are_violations() -> None:
    result = verdict(story(journal(), checks=tuple(c for c in check_names() if c != "canary")))
    assert result.violations == ("t+360s gpu-dp-0/gpu-0 released without a passed canary",)
    missing = journal()
    missing.record(0, Kind.NOTE, "nothing happened")
    result = verdict(missing)
    assert any(
        "gpu-dp-0/gpu-0: quarantine warranted from t+10s, but no record by t+130s" in v
        for v in result.violations
    )
    assert any("gpu-dra-0/gpu-1: restrict warranted" in v for v in result.violations)


def test_warrants_too_late_in_the_run_or_under_a_tripped_breaker_are_missed_not_violated() -> None:
    short = journal(ended_at=400.0)  # the restrict is warranted from 320 s, grace 120 s: too late
    short.record(50, Kind.PHASE, "Pending", "gpu-dp-0", QUARANTINED, record="q", action="quarantine")
    result = verdict(short)
    assert result.violations == () and result.missed == (("gpu-dra-0/gpu-1", "restrict"),)
    tripped = journal()
    tripped.record(5, Kind.BREAKER, "tripped", trigger="capacity")
    assert verdict(tripped).violations == ()
    assert len(verdict(tripped).missed) == 2


FLAPS = resolve(
    {
        "name": "flaps",
        "fleet": [
            {"name": "gpu-dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"},
            {"name": "gpu-dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
        ],
        "timeline": [
            # Three 20 s episodes from 10 s: a flap, complete at 90 s.
            {
                "at": "10s",
                "fault": "flap",
                "device": {"node": "gpu-dp-0", "gpu": 0},
                "times": 3,
                "period": "40s",
            },
            # One episode short of it.
            {
                "at": "10s",
                "fault": "flap",
                "device": {"node": "gpu-dp-0", "gpu": 1},
                "times": 2,
                "period": "40s",
            },
            # Episodes too short for the rules' evaluations to be sure to see them.
            {
                "at": "10s",
                "fault": "flap",
                "device": {"node": "gpu-dra-0", "gpu": 1},
                "times": 6,
                "period": "10s",
            },
            # Three short Unhealthy spells exactly the window apart from first to last.
            *(
                {
                    "at": at,
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dra-0", "gpu": 0},
                    "duration": "20s",
                }
                for at in ("0s", "900s", "1800s")
            ),
        ],
    }
)
FLAPPING = UnhealthyFlapping(episodes=3, window=1800.0, seen_from=20.0)
UNHEALTHY_FOR = 60.0


def flaps_journal() -> Journal:
    devices = {
        uuid(node, i): Device(uuid(node, i), node, i, group.path)
        for node, group in FLAPS.nodes.items()
        for i in range(group.gpus_per_node)
    }
    return Journal("flaps", "", 10.0, devices, ended_at=2400.0)


def flaps_verdict(j: Journal, flapping: UnhealthyFlapping | None = FLAPPING):  # type: ignore[no-untyped-def]
    return judge(
        j,
        FLAPS,
        fatal_xids=FATAL,
        tolerance=TOLERANCE,
        unhealthy_for=UNHEALTHY_FOR,
        grace=GRACE,
        flapping=flapping,
    )


def test_a_flap_is_due_at_the_episode_that_completes_the_count_within_the_window() -> None:
    # Not gpu-dp-0/1 (two episodes), nor gpu-dra-0/1 (5 s episodes), nor gpu-dra-0/0 (the third
    # starts exactly the window after the first).
    assert flapping_due(FLAPS, unhealthy_for=UNHEALTHY_FOR, rule=FLAPPING) == {("gpu-dp-0", 0): 90.0}
    wider = UnhealthyFlapping(episodes=3, window=1801.0, seen_from=20.0)
    assert flapping_due(FLAPS, unhealthy_for=UNHEALTHY_FOR, rule=wider) == {
        ("gpu-dp-0", 0): 90.0,
        ("gpu-dra-0", 0): 1800.0,
    }


def test_a_long_episode_counts_for_nothing_and_overlapping_spells_are_one_episode() -> None:
    long = resolve(
        {
            "name": "long",
            "fleet": [{"name": "gpu-dra", "count": 1, "gpusPerNode": 1, "path": "dra"}],
            "timeline": [
                # Short, then 100 s-190 s as one episode of 90 s (two spells overlapping), short.
                {
                    "at": at,
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dra-0", "gpu": 0},
                    "duration": d,
                }
                for at, d in (("0s", "20s"), ("100s", "90s"), ("150s", "20s"), ("300s", "20s"))
            ],
        }
    )
    assert flapping_due(long, unhealthy_for=UNHEALTHY_FOR, rule=FLAPPING) == {}
    # Under a 2m `for:` the 90 s episode is a short one too: three of them by 300 s.
    assert flapping_due(long, unhealthy_for=120.0, rule=FLAPPING) == {("gpu-dra-0", 0): 300.0}


def test_a_flapping_quarantine_is_warranted_and_a_missing_one_is_a_violation() -> None:
    flapper = uuid("gpu-dp-0", 0)
    answered = flaps_journal()
    answered.record(
        95,
        Kind.DELIVERY,
        "responder",
        "gpu-dp-0",
        flapper,
        status="firing",
        action="quarantine",
        alertname="GPUDeviceUnhealthyFlapping",
    )
    answered.record(96, Kind.PHASE, "Pending", "gpu-dp-0", flapper, record="rec-f", action="quarantine")
    answered.record(96, Kind.ENFORCED, "quarantine", "gpu-dp-0", flapper, annotation="a")
    answered.record(96, Kind.PHASE, "Quarantined", "gpu-dp-0", flapper, record="rec-f", action="quarantine")
    result = flaps_verdict(answered)
    assert result.violations == ()
    assert ("gpu-dp-0/gpu-0", "quarantine") in result.acted

    silent = flaps_journal()
    silent.record(0, Kind.NOTE, "nothing happened")
    assert flaps_verdict(silent).violations == (
        "gpu-dp-0/gpu-0: quarantine warranted from t+90s (Unhealthy flapping), but no record by t+210s",
    )
    # Flaps the rule does not catch, and every flap without the rule, may go unanswered.
    assert {"gpu-dp-0/gpu-1", "gpu-dra-0/gpu-0", "gpu-dra-0/gpu-1"} <= {
        w for w, _ in flaps_verdict(silent).missed
    }
    assert flaps_verdict(silent, flapping=None).violations == ()


def test_a_fixed_topology_jobs_pods_on_healthy_devices_move_with_it() -> None:
    j = story(journal())
    healthy = uuid("gpu-dp-0", 1)
    j.record(100, Kind.EVICTION, "ns/serve-2", "gpu-dp-0", healthy, job="ns/serve", devices=healthy)
    assert verdict(j).violations == ()


def test_a_job_level_move_awaiting_its_replacements_justifies_its_evictions_and_nothing_else() -> None:
    """A move that awaits its job's replacements has no outcome yet (maybe never): its evictions
    of the job's pods on healthy devices are still its own. An eviction of that job outside its
    move, of another job, or by a move for a restrict, is for no quarantine."""
    q, r = "rec-q2", "rec-r2"
    healthy = [APP_XID, uuid("gpu-dra-1", 0)]

    def run(*evictions: tuple[float, str, str], resolution: float = 0.0) -> tuple[str, ...]:
        j = dataclasses.replace(journal(ended_at=700.0), resolution_seconds=resolution)
        for phase, episode in (("Pending", "0"), ("Quarantined", "1")):
            j.record(
                60, Kind.PHASE, phase, "gpu-dp-0", QUARANTINED, record=q, action="quarantine", episode=episode
            )
        j.record(
            63,
            Kind.NOTE,
            "move-started",
            "gpu-dp-0",
            QUARANTINED,
            record=q,
            job="research/train",
            episode="1",
        )
        # The restrict of the long Unknown moves its own job's pods: never a justification.
        j.record(331, Kind.PHASE, "Pending", "gpu-dra-0", RESTRICTED, record=r, action="restrict")
        j.record(331, Kind.PHASE, "Quarantined", "gpu-dra-0", RESTRICTED, record=r, action="restrict")
        j.record(332, Kind.NOTE, "move-started", "gpu-dra-0", RESTRICTED, record=r, job="lab/nb", episode="1")
        for i, (at, job, device) in enumerate(evictions):
            j.record(at, Kind.EVICTION, f"{job}-{i}", "gpu-dra-0", device, job=job, devices=device)
        return tuple(
            v
            for v in judge(j, SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE, grace=GRACE).violations
            if "evicted for" in v
        )

    # No MIGRATION entry ever: the move still awaits its replacements at the end.
    assert run((82, "research/train", healthy[0]), (83, "research/train", healthy[1])) == ()
    # Seen in either order within one observation: the eviction may be journaled first.
    assert run((58, "research/train", healthy[0]), resolution=5.0) == ()
    assert run((58, "research/train", healthy[0])) == (
        "t+58s pod research/train-0 on gpu-dp-0/gpu-1 evicted for no quarantine",
    )
    assert run((40, "research/train", healthy[0])) == (
        "t+40s pod research/train-0 on gpu-dp-0/gpu-1 evicted for no quarantine",
    )
    assert run((90, "ns/other", healthy[1])) == (
        "t+90s pod ns/other-0 on gpu-dra-1/gpu-0 evicted for no quarantine",
    )
    assert run((340, "lab/nb", SHORT)) == (
        "t+340s pod lab/nb-0 on gpu-dra-0/gpu-0 evicted for no quarantine",
    )


def test_a_move_justifies_no_eviction_after_its_outcome_or_its_episode() -> None:
    healthy = uuid("gpu-dp-0", 1)
    j = story(journal())  # rec-q's move of ns/serve: started t+85, succeeded t+101
    j.record(150, Kind.EVICTION, "ns/serve-2", "gpu-dp-0", healthy, job="ns/serve", devices=healthy)
    assert verdict(j).violations == ("t+150s pod ns/serve-2 on gpu-dp-0/gpu-1 evicted for no quarantine",)
    # A move under way that outlives its quarantine episode (the record ramps) holds nothing then.
    j = story(journal())
    j.record(200, Kind.NOTE, "move-started", "gpu-dp-0", QUARANTINED, record="rec-q", job="ns/b", episode="1")
    j.record(299, Kind.EVICTION, "ns/b-0", "gpu-dp-0", healthy, job="ns/b", devices=healthy)
    j.record(305, Kind.EVICTION, "ns/b-1", "gpu-dp-0", healthy, job="ns/b", devices=healthy)
    assert verdict(j).violations == ("t+305s pod ns/b-1 on gpu-dp-0/gpu-1 evicted for no quarantine",)


@given(
    results=st.fixed_dictionaries(
        {name: st.sampled_from(["passed", "failed", None]) for name in check_names()}
    ),
    earlier=st.booleans(),
)
def test_a_release_is_a_violation_exactly_when_a_check_is_missing(
    results: dict[str, str | None], earlier: bool
) -> None:
    j = story(journal(), checks=())
    if earlier:
        # Checks that passed in an earlier attempt do not count after a new quarantine.
        for i, name in enumerate(check_names()):
            j.record(150 + i, Kind.CHECK, name, "gpu-dp-0", QUARANTINED, record="rec-q", result="passed")
        j.record(
            150 + len(results), Kind.PHASE, "Quarantined", "gpu-dp-0", QUARANTINED, record="rec-q",
            action="quarantine",
        )  # fmt: skip
    for i, (name, result) in enumerate(results.items()):  # the probe's at 210 s, the canary's at 230 s
        if result:
            j.record(210 + 20 * i, Kind.CHECK, name, "gpu-dp-0", QUARANTINED, record="rec-q", result=result)
    released_badly = [v for v in verdict(j).violations if "released without" in v]
    assert bool(released_badly) == any(result != "passed" for result in results.values())


@given(
    evictions=st.lists(
        st.tuples(
            st.sampled_from([QUARANTINED, RESTRICTED, SHORT, APP_XID]),
            st.floats(min_value=0, max_value=499),
            st.sampled_from(["ns/serve", "lab/nb", "ns/other"]),
        ),
        max_size=6,
    )
)
def test_an_eviction_is_a_violation_exactly_when_no_quarantine_covers_it(
    evictions: list[tuple[str, float, str]],
) -> None:
    j = story(journal())
    expected = 0
    for i, (device, at, job) in enumerate(evictions):
        j.record(at, Kind.EVICTION, f"pod-{i}", "n", device, job=job, devices=device)
        held = device == QUARANTINED and 81 <= at < 360
        # The quarantine's move of this job, under way from t+85 to t+101.
        moved = job == "ns/serve" and 85 <= at <= 101
        expected += not (held or moved)
    assert sum("evicted for" in v for v in verdict(j).violations) == expected


# ----- the invariants of issue 17 ------------------------------------------------------------

OTHER = uuid("gpu-dp-0", 1)
DEADLINE = 60.0
REACTION = 60.0
PASS = 5.0


def full_story(j: Journal, *, canary_attempt: str = "1") -> Journal:
    """Every new invariant held: the work moved, checks on the device in the released attempt,
    a person's request honoured through them, no step while the health source was down."""
    q = "rec-q"
    j.record(12, Kind.HEALTH, "Unhealthy", "gpu-dp-0", QUARANTINED)
    j.record(60, Kind.ALERT_FIRING, "GPUDeviceXid", "gpu-dp-0", QUARANTINED, action="quarantine")
    j.record(
        80,
        Kind.DELIVERY,
        "responder",
        "gpu-dp-0",
        QUARANTINED,
        status="firing",
        action="quarantine",
        alertname="GPUDeviceXid",
    )
    pod = {"pod": "ns/serve-1", "job": "ns/serve", "devices": QUARANTINED}
    j.record(70, Kind.POD, "running", "gpu-dp-0", QUARANTINED, **pod)
    j.record(70, Kind.POD_STARTED, "ns/serve-1", "gpu-dp-0", QUARANTINED, devices=QUARANTINED)
    phase = {"record": q, "action": "quarantine", "episode": "1"}
    j.record(81, Kind.PHASE, "Pending", "gpu-dp-0", QUARANTINED, **{**phase, "episode": "0"})
    j.record(81, Kind.ENFORCED, "quarantine", "gpu-dp-0", QUARANTINED, annotation="a")
    j.record(81, Kind.PHASE, "Quarantined", "gpu-dp-0", QUARANTINED, **phase, attempt="0")
    j.record(85, Kind.NOTE, "move-started", "gpu-dp-0", QUARANTINED, record=q, job="ns/serve", episode="1")
    j.record(100, Kind.EVICTION, "ns/serve-1", "gpu-dp-0", QUARANTINED, job="ns/serve", devices=QUARANTINED)
    j.record(100, Kind.POD, "stopped", "gpu-dp-0", QUARANTINED, **pod)
    j.record(101, Kind.MIGRATION, "succeeded", "gpu-dp-0", QUARANTINED, record=q, job="ns/serve", episode="1")
    j.record(
        102,
        Kind.POD_STARTED,
        "gpuhealth-system/hold-q",
        "gpu-dp-0",
        QUARANTINED,
        devices=QUARANTINED,
        holder=q,
    )
    j.record(150, Kind.HEALTH, "Healthy", "gpu-dp-0", QUARANTINED)
    j.record(150, Kind.ALERT_RESOLVED, "GPUDeviceXid", "gpu-dp-0", QUARANTINED)
    j.record(160, Kind.HEALTH_SOURCE, "down")
    j.record(190, Kind.HEALTH_SOURCE, "up")
    check = {"record": q, "attempt": "1", "ranOn": QUARANTINED, "result": "passed"}
    probe = {"pod": "gpuhealth/probe-x", "job": "gpuhealth/probe", "devices": QUARANTINED, "check": "probe"}
    j.record(205, Kind.POD, "running", "gpu-dp-0", QUARANTINED, **probe)
    j.record(
        205,
        Kind.POD_STARTED,
        "gpuhealth/probe-x",
        "gpu-dp-0",
        QUARANTINED,
        devices=QUARANTINED,
        check="probe",
    )
    j.record(210, Kind.POD, "stopped", "gpu-dp-0", QUARANTINED, **probe)
    j.record(250, Kind.REQUEST, "requested", "gpu-dp-0", QUARANTINED, record=q, actor="person/ana")
    j.record(250, Kind.REQUEST, "honoured", "gpu-dp-0", QUARANTINED, record=q, reason="Honoured")
    asked = {**phase, "attempt": "1", "requested": "person/ana"}
    climbed(
        j,
        lambda rung, at: asked if at > 250 else {**phase, "attempt": "1"},
        lambda rung: {**check, "attempt": canary_attempt} if rung.name == "canary" else check,
        starts={**STORY_AT, PROBING: 162.0},  # the probe within a pass of the source's outage
    )
    j.record(
        310,
        Kind.POD,
        "running",
        "gpu-dp-0",
        QUARANTINED,
        pod="ns/opted-0",
        job="ns/opted",
        devices=QUARANTINED,
    )
    j.record(310, Kind.POD_STARTED, "ns/opted-0", "gpu-dp-0", QUARANTINED, devices=QUARANTINED)
    j.record(360, Kind.PHASE, "Released", "gpu-dp-0", QUARANTINED, **asked)
    j.record(360, Kind.LIFTED, "quarantine", "gpu-dp-0", QUARANTINED, annotation="a")
    r = "rec-r"
    j.record(330, Kind.DELIVERY, "responder", "gpu-dra-0", RESTRICTED, status="firing", action="restrict")
    j.record(331, Kind.PHASE, "Pending", "gpu-dra-0", RESTRICTED, record=r, action="restrict")
    j.record(331, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-r")
    j.record(331, Kind.PHASE, "Quarantined", "gpu-dra-0", RESTRICTED, record=r, action="restrict")
    # A restrict never moves work: a pod staying on it is no violation.
    j.record(
        335, Kind.POD, "running", "gpu-dra-0", RESTRICTED, pod="lab/nb-0", job="lab/nb", devices=RESTRICTED
    )
    j.record(335, Kind.POD_STARTED, "lab/nb-0", "gpu-dra-0", RESTRICTED, devices=RESTRICTED)
    return j


def full_verdict(j: Journal, scenario=SCENARIO):  # type: ignore[no-untyped-def]
    return judge(
        j,
        scenario,
        fatal_xids=FATAL,
        tolerance=TOLERANCE,
        grace=GRACE,
        move_deadline=DEADLINE,
        reaction=REACTION,
        pass_seconds=PASS,
    )


def test_the_full_story_breaks_none_of_the_new_invariants() -> None:
    result = full_verdict(full_story(journal()))
    assert result.violations == ()
    assert result.acted == (("gpu-dp-0/gpu-0", "quarantine"), ("gpu-dra-0/gpu-1", "restrict"))


def _late_pod(j: Journal, *, job: str = "ns/late") -> Entry:
    return j.record(
        120, Kind.POD, "running", "gpu-dp-0", QUARANTINED, pod="ns/late-0", job=job, devices=QUARANTINED
    )


NEW_BROKEN: list[tuple[str, Mutation, str]] = [
    (
        "a pod left on the device with no move",
        _late_pod,
        "t+180s pod ns/late-0 still on quarantined gpu-dp-0/gpu-0 (60s after t+120s; no move started)",
    ),
    (
        "a pod left on the device past its move's deadline",
        lambda j: (
            _late_pod(j),
            j.record(
                130,
                Kind.NOTE,
                "move-started",
                "gpu-dp-0",
                QUARANTINED,
                record="rec-q",
                job="ns/late",
                episode="1",
            ),
            j.record(
                150,
                Kind.MIGRATION,
                "succeeded",
                "gpu-dp-0",
                QUARANTINED,
                record="rec-q",
                job="ns/late",
                episode="1",
            ),
        ),
        "t+190s pod ns/late-0 still on quarantined gpu-dp-0/gpu-0 (60s after t+120s; its move started "
        "t+130s)",
    ),
    (
        "a check that ran on another device",
        lambda j: j.record(
            212,
            Kind.CHECK,
            "probe",
            "gpu-dp-0",
            QUARANTINED,
            record="rec-q",
            attempt="1",
            ranOn=OTHER,
            result="passed",
        ),
        "t+212s the probe of gpu-dp-0/gpu-0 (passed) ran on gpu-dp-0/gpu-1",
    ),
    (
        "a check that passed on no device",
        lambda j: j.record(
            212,
            Kind.CHECK,
            "probe",
            "gpu-dp-0",
            QUARANTINED,
            record="rec-q",
            attempt="1",
            ranOn="",
            result="passed",
        ),
        "t+212s the probe of gpu-dp-0/gpu-0 passed with no pod seen on the device",
    ),
    (
        "a delivered quarantine left unenforced",
        lambda j: (
            j.record(365, Kind.ALERT_FIRING, "GPUDeviceXid", "gpu-dp-0", QUARANTINED),
            j.record(
                370,
                Kind.DELIVERY,
                "responder",
                "gpu-dp-0",
                QUARANTINED,
                status="firing",
                action="quarantine",
                alertname="GPUDeviceXid",
            ),
        ),
        "t+370s GPUDeviceXid fired for gpu-dp-0/gpu-0 and reached the responder, but the device was "
        "not enforced by t+430s with the breaker closed",
    ),
    (
        "a step up the ladder while the health source is down",
        # Down over the canary's rung entered at 220 s only (not over the rungs after it).
        lambda j: (j.record(212, Kind.HEALTH_SOURCE, "down"), j.record(225, Kind.HEALTH_SOURCE, "up")),
        "t+220s gpu-dp-0/gpu-0 stepped Probing -> Canary while the responders' health source was down",
    ),
]


@pytest.mark.parametrize(("case", "mutate", "message"), NEW_BROKEN, ids=[b[0] for b in NEW_BROKEN])
def test_each_new_invariant_broken_alone_is_a_violation_naming_it(
    case: str, mutate: Mutation, message: str
) -> None:
    j = full_story(journal())
    mutate(j)
    violations = full_verdict(j).violations
    assert len(violations) == 1 and message in violations[0], (case, violations)


def test_a_requested_release_needs_every_check_passed_in_its_own_attempt() -> None:
    result = full_verdict(full_story(journal(), canary_attempt="0"))
    assert result.violations == (
        "t+360s gpu-dp-0/gpu-0 released at person/ana's request without a passed canary in attempt 1",
    )


def test_a_pod_left_behind_is_excused_by_an_unrecoverable_move_a_tripped_breaker_or_a_busy_node() -> None:
    def late(*also: Callable[[Journal], object]) -> tuple[str, ...]:
        j = full_story(journal())
        _late_pod(j)
        for change in also:
            change(j)
        return full_verdict(j).violations

    assert late() != ()
    unrecoverable = lambda j: j.record(  # noqa: E731
        170,
        Kind.MIGRATION,
        "unrecoverable",
        "gpu-dp-0",
        QUARANTINED,
        record="rec-q",
        job="ns/late",
        episode="1",
    )
    assert late(unrecoverable) == ()
    assert late(lambda j: j.record(150, Kind.BREAKER, "tripped", trigger="rate")) == ()
    # Another device's move on the node was in flight: the node's one slot holds this one back.
    busy = lambda j: j.record(  # noqa: E731
        110, Kind.NOTE, "move-started", "gpu-dp-0", OTHER, record="rec-o", job="ns/other", episode="1"
    )
    assert late(busy) == ()
    # Gone before the deadline: no violation.
    gone = lambda j: j.record(  # noqa: E731
        175, Kind.POD, "stopped", "gpu-dp-0", QUARANTINED, pod="ns/late-0", job="ns/late", devices=QUARANTINED
    )
    assert late(gone) == ()


def _holder(j: Journal, what: str, at: float) -> None:
    j.record(
        at, Kind.POD, what, "gpu-dp-0", QUARANTINED,
        pod="gpuhealth-system/rec-q-hold-x", job="", devices=QUARANTINED, holder="rec-q",
    )  # fmt: skip


def test_gpuhealth_s_holder_on_the_card_is_never_a_pod_left_behind() -> None:
    j = full_story(journal())
    _holder(j, "running", 120)
    _holder(j, "stopped", 300)  # gone when the card ramps
    assert full_verdict(j).violations == ()


def test_a_holder_that_outlasts_its_record_s_hold_is_a_violation() -> None:
    j = full_story(journal())
    _holder(j, "running", 120)
    assert full_verdict(j).violations == (
        "t+360s holder gpuhealth-system/rec-q-hold-x still on gpu-dp-0/gpu-0 200s after its record's "
        "hold ended at t+300s",
    )


def test_a_release_while_the_driver_reports_unhealthy_is_a_violation_even_unseen() -> None:
    scenario = resolve(
        {
            "name": "relapse",
            "fleet": [
                {"name": "gpu-dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"},
                {"name": "gpu-dra", "count": 2, "gpusPerNode": 2, "path": "dra"},
            ],
            "timeline": [
                {"at": "10s", "fault": "xid", "device": {"node": "gpu-dp-0", "gpu": 0}, "xid": 79},
                {"at": "150s", "fault": "recover", "device": {"node": "gpu-dp-0", "gpu": 0}},
                # Idle and failing again from 300 s: no pod, so no one reports it (no HEALTH entry).
                {"at": "300s", "fault": "device-unhealthy", "device": {"node": "gpu-dp-0", "gpu": 0}},
                {
                    "at": "20s",
                    "fault": "device-unknown",
                    "device": {"node": "gpu-dra-0", "gpu": 1},
                    "duration": "8m",
                },
            ],
        }
    )
    violations = full_verdict(full_story(journal()), scenario).violations
    assert violations == ("t+360s gpu-dp-0/gpu-0 released while its driver reported it Unhealthy",)
    # A fault that begins within the observation before the release is not blamed on it.
    j = full_story(journal())
    j.resolution_seconds = 2.0
    late = dataclasses.replace(
        scenario,
        timeline=tuple(dataclasses.replace(f, at=359.0) if f.at == 300 else f for f in scenario.timeline),
    )
    assert full_verdict(j, late).violations == ()


def test_the_reported_unhealthy_spans_follow_the_timeline_as_the_simulator_plays_it() -> None:
    scenario = resolve(
        {
            "name": "truth",
            "fleet": [
                {"name": "gpu-dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"},
                {"name": "gpu-dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
            ],
            "timeline": [
                # A timed spell, outlasted by a later one (its own end no longer counts).
                {
                    "at": "0s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dra-0", "gpu": 0},
                    "duration": "60s",
                },
                {
                    "at": "30s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dra-0", "gpu": 0},
                    "duration": "60s",
                },
                # A fatal XID lasts until recover; an application XID is nothing.
                {"at": "10s", "fault": "xid", "device": {"node": "gpu-dra-0", "gpu": 1}, "xid": 79},
                {"at": "20s", "fault": "xid", "device": {"node": "gpu-dra-0", "gpu": 2}, "xid": 13},
                # A lost GPU outlasts a timed spell's end.
                {"at": "0s", "fault": "gpu-lost", "device": {"node": "gpu-dra-0", "gpu": 3}},
                {
                    "at": "5s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dra-0", "gpu": 3},
                    "duration": "10s",
                },
                {"at": "100s", "fault": "xid", "device": {"node": "gpu-dra-0", "gpu": 1}, "xid": 48},
                {"at": "200s", "fault": "recover", "device": {"node": "gpu-dra-0", "gpu": 1}},
                # A flap; and a device-plugin node's broken stream makes every device Unhealthy.
                {
                    "at": "0s",
                    "fault": "flap",
                    "device": {"node": "gpu-dp-0", "gpu": 0},
                    "times": 2,
                    "period": "20s",
                },
                {"at": "100s", "fault": "health-stream-broken", "node": "gpu-dp-0", "duration": "30s"},
            ],
        }
    )
    assert reported_unhealthy(scenario) == {
        ("gpu-dra-0", 0): [(0.0, 90.0)],
        ("gpu-dra-0", 1): [(10.0, 200.0)],
        ("gpu-dra-0", 3): [(0.0, math.inf)],
        ("gpu-dp-0", 0): [(0.0, 10.0), (20.0, 30.0), (100.0, 130.0)],
        ("gpu-dp-0", 1): [(100.0, 130.0)],
    }


def test_a_failing_dcgm_health_watch_warrants_quarantine_and_holds_the_card_until_it_recovers() -> None:
    scenario = resolve(
        {
            "fleet": [
                {"name": "gpu-dra", "count": 1, "gpusPerNode": 2, "path": "dra", "dcgmExporter": "hostname"}
            ],
            "timeline": [
                {
                    "at": "10s",
                    "fault": "health-watch",
                    "device": {"node": "gpu-dra-0", "gpu": 1},
                    "watch": "MEM",
                },
                {"at": "90s", "fault": "recover", "device": {"node": "gpu-dra-0", "gpu": 1}},
            ],
        }
    )
    assert warrants(scenario, fatal_xids=FATAL, tolerance=TOLERANCE) == {("gpu-dra-0", 1): {"quarantine"}}
    # Only a watch the rules act on: a failing THERMAL watch (left out by default) warrants nothing.
    assert warrants(scenario, fatal_xids=FATAL, tolerance=TOLERANCE, health_watches=("MEM",)) == {
        ("gpu-dra-0", 1): {"quarantine"}
    }
    assert warrants(scenario, fatal_xids=FATAL, tolerance=TOLERANCE, health_watches=("PCIE", "ALL")) == {}
    # DCGM's verdict, not the driver's, but no release may happen while it stands.
    assert reported_unhealthy(scenario) == {("gpu-dra-0", 1): [(10.0, 90.0)]}


def test_an_unenforced_delivery_is_excused_by_a_resolved_alert_a_tripped_breaker_or_the_rate_limit() -> None:
    def unenforced(*also: Callable[[Journal], object]) -> tuple[str, ...]:
        j = full_story(journal())
        j.record(365, Kind.ALERT_FIRING, "GPUDeviceXid", "gpu-dp-0", QUARANTINED)
        j.record(
            370, Kind.DELIVERY, "responder", "gpu-dp-0", QUARANTINED,
            status="firing", action="quarantine", alertname="GPUDeviceXid",
        )  # fmt: skip
        for change in also:
            change(j)
        return tuple(v for v in full_verdict(j).violations if "reached the responder" in v)

    assert unenforced() != ()
    assert (
        unenforced(lambda j: j.record(400, Kind.ALERT_RESOLVED, "GPUDeviceXid", "gpu-dp-0", QUARANTINED))
        == ()
    )
    assert unenforced(lambda j: j.record(420, Kind.BREAKER, "tripped", trigger="rate")) == ()
    assert (
        unenforced(
            lambda j: j.record(
                371,
                Kind.PHASE,
                "Pending",
                "gpu-dp-0",
                QUARANTINED,
                record="rec-q2",
                action="quarantine",
                why="RateLimited",
            )
        )
        == ()
    )
    enforced = lambda j: j.record(400, Kind.ENFORCED, "quarantine", "gpu-dp-0", QUARANTINED, annotation="a")  # noqa: E731
    assert unenforced(enforced) == ()


def test_a_firm_failure_beside_a_transient_one_must_be_answered() -> None:
    scenario = resolve(
        {
            "name": "mixed",
            "fleet": [{"name": "gpu-dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"}],
            "timeline": [
                # Shorter than the alert's for: may rightly go unanswered ...
                {
                    "at": "0s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dp-0", "gpu": 0},
                    "duration": "30s",
                },
                # ... but this one may not, and is due from its own start.
                {"at": "200s", "fault": "device-unhealthy", "device": {"node": "gpu-dp-0", "gpu": 0}},
                {
                    "at": "0s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dp-0", "gpu": 1},
                    "duration": "30s",
                },
            ],
        }
    )
    devices = {
        uuid("gpu-dp-0", i): Device(uuid("gpu-dp-0", i), "gpu-dp-0", i, "device-plugin") for i in range(2)
    }
    silent = Journal("mixed", "", 10.0, devices, ended_at=600.0)
    silent.record(0, Kind.NOTE, "nothing happened")
    result = judge(
        silent, scenario, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=UNHEALTHY_FOR, grace=GRACE
    )
    assert result.violations == ("gpu-dp-0/gpu-0: quarantine warranted from t+200s, but no record by t+320s",)
    assert result.missed == (("gpu-dp-0/gpu-1", "quarantine"),)
    # Too late in the run for the firm one: missed, not violated.
    silent.ended_at = 300.0
    assert (
        judge(
            silent, scenario, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=UNHEALTHY_FOR, grace=GRACE
        ).violations
        == ()
    )


def _started(j: Journal, at: float, pod: str, devices: str = QUARANTINED, **detail: str) -> Entry:
    return j.record(at, Kind.POD_STARTED, pod, "gpu-dp-0", QUARANTINED, devices=devices, **detail)


def test_a_pod_started_on_a_quarantined_card_is_exposure_naming_pod_card_record_and_time() -> None:
    j = full_story(journal())
    _started(j, 120, "ns/serve-2")
    _started(j, 140, "ns/wide-0", devices=f"{OTHER},{QUARANTINED}")  # one of several cards it got
    assert full_verdict(j).violations == (
        "t+120s pod ns/serve-2 started on quarantined gpu-dp-0/gpu-0 (record rec-q, quarantined since t+81s)",
        "t+140s pod ns/wide-0 started on quarantined gpu-dp-0/gpu-0 (record rec-q, quarantined since t+81s)",
    )
    assert exposures(j) == (
        Exposure(120, "ns/serve-2", QUARANTINED, "gpu-dp-0/gpu-0", "rec-q", 81),
        Exposure(140, "ns/wide-0", QUARANTINED, "gpu-dp-0/gpu-0", "rec-q", 81),
    )


@pytest.mark.parametrize(
    ("at", "detail"),
    [
        (120, {"holder": "rec-q"}),
        (120, {"check": "canary"}),
        (75, {}),  # before the quarantine: the move's, not exposure
        (81, {}),  # seen at the very moment it was quarantined: it may have come first
        (305, {}),  # on the ramp: opted-in work may come
        (400, {}),  # after its release
    ],
    ids=["holder", "check", "before", "at-quarantine", "ramp", "released"],
)
def test_gpuhealths_own_pods_and_pods_outside_the_window_are_not_exposure(
    at: float, detail: dict[str, str]
) -> None:
    j = full_story(journal())
    _started(j, at, "ns/other-0", **detail)
    assert exposures(j) == ()
    assert full_verdict(j).violations == ()


def test_a_second_episode_opens_a_new_window_from_the_ramp() -> None:
    j = journal()
    phase = {"record": "rec-q", "action": "quarantine"}
    for at, what, episode in ((81, "Quarantined", "1"), (300, "Ramp", "1"), (320, "Quarantined", "2")):
        j.record(at, Kind.PHASE, what, "gpu-dp-0", QUARANTINED, **phase, episode=episode)
    _started(j, 310, "ns/opted-0")  # on the ramp: there when the card was quarantined again
    _started(j, 330, "ns/serve-2")
    assert exposures(j) == (Exposure(330, "ns/serve-2", QUARANTINED, "gpu-dp-0/gpu-0", "rec-q", 320),)


def test_the_backoff_model_steps_as_the_rules_do() -> None:
    """In step with node_device:gpu_device_unknown_tolerance:seconds (rules.render.unknown_window):
    tolerance x factor ^ repeats, rounded to the rules' whole seconds, between floor and cap."""
    from rules.render import DEFAULT_CONFIG, load_config, scaled, unknown_tolerance_cap, unknown_window

    for speed in (1, 20):
        dev = (
            load_config(DEFAULT_CONFIG) if speed == 1 else scaled(load_config(DEFAULT_CONFIG), speed)
        ).device
        backoff = UnknownBackoff(
            factor=dev.unknown_tolerance_factor,
            floor=dev.unknown_tolerance_floor.seconds * speed,
            repeat_window=dev.unknown_repeat_window.seconds * speed,
            cap=unknown_tolerance_cap(dev).seconds * speed,
            unit=speed,
        )
        tolerance = dev.unknown_tolerance.seconds * speed
        assert [backoff.window(tolerance, n) for n in range(6)] == [
            unknown_window(dev, n) * speed for n in range(6)
        ]
    assert [backoff.window(300.0, n) for n in range(4)] == [300.0, 220.0, 160.0, 160.0]
