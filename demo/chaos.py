"""`gpuhealth chaos`: scenarios run through the whole pipeline while faults are injected.

The plan is pure (`demo.chaos_plan`); this module executes it through the pipeline's seams
(`demo.pipeline.Controls`) and prints one table. `ChaosExecutor`:

- on every pass of the pipeline's observation loop (`on_tick`), opens and closes the API fault
  windows that are due on the simulated apiserver (`SimulatedCluster.api_faults`, reached
  through the cluster handle's `call`) and steps the cluster's wall clock
  (`SimulatedCluster.clock.step`), noting each in the journal;
- decides, as the webhook front's hook, what happens to each notification: forwarded twice
  (a duplicate delivery) or held back until a later one has gone through (out of order);
- leaves process kills to the pipeline, which runs them from the scenario's `demo:` section
  (`chaos_plan.staged` puts them there).

Exit codes: 0 every must-be-0 column is 0 in every run, 1 one is not (or a run failed),
2 bad flags or input.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TextIO

from demo.chaos_plan import ChaosPlan, injected_text
from demo.journal import Journal, Kind
from simulator.apiserver.faults import FaultRule, describe, rule_from_json


class _Cluster(Protocol):
    def call(self, fn: Callable[[Any], Any], timeout: float = ...) -> Any: ...


class RunningPipeline(Protocol):
    """What the executor uses of `demo.pipeline.Running`."""

    @property
    def cluster(self) -> _Cluster: ...
    @property
    def journal(self) -> Journal: ...
    def now(self) -> float: ...


class _Request(Protocol):
    @property
    def body(self) -> bytes: ...


Reply = tuple[int, bytes]


class ChaosExecutor:
    """Applies one `ChaosPlan` to a running pipeline and counts what it injected."""

    def __init__(self, plan: ChaosPlan, out: TextIO | None = None, *, label: str = "chaos") -> None:
        self.plan = plan
        self.out = out
        self.label = label
        self._schedule = plan.api_schedule()
        self._steps = list(plan.steps)
        self._api_counts: dict[str, int] = {}
        self.counts: Counter[str] = Counter()
        """Faults this executor injected itself (clock steps, duplicates, reorders)."""
        self._lock = threading.Condition()
        self.decided = 0
        """Notifications whose fate the hook has drawn."""
        self._forwarded = 0

    # -- the pipeline's seams

    def on_started(self, run: RunningPipeline) -> None:
        run.cluster.call(lambda c: c.api_faults.configure((), seed=self.plan.seed))
        self._say(
            run,
            f"plan: {len(self.plan.windows)} API windows, {len(self.plan.kills)} kills, "
            f"{len(self.plan.steps)} clock steps",
        )

    def on_tick(self, run: RunningPipeline) -> None:
        now = run.now()
        while self._schedule and self._schedule[0][0] <= now:
            _, raw = self._schedule.pop(0)
            rules = tuple(rule_from_json(r, f"window rule {r}") for r in raw)
            run.cluster.call(_configure(rules))
            self._note(run, now, f"API faults now: {describe(rules)}")
        while self._steps and self._steps[0].at <= now:
            step = self._steps.pop(0)
            run.cluster.call(_step(step.seconds))
            self.counts["clock-jump"] += 1
            self._note(run, now, f"cluster clock stepped {step.seconds:+.0f}s")
        self._api_counts = run.cluster.call(lambda c: dict(c.api_faults.injected))

    def front_hook(self, request: _Request, forward: Callable[[Any], Reply]) -> Reply:
        """The webhook front's hook: forward once, twice, or after a later notification."""
        chaos = self.plan.deliveries
        if chaos is None:
            return self._forward(request, forward)
        with self._lock:
            index, self.decided = self.decided, self.decided + 1
        fate = chaos.decide(index)
        if fate.hold:
            with self._lock:
                before = self._forwarded
                overtaken = self._lock.wait_for(lambda: self._forwarded > before, timeout=chaos.hold_seconds)
            if overtaken:
                with self._lock:
                    self.counts["webhook-reorder"] += 1
        reply = self._forward(request, forward)
        if fate.copies > 1:
            with self._lock:
                self.counts["webhook-duplicate"] += 1
            reply = self._forward(request, forward)
        return reply

    def _forward(self, request: _Request, forward: Callable[[Any], Reply]) -> Reply:
        reply = forward(request)
        with self._lock:
            self._forwarded += 1
            self._lock.notify_all()
        return reply

    # -- the figures

    def injected(self, journal: Journal) -> dict[str, int]:
        """Every fault injected in the run, by kind: API faults as the apiserver counted them,
        process kills as the journal recorded them, and this executor's own."""
        total: Counter[str] = Counter(self._api_counts)
        total.update(self.counts)
        total.update(kills_by_kind(journal))
        return {k: total[k] for k in sorted(total) if total[k]}

    def _note(self, run: RunningPipeline, at: float, text: str) -> None:
        run.journal.record(at, Kind.NOTE, f"chaos: {text}")
        self._say(run, text, at)

    def _say(self, run: RunningPipeline, text: str, at: float | None = None) -> None:
        if self.out is not None:
            stamp = f"t+{at if at is not None else run.now():6.0f}s"
            print(f"[{self.label} {stamp}] {text}", file=self.out, flush=True)


def _configure(rules: tuple[FaultRule, ...]) -> Callable[[Any], None]:
    return lambda cluster: cluster.api_faults.configure(rules)


def _step(seconds: float) -> Callable[[Any], None]:
    return lambda cluster: cluster.clock.step(seconds)


def kills_by_kind(journal: Journal) -> Mapping[str, int]:
    """Process kills the journal recorded, by chaos kind (`kill-responder-leader`, ...)."""
    kinds: Counter[str] = Counter()
    for entry in journal.of(Kind.PROCESS):
        if entry.what != "killed":
            continue
        name = entry.detail.get("name", "")
        if name.startswith("responder"):
            kinds[f"kill-responder-{entry.detail.get('role') or 'follower'}"] += 1
        elif name.startswith("exporter"):
            kinds["kill-exporter"] += 1
        elif name.startswith("alertmanager"):
            kinds["kill-alertmanager"] += 1
        else:
            kinds[f"kill-{name}"] += 1
    return kinds


__all__ = ["ChaosExecutor", "injected_text", "kills_by_kind"]
