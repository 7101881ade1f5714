"""Safety verdicts of a run: which automated actions a scenario's faults warrant.

Aspects covered: confirmed failures (fatal XID, GPU lost, uncorrectable ECC) warrant
quarantine; an Unknown warrants restrict only when it lasts the whole tolerance window (as
played: a recover cuts it short, overlapping faults make one spell);
an application XID, a short Unknown and an unreachable node warrant nothing, so an action
on them is a violation; an action on a device the scenario never touched is a violation;
warranted actions that never came are listed as missed, not as violations; every action a
delivery asks for is judged, not only the ones the responder knows; an action seen before
its fault (or before the tolerance window ran) is a violation.
"""

from __future__ import annotations

from pathlib import Path

from demo.safety import Action, judge, requested_actions, warranted_from, warrants
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import resolve

SCENARIO = resolve(Path(__file__).with_name("safety-scenario.yaml"))
FATAL = (48, 79)
TOLERANCE = 300.0
UUIDS = {
    (node, i): gpu_uuid(node, i) for node, group in SCENARIO.nodes.items() for i in range(group.gpus_per_node)
}


def act(alertname: str, action: str, node: str, gpu: int) -> Action:
    return Action(alertname, action, node, UUIDS[(node, gpu)])


def test_faults_warrant_quarantine_for_failures_and_restrict_only_for_long_unknowns() -> None:
    assert warrants(SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE) == {
        ("gpu-dp-0", 0): {"quarantine"},
        ("gpu-dra-0", 1): {"restrict"},
    }


def test_warranted_actions_pass_and_duplicates_are_fine() -> None:
    verdict = judge(
        SCENARIO,
        [
            act("GPUDeviceUnhealthy", "quarantine", "gpu-dp-0", 0),
            act("GPUDeviceFatalXid", "quarantine", "gpu-dp-0", 0),
            act("GPUDeviceUnknownExpired", "restrict", "gpu-dra-0", 1),
            act("GPUDeviceUnknownExpired", "restrict", "gpu-dra-0", 1),
        ],
        UUIDS,
        fatal_xids=FATAL,
        tolerance=TOLERANCE,
    )
    assert verdict.violations == ()
    assert verdict.missed == ()
    assert ("gpu-dra-0/gpu-1", "restrict", "GPUDeviceUnknownExpired") in verdict.acted


def test_acting_on_a_short_unknown_an_application_xid_or_an_unreachable_node_is_a_violation() -> None:
    verdict = judge(
        SCENARIO,
        [
            act("GPUDeviceUnknownExpired", "restrict", "gpu-dra-0", 0),
            act("GPUDeviceUnhealthy", "quarantine", "gpu-dp-0", 1),
            act("GPUDeviceUnknownExpired", "restrict", "gpu-dra-1", 0),
            act("GPUDeviceUnknownExpired", "quarantine", "gpu-dra-0", 1),
        ],
        UUIDS,
        fatal_xids=FATAL,
        tolerance=TOLERANCE,
    )
    assert len(verdict.violations) == 4
    assert "restrict gpu-dra-0/gpu-0" in verdict.violations[0] and "no fault on it" in verdict.violations[0]
    assert (
        "quarantine gpu-dra-0/gpu-1" in verdict.violations[3] and "warrant restrict" in verdict.violations[3]
    )
    assert verdict.missed == (("gpu-dp-0/gpu-0", "quarantine"), ("gpu-dra-0/gpu-1", "restrict"))


def test_an_action_on_an_unknown_device_is_a_violation() -> None:
    verdict = judge(
        SCENARIO,
        [Action("GPUDeviceUnhealthy", "quarantine", "gpu-dp-0", "GPU-not-in-this-fleet")],
        UUIDS,
        fatal_xids=FATAL,
        tolerance=TOLERANCE,
    )
    assert verdict.violations and "GPU-not-in-this-fleet" in verdict.violations[0]


def test_a_longer_tolerance_takes_the_warrant_away() -> None:
    assert ("gpu-dra-0", 1) not in warrants(SCENARIO, fatal_xids=FATAL, tolerance=600.0)


def test_an_unknown_cut_short_by_a_recover_warrants_nothing_and_overlaps_add_up() -> None:
    # A fault's duration alone overstated these: an 8-minute Unknown recovered after 30 s,
    # and a broken stream without a duration recovered after a minute, each passed a restrict.
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
    uuids = {(n, i): gpu_uuid(n, i) for n in ("gpu-dra-0", "gpu-dra-1") for i in range(2)}
    verdict = judge(
        scenario,
        [
            Action("GPUDeviceUnknownExpired", "restrict", "gpu-dra-0", uuids[("gpu-dra-0", 0)]),
            Action("GPUDeviceUnknownExpired", "restrict", "gpu-dra-1", uuids[("gpu-dra-1", 0)]),
        ],
        uuids,
        fatal_xids=FATAL,
        tolerance=TOLERANCE,
    )
    assert len(verdict.violations) == 2


def test_any_action_a_delivery_asks_for_is_judged_not_only_the_known_ones() -> None:
    # Only quarantine and restrict were collected: an alert asking the responder to evict
    # pods passed the verdict unseen.
    uuid = UUIDS[("gpu-dp-0", 0)]
    body = {
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "A", "action": "quarantine", "node": "gpu-dp-0", "device": uuid},
            },
            {
                "status": "firing",
                "labels": {"alertname": "B", "action": "evict-pods", "node": "gpu-dp-0", "device": uuid},
            },
            {"status": "firing", "labels": {"alertname": "C", "action": "none", "node": "gpu-dp-0"}},
            {"status": "resolved", "labels": {"alertname": "D", "action": "quarantine", "node": "gpu-dp-0"}},
            "not an alert",
        ]
    }
    actions = requested_actions(body)
    assert [a.alertname for a in actions] == ["A", "B"]
    verdict = judge(SCENARIO, actions, UUIDS, fatal_xids=FATAL, tolerance=TOLERANCE)
    assert len(verdict.violations) == 1 and "B asked to evict-pods gpu-dp-0/gpu-0" in verdict.violations[0]
    assert requested_actions([1, 2]) == [] and requested_actions({"alerts": 3}) == []


def test_an_action_seen_before_its_fault_or_window_is_a_violation() -> None:
    # Without times, a quarantine before the XID or a restrict inside the tolerance window
    # passed as long as the device had a warrant at some point of the run.
    assert warranted_from(SCENARIO, fatal_xids=FATAL, tolerance=TOLERANCE) == {
        (("gpu-dp-0", 0), "quarantine"): 10.0,
        (("gpu-dra-0", 1), "restrict"): 20.0 + TOLERANCE,
    }
    dp, dra = UUIDS[("gpu-dp-0", 0)], UUIDS[("gpu-dra-0", 1)]
    early = [
        Action("GPUDeviceUnhealthy", "quarantine", "gpu-dp-0", dp, seen_at=5.0),
        Action("GPUDeviceUnknownExpired", "restrict", "gpu-dra-0", dra, seen_at=100.0),
    ]
    verdict = judge(SCENARIO, early, UUIDS, fatal_xids=FATAL, tolerance=TOLERANCE)
    assert len(verdict.violations) == 2
    assert "by t+5s, before anything warranted it (from t+10s)" in verdict.violations[0]
    in_time = [
        Action("GPUDeviceUnhealthy", "quarantine", "gpu-dp-0", dp, seen_at=12.0),
        Action("GPUDeviceUnknownExpired", "restrict", "gpu-dra-0", dra, seen_at=330.0),
    ]
    assert judge(SCENARIO, in_time, UUIDS, fatal_xids=FATAL, tolerance=TOLERANCE).violations == ()


def test_an_unhealthy_that_clears_before_the_alerts_for_is_not_expected_to_cause_an_action() -> None:
    scenario = resolve(
        {
            "name": "blips",
            "fleet": [{"name": "gpu-dp", "count": 1, "gpusPerNode": 2, "path": "device-plugin"}],
            "timeline": [
                {
                    "at": "0s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dp-0", "gpu": 0},
                    "duration": "20s",
                },
                {
                    "at": "0s",
                    "fault": "device-unhealthy",
                    "device": {"node": "gpu-dp-0", "gpu": 1},
                    "duration": "5m",
                },
            ],
        }
    )
    uuids = {("gpu-dp-0", i): gpu_uuid("gpu-dp-0", i) for i in range(2)}
    verdict = judge(scenario, [], uuids, fatal_xids=FATAL, tolerance=TOLERANCE, unhealthy_for=60.0)
    # Quarantining the 20 s blip would still be allowed; only the 5-minute failure is expected.
    assert verdict.missed == (("gpu-dp-0/gpu-1", "quarantine"),)
    assert judge(scenario, [], uuids, fatal_xids=FATAL, tolerance=TOLERANCE).missed == (
        ("gpu-dp-0/gpu-0", "quarantine"),
        ("gpu-dp-0/gpu-1", "quarantine"),
    )
