"""When the migrator reads the other records (responder.migrate.executor, a performance fix).

Aspects: a quarantined device with nothing to move (no pods on it, every move it remembers
finished) comes back exactly as before and costs no list of the records (reading them made a
reconcile pass quadratic in the records); a device with a job on it, or with a move still in
flight, reads them once, so the per-node and per-namespace caps are still rebuilt from them.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from gpuhealth.clock import ManualClock
from gpuhealth.kube.resources import Resource
from responder.migrate.executor import Migrator, MigratorMetrics, MigratorSettings
from responder.records import Migration, MigrationOutcome, Quarantine
from tests.responder.test_migrator import NOW, FakeClient, pod, record
from tests.support.backends import shipped

PODS = Resource("", "v1", "pods", True)


def counting(reads: list[int]) -> Callable[[], list[Quarantine]]:
    def records() -> list[Quarantine]:
        reads.append(1)
        return []

    return records


def migrator(client: FakeClient, reads: list[int]) -> Migrator:
    return Migrator(
        client,
        MigratorSettings(),
        ManualClock(NOW),
        metrics=MigratorMetrics(CollectorRegistry()),
        records=counting(reads),
        backends=shipped(client),
    )


FINISHED = [o for o in MigrationOutcome if o.finished]


@given(st.lists(st.sampled_from(FINISHED), max_size=4))
def test_nothing_to_move_is_the_record_as_it_was_without_reading_the_records(
    outcomes: list[MigrationOutcome],
) -> None:
    moves = [Migration("ml", f"Job/j{i}", f"uid-{i}", f"k{i}", outcome=o) for i, o in enumerate(outcomes)]
    before = record().with_migrations(moves)
    reads: list[int] = []
    after = migrator(FakeClient(), reads).step(before, NOW)
    assert after == before
    assert reads == []


@pytest.mark.parametrize("in_flight", [False, True])
def test_a_job_on_the_device_or_a_move_in_flight_reads_the_records_once(in_flight: bool) -> None:
    client = FakeClient()
    before = record()
    if in_flight:
        before = before.with_migrations([Migration("ml", "Job/train", "uid-train", "k")])
    else:
        client.add(PODS, pod("train-0"))
    reads: list[int] = []
    after = migrator(client, reads).step(before, NOW)
    assert reads == [1]
    assert [m.owner for m in after.status.migrations] == ["Job/train"]
