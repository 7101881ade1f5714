"""The end-to-end latency bench's own parts (the run itself is `python -m bench e2e_latency`).

Aspects covered: bad options are usage errors; the bench scenario is a valid scenario with
every fault on its own allocated GPU, each kind the same number of times, Unknowns on DRA
devices, faults spaced; the figures per fault kind come from the summary, with the excess over
the floor in wall seconds, and a kind misses its target when a fault of it never reached
enforcement.
"""

from __future__ import annotations

import itertools

import pytest

from bench.bench_e2e_latency import KINDS, bench_scenario, figures, main
from demo.journal import Kind
from demo.summary import summarize
from simulator.scenario import from_dict
from tests.support import journals
from tests.support.journals import XID_GPU, uuid


def test_the_bench_scenario_puts_each_fault_on_its_own_gpu() -> None:
    scenario = from_dict(bench_scenario(per_kind=3, spacing=10.0))
    places = [(f.device.node, f.device.gpu) for f in scenario.timeline if f.device is not None]
    assert len(places) == len(set(places)) == 3 * len(KINDS)
    kinds = [f.kind for f in scenario.timeline]
    assert {k: kinds.count(k) for k in kinds} == {kind: 3 for kind, _, _ in KINDS}
    assert all(f.device.node.startswith("lat-dra") for f in scenario.timeline if f.kind == "device-unknown")
    times = [f.at for f in scenario.timeline]
    assert all(b - a == pytest.approx(10.0) for a, b in itertools.pairwise(times))
    # Every GPU holds a pod, so the kubelet reports on each of them.
    assert sum(w.replicas * w.gpus_per_pod for w in scenario.workloads) == scenario.gpu_count()


def test_a_fleet_too_small_for_the_faults_is_refused() -> None:
    with pytest.raises(ValueError, match="no device left"):
        bench_scenario(per_kind=100)


def test_figures_per_fault_kind() -> None:
    journal = journals.closed_loop()
    summary = summarize(journal, floors={"GPUDeviceFatalXid": 40.0, "GPUDeviceUnknownExpired": 340.0})
    rows = {r.fault: r for r in figures(summary, speed=20.0)}
    xid = rows["xid"]
    # Two xid faults: the fatal one reached enforcement, the application XID never fired.
    assert (xid.count, xid.seen, xid.alert, xid.floors) == (1, 2, "FatalXid x1", "40")
    assert xid.median == pytest.approx(43.4)
    assert xid.over_median_wall == pytest.approx(3.4 / 20.0)
    assert not xid.met  # one fault of the kind never reached enforcement
    unknown = rows["device-unknown"]
    assert (unknown.count, unknown.seen) == (1, 2)
    assert unknown.median == pytest.approx(427.0 - 85.0)
    assert rows["ecc"].count == rows["ecc"].seen == 0


def test_a_kind_meets_its_target_when_every_fault_is_enforced_within_the_floor() -> None:
    journal = journals.empty()
    device = uuid(XID_GPU)
    journal.record(10.0, Kind.FAULT, "gpu-lost", "gpu-dra-0", device)
    journal.record(52.0, Kind.ALERT_FIRING, "GPUDeviceFatalXid", "gpu-dra-0", device, action="quarantine")
    journal.record(
        52.5, Kind.DELIVERY, "responder", "gpu-dra-0", device, alertname="GPUDeviceFatalXid", status="firing"
    )
    journal.record(53.0, Kind.ENFORCED, "quarantine", "gpu-dra-0", device, rule="r")
    rows = {r.fault: r for r in figures(summarize(journal, floors={"GPUDeviceFatalXid": 40.0}), speed=20.0)}
    assert rows["gpu-lost"].met
    assert rows["gpu-lost"].over_p99_wall == pytest.approx(3.0 / 20.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--per-kind", "0"], "--per-kind 0: at least 1"),
        (["--per-kind", "100"], "no device left"),
        (["--speed", "0"], "--speed"),
        # The rules shrunk 200 times no longer hold together: the first check that fails (the
        # warning inside the shortest Unknown window) names its keys.
        (["--speed", "200"], "device.unknown_tolerance_floor (1s)"),
    ],
)
def test_bad_options_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err
