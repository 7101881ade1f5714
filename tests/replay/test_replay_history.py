"""A recorded alert history as the replay's input (responder.replay.history).

Aspects: ALERTS samples split into firing episodes at a gap of more than one missed evaluation,
and a series read in several pages is one; a firing is delivered `group_wait` after its first
sample and resolved `group_interval` after the evaluation that found it gone, with its own
labels (`xid`) and without the ones the delivery sets; alerts without an action or a device
never reach the responder; GPUNodeUnreachable inhibits its node's device alerts, wholly or until
it resolves; a card reads Unhealthy and broken while a quarantine alert fires, Unknown while a
restrict alert fires; played through the engine, the history quarantines the card from its
delivery and moves its work once, and restricts the Unknown one without moving anything.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from backtest.inputs import replay_settings, rule_timings
from responder.reconcile.policy import Health
from responder.replay import history
from responder.replay.engine import replay_deliveries
from responder.replay.timeline import CheckTruth, Frame

T0 = 1_800_000_000.0
STEP = 60.0
RULES = replace(rule_timings(), group_wait=10.0, group_interval=30.0)


def _samples(first: float, last: float) -> list[float]:
    return [first + i * STEP for i in range(int((last - first) // STEP) + 1)]


def _alert(name: str, action: str, node: str, device: str = "", **more: str) -> dict[str, str]:
    labels = {"__name__": "ALERTS", "alertstate": "firing", "alertname": name, "action": action, "node": node}
    return {**labels, **({"device": device} if device else {}), **more}


def test_samples_split_into_episodes_at_a_gap_of_more_than_one_missed_evaluation() -> None:
    stamps = [T0, T0 + 60, T0 + 150, T0 + 300, T0 + 360]
    assert history.runs(stamps, STEP) == [(T0, T0 + 150), (T0 + 300, T0 + 360)]


@given(st.lists(st.integers(min_value=0, max_value=500), min_size=1), st.integers(min_value=1, max_value=6))
def test_a_series_read_in_pages_is_the_series_read_at_once(points: list[int], pages: int) -> None:
    stamps = sorted({T0 + p * STEP for p in points})
    labels = _alert("GPUDeviceUnhealthy", "quarantine", "n1", "GPU-0")
    cut = [stamps[i::pages] for i in range(pages)]
    assert history.firings([(labels, part) for part in cut], STEP) == history.firings(
        [(labels, stamps)], STEP
    )


def test_a_firing_is_delivered_after_group_wait_and_resolved_after_the_evaluation_that_found_it_gone() -> (
    None
):
    labels = _alert("GPUDeviceFatalXid", "quarantine", "n1", "GPU-0", xid="79", severity="critical")
    fired = history.firings([(labels, _samples(T0, T0 + 600))], STEP)
    [episode] = history.deliveries(fired, STEP, RULES)
    assert (episode.name, episode.action, episode.node, episode.device) == (
        "GPUDeviceFatalXid",
        "quarantine",
        "n1",
        "GPU-0",
    )
    assert episode.fires == T0 + 10.0
    assert episode.resolves == T0 + 600 + STEP + 30.0
    assert dict(episode.labels) == {"xid": "79", "severity": "critical"}


def test_alerts_without_an_action_or_a_device_never_reach_the_responder() -> None:
    fired = history.firings(
        [
            (_alert("GPUDeviceStatusStale", "none", "n1", "GPU-0"), _samples(T0, T0 + 600)),
            (_alert("GPUFleetUnknownStorm", "none", ""), _samples(T0, T0 + 600)),
        ],
        STEP,
    )
    assert len(fired) == 2
    assert history.deliveries(fired, STEP, RULES) == []


def test_an_unreachable_node_inhibits_its_device_alerts_wholly_or_until_it_resolves() -> None:
    fired = history.firings(
        [
            (_alert("GPUNodeUnreachable", "none", "n1"), _samples(T0, T0 + 1200)),
            (_alert("GPUDeviceUnhealthy", "quarantine", "n1", "GPU-0"), _samples(T0 + 60, T0 + 600)),
            (_alert("GPUDeviceUnhealthy", "quarantine", "n1", "GPU-1"), _samples(T0 + 60, T0 + 3000)),
            (_alert("GPUDeviceUnhealthy", "quarantine", "n2", "GPU-0"), _samples(T0 + 60, T0 + 600)),
        ],
        STEP,
    )
    delivered = {(e.node, e.device): e.fires for e in history.deliveries(fired, STEP, RULES)}
    assert delivered == {("n1", "GPU-1"): T0 + 1200 + STEP + 10.0, ("n2", "GPU-0"): T0 + 60 + 10.0}
    assert {(f.label("node"), f.label("device")) for f in history.uninhibited(fired, STEP)} == set(delivered)


def test_a_card_reads_unhealthy_while_a_quarantine_alert_fires_and_unknown_while_a_restrict_fires() -> None:
    fired = history.firings(
        [
            (_alert("GPUDeviceUnhealthy", "quarantine", "n1", "GPU-0"), _samples(T0, T0 + 600)),
            (_alert("GPUDeviceUnknownExpired", "restrict", "n1", "GPU-1"), _samples(T0, T0 + 600)),
        ],
        STEP,
    )
    readings = history.readings(fired, STEP)
    assert readings.health("n1", "GPU-0", T0 + 300)[0] == Health.UNHEALTHY
    assert readings.health("n1", "GPU-0", T0 + 660) == (Health.HEALTHY, T0 + 660)
    assert readings.health("n1", "GPU-1", T0 + 300)[0] == Health.UNKNOWN
    assert readings.broken("n1", "GPU-0", T0 + 600, T0 + 700)
    assert not readings.broken("n1", "GPU-0", T0 + 660, T0 + 700)
    assert not readings.broken("n1", "GPU-1", T0, T0 + 600)
    assert history.broken(fired, STEP) == {("n1", "GPU-0"): [(T0, T0 + 660)]}


def test_played_through_the_engine_the_card_is_quarantined_once_and_the_unknown_one_restricted() -> None:
    fired = history.firings(
        [
            (_alert("GPUDeviceUnhealthy", "quarantine", "n1", "GPU-0"), _samples(T0, T0 + 1800)),
            (_alert("GPUDeviceUnknownExpired", "restrict", "n1", "GPU-1"), _samples(T0 + 3600, T0 + 4200)),
        ],
        STEP,
    )
    frame = Frame(T0, T0 + 86400, 16, CheckTruth(120.0, 300.0))
    played = replay_deliveries(
        frame, history.deliveries(fired, STEP, RULES), history.readings(fired, STEP), replay_settings()
    )
    holds = {(h.node, h.device): h for h in played.holds}
    assert (holds[("n1", "GPU-0")].action, holds[("n1", "GPU-0")].start) == ("quarantine", T0 + 10.0)
    assert holds[("n1", "GPU-0")].end > T0 + 1800 + STEP
    assert (holds[("n1", "GPU-1")].action, holds[("n1", "GPU-1")].reason) == ("restrict", "Unknown")
    assert [(m.node, m.device, m.at) for m in played.moves] == [("n1", "GPU-0", T0 + 10.0)]
    assert played.breaker_trips == 0
