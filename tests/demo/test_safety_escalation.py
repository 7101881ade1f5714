"""The safety verdict's node-action invariant (demo.safety): no node action without a
justification that held at the time; and the `escalated` expectation (demo.expectations).

Aspects: gpuhealth's escalation taint on a node whose faults warranted quarantines on three
cards within the window passes; the same taint injected on a node with one failing card fails
the verdict, as does one before the third card failed, one over cards spread wider than the
window, one made with the breaker tripped, and any node action when no escalation rule is given;
a cordon or another gpuhealth taint is never justified; a GPU lost on the node (the driver's
taint on every device) with two failing cards justifies it, one card does not. `escalated:` names
exactly the nodes escalated (none for `[]`), and a node outside the fleet is refused;
`escalationsLifted:` wants the node's taint lifted at the end (not put back).
"""

from __future__ import annotations

import pytest

from demo.expectations import ExpectationError, evaluate, parse
from demo.journal import Device, Journal, Kind
from demo.safety import NodeEscalation, judge
from responder.reconcile.escalation import TAINT_KEY
from simulator.fleet.objects import gpu_uuid
from simulator.model import Scenario
from simulator.scenario import from_dict

RULE = NodeEscalation(cards=3, window=600.0, lost_cards=2)
FATAL = (48, 79)


def scenario(*faults: dict[str, object]) -> Scenario:
    return from_dict(
        {
            "name": "escalation-verdict",
            "fleet": [{"name": "gpu", "count": 2, "gpusPerNode": 8, "path": "dra"}],
            "timeline": list(faults),
        }
    )


def unhealthy(node: str, gpu: int, at: str) -> dict[str, object]:
    return {"at": at, "fault": "device-unhealthy", "device": {"node": node, "gpu": gpu}}


THREE_AND_ONE = scenario(
    unhealthy("gpu-0", 0, "30s"),
    unhealthy("gpu-0", 1, "40s"),
    unhealthy("gpu-0", 2, "50s"),
    unhealthy("gpu-1", 5, "30s"),
)


def journal(s: Scenario) -> Journal:
    devices = {
        gpu_uuid(node, i): Device(gpu_uuid(node, i), node, i, group.path)
        for node, group in s.nodes.items()
        for i in range(group.gpus_per_node)
    }
    return Journal("escalation-verdict", "", 10.0, devices, ended_at=60.0)


def node_violations(
    s: Scenario, *entries: tuple[float, str, str, str], rule: NodeEscalation | None = RULE
) -> list[str]:
    j = journal(s)
    for at, what, node, key in entries:
        if what == "tripped":
            j.record(at, Kind.BREAKER, "tripped")
        else:
            j.record(at, Kind.NODE_ACTION, what, node, key=key)
    verdict = judge(j, s, fatal_xids=FATAL, tolerance=300.0, escalation=rule)
    return [v for v in verdict.violations if "node" in v or "escalated" in v]


def test_three_cards_failing_together_justify_the_escalation_taint() -> None:
    assert node_violations(THREE_AND_ONE, (55.0, "taint", "gpu-0", TAINT_KEY)) == []


def test_an_injected_escalation_of_a_node_with_one_failing_card_fails_the_verdict() -> None:
    (line,) = node_violations(THREE_AND_ONE, (55.0, "taint", "gpu-1", TAINT_KEY))
    assert line == (
        f"t+55s gpu-1 escalated ({TAINT_KEY}) without a justification: fewer than 3 cards failing within 600s"
    )


def test_an_escalation_before_the_third_card_failed_is_unjustified() -> None:
    assert node_violations(THREE_AND_ONE, (45.0, "taint", "gpu-0", TAINT_KEY))


def test_cards_spread_wider_than_the_window_justify_nothing() -> None:
    narrow = NodeEscalation(cards=3, window=15.0, lost_cards=2)
    assert node_violations(THREE_AND_ONE, (55.0, "taint", "gpu-0", TAINT_KEY), rule=narrow)


def test_an_escalation_with_the_breaker_tripped_is_a_violation() -> None:
    (line,) = node_violations(THREE_AND_ONE, (52.0, "tripped", "", ""), (55.0, "taint", "gpu-0", TAINT_KEY))
    assert "with the breaker tripped" in line


@pytest.mark.parametrize(
    ("what", "key", "rule"),
    [
        ("cordon", "spec.unschedulable", RULE),
        ("taint", "gpuhealth.io/something-else", RULE),
        ("taint", TAINT_KEY, None),
        ("taint", TAINT_KEY, NodeEscalation(cards=3, window=600.0, lost_cards=2, enabled=False)),
    ],
    ids=["cordon", "another-taint", "no-rule", "disabled"],
)
def test_other_node_actions_are_never_justified(what: str, key: str, rule: NodeEscalation | None) -> None:
    assert node_violations(THREE_AND_ONE, (55.0, what, "gpu-0", key), rule=rule)


def test_a_lost_gpu_with_two_failing_cards_justifies_it_and_with_one_does_not() -> None:
    lost = {"at": "30s", "fault": "gpu-lost", "device": {"node": "gpu-0", "gpu": 0}}
    two = scenario(lost, unhealthy("gpu-0", 3, "35s"))
    assert node_violations(two, (40.0, "taint", "gpu-0", TAINT_KEY)) == []
    assert node_violations(scenario(lost), (40.0, "taint", "gpu-0", TAINT_KEY))


def test_the_escalated_expectation_names_exactly_the_nodes_escalated() -> None:
    j = journal(THREE_AND_ONE)
    j.record(55.0, Kind.NODE_ACTION, "taint", "gpu-0", key=TAINT_KEY)
    assert evaluate(parse({"escalated": ["gpu-0"]}, "x.yaml", nodes=THREE_AND_ONE.nodes), j) == []
    (line,) = evaluate(parse({"escalated": []}, "x.yaml", nodes=THREE_AND_ONE.nodes), j)
    assert line == "escalated: expected none, got gpu-0"
    with pytest.raises(ExpectationError, match="no node 'gpu-9'"):
        parse({"escalated": ["gpu-9"]}, "x.yaml", nodes=THREE_AND_ONE.nodes)


def test_escalations_lifted_wants_the_taint_gone_at_the_end() -> None:
    j = journal(THREE_AND_ONE)
    j.record(55.0, Kind.NODE_ACTION, "taint", "gpu-0", key=TAINT_KEY)
    want = parse({"escalationsLifted": ["gpu-0"]}, "x.yaml", nodes=THREE_AND_ONE.nodes)
    assert evaluate(want, j) == ["escalationsLifted: gpu-0's escalation was not lifted by the end of the run"]
    j.record(58.0, Kind.NOTE, "node-taint-lifted", "gpu-0", key=TAINT_KEY)
    assert evaluate(want, j) == []
    j.record(59.0, Kind.NODE_ACTION, "taint", "gpu-0", key=TAINT_KEY)  # put back: not lifted at the end
    assert evaluate(want, j)
