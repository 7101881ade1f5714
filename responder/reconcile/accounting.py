"""The leader's measures of what quarantines cost and what they turned out to be.

`WorkLostMeter` is the third: `gpuhealth_migration_work_lost_seconds{since}`, the work each pod
evicted by a move had done since its last checkpoint (`responder.reconcile.work_lost`), observed
by the migration executor when an eviction lands.

The instruments of `gpuhealth_quarantined_device_seconds_total` (the rule in
`responder.reconcile.measures`) and `gpuhealth_quarantines_ended_total` (the verdict in
`responder.verdicts`), fed by the reconciler at the end of each pass and at each quarantine's
end. Kept apart from the reconciler's other gauges because both are counters whose first
increment `increase()` must see: every series is created at 0 as soon as it can be named (a
device enters an excluding phase; a quarantine of a reason is open), one pass before it can
grow.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry

from gpuhealth import instruments
from responder import metrics
from responder.ladder import LADDER, Ladder
from responder.reconcile.measures import ExclusionMeter, series_of
from responder.reconcile.work_lost import Since, WorkLost, WorkLostError, fallback, work_lost
from responder.records import ACTIVE_PHASES, Quarantine
from responder.verdicts import QuarantineVerdict, verdict_of

log = logging.getLogger(__name__)


class QuarantineAccounting:
    def __init__(
        self, registry: CollectorRegistry, *, ladder: Ladder = LADDER, dry_run: bool = False
    ) -> None:
        self.seconds = instruments.counter(metrics.QUARANTINED_SECONDS, registry)
        self.ended = instruments.counter(metrics.QUARANTINES_ENDED, registry)
        self._meter = ExclusionMeter(ladder=ladder, dry_run=dry_run)
        self._ladder = ladder

    def passed(self, now: float, listed: Iterable[Quarantine], decided: Iterable[Quarantine]) -> None:
        """A pass completed at `now`: `listed` as the pass read the records, `decided` as it left them."""
        for series, seconds in self._meter.advance(now, listed).items():
            self.seconds.labels(*series).inc(seconds)
        for record in decided:
            born = series_of(record, ladder=self._ladder, dry_run=self._meter.dry_run)
            if born is not None:
                self.seconds.labels(*born)
            if record.status.phase in ACTIVE_PHASES:
                for verdict in QuarantineVerdict:
                    self.ended.labels(verdict.value, record.spec.reason)

    def quarantine_ended(self, record: Quarantine) -> QuarantineVerdict | None:
        """`record` was just written Released or Abandoned: count its verdict (if it has one)."""
        verdict = verdict_of(record, self._ladder)
        if verdict is not None:
            self.ended.labels(verdict.value, record.spec.reason).inc()
        return verdict

    def term_ended(self) -> None:
        """This replica stopped leading: its series stay (counters only grow), its account restarts."""
        self._meter.forget()


class WorkLostMeter:
    """`gpuhealth_migration_work_lost_seconds{since}`, both series born at 0 (empty histograms)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.histogram = instruments.histogram(
            metrics.MIGRATION_WORK_LOST, registry, metrics.WORK_LOST_BUCKETS
        )
        for since in Since:
            self.histogram.labels(since.value)

    def evicted(self, pod: Mapping[str, Any], now: float) -> WorkLost | None:
        """An eviction of a move landed on `pod` (the object as read before it) at `now`."""
        try:
            lost = work_lost(pod, now)
        except WorkLostError as error:
            log.warning("%s; counting the work lost since the pod started", error)
            lost = fallback(pod, now)
        if lost is not None:
            self.histogram.labels(lost.since.value).observe(lost.seconds)
        return lost
