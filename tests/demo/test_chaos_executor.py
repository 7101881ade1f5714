"""The chaos executor (`demo/chaos.py`) against a stand-in for the running pipeline.

Aspects: API fault windows are configured on the cluster's injector when their time comes and
cleared when they close, each noted in the journal; clock steps move the cluster's steppable
clock once; what the injector counted, the executor's own faults and the kills the journal
recorded add up by kind; the webhook hook forwards once without webhook faults, twice for a
duplicate, and a late delivery sends the notification before it again after its own (out of
order). On the real control
plane: each component restart and compaction is done once at its time, in plan order (a
compaction compacts etcd, then restarts kube-apiserver), counted by kind and noted with how long
the restart took; after a compaction the exporters' expired-watch restarts rising in Prometheus
is noted once as the evidence of 410s, and not before they rise; a plan for one control plane
on the other's cluster fails at the start. The command refuses, before it starts anything (exit
2), a fault kind of the other control plane and `--kubernetes-version` without the real one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from demo.chaos import EXPIRED_WATCHES, ChaosExecutor, kills_by_kind
from demo.chaos_plan import REAL, ApiWindow, ChaosError, ChaosPlan, ClockStep, DeliveryChaos, PlaneFault
from demo.journal import Journal, Kind
from gpuhealth.clock import SteppableClock
from gpuhealth_cli.main import main
from simulator.apiserver.faults import FaultInjector


@dataclasses.dataclass
class FakeCluster:
    """What `ClusterHandle.call` hands its function: the injector and the clock of a cluster."""

    api_faults: FaultInjector = dataclasses.field(default_factory=FaultInjector)
    clock: SteppableClock = dataclasses.field(default_factory=SteppableClock)

    def call(self, fn: Callable[[Any], Any], timeout: float = 30.0) -> Any:
        return fn(self)


@dataclasses.dataclass
class FakePlane:
    """What `ControlPlane` does for the executor, recorded: ("restart", name) and ("compact",)."""

    done: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    revision: int = 41
    revived: list[str] = dataclasses.field(default_factory=list)

    def restart(self, name: str) -> float:
        self.done.append(("restart", name))
        if name == "kube-apiserver":
            self.revived.append("kube-controller-manager")  # as the real one may exit meanwhile
        return 2.5

    def compact_etcd(self) -> int:
        self.done.append(("compact",))
        self.revision += 1
        return self.revision


@dataclasses.dataclass
class FakeRealCluster:
    plane: FakePlane = dataclasses.field(default_factory=FakePlane)


@dataclasses.dataclass
class FakePrometheus:
    expired: float | None = 3.0
    asked: list[str] = dataclasses.field(default_factory=list)

    def value(self, expr: str) -> float | None:
        self.asked.append(expr)
        return self.expired


@dataclasses.dataclass
class FakeRun:
    cluster: Any
    journal: Journal
    at: float = 0.0
    prometheus: FakePrometheus = dataclasses.field(default_factory=FakePrometheus)

    def now(self) -> float:
        return self.at


def _run() -> FakeRun:
    return FakeRun(FakeCluster(), Journal("s", "", 20.0, {}))


def test_windows_open_and_close_and_clock_steps_apply_once() -> None:
    plan = ChaosPlan(
        seed=4,
        kinds=("api-503", "clock-jump"),
        windows=(ApiWindow(10, 70, "api-503", {"kind": "error", "code": 503, "probability": 1.0}),),
        steps=(ClockStep(40, 120.0),),
    )
    executor = ChaosExecutor(plan)
    run = _run()
    executor.on_started(run)
    executor.on_tick(run)
    assert not run.cluster.api_faults.active
    run.at = 12
    executor.on_tick(run)
    assert [r.code for r in run.cluster.api_faults.rules] == [503]
    run.cluster.api_faults.decide("list", "pods", "pods")  # a request meets the fault
    run.at = 45
    executor.on_tick(run)
    executor.on_tick(run)
    assert run.cluster.clock.offset == 120.0  # once, however many ticks follow
    run.at = 80
    executor.on_tick(run)
    assert not run.cluster.api_faults.active
    notes = [e.what for e in run.journal.of(Kind.NOTE)]
    assert notes == [
        "chaos: API faults now: api-503@1",
        "chaos: cluster clock stepped +120s",
        "chaos: API faults now: none",
    ]
    run.journal.record(50, Kind.PROCESS, "killed", name="responder-1", role="leader")
    run.journal.record(60, Kind.PROCESS, "killed", name="exporter-gpu-dp-0")
    run.journal.record(61, Kind.PROCESS, "started", name="exporter-gpu-dp-0")
    assert executor.injected(run.journal) == {
        "api-503": 1,
        "clock-jump": 1,
        "kill-exporter": 1,
        "kill-responder-leader": 1,
    }


def test_kills_by_kind_name_the_role() -> None:
    j = Journal("s", "", 20.0, {})
    j.record(1, Kind.PROCESS, "killed", name="responder-0", role="follower")
    j.record(2, Kind.PROCESS, "killed", name="alertmanager-1")
    assert kills_by_kind(j) == {"kill-responder-follower": 1, "kill-alertmanager": 1}


@dataclasses.dataclass(frozen=True)
class Req:
    body: bytes


def test_the_hook_forwards_once_without_webhook_faults_and_twice_for_a_duplicate() -> None:
    sent: list[bytes] = []

    def forward(request: Any) -> tuple[int, bytes]:
        sent.append(request.body)
        return 200, b"ok"

    plain = ChaosExecutor(ChaosPlan(seed=1, kinds=()))
    assert plain.front_hook(Req(b"a"), forward) == (200, b"ok") and sent == [b"a"]
    twice = ChaosExecutor(
        ChaosPlan(seed=1, kinds=("webhook-duplicate",), deliveries=DeliveryChaos(1, duplicate=1.0))
    )
    sent.clear()
    assert twice.front_hook(Req(b"b"), forward) == (200, b"ok")
    assert sent == [b"b", b"b"] and twice.counts == {"webhook-duplicate": 1}


def test_a_late_delivery_sends_the_notification_before_again_after_its_own() -> None:
    sent: list[bytes] = []

    def forward(request: Any) -> tuple[int, bytes]:
        sent.append(request.body)
        return 200, request.body

    executor = ChaosExecutor(
        ChaosPlan(seed=1, kinds=("webhook-reorder",), deliveries=DeliveryChaos(1, reorder=1e-9, at_least=1))
    )
    assert executor.front_hook(Req(b"first"), forward) == (200, b"first")  # none before it
    assert executor.front_hook(Req(b"second"), forward) == (200, b"second")  # its own answer
    assert executor.front_hook(Req(b"third"), forward) == (200, b"third")
    assert sent == [b"first", b"second", b"first", b"third"]  # the older one after the newer
    assert executor.counts == {"webhook-reorder": 1}


def _real_plan() -> ChaosPlan:
    return ChaosPlan(
        seed=2,
        kinds=("restart-etcd", "etcd-compaction", "restart-scheduler"),
        plane_faults=(
            PlaneFault(10, "restart-etcd"),
            PlaneFault(10, "restart-scheduler"),
            PlaneFault(30, "etcd-compaction"),
        ),
        control_plane=REAL,
    )


def test_control_plane_faults_are_done_once_at_their_time_and_a_compaction_restarts_the_apiserver() -> None:
    executor = ChaosExecutor(_real_plan())
    run = FakeRun(FakeRealCluster(), Journal("s", "", 20.0, {}))
    plane = run.cluster.plane
    executor.on_started(run)
    executor.on_tick(run)
    assert plane.done == []
    run.at = 12
    executor.on_tick(run)
    executor.on_tick(run)
    assert plane.done == [("restart", "etcd"), ("restart", "kube-scheduler")]
    run.at = 31
    executor.on_tick(run)
    assert plane.done[2:] == [("compact",), ("restart", "kube-apiserver")]
    assert executor.injected(run.journal) == {"etcd-compaction": 1, "restart-etcd": 1, "restart-scheduler": 1}
    notes = [e.what for e in run.journal.of(Kind.NOTE)]
    assert notes[:3] == [
        "chaos: etcd restarted, the control plane ready again after 2.5 s wall "
        "(the pipeline's observation waited until t+12s)",
        "chaos: kube-scheduler restarted, the control plane ready again after 2.5 s wall "
        "(the pipeline's observation waited until t+12s)",
        "chaos: etcd compacted at revision 42, then kube-apiserver restarted, the control plane ready "
        "again after 2.5 s wall; kube-controller-manager had exited and was started again "
        "(the pipeline's observation waited until t+31s)",
    ]


def test_the_410s_after_a_compaction_are_noted_once_the_exporters_count_them() -> None:
    executor = ChaosExecutor(_real_plan())
    run = FakeRun(FakeRealCluster(), Journal("s", "", 20.0, {}))
    executor.on_started(run)
    run.at = 31
    executor.on_tick(run)  # baseline read before the compaction: 3
    assert run.prometheus.asked and set(run.prometheus.asked) == {EXPIRED_WATCHES}
    executor.on_tick(run)
    run.prometheus.expired = None  # Prometheus did not answer: asked again later
    executor.on_tick(run)
    assert executor.expired_watches == 0
    assert not [e for e in run.journal.of(Kind.NOTE) if "410" in e.what]
    run.prometheus.expired = 8.0
    run.at = 33
    executor.on_tick(run)
    asked = len(run.prometheus.asked)
    executor.on_tick(run)
    assert len(run.prometheus.asked) == asked  # once seen, no more reads
    assert executor.expired_watches == 5
    [note] = [e for e in run.journal.of(Kind.NOTE) if "410" in e.what]
    assert note.at == 33
    assert note.what == (
        "chaos: our watches met 410 Gone: 5 exporter watch restarts (expired) since the compaction, "
        "each followed by a list"
    )


def test_a_plan_for_one_control_plane_fails_at_the_start_on_the_other() -> None:
    with pytest.raises(ChaosError, match="need the real control plane"):
        ChaosExecutor(_real_plan()).on_started(_run())
    simulated = ChaosPlan(seed=1, kinds=("api-503",))
    with pytest.raises(ChaosError, match="need the simulated cluster"):
        ChaosExecutor(simulated).on_started(FakeRun(FakeRealCluster(), Journal("s", "", 20.0, {})))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--control-plane", "real", "--faults", "kills,api-503"],
            "--faults: api-503 cannot be injected on the real control plane (only on the simulated one)",
        ),
        (
            ["--faults", "control-plane"],
            "--faults: restart-apiserver, restart-etcd, etcd-compaction, restart-scheduler, "
            "restart-controller-manager cannot be injected on the simulated control plane "
            "(only on the real one)",
        ),
        (["--kubernetes-version", "1.36"], "--kubernetes-version applies to --control-plane real"),
    ],
)
def test_the_command_refuses_faults_its_control_plane_cannot_inject(
    tmp_path: Path, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    workdir = tmp_path / "run"
    assert main(["chaos", *flags, "--workdir", str(workdir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuhealth chaos: error: {message}"), err
    assert not workdir.exists()  # refused before anything started
