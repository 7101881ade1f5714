"""The device directory's schema: its layout from `DeviceState`'s fields, and its migrations.

Aspects covered: a version 1 file, written as the first release wrote it, opens with the
current code and keeps every device, removed device's version, pod, lease and log row, and
an exporter goes on writing into it; the chain upgrades a file in place (SQL and function
steps, one log line naming both versions), and a failing step leaves the file at its
version with its data; a file newer than the code is refused by the writer and the reader,
naming the version and what to do, and left untouched; a reader refuses an older file and
says how to upgrade it; an upgraded version 1 file has the columns a new file has; a
device's row reads back as the same device.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter import directory as directory_module
from exporter.directory import (
    SCHEMA_VERSION,
    Directory,
    DirectoryError,
    DirectoryReader,
    MigrationStep,
    _device_from_row,
    _device_row,
    open_store,
)
from exporter.snapshot import Allocation, DeviceState, DriverTaint
from exporter.state import ObservationRecord, PodVersion
from gpuhealth.clock import ManualClock
from tests.exporter.fixtures.builders import container, gpu_uuid, pod, resource
from tests.exporter.fixtures.strategies import devices

U0, U1, U2 = gpu_uuid("node-1", 0), gpu_uuid("node-1", 1), gpu_uuid("node-2", 0)

# Fixture data: the layout and rows exactly as the first release (schema version 1) wrote
# them. Never derive this from the current code: it is what files in the field hold.
V1_FILE = f"""
CREATE TABLE IF NOT EXISTS observations (
    seq INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    device TEXT NOT NULL,
    status_version INTEGER NOT NULL,
    observed_at REAL NOT NULL,
    health TEXT NOT NULL,
    message TEXT NOT NULL,
    namespace TEXT NOT NULL,
    pod TEXT NOT NULL,
    container TEXT NOT NULL,
    resource TEXT NOT NULL,
    claim TEXT NOT NULL,
    pod_resource_version TEXT NOT NULL,
    UNIQUE (node, device, status_version)
);
CREATE TABLE IF NOT EXISTS devices (
    node TEXT NOT NULL,
    device TEXT NOT NULL,
    health TEXT NOT NULL,
    message TEXT NOT NULL,
    status_version INTEGER NOT NULL,
    first_seen REAL NOT NULL,
    changed_at REAL NOT NULL,
    observed_at REAL NOT NULL,
    unknown_since REAL,
    uuid TEXT NOT NULL,
    driver TEXT NOT NULL,
    pool TEXT NOT NULL,
    device_name TEXT NOT NULL,
    resource TEXT NOT NULL,
    allocations TEXT NOT NULL,
    driver_taints TEXT NOT NULL,
    removed INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (node, device)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pods (
    uid TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    resource_version TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY,
    lease_renewed_at REAL
);
INSERT INTO observations (node, device, status_version, observed_at, health, message, namespace, pod,
    container, resource, claim, pod_resource_version) VALUES
    ('node-1', '{U0}', 1, 1799999900.0, 'Healthy', '', 'team-a', 'p', 'main', 'nvidia.com/gpu', '', '39'),
    ('node-1', '{U0}', 2, 1799999950.0, 'Unknown', '', 'team-a', 'p', 'main', 'nvidia.com/gpu', '', '40'),
    ('node-1', '{U0}', 3, 1799999980.0, 'Unknown', 'no reading', 'team-a', 'p', 'main', 'nvidia.com/gpu',
        '', '41'),
    ('node-1', '{U1}', 1, 1799999900.0, 'Healthy', '', 'team-a', 'q', 'main', 'claim:gpus',
        'q-gpus-x7k2q', '12');
INSERT INTO devices (node, device, health, message, status_version, first_seen, changed_at, observed_at,
    unknown_since, uuid, driver, pool, device_name, resource, allocations, driver_taints, removed) VALUES
    ('node-1', '{U0}', 'Unknown', 'no reading', 3, 1799999900.0, 1799999980.0, 1799999990.0,
        1799999950.0, '{U0}', '', '', '', 'nvidia.com/gpu',
        '[["team-a","p","main","nvidia.com/gpu",""]]', '[]', 0),
    ('node-1', '{U1}', 'Healthy', '', 1, 1799999900.0, 1799999900.0, 1799999995.0,
        NULL, '{U1}', 'gpu.nvidia.com', 'node-1', 'gpu-1', 'claim:gpus',
        '[["team-a","q","main","claim:gpus","q-gpus-x7k2q"]]',
        '[["gpu.nvidia.com/xid","NoSchedule","79"]]', 0),
    ('node-2', '{U2}', 'Healthy', '', 7, 1799990000.0, 1799990000.0, 1799999000.0,
        NULL, '{U2}', '', '', '', 'nvidia.com/gpu', '[]', '[]', 1);
INSERT INTO pods (uid, namespace, name, resource_version) VALUES
    ('uid-team-a-p', 'team-a', 'p', '41'), ('uid-team-a-q', 'team-a', 'q', '12');
INSERT INTO nodes (node, lease_renewed_at) VALUES ('node-1', 1799999990.0), ('node-2', NULL);
PRAGMA user_version = 1;
"""

V1_DEVICES = [
    DeviceState(
        node="node-1",
        device=U0,
        health="Unknown",
        message="no reading",
        status_version=3,
        first_seen=1_799_999_900.0,
        changed_at=1_799_999_980.0,
        observed_at=1_799_999_990.0,
        unknown_since=1_799_999_950.0,
        uuid=U0,
        resource="nvidia.com/gpu",
        allocations=(Allocation("team-a", "p", "main", "nvidia.com/gpu"),),
    ),
    DeviceState(
        node="node-1",
        device=U1,
        health="Healthy",
        message="",
        status_version=1,
        first_seen=1_799_999_900.0,
        changed_at=1_799_999_900.0,
        observed_at=1_799_999_995.0,
        uuid=U1,
        driver="gpu.nvidia.com",
        pool="node-1",
        device_name="gpu-1",
        resource="claim:gpus",
        allocations=(Allocation("team-a", "q", "main", "claim:gpus", "q-gpus-x7k2q"),),
        driver_taints=(DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),),
    ),
]


@pytest.fixture
def v1_path(tmp_path: Path) -> str:
    path = str(tmp_path / "v1.sqlite")
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(V1_FILE)
    conn.close()
    return path


def user_version(path: str) -> int:
    conn = sqlite3.connect(path)
    try:
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
        return version
    finally:
        conn.close()


def columns(path: str) -> dict[str, dict[str, tuple[str, int, int]]]:
    """Per table: column -> (type, not null, primary key position). Order and defaults aside:
    queries name their columns, and ALTER TABLE ADD COLUMN appends and needs a default."""
    conn = sqlite3.connect(path)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {
            table: {row[1]: (row[2], row[3], row[5]) for row in conn.execute(f"PRAGMA table_info({table})")}
            for table in tables
        }
    finally:
        conn.close()


def test_a_version_1_file_opens_with_everything_it_held(v1_path: str, clock: ManualClock) -> None:
    directory = Directory(v1_path, clock=clock)
    restored = directory.load()
    assert sorted(restored.devices, key=lambda d: d.device) == sorted(V1_DEVICES, key=lambda d: d.device)
    assert restored.removed_versions == {("node-2", U2): 7}
    assert sorted(restored.pods, key=lambda p: p.uid) == [
        PodVersion("uid-team-a-p", "team-a", "p", "41"),
        PodVersion("uid-team-a-q", "team-a", "q", "12"),
    ]
    assert restored.leases == {"node-1": 1_799_999_990.0, "node-2": None}
    assert [(r.device, r.status_version, r.message, r.pod_resource_version) for r in directory.replay()] == [
        (U0, 1, "", "39"),
        (U0, 2, "", "40"),
        (U0, 3, "no reading", "41"),
        (U1, 1, "", "12"),
    ]
    # The exporter goes on from there: an old event is ignored, a new one continues the numbering.
    store = open_store(directory, clock)
    p = pod("p", container("main", ("nvidia.com/gpu", [resource(U0, "Healthy")])), rv=41)
    store.apply_pod("MODIFIED", p)
    assert store.snapshot().devices[("node-1", U0)].status_version == 3
    store.apply_pod("MODIFIED", {**p, "metadata": {**p["metadata"], "resourceVersion": "42"}})
    store.sync()
    directory.close()
    assert user_version(v1_path) == SCHEMA_VERSION
    reader = DirectoryReader(v1_path)
    try:
        device = next(d for d in reader.devices() if d.device == U0)
        assert (device.health, device.status_version, device.unknown_since) == ("Healthy", 4, None)
        assert device.first_seen == 1_799_999_900.0
        assert [r.status_version for r in reader.replay() if r.device == U0] == [1, 2, 3, 4]
    finally:
        reader.close()


def test_an_upgraded_version_1_file_has_the_columns_of_a_new_file(
    v1_path: str, tmp_path: Path, clock: ManualClock
) -> None:
    """Fails when a `DeviceState` field (or any column) is added without its migration step."""
    Directory(v1_path, clock=clock).close()
    new = str(tmp_path / "new.sqlite")
    Directory(new, clock=clock).close()
    assert columns(v1_path) == columns(new)
    assert user_version(v1_path) == user_version(new) == SCHEMA_VERSION


def _fill_notes(conn: sqlite3.Connection) -> None:
    conn.execute("UPDATE devices SET note = 'from ' || health")


@pytest.mark.parametrize("reader_first", [True, False])
def test_the_chain_upgrades_an_old_file_in_place_step_by_step(
    v1_path: str,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    reader_first: bool,
) -> None:
    # Two test-only steps past the real chain: one SQL script, one function.
    sql: MigrationStep = (
        "ALTER TABLE devices ADD COLUMN note TEXT NOT NULL DEFAULT '';\n"
        "CREATE INDEX by_health ON devices (health);"
    )
    monkeypatch.setitem(directory_module.MIGRATIONS, SCHEMA_VERSION, sql)
    monkeypatch.setitem(directory_module.MIGRATIONS, SCHEMA_VERSION + 1, _fill_notes)
    if reader_first:
        # A reader never writes (an exporter may be writing the file): it says how to upgrade.
        with pytest.raises(
            DirectoryError,
            match=f"schema version 1 is older than this gpuhealth's {SCHEMA_VERSION + 2}: start the exporter",
        ):
            DirectoryReader(v1_path)
    with caplog.at_level(logging.INFO, logger="exporter.directory"):
        directory = Directory(v1_path, clock=clock)
    assert (
        f"device directory {v1_path}: schema upgraded in place from version 1 to {SCHEMA_VERSION + 2}"
        in caplog.messages
    )
    assert sorted(directory.load().devices, key=lambda d: d.device) == sorted(
        V1_DEVICES, key=lambda d: d.device
    )
    directory.close()
    assert user_version(v1_path) == SCHEMA_VERSION + 2
    conn = sqlite3.connect(v1_path)
    assert sorted(conn.execute("SELECT device, note FROM devices")) == [
        (U0, "from Unknown"),
        (U1, "from Healthy"),
        (U2, "from Healthy"),
    ]
    conn.close()
    reader = DirectoryReader(v1_path)
    assert len(reader.devices()) == 2
    reader.close()
    # Opened again, nothing is left to do.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="exporter.directory"):
        Directory(v1_path, clock=clock).close()
    assert not [m for m in caplog.messages if "upgraded" in m]


def _half_done_then_broken(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE devices ADD COLUMN half TEXT NOT NULL DEFAULT ''")
    conn.execute("DELETE FROM observations")
    conn.execute("SELECT * FROM no_such_table")


def _raises(conn: sqlite3.Connection) -> None:
    conn.execute("DELETE FROM observations")
    raise ValueError("a bug in the step")


@pytest.mark.parametrize(
    "step",
    [
        "ALTER TABLE devices ADD COLUMN half TEXT NOT NULL DEFAULT '';\nDELETE FROM observations;\n"
        "SELECT * FROM no_such_table",
        _half_done_then_broken,
        _raises,
    ],
    ids=["sql", "function", "function-bug"],
)
def test_a_failing_step_leaves_the_file_at_its_version_with_its_data(
    v1_path: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch, step: MigrationStep
) -> None:
    Directory(v1_path, clock=clock).close()  # through the real chain first
    before = columns(v1_path)
    monkeypatch.setitem(directory_module.MIGRATIONS, SCHEMA_VERSION, step)
    with pytest.raises(
        DirectoryError,
        match=f"cannot open the device directory: schema upgrade from version {SCHEMA_VERSION} to "
        f"{SCHEMA_VERSION + 1} failed, the file stays at version {SCHEMA_VERSION}",
    ):
        Directory(v1_path, clock=clock)
    assert user_version(v1_path) == SCHEMA_VERSION
    assert columns(v1_path) == before
    monkeypatch.delitem(directory_module.MIGRATIONS, SCHEMA_VERSION)
    # The lock was released and the data is all there.
    directory = Directory(v1_path, clock=clock)
    assert len(list(directory.replay())) == 4
    directory.close()


def test_a_file_newer_than_the_code_is_refused_and_left_untouched(v1_path: str, clock: ManualClock) -> None:
    Directory(v1_path, clock=clock).close()
    conn = sqlite3.connect(v1_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = columns(v1_path)
    told = (
        f"schema version {SCHEMA_VERSION + 1} is newer than this gpuhealth knows \\({SCHEMA_VERSION}\\): "
        "a later release wrote it; run that release or a later one, or give this one a new --directory file"
    )
    with pytest.raises(DirectoryError, match=f"{v1_path}: cannot open the device directory: {told}"):
        Directory(v1_path, clock=clock)
    with pytest.raises(DirectoryError, match=f"{v1_path}: not a readable device directory: {told}"):
        DirectoryReader(v1_path)
    assert user_version(v1_path) == SCHEMA_VERSION + 1
    assert columns(v1_path) == before
    conn = sqlite3.connect(v1_path)
    assert conn.execute("SELECT count(*) FROM observations").fetchone() == (4,)
    conn.close()


def test_a_reader_refuses_a_file_no_exporter_has_written(tmp_path: Path) -> None:
    empty = str(tmp_path / "empty.sqlite")
    sqlite3.connect(empty).close()
    with pytest.raises(DirectoryError, match="schema version 0: no exporter has written this file"):
        DirectoryReader(empty)


def test_the_chain_must_step_one_version_at_a_time(
    v1_path: str, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(directory_module.MIGRATIONS, SCHEMA_VERSION + 1, "SELECT 1")
    with pytest.raises(AssertionError, match="one by one"):
        Directory(v1_path, clock=clock)
    monkeypatch.undo()
    Directory(v1_path, clock=clock).close()  # the lock was released


@given(devices, st.booleans())
def test_a_device_row_reads_back_as_the_same_device(device: DeviceState, removed: bool) -> None:
    row = _device_row(device, removed)
    assert row[-1] == (1 if removed else 0)
    assert _device_from_row(row) == device


def test_a_device_row_survives_sqlite(tmp_path: Path, clock: ManualClock) -> None:
    directory = Directory(str(tmp_path / "d.sqlite"), clock=clock, background=False)
    for device in V1_DEVICES:
        directory.record_change(device, ObservationRecord(device.node, device.device, 1, 0.0, "Healthy", ""))
    directory.flush(force=True)
    assert directory.devices() == V1_DEVICES
    directory.close()
