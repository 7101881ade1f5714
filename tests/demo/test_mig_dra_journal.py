"""The safety verdict on a MIG card on DRA (demo.safety), over the journal of tests/demo/test_safety.

Aspects covered: a card excluded by one DeviceTaintRule per MIG device of it (each rule naming
its own slice device) is one action, not a second rule for the device; a second rule for the same
slice device while the first stands still is a violation; a rule lifted and made again for the
same slice device is not. The observer journals a rule on a MIG device (`gpu-<minor>-mig-...`)
as a rule on its card, with the MIG device's name.
"""

from __future__ import annotations

from demo.journal import Journal, Kind
from demo.observer import RULES
from tests.demo.test_observer import UUID, observer, rule
from tests.demo.test_safety import RESTRICTED, journal, story, verdict

MIG_A, MIG_B = "gpu-1-mig-3g40gb-9-0", "gpu-1-mig-3g40gb-9-4"


def _carved() -> Journal:
    j = story(journal())
    j.record(332, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-m-0", deviceName=MIG_A)
    j.record(332, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-m-1", deviceName=MIG_B)
    return j


def test_one_rule_per_mig_device_of_a_card_is_not_a_second_rule() -> None:
    assert verdict(_carved()).violations == ()


def test_a_second_rule_for_the_same_mig_device_is_a_violation_until_the_first_is_lifted() -> None:
    j = _carved()
    j.record(333, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-m-2", deviceName=MIG_A)
    (violation,) = verdict(j).violations
    assert "a second DeviceTaintRule rule-m-2" in violation and "rule-m-0" in violation
    again = _carved()
    again.record(333, Kind.LIFTED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-m-0", deviceName=MIG_A)
    again.record(334, Kind.ENFORCED, "quarantine", "gpu-dra-0", RESTRICTED, rule="rule-m-2", deviceName=MIG_A)
    assert verdict(again).violations == ()


def test_the_observer_journals_a_rule_on_a_mig_device_as_its_card_naming_the_device() -> None:
    o = observer()
    for i, device in enumerate(("gpu-3-mig-3g40gb-9-0", "gpu-3-mig-3g40gb-9-4")):
        carved = rule("gpuhealth.io/quarantine")
        carved["metadata"]["name"] = f"rec-{i}"
        carved["spec"]["deviceSelector"]["device"] = device
        o.change(1 + i, RULES, "ADDED", carved)
    o.change(3, RULES, "DELETED", carved)
    entries = [(e.kind, e.device, e.detail["rule"], e.detail["deviceName"]) for e in o.journal.entries]
    assert entries == [
        (Kind.ENFORCED, UUID, "rec-0", "gpu-3-mig-3g40gb-9-0"),
        (Kind.ENFORCED, UUID, "rec-1", "gpu-3-mig-3g40gb-9-4"),
        (Kind.LIFTED, UUID, "rec-1", "gpu-3-mig-3g40gb-9-4"),
    ]
