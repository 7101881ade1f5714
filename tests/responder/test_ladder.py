"""The release ladder as data (responder.ladder): one declaration, read by everything else.

Aspects: the shipped ladder is probe, canary, stability window, ramp; the CRD's phase enum,
the demo's progress columns, verdicts, expectations and report colours, and the dashboards'
phase lists are the records' phase sequence; a rung's length comes from its policy setting;
a malformed ladder or rung is refused with what is wrong; a fake rung added to the ladder
(one declaration, its check run by the check executor) is walked by the reconciler in order,
its verdict kept in `status.lastCheck`, and a record standing on it is read back.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dashboards import definitions
from demo import expectations, progress, report, safety, summary
from responder.ladder import CANARY, CANARY_TAINT, LADDER, PROBING, RAMP, STABILIZING, Kind, Ladder, Rung
from responder.policy import CheckResult, Health, PolicySettings
from responder.records import PHASES, RELEASE_PHASES, CheckOutcome, Phase, Verdict, from_object
from tests.responder.test_reconciler import NOW, POLICY, SETTINGS, Harness

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"


def test_the_shipped_ladder_is_probe_canary_window_ramp() -> None:
    assert [(r.phase, r.name, r.kind) for r in LADDER.rungs] == [
        (PROBING, "probe", Kind.CHECK),
        (CANARY, "canary", Kind.CHECK),
        (STABILIZING, "stability window", Kind.WINDOW),
        (RAMP, "ramp", Kind.RAMP),
    ]
    assert LADDER.describe() == "probe, canary, stability window and ramp"
    assert LADDER.rung(RAMP) == Rung(RAMP, "ramp", Kind.RAMP, setting="ramp_seconds", taint=CANARY_TAINT)
    # The probe judges the device itself; from the canary on, the metrics must agree.
    assert [r.metrics_judge for r in LADDER.rungs] == [False, True, True, True]


def test_every_phase_list_is_the_records_sequence() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert tuple(schema["properties"]["status"]["properties"]["phase"]["enum"]) == PHASES
    assert ("Pending", "Deferred", "Quarantined", *LADDER.phases, "Released", "Abandoned") == PHASES
    assert PHASES[:-1] == progress.PHASE_ORDER
    assert frozenset(LADDER.phases) == safety.RELEASING
    assert (
        summary.RELEASE_PHASES == expectations.RELEASE_WALK == RELEASE_PHASES == (*LADDER.phases, "Released")
    )
    assert set(report.PHASE_COLOURS) == set(PHASES)
    assert definitions.RELEASE_PHASES.split("|") == ["Quarantined", *LADDER.phases]


def test_a_rungs_length_is_its_policy_setting() -> None:
    rungs = PolicySettings(probe_timeout_seconds=42, ramp_seconds=7).rungs
    assert [r.seconds for r in rungs.rungs] == [42, 1200, 1800, 7]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Ladder(()), "at least one rung"),
        (lambda: Rung("probing", "probe", Kind.CHECK), "one CamelCase word"),
        (lambda: Rung("Probing", "pro be", Kind.CHECK), "letters, digits and '-' only"),
        (lambda: Rung("Ramp", "ramp", Kind.RAMP), "a taint is required"),
        (lambda: Rung("Soak", "soak", Kind.WINDOW, taint="x"), "only a ramp carries a taint"),
        (lambda: LADDER.inserted(Rung(CANARY, "again", Kind.WINDOW, seconds=1), after=PROBING), "repeat"),
        (
            lambda: PolicySettings(ladder=LADDER.inserted(Rung("Soak", "soak", Kind.WINDOW), after=CANARY)),
            "rung Soak's seconds must be finite and greater than zero",
        ),
        (
            lambda: PolicySettings(ladder=Ladder((Rung("Soak", "soak", Kind.WINDOW, setting="dry_run"),))),
            "'dry_run' is not a duration field",
        ),
    ],
)
def test_a_malformed_ladder_is_refused_with_what_is_wrong(build: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()  # type: ignore[operator]


BURN_IN = Rung("BurnIn", "burn-in", Kind.CHECK, seconds=300)
"""A rung the shipped ladder does not have: one declaration, run by the check executor."""


def test_a_fake_rung_is_walked_in_order_with_its_verdict_kept() -> None:
    ladder = LADDER.inserted(BURN_IN, after=CANARY)
    h = Harness(replace(SETTINGS, policy=replace(POLICY, ladder=ladder)))
    name = h.add()
    h.reconciler.reconcile_once()
    h.resolve(name)
    walked = []
    for _ in range(12):
        h.clock.advance(61)
        record = from_object(h.client.objects[name], ladder)
        h.health.set(record.spec.node, record.spec.device, Health.HEALTHY, NOW - 86400)
        rung = ladder.rung(record.status.phase)
        if rung is not None and rung.kind == Kind.CHECK:
            h.checks.complete(record, rung.name, CheckResult.SUCCEEDED)
        h.reconciler.reconcile_once()
        phase = from_object(h.client.objects[name], ladder).status.phase
        if not walked or walked[-1] != phase:
            walked.append(phase)
        if phase == Phase.RELEASED:
            break
    assert walked == [PROBING, CANARY, "BurnIn", STABILIZING, RAMP, "Released"]
    assert [kind for _, kind, _ in h.checks.started] == ["probe", "canary", "burn-in"]
    assert [kind for _, kind, _ in h.checks.finished] == ["probe", "canary", "burn-in"]
    released = from_object(h.client.objects[name], ladder)
    assert released.status.last_check == CheckOutcome("burn-in", 1, Verdict.PASSED)
    assert h.events.reasons(name)[-1] == "Released"
    # The shipped ladder does not know the rung: a record standing on it is refused by name.
    h.client.objects[name]["status"]["phase"] = "BurnIn"
    with pytest.raises(ValueError, match="'BurnIn' is not a phase"):
        from_object(h.client.objects[name])
