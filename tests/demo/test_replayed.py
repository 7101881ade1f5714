"""A recorded run's journal as the replay's input (demo.replayed), without a run.

Aspects: the responder's deliveries keep their times on the responders' clock (scenario seconds
over the speed) and Alertmanager's episodes (a duplicate or re-delivery is the same episode, a
firing after its resolved a new one), other receivers' deliveries are left out; a check's verdict
lasts as long after its rung began as in the run; a device-unhealthy fault reads Unhealthy for its
duration or until a `recover`, an open one until `recover` or the run's end, an application XID
and an ECC error not at all, a device-unknown fault is an Unknown spell; the pods holding a
device are the tenants', on every card they list, until they stop (gpuhealth's check and holder
pods left out); a fault kind, a node fault or a reset the replay does not model is refused,
naming it; the comparison names every device and field where the replay differs, and a record
on one side only.
"""

from __future__ import annotations

import pytest

from demo.journal import Device, Journal, Kind
from demo.replayed import Reached, differences, recorded
from responder.reconcile.policy import CheckResult
from responder.replay.timeline import Signal

SPEED = 20.0
NODE = "gpu-dp-0"
GPU0, GPU1 = "GPU-0000", "GPU-1111"
RECORD = "gpu-dp-0-gpu-0000"


def journal() -> Journal:
    return Journal(
        scenario="hand-written",
        description="",
        speed=SPEED,
        devices={u: Device(u, NODE, i, "device-plugin") for i, u in enumerate((GPU0, GPU1))},
        ended_at=800.0,
    )


def deliver(j: Journal, at: float, status: str, receiver: str = "responder") -> None:
    detail = {
        "alertname": "GPUDeviceUnhealthy",
        "status": status,
        "action": "quarantine",
        "fingerprint": "f0",
    }
    j.record(at, Kind.DELIVERY, receiver, NODE, GPU0, **detail)


def test_deliveries_keep_their_time_on_the_responders_clock_and_alertmanagers_episodes() -> None:
    j = journal()
    deliver(j, 100.0, "firing")
    deliver(j, 100.5, "firing")  # the HA peer's copy
    deliver(j, 140.0, "firing", receiver="page")
    deliver(j, 300.0, "resolved")
    deliver(j, 600.0, "firing")  # fired again: a new episode

    got = recorded(j).deliveries

    assert [(d.at, d.status, d.starts_at) for d in got] == [
        (5.0, "firing", 5.0),
        (100.5 / SPEED, "firing", 5.0),
        (15.0, "resolved", 5.0),
        (30.0, "firing", 30.0),
    ]
    assert dict(got[0].labels) == {
        "alertname": "GPUDeviceUnhealthy",
        "action": "quarantine",
        "node": NODE,
        "device": GPU0,
    }
    assert {d.fingerprint for d in got} == {"f0"}


def test_a_checks_verdict_lasts_as_long_after_its_rung_began_as_in_the_run() -> None:
    j = journal()
    for at, phase in ((100.0, "Pending"), (101.0, "Quarantined"), (320.0, "Probing"), (420.0, "Canary")):
        j.record(at, Kind.PHASE, phase, NODE, GPU0, record=RECORD, attempt="1")
    j.record(340.0, Kind.CHECK, "probe", NODE, GPU0, record=RECORD, attempt="1", result="passed")
    j.record(430.0, Kind.CHECK, "canary", NODE, GPU0, record=RECORD, attempt="1", result="failed")

    verdicts = recorded(j).verdicts

    assert verdicts == {
        ((NODE, GPU0), "probe", 1): (20.0 / SPEED, CheckResult.SUCCEEDED),
        ((NODE, GPU0), "canary", 1): (10.0 / SPEED, CheckResult.FAILED),
    }


def test_faults_give_the_unhealthy_reports_of_the_device_plugin() -> None:
    j = journal()
    j.record(20.0, Kind.FAULT, "device-unhealthy", NODE, GPU0, duration="240")
    j.record(200.0, Kind.FAULT, "recover", NODE, GPU0)  # before the fault's own end
    j.record(30.0, Kind.FAULT, "xid", NODE, GPU1, xid="13")  # an application's error
    j.record(40.0, Kind.FAULT, "xid", NODE, GPU1, xid="79")
    j.record(400.0, Kind.FAULT, "recover", NODE, GPU1)
    j.record(600.0, Kind.FAULT, "device-unhealthy", NODE, GPU0)  # no end: until the run's
    j.record(610.0, Kind.FAULT, "ecc", NODE, GPU1)  # its alert and its checks see it, no reading
    j.record(620.0, Kind.FAULT, "device-unknown", NODE, GPU1, duration="90")

    timeline = recorded(j).timeline

    assert sorted((f.device, f.at, f.until) for f in timeline.faults) == [
        (GPU0, 1.0, 10.0),
        (GPU0, 30.0, 40.0),
        (GPU1, 2.0, 20.0),
    ]
    assert {f.signal for f in timeline.faults} == {Signal.FATAL_XID}
    assert [(u.node, u.devices, u.at, u.seconds) for u in timeline.spells] == [(NODE, (GPU1,), 31.0, 4.5)]
    assert (timeline.start, timeline.end, timeline.eligible) == (0.0, 40.0, 2)


def test_the_pods_holding_a_device_are_the_tenants_not_gpuhealths_own() -> None:
    j = journal()
    both = f"{GPU0},{GPU1}"
    j.record(
        100.0, Kind.POD, "running", NODE, GPU0, pod="inference/serve-a", job="inference/serve", devices=both
    )
    j.record(
        200.0, Kind.POD, "stopped", NODE, GPU0, pod="inference/serve-a", job="inference/serve", devices=both
    )
    j.record(
        300.0, Kind.POD, "running", NODE, GPU1, pod="gpuhealth-system/probe-1-x", devices=GPU1, check="probe"
    )
    j.record(
        300.0, Kind.POD, "running", NODE, GPU1, pod="gpuhealth-system/hold-y", devices=GPU1, holder=RECORD
    )
    j.record(
        400.0, Kind.POD, "running", NODE, GPU1, pod="research/train-0", job="research/train", devices=GPU1
    )

    holders = recorded(j).holders

    assert holders == {
        (NODE, GPU0): ((5.0, 10.0, "inference/serve-a"),),
        (NODE, GPU1): ((5.0, 10.0, "inference/serve-a"), (20.0, float("inf"), "research/train-0")),
    }


@pytest.mark.parametrize(
    ("kind", "what", "device", "named"),
    [
        (Kind.FAULT, "flap", GPU0, "fault flap"),
        (Kind.FAULT, "kubelet-stopped", "", "node fault kubelet-stopped"),
        (Kind.RESET, "started", GPU0, "reset entry"),
    ],
)
def test_what_the_replay_does_not_model_is_refused_by_name(
    kind: Kind, what: str, device: str, named: str
) -> None:
    j = journal()
    j.record(50.0, kind, what, NODE, device)
    with pytest.raises(ValueError, match=named):
        recorded(j)


def test_the_comparison_names_each_device_and_field_that_differs() -> None:
    walked = Reached("quarantine", "Unhealthy", ("Pending", "Quarantined", "Probing"), "Probing", 1, 1, 0)
    relapsed = Reached("quarantine", "Unhealthy", ("Pending", "Quarantined"), "Quarantined", 1, 1, 0)
    run = {(NODE, GPU0): walked, (NODE, GPU1): walked}
    replayed = {(NODE, GPU0): walked, (NODE, GPU1): relapsed, ("gpu-dp-1", GPU0): walked}

    assert differences(run, run) == []
    assert differences(run, replayed) == [
        f"{NODE}/{GPU1}: phases: run ('Pending', 'Quarantined', 'Probing'), "
        "replay ('Pending', 'Quarantined')",
        f"{NODE}/{GPU1}: final: run 'Probing', replay 'Quarantined'",
        f"gpu-dp-1/{GPU0}: a record in the replay only",
    ]
