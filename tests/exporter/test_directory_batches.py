"""How the directory writes a periodic batch: grouped statements give the per-row results.

Aspects covered: a replaced pod's devices get their new allocations and heartbeat in one
grouped UPDATE; a device whose identity or taints moved is rewritten in full together
with its heartbeat; heartbeats of more devices than one grouped statement names all
reach the file; a restart reads all of it back. Batches that queue up while the writer
thread is busy go into one transaction, in order, and one it cannot write holds back only
itself.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from exporter.directory import Directory, DirectoryError, open_store
from exporter.observer import persist
from exporter.snapshot import Allocation, DriverTaint
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import DRIVER, claim, container, gpu_uuid, pod, resource, slice_


def gpus(n: int) -> list[str]:
    return [gpu_uuid("node-1", i) for i in range(n)]


def dp_pod(name: str, ids: list[str], rv: int, **kw: object) -> dict:
    return pod(name, container("main", ("nvidia.com/gpu", [resource(i) for i in ids])), rv=rv, **kw)  # type: ignore[arg-type]


def health_pod(health: str, rv: int) -> dict:
    ids = gpus(1)
    return pod("p", container("main", ("nvidia.com/gpu", [resource(ids[0], health)])), rv=rv)


class HeldWriter:
    """An `on_write` that holds the writer thread after its first transaction until released,
    so the batches flushed meanwhile queue up behind it."""

    def __init__(self) -> None:
        self.writes: list[float] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.writes.append(seconds)
        self.entered.set()
        assert self.release.wait(timeout=60), "the test never released the writer"


def test_a_replaced_pods_devices_get_new_allocations_and_heartbeats(
    tmp_path: Path, clock: ManualClock
) -> None:
    path = str(tmp_path / "d.sqlite")
    directory = Directory(path, clock=clock, heartbeat_flush_seconds=5)
    store = open_store(directory, clock)
    ids = gpus(3)
    store.apply_pod("ADDED", dp_pod("old", ids, 1))
    persist(store, directory, force=True)
    created = clock.now()
    clock.advance(10)
    store.apply_pod("MODIFIED", dp_pod("old", ids, 2, phase="Succeeded"))
    store.apply_pod("DELETED", dp_pod("old", ids, 3, phase="Succeeded"))
    store.apply_pod("ADDED", dp_pod("new", ids, 4))
    confirmed = clock.now()
    clock.advance(10)
    persist(store, directory, force=True)
    rows = {d.device: d for d in directory.devices()}
    assert set(rows) == set(ids)
    for row in rows.values():
        assert row.allocations == (Allocation("team-a", "new", "main", "nvidia.com/gpu"),)
        assert (row.first_seen, row.observed_at, row.status_version) == (created, confirmed, 1)
    directory.close()
    again = Directory(path, clock=clock)
    restored = open_store(again, clock)
    device = restored.device("node-1", ids[0])
    assert device is not None and device.allocations[0].pod == "new" and device.observed_at == confirmed
    again.close()


def test_identity_and_taint_changes_are_written_in_full_with_the_heartbeat(
    tmp_path: Path, clock: ManualClock
) -> None:
    directory = Directory(str(tmp_path / "d.sqlite"), clock=clock, heartbeat_flush_seconds=5)
    store = open_store(directory, clock)
    u0 = gpu_uuid("node-1", 0)
    store.apply_slice("ADDED", slice_("s", "node-1", {"gpu-0": u0}))
    store.apply_claim("ADDED", claim("p-gpus", [("big", DRIVER, "node-1", "gpu-0")]))
    entry = resource("k8s.gpu.nvidia.com/claim=claim-uid-p-gpus-gpu-0")
    dra = pod("p", container("main", ("claim:gpus/big", [entry])), claim_statuses={"gpus": "p-gpus"}, rv=1)
    store.apply_pod("ADDED", dra)
    persist(store, directory, force=True)
    clock.advance(10)
    taint = {"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}
    store.apply_slice("MODIFIED", slice_("s", "node-1", {"gpu-0": u0}, taints={"gpu-0": [taint]}))
    store.apply_pod("MODIFIED", {**dra, "metadata": {**dra["metadata"], "resourceVersion": "2"}})
    confirmed = clock.now()
    persist(store, directory, force=True)
    (row,) = directory.devices()
    assert row.driver_taints == (DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),)
    assert (row.uuid, row.driver, row.device_name, row.observed_at) == (u0, DRIVER, "gpu-0", confirmed)
    directory.close()


def test_heartbeats_of_more_devices_than_one_statement_names_all_reach_the_file(
    tmp_path: Path, clock: ManualClock
) -> None:
    directory = Directory(str(tmp_path / "d.sqlite"), clock=clock, heartbeat_flush_seconds=5)
    store = open_store(directory, clock)
    ids = gpus(37)  # 16 + 16 + 5 per statement
    store.apply_pod("ADDED", dp_pod("big", ids, 1))
    persist(store, directory, force=True)
    clock.advance(30)
    store.apply_pod("MODIFIED", dp_pod("big", ids, 2))
    persist(store, directory, force=True)
    rows = directory.devices()
    assert len(rows) == 37 and {r.observed_at for r in rows} == {clock.now()}
    directory.close()


def test_batches_queued_behind_a_busy_writer_are_written_in_one_transaction_in_order(
    tmp_path: Path, clock: ManualClock
) -> None:
    held = HeldWriter()
    directory = Directory(str(tmp_path / "d.sqlite"), clock=clock, on_write=held)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", health_pod("Healthy", 1))
    assert persist(store, directory) > 0
    assert held.entered.wait(timeout=60), "the writer never took the first batch"
    healths = ["Unhealthy", "Healthy", "Unknown", "Unhealthy"]
    for rv, health in enumerate(healths, start=2):
        clock.advance(1)
        store.apply_pod("MODIFIED", health_pod(health, rv))
        assert persist(store, directory) > 0  # each its own batch, queued behind the held one
    held.release.set()
    directory.wait()
    assert len(held.writes) == 2  # the first batch, then the four queued ones together
    assert [(r.status_version, r.health) for r in directory.replay()] == list(
        enumerate(["Healthy", *healths], start=1)
    )
    (row,) = directory.devices()
    assert (row.health, row.status_version, row.changed_at) == ("Unhealthy", 5, clock.now())
    directory.close()


def test_a_batch_that_cannot_be_written_holds_back_only_itself(tmp_path: Path, clock: ManualClock) -> None:
    held = HeldWriter()
    directory = Directory(str(tmp_path / "d.sqlite"), clock=clock, on_write=held)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", health_pod("Healthy", 1))
    persist(store, directory)
    assert held.entered.wait(timeout=60), "the writer never took the first batch"
    clock.advance(1)
    store.apply_pod("MODIFIED", health_pod("Unhealthy", 2))
    persist(store, directory)
    # A value SQLite cannot bind: that batch's transaction fails whatever else it holds.
    directory.record_lease("node-1", object())  # type: ignore[arg-type]
    directory.flush(force=True)
    clock.advance(1)
    store.apply_pod("MODIFIED", health_pod("Healthy", 3))
    persist(store, directory)
    held.release.set()
    directory.wait()
    assert [r.health for r in directory.replay()] == ["Healthy", "Unhealthy", "Healthy"]
    assert directory.leases() == {}
    with pytest.raises(DirectoryError, match="write failed"):
        directory.close()  # the last try at the kept batch
