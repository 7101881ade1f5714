"""The release ladder as data (gpuhealth.ladder; responder.ladder names it): one declaration, read by all.

Aspects: the shipped ladder climbs probe, canary, stability window, ramp (in that order, the
probe first and the ramp last; other rungs may come between); the CRD's phase enum,
the demo's progress columns, verdicts, expectations and report colours, and the dashboards'
phase lists are the records' phase sequence; a rung's length comes from its policy setting,
whose default and configuration key are the rung's;
a malformed ladder or rung is refused with what is wrong; a fake rung added to the ladder
(one declaration, its check run by the check executor) is walked by the reconciler in order,
its verdict kept in `status.lastCheck`, and a record standing on it is read back; a fake
backend (one class, one entry in the backends) claims its devices from what the API says,
enforces, names its enforcement, holds the check pod's device request and lifts on release,
while a record walks the fake rung.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards import definitions
from demo import expectations, progress, report, safety, summary
from gpuhealth import yaml_keys
from gpuhealth.kube.resources import Resource
from responder.checks.jobs import CheckSettings, CheckSpec, JobChecks
from responder.enforce.backends import Backends, DeviceRequest, Evidence
from responder.enforce.holders import DeviceHolders
from responder.enforce.identity import Identity
from responder.enforce.node_annotation import NodeAnnotation
from responder.enforce.observed import Observed
from responder.enforce.taint_rules import TaintRules
from responder.ladder import (
    CANARY,
    CANARY_TAINT,
    KNOWN,
    LADDER,
    PROBING,
    QUARANTINE_TAINT,
    RAMP,
    STABILIZING,
    Kind,
    Ladder,
    LadderSettings,
    Rung,
)
from responder.reconcile.policy import CheckResult, Enforce, Health, PolicySettings
from responder.records import PHASES, RELEASE_PHASES, CheckOutcome, Phase, Quarantine, Verdict, from_object
from tests.responder.test_reconciler import NOW, POLICY, SETTINGS, Harness
from tests.support.ladders import check_names, walk

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"


def test_the_shipped_ladder_climbs_probe_canary_window_ramp() -> None:
    # The shipped rungs in their order (a rung added between them keeps them so): the probe
    # first, the ramp last, right before the release.
    shipped = [LADDER.rung(p) for p in (PROBING, CANARY, STABILIZING, RAMP)]
    assert [(r.phase, r.name, r.kind) for r in shipped if r is not None] == [
        (PROBING, "probe", Kind.CHECK),
        (CANARY, "canary", Kind.CHECK),
        (STABILIZING, "stability window", Kind.WINDOW),
        (RAMP, "ramp", Kind.RAMP),
    ]
    assert [p for p in LADDER.phases if p in (PROBING, CANARY, STABILIZING, RAMP)] == [
        PROBING,
        CANARY,
        STABILIZING,
        RAMP,
    ]
    assert LADDER.first.phase == PROBING and LADDER.rungs[-1].phase == RAMP
    assert Ladder(tuple(r for r in shipped if r is not None)).describe() == (
        "probe, canary, stability window and ramp"
    )
    assert LADDER.rung(RAMP) == Rung(
        RAMP, "ramp", Kind.RAMP, 3600, "ramp_seconds", "policy.ramp", taint=CANARY_TAINT
    )
    # The probe judges the device itself; from the canary on, the metrics must agree.
    assert [r.metrics_judge for r in shipped if r is not None] == [False, True, True, True]


def test_every_phase_list_is_the_records_sequence() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert tuple(schema["properties"]["status"]["properties"]["phase"]["enum"]) == PHASES
    # The optional reset rung is a phase a record may hold (before the probe), on or off.
    assert ("Pending", "Deferred", "Quarantined", *KNOWN.phases, "Released", "Abandoned") == PHASES
    assert KNOWN.phases == ("Resetting", *LADDER.phases)
    assert PHASES[:-1] == progress.PHASE_ORDER
    assert frozenset(KNOWN.phases) == safety.RELEASING
    assert (
        summary.RELEASE_PHASES == expectations.RELEASE_WALK == RELEASE_PHASES == (*LADDER.phases, "Released")
    )
    assert set(report.PHASE_COLOURS) == set(PHASES)
    assert definitions.RELEASE_PHASES.split("|") == ["Quarantined", *KNOWN.phases]


def test_a_rungs_length_is_its_policy_setting() -> None:
    rungs = PolicySettings(probe_timeout_seconds=42, ramp_seconds=7).rungs
    given = {PROBING: 42, RAMP: 7}
    assert [r.seconds for r in rungs.rungs] == [given.get(r.phase, r.seconds) for r in LADDER.rungs]


def test_a_rungs_setting_its_default_and_its_key_come_from_the_rung() -> None:
    """One declaration: the setting's default is the rung's declared length, its key the rung's
    key (the configuration file sets it there), for every rung a responder may walk."""
    defaults = LadderSettings()
    keys = {(d.section, d.name): d.attribute for d in yaml_keys.declared(defaults)}
    for rung in KNOWN.rungs:
        assert getattr(defaults, rung.setting) == rung.seconds, rung.phase
        section, _, name = rung.key.partition(".")
        assert keys[(section, name)] == (rung.setting,), rung.phase
    # The rungs that end by a timeout (the stuck alert's rows): the reset and every check.
    assert [r.phase for r in KNOWN.timed_out()] == ["Resetting", *(r.phase for r in LADDER.checks())]


def test_a_check_rungs_pod_is_the_one_it_declares_unless_the_settings_give_one() -> None:
    canary = LADDER.rung(CANARY)
    assert canary is not None and canary.image and canary.command
    assert CheckSettings().spec("canary") == CheckSpec("canary", canary.image, canary.command)
    own = CheckSpec("canary", "example.com/mine:1", ("mine",))
    assert CheckSettings(canary=own).spec("canary") == own


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Ladder(()), "at least one rung"),
        (lambda: Rung("probing", "probe", Kind.CHECK), "one CamelCase word"),
        (lambda: Rung("Probing", "pro be", Kind.CHECK), "letters, digits and '-' only"),
        (lambda: Rung("Ramp", "ramp", Kind.RAMP), "a taint is required"),
        (lambda: Rung("Soak", "soak", Kind.WINDOW, taint="x"), "only a ramp carries a taint"),
        (
            lambda: Rung("Soak", "soak", Kind.WINDOW, image="x", command=("y",)),
            "only a check carries an image",
        ),
        (lambda: Rung("BurnIn", "burn-in", Kind.CHECK, image="x"), "an image and a command, or neither"),
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
LAST_CHECK = LADDER.checks()[-1].phase
"""Where the fake rung goes: after the shipped ladder's last check, before its waits (so its
verdict is the last one kept)."""
BURN_IN_SPEC = CheckSpec(BURN_IN.name, "example.com/burn-in:1", ("burn-in", "--minutes", "5"))
"""Its executor: what its check's pod runs."""


def test_a_fake_rung_is_walked_in_order_with_its_verdict_kept() -> None:
    ladder = LADDER.inserted(BURN_IN, after=LAST_CHECK)
    h = Harness(replace(SETTINGS, policy=replace(POLICY, ladder=ladder)))
    name = h.add()
    h.reconciler.reconcile_once()
    h.resolve(name)
    walked = []
    for _ in range(4 * len(ladder.rungs)):  # a minute or two a rung
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
    assert walked == walk(ladder)  # each rung once, in order
    assert walked[walked.index(LAST_CHECK) + 1] == "BurnIn"
    assert [kind for _, kind, _ in h.checks.started] == check_names(ladder)
    assert [kind for _, kind, _ in h.checks.finished] == check_names(ladder)
    assert "burn-in" in check_names(ladder)
    released = from_object(h.client.objects[name], ladder)
    assert released.status.last_check == CheckOutcome("burn-in", 1, Verdict.PASSED)
    assert h.events.reasons(name)[-1] == "Released"
    # The shipped ladder does not know the rung: a record standing on it is refused by name.
    h.client.objects[name]["status"]["phase"] = "BurnIn"
    with pytest.raises(ValueError, match="'BurnIn' is not a phase"):
        from_object(h.client.objects[name])


class FakeAccelerator:
    """A backend the shipped responder does not have: devices on nodes labelled
    `example.com/accelerator=fake`, enforced by an entry in memory."""

    path = "fake-accelerator"
    listed: tuple[Resource, ...] = ()

    def __init__(self) -> None:
        self.entries: dict[str, str] = {}
        self.calls: list[str] = []

    def identify(self, record: Quarantine, evidence: Evidence) -> Identity | None:
        node = evidence.node() or {}
        if ((node.get("metadata") or {}).get("labels") or {}).get("example.com/accelerator") != "fake":
            return None
        return Identity(self.path, uuid=record.spec.uuid)

    def enforced_as(self, record: Quarantine) -> str:
        return f"FakeEntry/{record.name}"

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool:
        return record.name in self.entries and (
            wanted is None or self.entries[record.name] == wanted.taint_key
        )

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None:
        self.calls.append(f"enforce {effect.taint_key}")
        self.entries[record.name] = effect.taint_key

    def lift(self, record: Quarantine, seen: Observed | None = None) -> None:
        self.calls.append("lift")
        self.entries.pop(record.name, None)

    def holders(self, record: Quarantine, node_pods: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            p
            for p in node_pods
            if p["metadata"].get("annotations", {}).get("fake/device") == record.spec.uuid
        ]

    def device_request(self, record: Quarantine, name: str, namespace: str) -> DeviceRequest:
        return DeviceRequest(
            container={"resources": {"limits": {"example.com/fake": "1"}}},
            pod={"nodeName": record.spec.node},
            annotations={"fake/device": record.spec.uuid},
        )


def test_a_fake_backend_and_a_fake_rung_are_walked_through_by_one_record() -> None:
    ladder = LADDER.inserted(BURN_IN, after=LAST_CHECK)
    fake = FakeAccelerator()
    h = Harness(replace(SETTINGS, policy=replace(POLICY, ladder=ladder)))
    client = h.client
    client.nodes["gpu-node-1"] = {
        "metadata": {"name": "gpu-node-1", "labels": {"example.com/accelerator": "fake"}}
    }
    backends = Backends(client, (TaintRules(client, None), fake, NodeAnnotation(client)))
    h.enforcer = backends  # type: ignore[assignment]
    h.kwargs["holders"] = DeviceHolders(client, backends)
    h.reconciler = h.new_reconciler()
    name = h.add()  # its alert carries no driver label: a device-plugin guess
    h.reconciler.reconcile_once()
    record = from_object(client.objects[name], ladder)
    assert record.spec.path == "fake-accelerator"
    assert record.status.phase == Phase.QUARANTINED and record.status.enforced == f"FakeEntry/{name}"
    assert fake.entries == {name: QUARANTINE_TAINT}
    # The check executor gets the device through the backend's request.
    checks = CheckSettings(extra=(BURN_IN_SPEC,))
    job = JobChecks(client, backends, checks).job(record, BURN_IN.name, 1)
    pod = job["spec"]["template"]
    assert pod["spec"]["containers"][0]["image"] == BURN_IN_SPEC.image
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"example.com/fake": "1"}}
    assert pod["spec"]["nodeName"] == "gpu-node-1"
    assert pod["metadata"]["annotations"]["fake/device"] == record.spec.uuid

    h.resolve(name)
    walked = []
    for _ in range(4 * len(ladder.rungs)):  # a minute or two a rung
        h.clock.advance(61)
        record = from_object(client.objects[name], ladder)
        h.health.set(record.spec.node, record.spec.device, Health.HEALTHY, NOW - 86400)
        rung = ladder.rung(record.status.phase)
        if rung is not None and rung.kind == Kind.CHECK:
            h.checks.complete(record, rung.name, CheckResult.SUCCEEDED)
        h.reconciler.reconcile_once()
        phase = from_object(client.objects[name], ladder).status.phase
        if not walked or walked[-1] != phase:
            walked.append(phase)
        if phase == Phase.RELEASED:
            break
    assert walked == walk(ladder) and walked[walked.index(LAST_CHECK) + 1] == "BurnIn"
    assert fake.calls == [f"enforce {QUARANTINE_TAINT}", f"enforce {CANARY_TAINT}", "lift"]
    assert fake.entries == {}
