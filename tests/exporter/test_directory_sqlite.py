"""The replayable device directory (SQLite).

Aspects covered: a heartbeat writes no log row while a change writes one with its
evidence; status versions increase only on change; duplicate and out-of-order pod
events write nothing; restart rebuilds status versions, transition and Unknown-since
times, allocations and pod versions (old events stay ignored, numbering continues, also
for a removed device that comes back); replay streams the log from a time; one writer
at a time; readers open it read-only; batched heartbeats reach the file on the periodic
flush; bad files give clear errors.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from exporter.directory import Directory, DirectoryError, DirectoryReader, open_store
from exporter.observer import persist
from exporter.state import DUPLICATE, OUT_OF_ORDER, PODS
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import container, gpu_uuid, lease, pod, resource

U0 = gpu_uuid("node-1", 0)


def dp_pod(health: str, rv: int, name: str = "p", message: str | None = None, **kw: object) -> dict:
    return pod(name, container("main", ("nvidia.com/gpu", [resource(U0, health, message)])), rv=rv, **kw)  # type: ignore[arg-type]


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "directory.sqlite")


def test_heartbeats_write_no_log_rows_and_changes_do(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", dp_pod("Healthy", 1))
    for rv in range(2, 6):
        clock.advance(10)
        store.apply_pod("MODIFIED", dp_pod("Healthy", rv))
    clock.advance(10)
    store.apply_pod("MODIFIED", dp_pod("Unhealthy", 6, message="XID 79"))
    directory.flush(force=True)
    log = list(directory.replay())
    assert [(r.status_version, r.health, r.message) for r in log] == [
        (1, "Healthy", ""),
        (2, "Unhealthy", "XID 79"),
    ]
    assert (log[1].namespace, log[1].pod, log[1].container, log[1].pod_resource_version) == (
        "team-a",
        "p",
        "main",
        "6",
    )
    (device,) = directory.devices()
    assert (device.status_version, device.changed_at, device.observed_at) == (2, clock.now(), clock.now())
    directory.close()


def test_duplicate_and_out_of_order_events_write_nothing(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", dp_pod("Healthy", 10))
    store.apply_pod("MODIFIED", dp_pod("Unhealthy", 12))
    directory.flush(force=True)
    store.apply_pod("MODIFIED", dp_pod("Unhealthy", 12))
    store.apply_pod("MODIFIED", dp_pod("Healthy", 11))
    assert directory.pending == 0
    assert store.stats.events_ignored == {DUPLICATE: 1, OUT_OF_ORDER: 1}
    assert len(list(directory.replay())) == 2
    directory.close()


def test_restart_rebuilds_versions_times_and_ignores_old_events(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_lease("ADDED", lease("node-1"))
    store.apply_pod("ADDED", dp_pod("Healthy", 1))
    first_seen = clock.now()
    clock.advance(60)
    store.apply_pod("MODIFIED", dp_pod("Unknown", 2, message="stream broken"))
    unknown_since = clock.now()
    clock.advance(30)
    store.apply_pod("MODIFIED", dp_pod("Unknown", 3, message="timeout"))
    before = store.snapshot().devices[("node-1", U0)]
    directory.close()

    clock.advance(120)  # the exporter is down for two minutes
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    restored = store.snapshot().devices[("node-1", U0)]
    assert restored == before
    assert (restored.status_version, restored.first_seen, restored.unknown_since) == (
        3,
        first_seen,
        unknown_since,
    )
    assert "node-1" in store.snapshot().nodes
    # Replayed old events change nothing; a new one continues the numbering.
    store.apply_pod("MODIFIED", dp_pod("Healthy", 2))
    assert store.stats.events_ignored == {OUT_OF_ORDER: 1}
    store.apply_pod("MODIFIED", dp_pod("Healthy", 4))
    assert store.snapshot().devices[("node-1", U0)].status_version == 4
    directory.close()


def test_restart_then_relist_releases_pods_that_vanished_meanwhile(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", dp_pod("Healthy", 1))
    directory.close()
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    assert len(store.snapshot().devices[("node-1", U0)].allocations) == 1
    store.relist(PODS, [])
    assert store.snapshot().devices[("node-1", U0)].allocations == ()
    persist(store, directory, force=True)
    directory.close()
    reader = DirectoryReader(path)
    assert reader.devices()[0].allocations == ()
    reader.close()


def test_removed_device_keeps_its_version_across_restarts(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_lease("ADDED", lease("node-1"))
    store.apply_pod("ADDED", dp_pod("Healthy", 1))
    store.apply_pod("MODIFIED", dp_pod("Unhealthy", 2))
    store.apply_pod("DELETED", dp_pod("Unhealthy", 3))
    store.apply_lease("DELETED", lease("node-1"))
    directory.close()
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    assert store.snapshot().devices == {}
    store.apply_pod("ADDED", dp_pod("Healthy", 9, name="q"))
    assert store.snapshot().devices[("node-1", U0)].status_version == 3
    directory.close()


@pytest.mark.parametrize("background", [True, False])
def test_a_device_that_comes_back_in_the_same_run_is_current_after_a_restart(
    path: str, clock: ManualClock, background: bool
) -> None:
    # Its row kept the removed flag (only the status columns were updated), so a restarted
    # exporter had lost it: `gpuhealth devices` did not list it either.
    directory = Directory(path, clock=clock, background=background)
    store = open_store(directory, clock)
    store.apply_lease("ADDED", lease("node-1"))
    store.apply_pod("ADDED", dp_pod("Healthy", 1))
    store.apply_pod("DELETED", dp_pod("Healthy", 2))
    store.apply_lease("DELETED", lease("node-1"))
    persist(store, directory, force=True)
    clock.advance(5)
    store.apply_pod("ADDED", dp_pod("Unhealthy", 9, name="q"))
    persist(store, directory, force=True)
    assert [(d.device, d.health, d.status_version) for d in directory.devices()] == [(U0, "Unhealthy", 2)]
    directory.close()
    directory = Directory(path, clock=clock)
    restored = open_store(directory, clock).snapshot().devices[("node-1", U0)]
    assert (restored.health, restored.status_version, restored.allocations[0].pod) == ("Unhealthy", 2, "q")
    directory.close()


def test_replay_streams_the_log_from_a_time(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    for rv, health in enumerate(["Healthy", "Unhealthy", "Healthy", "Unknown"], start=1):
        store.apply_pod("MODIFIED", dp_pod(health, rv))
        clock.advance(60)
    directory.flush()
    since = clock.now() - 120
    assert [r.health for r in directory.replay(since)] == ["Healthy", "Unknown"]
    directory.close()
    reader = DirectoryReader(path)
    assert [r.status_version for r in reader.replay()] == [1, 2, 3, 4]
    reader.close()


def test_heartbeats_reach_the_file_on_the_periodic_flush(path: str, clock: ManualClock) -> None:
    writes: list[float] = []
    directory = Directory(path, clock=clock, heartbeat_flush_seconds=5, on_write=writes.append)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", dp_pod("Healthy", 1))
    persist(store, directory)
    directory.wait()  # written on its own (batches that queue up share a transaction)
    clock.advance(2)
    store.apply_pod("MODIFIED", dp_pod("Healthy", 2))
    assert persist(store, directory) == 0  # only a confirmation pending, not due yet
    clock.advance(3)
    assert persist(store, directory) == 2  # the heartbeat and the pod's version
    assert directory.devices()[0].observed_at == clock.now() - 3
    assert len(writes) == 2 and all(w >= 0 for w in writes)
    directory.close()


def test_one_writer_at_a_time(path: str, clock: ManualClock) -> None:
    directory = Directory(path, clock=clock)
    with pytest.raises(DirectoryError, match="another exporter"):
        Directory(path, clock=clock)
    directory.close()
    Directory(path, clock=clock).close()


def test_bad_files_give_clear_errors(tmp_path: Path, clock: ManualClock) -> None:
    with pytest.raises(DirectoryError, match="no device directory"):
        DirectoryReader(str(tmp_path / "missing.sqlite"))
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(DirectoryError, match="not a readable device directory"):
        DirectoryReader(str(junk))
    with pytest.raises(DirectoryError, match="cannot open"):
        Directory(str(junk), clock=clock)
    with pytest.raises(DirectoryError, match="lock file"):
        Directory(str(tmp_path / "no" / "such" / "dir.sqlite"), clock=clock)


@pytest.mark.parametrize("table", ["devices", "observations"])
def test_a_foreign_database_is_a_clear_error_not_a_failed_query(
    tmp_path: Path, clock: ManualClock, table: str
) -> None:
    foreign = str(tmp_path / "foreign.sqlite")
    conn = sqlite3.connect(foreign)
    conn.execute(f"CREATE TABLE {table} (a)")
    conn.commit()
    conn.close()
    with pytest.raises(DirectoryError, match="not a readable device directory"):
        DirectoryReader(foreign)
    with pytest.raises(DirectoryError, match=f"cannot open the device directory: table {table} is not"):
        Directory(foreign, clock=clock)
    conn = sqlite3.connect(foreign)
    # Refused in the transaction that would have made it a directory: nothing was added.
    assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [(table,)]
    assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    conn.close()


def test_a_1024_character_message_survives_the_log_and_a_restart(path: str, clock: ManualClock) -> None:
    message = "".join(chr(0x41 + i % 26) for i in range(1023)) + "é"
    directory = Directory(path, clock=clock)
    store = open_store(directory, clock)
    store.apply_pod("ADDED", dp_pod("Unhealthy", 1, message=message))
    directory.close()
    directory = Directory(path, clock=clock)
    assert [r.message for r in directory.replay()] == [message]
    assert open_store(directory, clock).snapshot().devices[("node-1", U0)].message == message
    directory.close()
