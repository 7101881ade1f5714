"""The work a move cost each evicted pod (`responder.reconcile.work_lost`, `WorkLostMeter`).

Aspects: counted from the workload's last checkpoint when it reports one (the annotation), from
the pod's start when it does not; a checkpoint after the eviction is nothing lost, never negative;
a pod that says nothing (never started) is not counted; an annotation that is not RFC 3339 is
refused naming pod, annotation and value, and the meter then counts from the start; the
histogram's series exist at 0 before any eviction, and each eviction is one observation under
its `since`.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from responder.reconcile.accounting import WorkLostMeter
from responder.reconcile.work_lost import LAST_CHECKPOINT, Since, WorkLost, WorkLostError, work_lost

EVICTED = 1_777_000_000.0  # 2026-04-24T03:06:40Z
COUNT = "gpuhealth_migration_work_lost_seconds_count"
SUM = "gpuhealth_migration_work_lost_seconds_sum"


def pod(checkpoint: str | None = None, started: str | None = "2026-04-24T02:06:40Z") -> dict[str, Any]:
    annotations = {} if checkpoint is None else {LAST_CHECKPOINT: checkpoint}
    status = {} if started is None else {"startTime": started}
    return {"metadata": {"namespace": "ml", "name": "train-0", "annotations": annotations}, "status": status}


def test_work_since_the_last_checkpoint_is_lost() -> None:
    assert work_lost(pod("2026-04-24T03:05:40Z"), EVICTED) == WorkLost(60.0, Since.CHECKPOINT)
    # An offset other than UTC is the same instant.
    assert work_lost(pod("2026-04-24T05:05:40+02:00"), EVICTED) == WorkLost(60.0, Since.CHECKPOINT)
    assert work_lost(pod("2026-04-24T03:06:39.5Z"), EVICTED) == WorkLost(0.5, Since.CHECKPOINT)


def test_without_a_checkpoint_everything_since_the_start_is_lost() -> None:
    assert work_lost(pod(), EVICTED) == WorkLost(3600.0, Since.START)


def test_a_checkpoint_after_the_eviction_loses_nothing_rather_than_negative_work() -> None:
    assert work_lost(pod("2026-04-24T03:07:40Z"), EVICTED) == WorkLost(0.0, Since.CHECKPOINT)


def test_a_pod_that_never_started_and_never_checkpointed_is_not_counted() -> None:
    assert work_lost(pod(started=None), EVICTED) is None


@pytest.mark.parametrize("bad", ["yesterday", "2026-04-24", "1777000000", "2026-04-24T03:05:40", ""])
def test_an_unreadable_checkpoint_time_is_refused_with_pod_annotation_and_value(bad: str) -> None:
    with pytest.raises(WorkLostError) as excinfo:
        work_lost(pod(bad), EVICTED)
    assert str(excinfo.value) == (
        f"pod ml/train-0: annotation {LAST_CHECKPOINT}={bad!r} is not an RFC 3339 time such as "
        "2026-05-01T12:00:00Z"
    )


def test_the_meter_observes_each_eviction_under_its_since(caplog: pytest.LogCaptureFixture) -> None:
    registry = CollectorRegistry()
    meter = WorkLostMeter(registry)
    for since in Since:
        assert registry.get_sample_value(COUNT, {"since": since.value}) == 0.0

    assert meter.evicted(pod("2026-04-24T03:05:40Z"), EVICTED) == WorkLost(60.0, Since.CHECKPOINT)
    assert meter.evicted(pod(), EVICTED) == WorkLost(3600.0, Since.START)
    with caplog.at_level(logging.WARNING):
        assert meter.evicted(pod("soon"), EVICTED) == WorkLost(3600.0, Since.START)
    assert "annotation gpuhealth.io/last-checkpoint-time='soon' is not an RFC 3339 time" in caplog.text
    assert meter.evicted(pod(started=None), EVICTED) is None

    assert registry.get_sample_value(COUNT, {"since": "checkpoint"}) == 1.0
    assert registry.get_sample_value(SUM, {"since": "checkpoint"}) == 60.0
    assert registry.get_sample_value(COUNT, {"since": "start"}) == 2.0
    assert registry.get_sample_value(SUM, {"since": "start"}) == 7200.0
    bucket = "gpuhealth_migration_work_lost_seconds_bucket"
    assert registry.get_sample_value(bucket, {"since": "checkpoint", "le": "60.0"}) == 1.0
    assert registry.get_sample_value(bucket, {"since": "checkpoint", "le": "30.0"}) == 0.0
