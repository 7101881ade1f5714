"""Adapter: the replayable device directory, an embedded SQLite file.

Owns the persistent record of device state (requirement 2 and 8 of the mission):

- `observations`: an append-only log of status changes keyed by (node, device,
  status_version), with the observation time, health, message and the evidence (pod,
  container, claim, the pod's resourceVersion). Inserting a key twice is a no-op, so a
  replayed batch cannot duplicate history.
- `devices`: the current state per device (identity, allocations, health, message,
  first-seen, changed-at, last-confirmed, status version, Unknown-since). Removed devices
  keep their row (flagged) so their status version continues if they come back.
- `pods`: the latest processed resourceVersion per pod, and `nodes`: the latest kubelet
  Lease renewal per node, both for restarts and the `devices` command.

One writer: the exporter holds an exclusive lock file beside the database; readers open
it read-only (WAL mode lets them read while it writes). The state hands changes over as
they happen; they are kept in memory, coalesced per key, and written in one transaction
per `flush()`. Status changes are flushed on every call (after each batch of events);
heartbeats, pod versions and lease times, which only move timestamps, at most every
`heartbeat_flush_seconds`, so 80,000 devices confirmed every few seconds do not each
cost a write. Losing those on a crash only makes the restored ages look older.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from exporter.snapshot import Allocation, DeviceState, DriverTaint
from exporter.state import DeviceKey, DeviceStateStore, ObservationRecord, PodVersion
from gpuhealth.clock import Clock

SCHEMA_VERSION = 1

_SCHEMA = """
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
CREATE INDEX IF NOT EXISTS observations_time ON observations (observed_at);
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
);
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
"""

_DEVICE_COLUMNS = (
    "node, device, health, message, status_version, first_seen, changed_at, observed_at, unknown_since, "
    "uuid, driver, pool, device_name, resource, allocations, driver_taints, removed"
)
_LOG_COLUMNS = (
    "node, device, status_version, observed_at, health, message, namespace, pod, container, resource, "
    "claim, pod_resource_version"
)


class DirectoryError(Exception):
    """The directory cannot be opened or read (message says which file and why)."""


@dataclass(slots=True)
class Restored:
    """What a restarted exporter starts from."""

    devices: list[DeviceState] = field(default_factory=list)
    removed_versions: dict[DeviceKey, int] = field(default_factory=dict)
    pods: list[PodVersion] = field(default_factory=list)
    leases: dict[str, float | None] = field(default_factory=dict)


def _device_row(device: DeviceState, removed: bool) -> tuple[Any, ...]:
    allocations = orjson.dumps(
        [[a.namespace, a.pod, a.container, a.resource, a.claim] for a in device.allocations]
    ).decode()
    taints = orjson.dumps([[t.key, t.effect, t.value] for t in device.driver_taints]).decode()
    return (
        device.node,
        device.device,
        device.health,
        device.message,
        device.status_version,
        device.first_seen,
        device.changed_at,
        device.observed_at,
        device.unknown_since,
        device.uuid,
        device.driver,
        device.pool,
        device.device_name,
        device.resource,
        allocations,
        taints,
        1 if removed else 0,
    )


def _device_from_row(row: tuple[Any, ...]) -> DeviceState:
    return DeviceState(
        node=row[0],
        device=row[1],
        health=row[2],
        message=row[3],
        status_version=row[4],
        first_seen=row[5],
        changed_at=row[6],
        observed_at=row[7],
        unknown_since=row[8],
        uuid=row[9],
        driver=row[10],
        pool=row[11],
        device_name=row[12],
        resource=row[13],
        allocations=tuple(Allocation(*a) for a in orjson.loads(row[14])),
        driver_taints=tuple(DriverTaint(key=t[0], effect=t[1], value=t[2]) for t in orjson.loads(row[15])),
    )


def _record_from_row(row: tuple[Any, ...]) -> ObservationRecord:
    return ObservationRecord(*row)


class _Queries:
    """Reads shared by the writer and read-only readers."""

    _conn: sqlite3.Connection

    def devices(self, *, include_removed: bool = False) -> list[DeviceState]:
        where = "" if include_removed else " WHERE removed = 0"
        rows = self._conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices{where} ORDER BY node, device")
        return [_device_from_row(row) for row in rows]

    def leases(self) -> dict[str, float | None]:
        return dict(self._conn.execute("SELECT node, lease_renewed_at FROM nodes").fetchall())

    def replay(self, since: float | None = None) -> Iterator[ObservationRecord]:
        """The log in the order it was written, from `since` (wall seconds) on."""
        query = f"SELECT {_LOG_COLUMNS} FROM observations"
        params: tuple[Any, ...] = ()
        if since is not None:
            query += " WHERE observed_at >= ?"
            params = (since,)
        for row in self._conn.execute(query + " ORDER BY seq", params):
            yield _record_from_row(row)

    def load(self) -> Restored:
        restored = Restored()
        rows = self._conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices")
        for row in rows:
            if row[16]:
                restored.removed_versions[(row[0], row[1])] = row[4]
            else:
                restored.devices.append(_device_from_row(row))
        restored.pods = [
            PodVersion(*row)
            for row in self._conn.execute("SELECT uid, namespace, name, resource_version FROM pods")
        ]
        restored.leases = self.leases()
        return restored


class Directory(_Queries):
    """The single writer; also a `exporter.state.DirectorySink`."""

    def __init__(
        self,
        path: str,
        *,
        clock: Clock,
        heartbeat_flush_seconds: float = 5.0,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        self.path = path
        self._clock = clock
        self._heartbeat_flush_seconds = heartbeat_flush_seconds
        self._on_write = on_write
        self._lock: IO[bytes] | None = None
        if path != ":memory:":
            self._lock = _take_lock(path)
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode stays consistent on a crash and may lose only the last commits.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.executescript(_SCHEMA)
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                raise DirectoryError(f"{path}: directory schema version {version}, expected {SCHEMA_VERSION}")
            self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except sqlite3.Error as exc:
            self._release_lock()
            raise DirectoryError(f"{path}: cannot open the device directory: {exc}") from exc
        self._log: list[tuple[Any, ...]] = []
        self._devices: dict[DeviceKey, tuple[DeviceState, bool]] = {}
        self._heartbeats: dict[DeviceKey, float] = {}
        self._pods: dict[str, PodVersion | None] = {}
        self._leases: dict[str, float | None] = {}
        self._last_periodic = clock.monotonic()

    # ----- DirectorySink -----------------------------------------------------------

    def record_change(self, device: DeviceState, observation: ObservationRecord) -> None:
        o = observation
        self._log.append(
            (
                o.node,
                o.device,
                o.status_version,
                o.observed_at,
                o.health,
                o.message,
                o.namespace,
                o.pod,
                o.container,
                o.resource,
                o.claim,
                o.pod_resource_version,
            )
        )
        self._devices[(device.node, device.device)] = (device, False)

    def record_device(self, device: DeviceState) -> None:
        self._devices[(device.node, device.device)] = (device, False)

    def record_heartbeat(self, node: str, device: str, observed_at: float) -> None:
        self._heartbeats[(node, device)] = observed_at

    def record_removed(self, node: str, device: str) -> None:
        pending = self._devices.get((node, device))
        if pending is not None:
            self._devices[(node, device)] = (pending[0], True)
        else:
            # Only the flag moves; a sentinel row that `_write` turns into an UPDATE.
            self._devices[(node, device)] = (_REMOVED, True)
        self._heartbeats.pop((node, device), None)

    def record_pod(self, pod: PodVersion) -> None:
        self._pods[pod.uid] = pod

    def forget_pod(self, uid: str) -> None:
        self._pods[uid] = None

    def record_lease(self, node: str, renewed_at: float | None) -> None:
        self._leases[node] = renewed_at

    # ----- writing -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        return (
            len(self._log) + len(self._devices) + len(self._heartbeats) + len(self._pods) + len(self._leases)
        )

    def flush(self, *, force: bool = False) -> int:
        """Write what is due in one transaction; the number of rows written."""
        now = self._clock.monotonic()
        periodic = force or now - self._last_periodic >= self._heartbeat_flush_seconds
        if not (self._log or self._devices or (periodic and self.pending)):
            if periodic:
                self._last_periodic = now
            return 0
        started = time.perf_counter()
        rows = 0
        conn = self._conn
        try:
            conn.execute("BEGIN")
            if self._log:
                conn.executemany(
                    f"INSERT OR IGNORE INTO observations ({_LOG_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    self._log,
                )
                rows += len(self._log)
            if self._devices:
                full = [
                    _device_row(d, removed) for (d, removed) in self._devices.values() if d is not _REMOVED
                ]
                conn.executemany(
                    f"INSERT OR REPLACE INTO devices ({_DEVICE_COLUMNS}) VALUES "
                    "(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    full,
                )
                flags = [key for key, (d, _) in self._devices.items() if d is _REMOVED]
                conn.executemany(
                    "UPDATE devices SET removed = 1, allocations = '[]' WHERE node = ? AND device = ?", flags
                )
                rows += len(self._devices)
            if periodic:
                if self._heartbeats:
                    conn.executemany(
                        "UPDATE devices SET observed_at = max(observed_at, ?) WHERE node = ? AND device = ?",
                        [(t, node, device) for (node, device), t in self._heartbeats.items()],
                    )
                if self._pods:
                    conn.executemany(
                        "INSERT OR REPLACE INTO pods (uid, namespace, name, resource_version) "
                        "VALUES (?, ?, ?, ?)",
                        [(p.uid, p.namespace, p.name, p.resource_version) for p in self._pods.values() if p],
                    )
                    conn.executemany(
                        "DELETE FROM pods WHERE uid = ?",
                        [(uid,) for uid, p in self._pods.items() if p is None],
                    )
                if self._leases:
                    conn.executemany(
                        "INSERT OR REPLACE INTO nodes (node, lease_renewed_at) VALUES (?, ?)",
                        [(n, t) for n, t in self._leases.items() if t is not None],
                    )
                    conn.executemany(
                        "DELETE FROM nodes WHERE node = ?",
                        [(n,) for n, t in self._leases.items() if t is None],
                    )
                rows += len(self._heartbeats) + len(self._pods) + len(self._leases)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            # Keep the pending changes: the next flush retries them.
            raise DirectoryError(f"{self.path}: write failed: {exc}") from exc
        self._log.clear()
        self._devices.clear()
        if periodic:
            self._heartbeats.clear()
            self._pods.clear()
            self._leases.clear()
            self._last_periodic = now
        if self._on_write is not None:
            self._on_write(time.perf_counter() - started)
        return rows

    def close(self) -> None:
        try:
            self.flush(force=True)
        finally:
            self._conn.close()
            self._release_lock()

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class DirectoryReader(_Queries):
    """Read-only access for `gpuhealth devices` (works while an exporter writes)."""

    def __init__(self, path: str) -> None:
        if not os.path.exists(path):
            raise DirectoryError(f"{path}: no device directory there (start the exporter with --directory)")
        try:
            self._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            self._conn.execute("SELECT 1 FROM devices LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise DirectoryError(f"{path}: not a readable device directory: {exc}") from exc

    def close(self) -> None:
        self._conn.close()


_REMOVED = DeviceState(
    node="",
    device="",
    health="",
    message="",
    status_version=0,
    first_seen=0.0,
    changed_at=0.0,
    observed_at=0.0,
)


def _take_lock(path: str) -> IO[bytes]:
    try:
        lock = open(f"{path}.lock", "ab")  # noqa: SIM115 (held open for the writer's lifetime)
    except OSError as exc:
        raise DirectoryError(f"{path}: cannot create the directory's lock file ({exc.strerror})") from exc
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        lock.close()
        raise DirectoryError(f"{path}: another exporter is writing this directory ({exc.strerror})") from exc
    return lock


def open_store(
    directory: Directory | None, clock: Clock, *, node_name: str | None = None, nvml: bool = False
) -> DeviceStateStore:
    """A state that persists into `directory`, starting from what it already holds."""
    store = DeviceStateStore(clock, sink=directory, node_name=node_name, nvml=nvml)
    if directory is not None:
        restored = directory.load()
        store.restore(
            restored.devices,
            removed_versions=restored.removed_versions,
            pods=restored.pods,
            leases=restored.leases,
        )
    return store
