"""A scenario's `expect:` section: parsing it, and checking a run's journal against it.

Aspects covered:
- parsing: a full section becomes the frozen expectations it states; every refusal names the
  file and the field path (table of bad sections); devices are checked against the fleet
  (node, GPU index, path); a section that contradicts itself is refused; fuzzed with
  hypothesis: arbitrary YAML-shaped data only ever raises ExpectationError, and a valid
  section with one field spoiled names that field;
- checking, over synthetic journals: quarantines and restrictions (phase, reason, path,
  enforcement, detection latency, no eviction under a restriction), untouched devices and
  nodes, releases that walk every phase with passed checks, alerts fired and not fired,
  migrations (a job moved again in a later episode counts again), evictions, enforced devices,
  phases, the breaker, tenant events and node-wide actions; checks on their records' devices
  (not another, not none) and how many passed; release requests answered as expected (and for
  the reason); what happened while the health source was down (enforced, moved, released);
  each unmet expectation is one line naming what was expected and what was seen.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from demo.expectations import (
    ChecksExpectation,
    Count,
    DeviceExpectation,
    ExpectationError,
    Latency,
    NodeOrDevice,
    OutageExpectation,
    RampExpectation,
    RequestExpectation,
    check,
    evaluate,
    parse,
)
from demo.journal import Device, Journal, Kind
from responder.ladder import CANARY, LADDER
from responder.ladder import RAMP as RAMP_PHASE
from responder.ladder import Kind as RungKind
from simulator.scenario import ScenarioError, from_dict, parse_text
from tests.support.ladders import walk

SOURCE = "scenarios/x.yaml"

FLEET: dict[str, Any] = {
    "name": "expect-test",
    "fleet": [
        {"name": "gpu-dra", "count": 2, "gpusPerNode": 4, "path": "dra"},
        {"name": "gpu-dp", "count": 1, "gpusPerNode": 4, "path": "device-plugin"},
    ],
}
SCENARIO = from_dict(FLEET)
NODES = SCENARIO.nodes

FULL = """
quarantined:
  - {node: gpu-dra-0, gpu: 3, reason: FatalXid, path: dra, within: 2m}
  - {node: gpu-dp-0, gpu: 1}
restricted:
  - {node: gpu-dra-1, gpu: 2, within: 8m}
untouched:
  - {node: gpu-dra-1, gpu: 0}
  - {node: gpu-dp-0, gpu: 3}
released:
  - {node: gpu-dra-0, gpu: 3}
alerts:
  fired: [GPUDeviceFatalXid, {name: GPUDeviceUnknownExpired, node: gpu-dra-1, gpu: 2}]
  notFired: [{name: GPUDeviceUnknownExpired, node: gpu-dra-1, gpu: 0}, GPUNodeUnreachable]
migrations: {succeeded: 1, unrecoverable: 0}
evictions: {max: 2}
enforcedDevices: {min: 2, max: 3}
phases: {Deferred: 0}
breaker: closed
tenantEvents: [{reason: GPUQuarantineUnrecoverable, namespace: research, count: {max: 0}}]
nodeActions: 0
maxDetectionLatency: {overFloor: 30s}
ramp: [{node: gpu-dra-0, gpu: 3, job: inference/canary}]
checks: {onDevice: true, passed: {min: 2}}
releaseRequests:
  - {node: gpu-dp-0, gpu: 1, answer: refused, reason: FailureStands}
  - {node: gpu-dra-0, gpu: 3, answer: honoured}
healthSourceDown: {enforced: 1, succeeded: {min: 1}, released: 0}
"""


def parsed(text: str) -> Any:
    return parse(yaml.safe_load(text), SOURCE, nodes=NODES)


def refusal(raw: Any) -> str:
    with pytest.raises(ExpectationError) as caught:
        parse(raw, SOURCE, nodes=NODES)
    return str(caught.value)


# ---------------------------------------------------------------------------- parsing


def test_a_full_section_states_every_part() -> None:
    e = parsed(FULL)
    assert e.quarantined == (
        DeviceExpectation("gpu-dra-0", 3, "FatalXid", "dra", 120.0),
        DeviceExpectation("gpu-dp-0", 1),
    )
    assert e.restricted == (DeviceExpectation("gpu-dra-1", 2, within=480.0),)
    assert e.untouched == (NodeOrDevice("gpu-dra-1", 0), NodeOrDevice("gpu-dp-0", 3))
    assert e.released == (NodeOrDevice("gpu-dra-0", 3),)
    assert [a.label for a in e.alerts_fired] == [
        "GPUDeviceFatalXid",
        "GPUDeviceUnknownExpired on gpu-dra-1/gpu-2",
    ]
    assert [a.label for a in e.alerts_not_fired] == [
        "GPUDeviceUnknownExpired on gpu-dra-1/gpu-0",
        "GPUNodeUnreachable",
    ]
    assert e.migrations == {"succeeded": Count(1, 1), "unrecoverable": Count(0, 0)}
    assert e.evictions == Count(0, 2)
    assert e.enforced_devices == Count(2, 3)
    assert e.phases == {"Deferred": Count(0, 0)}
    assert e.breaker == "closed"
    assert e.tenant_events[0].count == Count(0, 0)
    assert e.node_actions == Count(0, 0)
    assert e.max_detection_latency == Latency(30.0, over_floor=True)
    assert e.ramp == (RampExpectation("gpu-dra-0", 3, "inference/canary"),)
    assert e.checks == ChecksExpectation(on_device=True, passed=Count(2, None))
    assert e.release_requests == (
        RequestExpectation("gpu-dp-0", 1, "refused", "FailureStands"),
        RequestExpectation("gpu-dra-0", 3, "honoured"),
    )
    assert e.health_source_down == OutageExpectation(Count(1, 1), Count(1, None), Count(0, 0))


def test_an_absent_or_empty_section_expects_nothing() -> None:
    assert parse(None, SOURCE).empty()
    assert parse({}, SOURCE).empty()
    assert check(SCENARIO, journal()) == []


@pytest.mark.parametrize(
    ("raw", "where", "says"),
    [
        ([1], "expect:", "expected a mapping"),
        ({"quarantine": []}, "expect.quarantine:", "unknown field"),
        ({"quarantined": {"node": "gpu-dra-0"}}, "expect.quarantined:", "expected a list"),
        ({"quarantined": [{"gpu": 1}]}, "expect.quarantined[0].node:", "is required"),
        (
            {"quarantined": [{"node": "gpu-x-0", "gpu": 1}]},
            "expect.quarantined[0].node:",
            "no node 'gpu-x-0'",
        ),
        ({"quarantined": [{"node": "gpu-dra-0", "gpu": 4}]}, "expect.quarantined[0].gpu:", "has 4 GPUs"),
        ({"quarantined": [{"node": "gpu-dra-0", "gpu": True}]}, "expect.quarantined[0].gpu:", "integer"),
        ({"quarantined": [{"node": "gpu-dra-0"}]}, "expect.quarantined[0].gpu:", "is required"),
        (
            {"quarantined": [{"node": "gpu-dp-0", "gpu": 0, "path": "dra"}]},
            "expect.quarantined[0].path:",
            "device-plugin path",
        ),
        (
            {"quarantined": [{"node": "gpu-dra-0", "gpu": 0, "reason": "Unknown"}]},
            "expect.quarantined[0].reason:",
            "under restricted",
        ),
        (
            {"restricted": [{"node": "gpu-dra-0", "gpu": 0, "reason": "Unknown"}]},
            "expect.restricted[0].reason:",
            "unknown field",
        ),
        (
            {"quarantined": [{"node": "gpu-dra-0", "gpu": 0, "within": "soon"}]},
            "expect.quarantined[0].within:",
            "not a duration",
        ),
        ({"released": [{"node": "gpu-dra-0"}]}, "expect.released[0].gpu:", "is required"),
        ({"ramp": [{"node": "gpu-dra-0", "gpu": 1}]}, "expect.ramp[0].job:", "is required"),
        (
            {"ramp": [{"node": "gpu-dra-0", "gpu": 1, "job": "canary"}]},
            "expect.ramp[0].job:",
            "namespace/name",
        ),
        ({"ramp": [{"node": "gpu-dra-0", "job": "a/b"}]}, "expect.ramp[0].gpu:", "is required"),
        (
            {"ramp": [{"node": "gpu-dra-0", "gpu": 1, "job": "a/b", "x": 1}]},
            "expect.ramp[0].x:",
            "unknown field",
        ),
        ({"alerts": {"fired": [{"node": "gpu-dra-0"}]}}, "expect.alerts.fired[0].name:", "is required"),
        (
            {"alerts": {"fired": [{"name": "A", "gpu": 1}]}},
            "expect.alerts.fired[0].node:",
            "required with gpu",
        ),
        ({"alerts": {"fired": [""]}}, "expect.alerts.fired[0]:", "must not be empty"),
        ({"alerts": {"firing": []}}, "expect.alerts.firing:", "unknown field"),
        ({"alerts": {"fired": ["A"], "notFired": ["A"]}}, "expect.alerts.notFired:", "also in alerts.fired"),
        ({"migrations": {"done": 1}}, "expect.migrations.done:", "unknown field"),
        ({"migrations": {}}, "expect.migrations:", "give at least one"),
        ({"migrations": {"succeeded": -1}}, "expect.migrations.succeeded:", "out of range"),
        ({"resets": {"cleared": 1}}, "expect.resets.cleared:", "unknown field"),
        ({"evictions": {"min": 3, "max": 1}}, "expect.evictions.max:", "below min (3)"),
        ({"evictions": {}}, "expect.evictions:", "give min, max or both"),
        ({"evictions": 1.5}, "expect.evictions:", "integer"),
        ({"phases": {"Broken": 1}}, "expect.phases.Broken:", "unknown field"),
        ({"breaker": "open"}, "expect.breaker:", "is not one of: tripped, closed"),
        ({"tenantEvents": [{"namespace": "a"}]}, "expect.tenantEvents[0].reason:", "is required"),
        ({"tenantEvents": "many"}, "expect.tenantEvents:", "integer"),
        ({"maxDetectionLatency": {"floor": "1s"}}, "expect.maxDetectionLatency.floor:", "unknown field"),
        ({"maxDetectionLatency": "90d"}, "expect.maxDetectionLatency:", "longer than"),
        ({"checks": {}}, "expect.checks:", "give onDevice, passed or both"),
        ({"checks": {"onDevice": "yes"}}, "expect.checks.onDevice:", "expected true or false"),
        (
            {"releaseRequests": [{"node": "gpu-dp-0", "gpu": 1, "answer": "maybe"}]},
            "expect.releaseRequests[0].answer:",
            "is not one of: honoured, refused",
        ),
        (
            {"releaseRequests": [{"node": "gpu-dp-0", "gpu": 1}]},
            "expect.releaseRequests[0].answer:",
            "is required",
        ),
        ({"healthSourceDown": {"released": -1}}, "expect.healthSourceDown.released:", "out of range"),
        ({"healthSourceDown": {}}, "expect.healthSourceDown:", "give at least one of"),
        (
            {
                "quarantined": [{"node": "gpu-dra-0", "gpu": 1}],
                "restricted": [{"node": "gpu-dra-0", "gpu": 1}],
            },
            "expect.restricted[0]:",
            "already expected in quarantined[0]",
        ),
        (
            {"quarantined": [{"node": "gpu-dra-0", "gpu": 1}], "untouched": [{"node": "gpu-dra-0"}]},
            "expect.untouched[0]:",
            "contradicts quarantined[0]",
        ),
        ({"quarantinedAtEnd": [{"node": "gpu-dra-0"}]}, "expect.quarantinedAtEnd[0].gpu:", "is required"),
        (
            {"quarantinedAtEnd": [{"node": "gpu-dra-0", "gpu": 1, "failed": 1}]},
            "expect.quarantinedAtEnd[0].failed:",
            "unknown field",
        ),
        (
            {
                "quarantinedAtEnd": [{"node": "gpu-dra-0", "gpu": 1}],
                "released": [{"node": "gpu-dra-0", "gpu": 1}],
            },
            "expect.quarantinedAtEnd[0]:",
            "also expected in released[0]",
        ),
        (
            {"quarantinedAtEnd": [{"node": "gpu-dra-0", "gpu": 1}], "untouched": [{"node": "gpu-dra-0"}]},
            "expect.quarantinedAtEnd[0]:",
            "contradicts untouched",
        ),
        (
            {"breaker": "closed", "phases": {"Deferred": {"min": 1}}},
            "expect.phases.Deferred:",
            "only an open breaker defers",
        ),
    ],
)
def test_a_bad_section_is_refused_naming_the_file_and_field(raw: Any, where: str, says: str) -> None:
    message = refusal(raw)
    assert message.startswith(f"{SOURCE}: {where} "), message
    assert says in message


def test_an_expectation_error_is_a_scenario_error() -> None:
    # So whatever refuses a bad scenario (gpuhealth demo exits 2) refuses a bad expectation too.
    with pytest.raises(ScenarioError):
        parse({"breaker": 1}, SOURCE)


def test_without_the_fleet_devices_are_not_checked_against_it() -> None:
    e = parse({"quarantined": [{"node": "elsewhere", "gpu": 12, "path": "dra"}]}, SOURCE)
    assert e.quarantined == (DeviceExpectation("elsewhere", 12, path="dra"),)


def test_a_scenario_file_carries_its_expectations_to_check() -> None:
    scenario = from_dict({**FLEET, "expect": {"quarantined": [{"node": "gpu-dra-0", "gpu": 9}]}}, "my.yaml")
    with pytest.raises(ExpectationError, match=r"^my.yaml: expect.quarantined\[0\].gpu: 9 is out of range"):
        check(scenario, journal())


yaml_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.sampled_from(["gpu-dra-0", "gpu-dp-0", "dra", "90s", "tripped", "GPUDeviceFatalXid"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "quarantined",
                    "restricted",
                    "untouched",
                    "released",
                    "alerts",
                    "fired",
                    "notFired",
                    "node",
                    "gpu",
                    "name",
                    "reason",
                    "path",
                    "within",
                    "min",
                    "max",
                    "evictions",
                    "migrations",
                    "succeeded",
                    "phases",
                    "Deferred",
                    "breaker",
                    "tenantEvents",
                    "count",
                    "namespace",
                    "maxDetectionLatency",
                    "overFloor",
                    "other",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(raw=yaml_values)
def test_arbitrary_data_is_parsed_or_refused_never_crashes(raw: Any) -> None:
    for nodes in (NODES, None):
        try:
            parse(raw, SOURCE, nodes=nodes)
        except ExpectationError as exc:
            assert str(exc).startswith(f"{SOURCE}: expect")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(
        alphabet=st.sampled_from(list("{}[]:,- \n'\"#&*!|>0123456789.abgmsnodepuqrtlxy")), max_size=80
    )
)
def test_arbitrary_yaml_text_in_a_scenario_file_is_parsed_or_refused(text: str) -> None:
    # The section as a user writes it: inside a scenario file, read by the simulator's parser.
    document = "fleet: [{name: gpu-dra, count: 2, gpusPerNode: 4, path: dra}]\nexpect:\n" + "\n".join(
        "  " + line for line in text.splitlines()
    )
    try:
        scenario = parse_text(document, SOURCE)
    except ScenarioError:
        return  # not YAML, or not a mapping: the simulator's own refusal, with a line number
    try:
        check(scenario, journal())
    except ExpectationError as exc:
        assert str(exc).startswith(f"{SOURCE}: expect")


VALID: dict[str, Any] = yaml.safe_load(FULL)


def _paths(value: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every leaf's path in `value` (mappings by key, lists by index)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _paths(v, (*prefix, k))]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _paths(v, (*prefix, i))]
    return [prefix]


def _spoiled(path: tuple[str | int, ...], bad: Any) -> Any:
    def walk(value: Any, rest: tuple[str | int, ...]) -> Any:
        if not rest:
            return bad
        head, tail = rest[0], rest[1:]
        if isinstance(value, dict):
            return {k: walk(v, tail) if k == head else v for k, v in value.items()}
        return [walk(v, tail) if i == head else v for i, v in enumerate(value)]

    return walk(VALID, path)


def _shown(path: tuple[str | int, ...]) -> str:
    out = "expect"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


@settings(max_examples=200, deadline=None)
@given(
    path=st.sampled_from(_paths(VALID)),
    bad=st.sampled_from([None, [], {"x": 1}, -3, True, "", "gpu-none-9", 10**9]),
)
def test_a_spoiled_field_of_a_valid_section_is_named(path: tuple[str | int, ...], bad: Any) -> None:
    try:
        parse(_spoiled(path, bad), SOURCE, nodes=NODES)
    except ExpectationError as exc:
        # Named: the field itself, or the part it sits in (a name string spoiled into a
        # mapping is judged as a whole item; a required field made null is named as required).
        assert f"{SOURCE}: expect" in str(exc)
        named = str(exc).split(": ", 2)[1]
        assert named.startswith(_shown(path[:1])), (named, path)  # never only the whole section
        assert _shown(path).startswith(named) or named.startswith(_shown(path[:-1])), (named, path)


def test_the_valid_section_itself_parses() -> None:
    assert not parse(VALID, SOURCE, nodes=NODES).empty()


# ---------------------------------------------------------------------------- checking


def journal(floor: float = 60.0, resolution: float = 5.0) -> Journal:
    devices = {
        f"uuid-{node}-{i}": Device(f"uuid-{node}-{i}", node, i, group.path)
        for node, group in NODES.items()
        for i in range(group.gpus_per_node)
    }
    return Journal("expect-test", "", 20.0, devices, floor_seconds=floor, resolution_seconds=resolution)


def uuid(node: str, gpu: int) -> str:
    return f"uuid-{node}-{gpu}"


def quarantine(
    j: Journal, node: str, gpu: int, *, at: float, reason: str = "FatalXid", enforced_after: float = 60.0
) -> None:
    """A device's fault, its record and its enforcement, as the pipeline journals them."""
    d = uuid(node, gpu)
    j.record(at, Kind.FAULT, "xid", node, d, xid="79")
    j.record(at + enforced_after - 5, Kind.PHASE, "Pending", node, d, reason=reason)
    j.record(at + enforced_after, Kind.PHASE, "Quarantined", node, d, reason=reason)
    how = (
        {"rule": f"rule-{gpu}"}
        if NODES[node].path == "dra"
        else {"annotation": "gpuhealth.io/quarantined-devices"}
    )
    j.record(at + enforced_after, Kind.ENFORCED, "quarantine", node, d, **how)


def recorded_only(j: Journal, node: str, gpu: int, **how: str) -> None:
    """A quarantine (FatalXid) and its enforcement `how`, with no fault journalled before it."""
    j.record(30, Kind.PHASE, "Quarantined", node, uuid(node, gpu), reason="FatalXid")
    j.record(30, Kind.ENFORCED, "quarantine", node, uuid(node, gpu), **how)


def release(
    j: Journal, node: str, gpu: int, *, at: float, phases: tuple[str, ...] | None = None
) -> dict[str, float]:
    """The device walks `phases` (the release ladder's walk unless given), one every 10 s from
    `at`; a check rung's pass is journalled a second before the phase that follows it on the
    ladder. Returns when each phase began."""
    d = uuid(node, gpu)
    steps = phases or tuple(walk())
    began = {}
    for i, phase in enumerate(steps):
        began[phase] = at + 10 * i
        j.record(at + 10 * i, Kind.PHASE, phase, node, d, reason="FatalXid")
        before = LADDER.rung(steps[i - 1]) if i else None
        if (
            before is not None
            and before.kind == RungKind.CHECK
            and LADDER.after(before) == LADDER.rung(phase)
        ):
            j.record(at + 10 * i - 1, Kind.CHECK, before.name, node, d, result="passed")
    if steps[-1] == "Released":
        j.record(at + 10 * len(steps), Kind.LIFTED, "quarantine", node, d)
    return began


def failures(section: str, j: Journal) -> list[str]:
    return evaluate(parsed(section), j)


def test_a_quarantine_as_expected_meets_every_part() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    quarantine(j, "gpu-dp-0", 1, at=30, reason="Unhealthy")
    section = """
    quarantined:
      - {node: gpu-dra-0, gpu: 3, reason: FatalXid, path: dra, within: 60s}
      - {node: gpu-dp-0, gpu: 1, reason: Unhealthy, path: device-plugin}
    enforcedDevices: 2
    maxDetectionLatency: 1m
    """
    assert failures(section, j) == []


def test_a_quarantine_never_enforced_says_what_was_seen() -> None:
    j = journal()
    j.record(30, Kind.FAULT, "xid", "gpu-dra-0", uuid("gpu-dra-0", 3))
    j.record(90, Kind.PHASE, "Deferred", "gpu-dra-0", uuid("gpu-dra-0", 3), reason="FatalXid")
    assert failures("quarantined: [{node: gpu-dra-0, gpu: 3}]", j) == [
        "quarantined gpu-dra-0/gpu-3: never reached Quarantined; phases seen: Deferred (reasons: FatalXid)",
        "quarantined gpu-dra-0/gpu-3: never enforced (no DeviceTaintRule or node annotation seen)",
    ]
    assert failures("quarantined: [{node: gpu-dra-0, gpu: 2}]", j)[0].endswith("no record at all")


def test_a_quarantine_with_another_reason_or_path_fails() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30, reason="Unhealthy")
    out = failures("quarantined: [{node: gpu-dra-0, gpu: 3, reason: FatalXid}]", j)
    assert out == [
        "quarantined gpu-dra-0/gpu-3 (reason FatalXid): never reached Quarantined with reason FatalXid; "
        "phases seen: Pending, Quarantined (reasons: Unhealthy)"
    ]
    j2 = journal()
    recorded_only(j2, "gpu-dra-0", 3, annotation="x")
    assert failures("quarantined: [{node: gpu-dra-0, gpu: 3, path: dra}]", j2) == [
        "quarantined gpu-dra-0/gpu-3 (path dra): enforced through annotation, not the dra path's rule"
    ]


def test_a_restriction_is_not_a_quarantine_and_the_other_way_round() -> None:
    j = journal()
    quarantine(j, "gpu-dra-1", 2, at=30, reason="Unknown")
    assert failures("restricted: [{node: gpu-dra-1, gpu: 2}]", j) == []
    assert "never reached Quarantined;" in failures("quarantined: [{node: gpu-dra-1, gpu: 2}]", j)[0]
    j2 = journal()
    quarantine(j2, "gpu-dra-1", 2, at=30)
    assert "with reason Unknown" in failures("restricted: [{node: gpu-dra-1, gpu: 2}]", j2)[0]


def test_a_restriction_that_moved_work_fails() -> None:
    j = journal()
    quarantine(j, "gpu-dra-1", 2, at=30, reason="Unknown")
    other = uuid("gpu-dra-1", 3)
    j.record(
        120, Kind.EVICTION, "research/train-0", "gpu-dra-1", other, devices=f"{other},{uuid('gpu-dra-1', 2)}"
    )
    j.record(130, Kind.MIGRATION, "succeeded", "gpu-dra-1", uuid("gpu-dra-1", 2), job="research/train")
    assert failures("restricted: [{node: gpu-dra-1, gpu: 2}]", j) == [
        "restricted gpu-dra-1/gpu-2: 1 eviction(s) of its pods, research/train-0",
        "restricted gpu-dra-1/gpu-2: a migration (succeeded) of its work",
    ]


def test_detection_latency_is_bounded_from_the_first_fault_with_the_resolution_allowed() -> None:
    j = journal(floor=60.0, resolution=5.0)
    quarantine(j, "gpu-dra-0", 3, at=30, enforced_after=100)
    assert failures("quarantined: [{node: gpu-dra-0, gpu: 3, within: 95s}]", j) == []  # 95 + 5 resolution
    out = failures("quarantined: [{node: gpu-dra-0, gpu: 3, within: 90s}]", j)
    assert out == [
        "quarantined gpu-dra-0/gpu-3: enforced 100s after its first fault (t+30s), more than 90s "
        "(bound 95s with the journal's resolution)"
    ]
    # Relative to the floor: 60 + 35 + 5 = 100 holds, 60 + 30 + 5 = 95 does not.
    assert (
        failures("{quarantined: [{node: gpu-dra-0, gpu: 3}], maxDetectionLatency: {overFloor: 35s}}", j) == []
    )
    out = failures("{quarantined: [{node: gpu-dra-0, gpu: 3}], maxDetectionLatency: {overFloor: 30s}}", j)
    assert "more than the pipeline's floor + 30s" in out[0]
    # A per-device bound wins over the section's.
    section = "{quarantined: [{node: gpu-dra-0, gpu: 3, within: 2m}], maxDetectionLatency: 10s}"
    assert failures(section, j) == []


def test_a_quarantine_without_a_fault_has_no_latency_to_meet() -> None:
    j = journal()
    recorded_only(j, "gpu-dra-0", 3, rule="r")
    assert failures("quarantined: [{node: gpu-dra-0, gpu: 3, within: 1m}]", j) == [
        "quarantined gpu-dra-0/gpu-3: enforced with no fault recorded on the device"
    ]


def test_untouched_devices_and_nodes() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    j.record(40, Kind.ALERT_FIRING, "GPUDeviceUnknown", "gpu-dra-1", uuid("gpu-dra-1", 0), action="none")
    # An alert alone (a warning) is not an action.
    assert failures("untouched: [{node: gpu-dra-1}, {node: gpu-dra-0, gpu: 2}]", j) == []
    assert failures("untouched: [{node: gpu-dra-0}]", j) == [
        "untouched gpu-dra-0/gpu-3: acted on at t+85s (phase Pending) and 2 more"
    ]
    # A pod evicted with its job (a sibling device failed) does not make the device acted on.
    j.record(50, Kind.EVICTION, "ns/p", "gpu-dra-1", uuid("gpu-dra-1", 1))
    assert failures("untouched: [{node: gpu-dra-1, gpu: 1}]", j) == []
    j.record(60, Kind.MIGRATION, "unrecoverable", "gpu-dra-1", uuid("gpu-dra-1", 1), job="ns/p")
    assert failures("untouched: [{node: gpu-dra-1, gpu: 1}]", j) == [
        "untouched gpu-dra-1/gpu-1: acted on at t+60s (migration unrecoverable) and 0 more"
    ]


def test_a_release_must_walk_every_phase_with_passed_checks() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    release(j, "gpu-dra-0", 3, at=200)
    assert failures("released: [{node: gpu-dra-0, gpu: 3}]", j) == []

    short = journal()
    quarantine(short, "gpu-dra-0", 3, at=30)
    # Released right after the canary: what follows it on the ladder never walked nor passed.
    cut = LADDER.phases.index(CANARY) + 1
    release(short, "gpu-dra-0", 3, at=200, phases=(*LADDER.phases[:cut], "Released"))
    out = failures("released: [{node: gpu-dra-0, gpu: 3}]", short)
    assert out[0].startswith(
        f"released gpu-dra-0/gpu-3: did not walk {' -> '.join(walk())}: stopped before {LADDER.phases[cut]}"
    )
    assert "Probing -> Canary -> " in out[0] and " -> Ramp -> Released: " in out[0]
    assert "released gpu-dra-0/gpu-3: no passed canary before release" in out


def test_a_release_that_must_wait_for_a_time_fails_when_its_walk_began_before_it() -> None:
    """`notBefore`: the device is held until then (the NVIDIA DRA driver's taint stands)."""
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    release(j, "gpu-dra-0", 3, at=200)
    assert failures("released: [{node: gpu-dra-0, gpu: 3, notBefore: 3m}]", j) == []
    assert failures("released: [{node: gpu-dra-0, gpu: 3, notBefore: 4m}]", j) == [
        "released gpu-dra-0/gpu-3: began its release walk at t+200s, before t+240s (notBefore)"
    ]
    assert "expect.untouched[0]" in refusal(
        {"untouched": [{"node": "gpu-dra-0", "gpu": 1, "notBefore": "1m"}]}
    )


def test_a_release_interrupted_by_a_failed_check_must_walk_again() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    # Every rung but the last, then back to Quarantined: the last rung alone is no walk.
    release(j, "gpu-dra-0", 3, at=200, phases=LADDER.phases[:-1])
    j.record(260, Kind.PHASE, "Quarantined", "gpu-dra-0", uuid("gpu-dra-0", 3), reason="FatalXid")
    j.record(270, Kind.PHASE, LADDER.phases[-1], "gpu-dra-0", uuid("gpu-dra-0", 3))
    j.record(280, Kind.PHASE, "Released", "gpu-dra-0", uuid("gpu-dra-0", 3))
    out = failures("released: [{node: gpu-dra-0, gpu: 3}]", j)
    assert f"stopped before {LADDER.phases[-1]}" in out[0] and LADDER.phases[-1] == RAMP_PHASE
    assert "released gpu-dra-0/gpu-3: still excluded at the end (quarantine since t+90s)" in out


def test_a_device_held_at_the_end_after_a_failed_attempt() -> None:
    """The idle relapse: checks passed, the device failed again in its window, and it ends
    Quarantined and excluded, its failed attempt counted."""
    section = "quarantinedAtEnd: [{node: gpu-dra-0, gpu: 3, failedAttempts: {min: 1}}]"
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    release(j, "gpu-dra-0", 3, at=200, phases=("Probing", "Canary", "Stabilizing"))
    j.record(260, Kind.PHASE, "Quarantined", "gpu-dra-0", uuid("gpu-dra-0", 3), reason="FatalXid")
    assert failures(section, j) == []

    never_tried = journal()
    quarantine(never_tried, "gpu-dra-0", 3, at=30)
    assert failures(section, never_tried) == [
        "quarantinedAtEnd gpu-dra-0/gpu-3: failed release attempts: expected at least 1, got 0 "
        "(Pending -> Quarantined)"
    ]
    assert failures("quarantinedAtEnd: [{node: gpu-dra-0, gpu: 3}]", never_tried) == []


def test_a_device_released_while_it_fails_is_not_held_at_the_end() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 3, at=30)
    released = release(j, "gpu-dra-0", 3, at=200)["Released"]
    out = failures("quarantinedAtEnd: [{node: gpu-dra-0, gpu: 3}]", j)
    assert out[0].startswith(f"quarantinedAtEnd gpu-dra-0/gpu-3: released at t+{released:.0f}s (")
    assert "quarantinedAtEnd gpu-dra-0/gpu-3: ends in Released, not Quarantined" in out
    assert "quarantinedAtEnd gpu-dra-0/gpu-3: not excluded at the end" in out
    unknown = failures("quarantinedAtEnd: [{node: gpu-dra-0, gpu: 2}]", journal())
    assert unknown == [
        "quarantinedAtEnd gpu-dra-0/gpu-2: ends in no record, not Quarantined",
        "quarantinedAtEnd gpu-dra-0/gpu-2: not excluded at the end",
    ]


def placed(j: Journal, node: str, gpu: int, *, at: float, job: str, opted_in: bool) -> None:
    """A moved job's replacement seen running on the device, as the observer journals it."""
    pod = f"{job}-x"
    j.record(
        at, Kind.NOTE, "placed", node, uuid(node, gpu), pod=pod, job=job,
        devices=uuid(node, gpu), optedIn=str(opted_in).lower(),
    )  # fmt: skip


RAMP = "ramp: [{node: gpu-dp-0, gpu: 1, job: inference/canary}]"


def test_a_ramp_takes_the_opted_in_job_and_nothing_else_before_the_release() -> None:
    j = journal()
    quarantine(j, "gpu-dp-0", 1, at=30, reason="Unhealthy")
    began = release(j, "gpu-dp-0", 1, at=200)  # Released 10 s after the Ramp
    placed(j, "gpu-dp-0", 1, at=began[RAMP_PHASE] + 5, job="inference/canary", opted_in=True)
    placed(j, "gpu-dp-0", 1, at=300, job="batch/train", opted_in=False)  # after the release: fine
    assert failures(RAMP, j) == []

    early = journal()
    quarantine(early, "gpu-dp-0", 1, at=30, reason="Unhealthy")
    began = release(early, "gpu-dp-0", 1, at=200)
    on_canary, on_ramp = began[CANARY] + 5, began[RAMP_PHASE] + 2
    placed(early, "gpu-dp-0", 1, at=on_canary, job="inference/canary", opted_in=True)
    placed(early, "gpu-dp-0", 1, at=on_ramp, job="batch/train", opted_in=False)
    assert failures(RAMP, early) == [
        "ramp gpu-dp-0/gpu-1: no pod of inference/canary was placed on it during its ramp "
        "(placed there: batch/train, inference/canary)",
        f"ramp gpu-dp-0/gpu-1: inference/canary-x was placed on it at t+{on_canary:.0f}s before its release "
        "(the device was not on its ramp)",
        f"ramp gpu-dp-0/gpu-1: batch/train-x was placed on it at t+{on_ramp:.0f}s before its release "
        "(it did not opt in)",
    ]

    never = journal()
    quarantine(never, "gpu-dp-0", 1, at=30, reason="Unhealthy")
    release(never, "gpu-dp-0", 1, at=200, phases=("Probing", "Canary"))
    assert failures(RAMP, never) == [
        "ramp gpu-dp-0/gpu-1: never reached Ramp (Pending -> Quarantined -> Probing -> Canary)"
    ]
    assert failures("ramp: [{node: gpu-dp-0, gpu: 2, job: a/b}]", never) == [
        "ramp gpu-dp-0/gpu-2: never reached Ramp (no record)"
    ]


def test_alerts_fired_and_not_fired_by_name_node_and_device() -> None:
    j = journal()
    j.record(40, Kind.ALERT_FIRING, "GPUDeviceFatalXid", "gpu-dra-0", uuid("gpu-dra-0", 3))
    j.record(50, Kind.ALERT_FIRING, "GPUNodeUnreachable", "gpu-dra-1")
    section = """
    alerts:
      fired:
        - GPUDeviceFatalXid
        - {name: GPUDeviceFatalXid, node: gpu-dra-0, gpu: 3}
        - {name: GPUNodeUnreachable, node: gpu-dra-1}
      notFired:
        - GPUDeviceUnknownExpired
        - {name: GPUDeviceFatalXid, node: gpu-dra-0, gpu: 2}
        - {name: GPUNodeUnreachable, node: gpu-dra-0}
    """
    assert failures(section, j) == []
    section = """
    alerts:
      fired: [{name: GPUDeviceFatalXid, node: gpu-dp-0}]
      notFired: [{name: GPUNodeUnreachable}]
    """
    assert failures(section, j) == [
        "alert GPUDeviceFatalXid on gpu-dp-0: expected to fire, never did (it fired on gpu-dra-0/gpu-3)",
        "alert GPUNodeUnreachable: expected not to fire, fired at t+50s on gpu-dra-1",
    ]


def test_counts_of_migrations_evictions_phases_events_and_node_actions() -> None:
    j = journal()
    for i in range(3):
        quarantine(j, "gpu-dra-0", i, at=30 + i)
    d = uuid("gpu-dra-0", 0)
    j.record(100, Kind.MIGRATION, "succeeded", "gpu-dra-0", d, job="research/train")
    j.record(101, Kind.MIGRATION, "succeeded", "gpu-dra-0", d, job="research/train")  # seen twice: one
    j.record(102, Kind.MIGRATION, "unrecoverable", "gpu-dra-0", uuid("gpu-dra-0", 1), job="research/batch")
    j.record(90, Kind.EVICTION, "research/train-0", "gpu-dra-0", d)
    j.record(91, Kind.EVICTION, "research/train-1", "gpu-dra-0", d)
    j.record(103, Kind.TENANT_EVENT, "GPUQuarantineUnrecoverable", "gpu-dra-0", pod="research/batch-0")
    j.record(104, Kind.PHASE, "Deferred", "gpu-dra-1", uuid("gpu-dra-1", 0))
    good = """
    migrations: {succeeded: 1, unrecoverable: 1, failed: 0}
    evictions: 2
    enforcedDevices: {min: 3}
    phases: {Quarantined: 3, Deferred: {max: 1}}
    tenantEvents: [{reason: GPUQuarantineUnrecoverable, namespace: research}]
    nodeActions: 0
    """
    assert failures(good, j) == []
    j.record(200, Kind.NODE_ACTION, "cordon", "gpu-dra-0", key="node.kubernetes.io/unschedulable")
    bad = """
    migrations: {succeeded: 0}
    evictions: {max: 1}
    enforcedDevices: {max: 2}
    phases: {Deferred: 0}
    tenantEvents: [{reason: GPUQuarantineUnrecoverable, namespace: inference}]
    nodeActions: 0
    """
    assert failures(bad, j) == [
        "migrations succeeded: expected exactly 0, got 1",
        "evictions: expected at most 1, got 2 (research/train-0, research/train-1)",
        "enforced devices: expected at most 2, got 3",
        "devices entering Deferred: expected exactly 0, got 1",
        "tenant events GPUQuarantineUnrecoverable in inference: expected at least 1, got 0",
        "node-wide actions: expected exactly 0, got 1 (cordon on gpu-dra-0)",
    ]
    assert failures("tenantEvents: 0", j) == ["tenant events: expected exactly 0, got 1"]


def test_resets_are_counted_by_outcome_once_per_card_and_request() -> None:
    j = journal()
    quarantine(j, "gpu-dra-0", 0, at=30)
    quarantine(j, "gpu-dra-0", 1, at=31)
    d0, d1 = uuid("gpu-dra-0", 0), uuid("gpu-dra-0", 1)
    j.record(100, Kind.RESET, "started", "gpu-dra-0", d0, request="r0")
    j.record(120, Kind.RESET, "succeeded", "gpu-dra-0", d0, request="r0", reason="GPUResetSucceeded")
    j.record(121, Kind.RESET, "succeeded", "gpu-dra-0", d0, request="r0")  # seen twice: one
    j.record(122, Kind.RESET, "failed", "gpu-dra-0", d1, request="r1", reason="ResetJobFailed")
    j.record(130, Kind.PHASE, "Resetting", "gpu-dra-0", d0)
    assert failures("resets: {succeeded: 1, failed: 1}\nphases: {Resetting: 1}", j) == []
    assert failures("resets: {failed: 0}", j) == ["resets failed: expected exactly 0, got 1"]


def test_the_breaker_tripped_or_closed() -> None:
    j = journal()
    assert failures("breaker: closed", j) == []
    assert failures("breaker: tripped", j) == ["breaker: expected to trip, never did"]
    j.record(120, Kind.BREAKER, "tripped", trigger="rate")
    assert failures("breaker: tripped", j) == []
    assert failures("breaker: closed", j) == [
        "breaker: expected to stay closed, tripped at t+120s (trigger rate)"
    ]


def test_devices_the_journal_does_not_know_fail_rather_than_pass() -> None:
    e = parse(
        {
            "quarantined": [{"node": "far", "gpu": 1}],
            "untouched": [{"node": "near"}],
            "released": [{"node": "far", "gpu": 0}],
        },
        SOURCE,
    )
    assert evaluate(e, journal()) == [
        "quarantined far/gpu-1: not a device of the run's fleet",
        "untouched near: no such device in the run's fleet",
        "released far/gpu-0: not a device of the run's fleet",
    ]


def test_check_reads_the_scenario_section() -> None:
    scenario = from_dict({**FLEET, "expect": {"breaker": "tripped", "nodeActions": 0}})
    assert check(scenario, journal()) == ["breaker: expected to trip, never did"]


def test_a_long_walk_is_shown_shortened() -> None:
    j = journal()
    quarantine(j, "gpu-dp-0", 1, at=30)
    for i in range(200):
        j.record(100 + i, Kind.PHASE, "Probing", "gpu-dp-0", uuid("gpu-dp-0", 1))
        j.record(100.5 + i, Kind.PHASE, "Quarantined", "gpu-dp-0", uuid("gpu-dp-0", 1))
    (line, *_) = failures("released: [{node: gpu-dp-0, gpu: 1}]", j)
    assert line.endswith(
        f"stopped before {LADDER.phases[1]} "
        "(Pending -> Quarantined -> Probing -> Quarantined -> (394 more) -> "
        "Probing -> Quarantined -> Probing -> Quarantined)"
    )


def test_a_job_moved_again_in_a_later_episode_counts_again() -> None:
    j = journal()
    d = uuid("gpu-dp-0", 1)
    j.record(100, Kind.MIGRATION, "succeeded", "gpu-dp-0", d, job="ns/serve", record="q", episode="1")
    j.record(101, Kind.MIGRATION, "succeeded", "gpu-dp-0", d, job="ns/serve", record="q", episode="1")
    j.record(300, Kind.MIGRATION, "succeeded", "gpu-dp-0", d, job="ns/serve", record="q", episode="2")
    assert failures("migrations: {succeeded: 2}", j) == []


def test_checks_on_their_devices_and_how_many_passed() -> None:
    j = journal()
    d, other = uuid("gpu-dp-0", 1), uuid("gpu-dp-0", 2)
    assert failures("checks: {onDevice: true}", j) == [
        "checks: expected probes and canaries on their devices, none ran"
    ]
    j.record(100, Kind.CHECK, "probe", "gpu-dp-0", d, result="passed", ranOn=d)
    j.record(110, Kind.CHECK, "canary", "gpu-dp-0", d, result="passed", ranOn=d)
    assert failures("checks: {onDevice: true, passed: 2}", j) == []
    j.record(120, Kind.CHECK, "probe", "gpu-dp-0", d, result="passed", ranOn=other)
    j.record(130, Kind.CHECK, "canary", "gpu-dp-0", d, result="failed", ranOn="")
    assert failures("checks: {onDevice: true, passed: {max: 2}}", j) == [
        "checks: the probe at t+120s for gpu-dp-0/gpu-1 ran on gpu-dp-0/gpu-2",
        "checks: the canary at t+130s for gpu-dp-0/gpu-1 ran on no device seen",
        "checks passed: expected at most 2, got 3",
    ]


def test_release_requests_answered_as_expected() -> None:
    j = journal()
    d = uuid("gpu-dp-0", 1)
    j.record(100, Kind.REQUEST, "requested", "gpu-dp-0", d, actor="person/ana")
    j.record(101, Kind.REQUEST, "refused", "gpu-dp-0", d, reason="FailureStands", actor="person/ana")
    j.record(400, Kind.REQUEST, "honoured", "gpu-dp-0", d, reason="Honoured", actor="person/ana")
    good = """
    releaseRequests:
      - {node: gpu-dp-0, gpu: 1, answer: refused, reason: FailureStands}
      - {node: gpu-dp-0, gpu: 1, answer: honoured}
    """
    assert failures(good, j) == []
    bad = """
    releaseRequests:
      - {node: gpu-dp-0, gpu: 1, answer: refused, reason: AlertFiring}
      - {node: gpu-dp-0, gpu: 2, answer: honoured}
    """
    assert failures(bad, j) == [
        "release request of gpu-dp-0/gpu-1: expected refused (AlertFiring); got refused (FailureStands) "
        "at t+101s, honoured (Honoured) at t+400s",
        "release request of gpu-dp-0/gpu-2: expected honoured; no answer",
    ]


def test_what_happened_while_the_health_source_was_down() -> None:
    j = journal()
    d = uuid("gpu-dra-0", 1)
    section = "healthSourceDown: {enforced: 1, succeeded: 1, released: 0}"
    assert failures(section, j) == ["healthSourceDown: the health source never went down in this run"]
    j.record(100, Kind.HEALTH_SOURCE, "down")
    j.record(120, Kind.ENFORCED, "quarantine", "gpu-dra-0", d, rule="r")
    j.record(150, Kind.MIGRATION, "succeeded", "gpu-dra-0", d, job="ns/serve")
    j.record(300, Kind.HEALTH_SOURCE, "up")
    j.record(400, Kind.PHASE, "Released", "gpu-dra-0", d)  # after it came back
    assert failures(section, j) == []
    j.record(500, Kind.HEALTH_SOURCE, "down")  # a second outage, never over
    j.record(510, Kind.PHASE, "Released", "gpu-dra-0", uuid("gpu-dra-0", 2))
    assert failures(section, j) == [
        "healthSourceDown: devices released while it was down: expected exactly 0, got 1"
    ]
