"""Adapter: the replayable device directory, an embedded SQLite file.

Owns the persistent record of device state, which a restarted exporter starts from and
`gpuhealth devices` reads and replays:

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
they happen; they are kept in memory, coalesced per key, and each `flush()` hands them
as one batch to a writer thread (SQLite releases the GIL while it works, so the event
loop is not held up by disk writes or WAL checkpoints), which writes the batches that
queued up meanwhile in one transaction. Status changes are
flushed at most every `change_flush_seconds` (after a batch of events); heartbeats, pod versions and lease
times, which only move timestamps, at most every `heartbeat_flush_seconds`, so 80,000
devices confirmed every few seconds do not each cost a write. Losing those on a crash
only makes the restored ages look older.

The file carries its schema version (`PRAGMA user_version`). The `devices` columns, rows
and UPDATEs follow `DeviceState`'s fields; a file an older release wrote is upgraded in
place when the exporter opens it, step by step through `MIGRATIONS`; a newer one is
refused, as is a file whose tables are not a directory's.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import Field, dataclass, field, fields
from typing import IO, Any

import orjson

from exporter.sharding import UNSHARDED, Shard
from exporter.snapshot import (
    ALLOCATIONS,
    DEVICE_FIELDS,
    IDENTITY,
    ITEMS,
    MOVES,
    SQL,
    STATUS,
    DeviceState,
    compiled_function,
)
from exporter.state import DeviceKey, DeviceStateStore, ObservationRecord, PodVersion
from gpuhealth.clock import Clock

log = logging.getLogger(__name__)

BASE_VERSION = 1
"""The schema version of the first release; the `MIGRATIONS` chain starts there."""

MigrationStep = str | Callable[[sqlite3.Connection], None]

MIGRATIONS: dict[int, MigrationStep] = {
    # Idle devices are tracked from ResourceSlices and NVML: who gave the status. Rows written
    # before were all reported by pods.
    1: "ALTER TABLE devices ADD COLUMN source TEXT NOT NULL DEFAULT 'pod'",
}
"""Schema upgrades by the version they start from: step N turns a version N file into
version N + 1. Each runs in one transaction with the new version number, so a failure
leaves the file at N. A step is SQL (run as a script) or a function of the connection.

Steps are written against the layout of their time, never derived from the current
fields: a new file gets the current layout from `_SCHEMA` and the latest version at once.
`tests/exporter/test_directory_schema.py` checks that a version 1 file upgraded by the
chain has the columns a new file has. A new `DeviceState` field, for example, is one step
`1: "ALTER TABLE devices ADD COLUMN reason TEXT NOT NULL DEFAULT ''"`."""

SCHEMA_VERSION = BASE_VERSION + len(MIGRATIONS)
"""The version this release writes (the code asks `_latest_version()`, which a test's own
step moves too)."""

_DEVICE_NAMES = tuple(f.name for f in DEVICE_FIELDS)
_DEVICE_COLUMNS = ", ".join((*_DEVICE_NAMES, "removed"))
"""What device reads select and full writes insert: the fields in order, then the flag."""
_REMOVED_AT = len(_DEVICE_NAMES)
_VERSION_AT = _DEVICE_NAMES.index("status_version")
_LOG_COLUMNS = ", ".join(ObservationRecord._fields)
"""An observation row is an `ObservationRecord` as is (its field order is the column order)."""


def _moved_by(*moves: str) -> list[Field[Any]]:
    return [f for f in DEVICE_FIELDS if f.metadata.get(MOVES) in moves]


def _marks(count: int) -> str:
    return ",".join("?" * count)


_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS observations (
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
)""",
    "CREATE TABLE IF NOT EXISTS devices (\n    "
    + ",\n    ".join(
        [
            *(f"{f.name} {f.metadata[SQL]}" for f in DEVICE_FIELDS),
            "removed INTEGER NOT NULL DEFAULT 0",
            "PRIMARY KEY (node, device)",
        ]
    )
    + "\n) WITHOUT ROWID",
    """CREATE TABLE IF NOT EXISTS pods (
    uid TEXT PRIMARY KEY,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    resource_version TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY,
    lease_renewed_at REAL
)""",
)
"""The current layout, for a new file (`devices` from the `DeviceState` fields)."""

_INSERT_LOG = (
    f"INSERT OR IGNORE INTO observations ({_LOG_COLUMNS}) VALUES ({_marks(len(ObservationRecord._fields))})"
)
_INSERT_DEVICE = f"INSERT OR REPLACE INTO devices ({_DEVICE_COLUMNS}) VALUES ({_marks(_REMOVED_AT + 1)})"
_UPDATE_STATUS = (
    f"UPDATE devices SET {', '.join(f'{f.name} = ?' for f in _moved_by(STATUS))} "
    "WHERE node = ? AND device = ?"
)
_UPDATE_ATTRIBUTES = (
    f"UPDATE devices SET {', '.join(f'{f.name} = ?' for f in _moved_by(IDENTITY, ALLOCATIONS))}, "
    "observed_at = max(observed_at, ?) WHERE node = ? AND device = ?"
)
"""Identity, taints and allocations, with the row's heartbeat (0.0 leaves observed_at)."""


class DirectoryError(Exception):
    """The directory cannot be opened or read (message says which file and why)."""


@dataclass(slots=True)
class Restored:
    """What a restarted exporter starts from."""

    devices: list[DeviceState] = field(default_factory=list)
    removed_versions: dict[DeviceKey, int] = field(default_factory=dict)
    pods: list[PodVersion] = field(default_factory=list)
    leases: dict[str, float | None] = field(default_factory=dict)


def _attribute_rows(
    lazy: dict[DeviceKey, DeviceState], keys: set[DeviceKey], heartbeats: dict[DeviceKey, float]
) -> list[tuple[Any, ...]]:
    """Full attribute UPDATE rows for `keys` (identity or taints moved), each with its heartbeat."""
    rows = []
    for key in keys:
        d = lazy.get(key)
        if d is not None:
            rows.append(_attribute_row(d, heartbeats.get(key, 0.0)))
    return rows


def _allocation_groups(
    lazy: dict[DeviceKey, DeviceState], skip: set[DeviceKey], heartbeats: dict[DeviceKey, float]
) -> dict[int, list[tuple[Any, ...]]]:
    """`(allocations, source, heartbeat, node, device...)` rows for devices whose holders alone moved
    (the source moves with them: who vouches for the status follows who holds the device).

    A replaced pod's devices share one allocations tuple, one node and one confirmation
    time: one UPDATE names them all, and the tuple is serialised once (keyed by identity;
    the batch holds the tuples alive).
    """
    texts: dict[int, str] = {}
    groups: dict[tuple[Any, ...], list[str]] = {}
    for key, d in lazy.items():
        if key in skip:
            continue
        text = texts.get(id(d.allocations))
        if text is None:
            text = texts[id(d.allocations)] = _allocations_json(d.allocations)
        groups.setdefault((text, d.source, heartbeats.get(key, 0.0), key[0]), []).append(key[1])
    return _by_size(groups)


def _heartbeat_groups(
    heartbeats: dict[DeviceKey, float], skip: dict[DeviceKey, DeviceState]
) -> dict[int, list[tuple[Any, ...]]]:
    """Heartbeats as `(time, node, device...)` rows.

    A pod confirms all its devices at one time, and they share a node: one UPDATE per
    (node, time) with `device IN (...)` costs about 40% less than one per device (SQLite's
    per-statement work is shared; measured 3.9 ms against 6.6 ms for 4,000 rows).
    """
    groups: dict[tuple[Any, ...], list[str]] = {}
    for key, at in heartbeats.items():
        if key not in skip:
            groups.setdefault((at, key[0]), []).append(key[1])
    return _by_size(groups)


_GROUP = 16
"""Most devices one grouped UPDATE names (a pod's devices: 8 GPUs per node is usual)."""


def _by_size(groups: dict[tuple[Any, ...], list[str]]) -> dict[int, list[tuple[Any, ...]]]:
    """`(*prefix, device...)` rows by their number of devices (one statement per size)."""
    by_size: dict[int, list[tuple[Any, ...]]] = {}
    for prefix, devices in groups.items():
        for start in range(0, len(devices), _GROUP):
            chunk = devices[start : start + _GROUP]
            by_size.setdefault(len(chunk), []).append((*prefix, *chunk))
    return by_size


def _json_codec(
    column: str, cls: type[Any]
) -> tuple[Callable[[tuple[Any, ...]], str], Callable[[str], tuple[Any, ...]]]:
    """(encode, decode) of a tuple of `cls` (a frozen dataclass) as a JSON list of field-value lists.

    The encoder is compiled (a list display per item): `operator.attrgetter` costs 15% more."""
    values = ", ".join(f"x.{f.name}" for f in fields(cls))
    encode = compiled_function(
        f"_encode_{column}", "items", f"_dumps([[{values}] for x in items]).decode()", _dumps=orjson.dumps
    )

    def decode(text: str) -> tuple[Any, ...]:
        return tuple(cls(*item) for item in orjson.loads(text))

    return encode, decode


_CODECS = {f.name: _json_codec(f.name, f.metadata[ITEMS]) for f in DEVICE_FIELDS if ITEMS in f.metadata}
_allocations_json = _CODECS["allocations"][0]
"""The `allocations` column's text (a replaced pod's devices share one tuple: encoded once)."""


def _row_function(name: str, params: str, values: list[Field[Any]], *extra: str) -> Callable[..., Any]:
    """`name(d, params)`: a row of the `values` fields of `d` as the columns hold them, then `extra`."""
    columns = [f"_encode_{f.name}(d.{f.name})" if f.name in _CODECS else f"d.{f.name}" for f in values]
    env = {f"_encode_{column}": encode for column, (encode, _) in _CODECS.items()}
    return compiled_function(name, f"d{params}", f"({', '.join([*columns, *extra])},)", **env)


_device_row: Callable[[DeviceState, bool], tuple[Any, ...]] = _row_function(
    "_device_row", ", removed", list(DEVICE_FIELDS), "1 if removed else 0"
)
"""The values of `_INSERT_DEVICE`."""
_status_row: Callable[[DeviceState], tuple[Any, ...]] = _row_function(
    "_status_row", "", _moved_by(STATUS), "d.node", "d.device"
)
"""The values of `_UPDATE_STATUS`."""
_attribute_row: Callable[[DeviceState, float], tuple[Any, ...]] = _row_function(
    "_attribute_row", ", heartbeat", _moved_by(IDENTITY, ALLOCATIONS), "heartbeat", "d.node", "d.device"
)
"""The values of `_UPDATE_ATTRIBUTES`."""
_device_from_row: Callable[[tuple[Any, ...]], DeviceState] = compiled_function(
    "_device_from_row",
    "row",
    "DeviceState("
    + ", ".join(
        f"_decode_{f.name}(row[{i}])" if f.name in _CODECS else f"row[{i}]"
        for i, f in enumerate(DEVICE_FIELDS)
    )
    + ")",
    **{f"_decode_{column}": decode for column, (_, decode) in _CODECS.items()},
)
"""A device from a row of `SELECT {_DEVICE_COLUMNS}` (positional: the columns are in field order)."""


def _record_from_row(row: tuple[Any, ...]) -> ObservationRecord:
    return ObservationRecord(*row)


@dataclass(slots=True)
class _Batch:
    """Pending changes handed to the writer as one transaction."""

    log: list[ObservationRecord]
    devices: dict[DeviceKey, tuple[DeviceState, bool]]
    status: dict[DeviceKey, DeviceState]
    lazy: dict[DeviceKey, DeviceState] = field(default_factory=dict)
    attributes: set[DeviceKey] = field(default_factory=set)
    """Keys of `lazy` whose identity or taints moved too (else only their allocations)."""
    heartbeats: dict[DeviceKey, float] = field(default_factory=dict)
    pods: dict[str, PodVersion | None] = field(default_factory=dict)
    leases: dict[str, float | None] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        parts = (self.log, self.devices, self.status, self.lazy, self.heartbeats, self.pods, self.leases)
        return sum(map(len, parts))


class _Queries:
    """Reads shared by the writer and read-only readers."""

    _conn: sqlite3.Connection

    def _before_read(self) -> None:
        pass

    def devices(self, *, include_removed: bool = False) -> list[DeviceState]:
        self._before_read()
        where = "" if include_removed else " WHERE removed = 0"
        rows = self._conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices{where} ORDER BY node, device")
        return [_device_from_row(row) for row in rows]

    def leases(self) -> dict[str, float | None]:
        self._before_read()
        return dict(self._conn.execute("SELECT node, lease_renewed_at FROM nodes").fetchall())

    def replay(self, since: float | None = None) -> Iterator[ObservationRecord]:
        """The log in the order it was written, from `since` (wall seconds) on."""
        self._before_read()
        query = f"SELECT {_LOG_COLUMNS} FROM observations"
        params: tuple[Any, ...] = ()
        if since is not None:
            query += " WHERE observed_at >= ?"
            params = (since,)
        for row in self._conn.execute(query + " ORDER BY seq", params):
            yield _record_from_row(row)

    def load(self) -> Restored:
        self._before_read()
        restored = Restored()
        rows = self._conn.execute(f"SELECT {_DEVICE_COLUMNS} FROM devices")
        for row in rows:
            if row[_REMOVED_AT]:
                restored.removed_versions[(row[0], row[1])] = row[_VERSION_AT]
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
        change_flush_seconds: float = 0.0,
        on_write: Callable[[float], None] | None = None,
        background: bool = True,
    ) -> None:
        self.path = path
        self._clock = clock
        self._heartbeat_flush_seconds = heartbeat_flush_seconds
        self._change_flush_seconds = change_flush_seconds
        self._on_write = on_write
        self._lock: IO[bytes] | None = None
        if path != ":memory:":
            self._lock = _take_lock(path)
        try:
            self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self._conn.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode stays consistent on a crash and may lose only the last commits.
            self._conn.execute("PRAGMA synchronous=NORMAL")
            _prepare_schema(self._conn, path)
        except BaseException as exc:
            if hasattr(self, "_conn"):
                self._conn.close()
            self._release_lock()
            if isinstance(exc, sqlite3.Error | DirectoryError):
                raise DirectoryError(f"{path}: cannot open the device directory: {exc}") from exc
            raise
        self._log: list[ObservationRecord] = []
        self._devices: dict[DeviceKey, tuple[DeviceState, bool]] = {}
        """Full rows to write (device, removed)."""
        self._status: dict[DeviceKey, DeviceState] = {}
        """Status-only updates of rows that exist."""
        self._lazy: dict[DeviceKey, DeviceState] = {}
        self._attributes: set[DeviceKey] = set()
        """Keys of `_lazy` whose identity or taints moved, not only their allocations."""
        """Full rows of existing devices whose allocations moved, written on the periodic flush."""
        self._known: set[DeviceKey] = {
            (node, device)
            for node, device in self._conn.execute("SELECT node, device FROM devices WHERE removed = 0")
        }
        """Devices that have a current row (so a status change can be an UPDATE of a few
        columns). Not the removed ones: one that comes back needs its whole row, flag included."""
        self._heartbeats: dict[DeviceKey, float] = {}
        self._pods: dict[str, PodVersion | None] = {}
        self._leases: dict[str, float | None] = {}
        self._last_periodic = self._last_changes = clock.monotonic()
        self._failed: list[_Batch] = []
        self._queue: queue.Queue[_Batch | None] = queue.Queue()
        self._writer: threading.Thread | None = None
        if background:
            self._writer = threading.Thread(target=self._run_writer, name="gpuhealth-directory", daemon=True)
            self._writer.start()

    # ----- DirectorySink -----------------------------------------------------------

    def record_change(self, device: DeviceState, observation: ObservationRecord) -> None:
        self._log.append(observation)
        key = (device.node, device.device)
        if key in self._devices or key not in self._known:
            self._devices[key] = (device, False)
        else:
            # The row exists: only the status columns move (no JSON to build).
            self._status[key] = device
            if key in self._lazy:
                self._lazy[key] = device

    def record_device(self, device: DeviceState) -> None:
        # Allocations and identity attributes are written with the heartbeats: a relist
        # restores them after a restart anyway, and pods come and go far more often than
        # device statuses change.
        key = (device.node, device.device)
        if key in self._devices:
            self._devices[key] = (device, False)
        else:
            self._lazy[key] = device
            self._attributes.add(key)

    def record_allocations(self, device: DeviceState) -> None:
        key = (device.node, device.device)
        if key in self._devices:
            self._devices[key] = (device, False)
        else:
            self._lazy[key] = device

    def record_heartbeats(self, keys: Iterable[DeviceKey], observed_at: float) -> None:
        heartbeats = self._heartbeats
        for key in keys:
            heartbeats[key] = observed_at

    def record_removed(self, node: str, device: str) -> None:
        pending = self._devices.get((node, device))
        status = self._status.pop((node, device), None)
        lazy = self._lazy.pop((node, device), None)
        self._attributes.discard((node, device))
        if lazy is not None:
            status = lazy
        self._known.discard((node, device))
        if pending is not None:
            self._devices[(node, device)] = (pending[0], True)
        elif status is not None:
            self._devices[(node, device)] = (status, True)
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
            len(self._log)
            + len(self._devices)
            + len(self._status)
            + len(self._lazy)
            + len(self._heartbeats)
            + len(self._pods)
            + len(self._leases)
        )

    def heartbeats_due(self) -> bool:
        """Whether the next flush writes heartbeats (the state's `sync()` should run first)."""
        return self._clock.monotonic() - self._last_periodic >= self._heartbeat_flush_seconds

    def flush(self, *, force: bool = False) -> int:
        """Hand what is due to the writer as one transaction; the number of rows in it.

        With `background` (the default) the writer thread does the SQL: SQLite releases
        the GIL while it works, so the event loop goes on applying events meanwhile.
        Without it the write happens here and a failure raises DirectoryError.
        """
        now = self._clock.monotonic()
        periodic = force or now - self._last_periodic >= self._heartbeat_flush_seconds
        if periodic:
            self._last_periodic = now
        changes_due = periodic or now - self._last_changes >= self._change_flush_seconds
        if not (
            (changes_due and (self._log or self._devices or self._status)) or (periodic and self.pending)
        ):
            return 0
        self._last_changes = now
        batch = _Batch(log=self._log, devices=self._devices, status=self._status)
        self._log, self._devices, self._status = [], {}, {}
        self._known.update(key for key, (_, removed) in batch.devices.items() if not removed)
        if periodic:
            batch.lazy = {k: d for k, d in self._lazy.items() if k not in batch.devices}
            batch.attributes = self._attributes
            self._attributes = set()
            batch.heartbeats, batch.pods, batch.leases = self._heartbeats, self._pods, self._leases
            self._lazy, self._heartbeats, self._pods, self._leases = {}, {}, {}, {}
        if self._writer is None:
            self._write(batch)
        else:
            self._queue.put(batch)
        return batch.rows

    def wait(self) -> None:
        """Until every handed-over batch is written (reads and tests call this)."""
        if self._writer is not None:
            self._queue.join()

    def _before_read(self) -> None:
        self.wait()

    def _run_writer(self) -> None:
        while True:
            taken = [self._queue.get()]
            # What queued up while the last transaction ran goes into one transaction: a
            # backlog costs one commit, not one per batch (and fewer hand-overs of the GIL
            # between this thread and the event loop, each of which can wait a switch interval).
            while taken[-1] is not None:
                try:
                    taken.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                batches = [b for b in taken if b is not None]
                if batches:
                    retry, self._failed = self._failed, []
                    self._write_each([*retry, *batches])
                if taken[-1] is None:
                    return
            finally:
                for _ in taken:
                    self._queue.task_done()

    def _write_each(self, batches: list[_Batch]) -> None:
        """All in one transaction; if that fails, batch by batch, so one bad batch holds back
        only itself. Failed batches are kept, in order, for the next write to retry."""
        try:
            self._write(*batches)
            return
        except DirectoryError:
            if len(batches) == 1:
                log.exception("device directory write failed; will retry")
                self._failed = batches
                return
        for pending in batches:
            try:
                self._write(pending)
            except DirectoryError:
                # The state is unaffected; the next write retries it.
                log.exception("device directory write failed; will retry")
                self._failed.append(pending)

    def _write(self, *batches: _Batch) -> None:
        """The batches in order, in one transaction (DirectoryError and nothing written if it fails)."""
        started = time.perf_counter()
        conn = self._conn
        try:
            conn.execute("BEGIN")
            for batch in batches:
                self._statements(conn, batch)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise DirectoryError(f"{self.path}: write failed: {exc}") from exc
        if self._on_write is not None:
            self._on_write(time.perf_counter() - started)

    def _statements(self, conn: sqlite3.Connection, batch: _Batch) -> None:
        """One batch's statements, in the open transaction."""
        if batch.log:
            conn.executemany(_INSERT_LOG, batch.log)
        if batch.devices:
            conn.executemany(
                _INSERT_DEVICE,
                [_device_row(d, removed) for (d, removed) in batch.devices.values() if d is not _REMOVED],
            )
            conn.executemany(
                "UPDATE devices SET removed = 1, allocations = '[]' WHERE node = ? AND device = ?",
                [key for key, (d, _) in batch.devices.items() if d is _REMOVED],
            )
        if batch.status:
            conn.executemany(_UPDATE_STATUS, [_status_row(d) for d in batch.status.values()])
        heartbeats = batch.heartbeats
        if batch.lazy:
            # Rows that exist; only what pods and slices change is rewritten, with the
            # row's heartbeat in the same UPDATE (a replaced pod's devices are usually
            # confirmed too: one row rewrite instead of two). 0.0 leaves observed_at.
            if batch.attributes:
                conn.executemany(
                    _UPDATE_ATTRIBUTES, _attribute_rows(batch.lazy, batch.attributes, heartbeats)
                )
            for size, rows in _allocation_groups(batch.lazy, batch.attributes, heartbeats).items():
                conn.executemany(
                    "UPDATE devices SET allocations = ?, source = ?, observed_at = max(observed_at, ?) "
                    f"WHERE node = ? AND device IN ({','.join('?' * size)})",
                    rows,
                )
        if heartbeats:
            for size, rows in _heartbeat_groups(heartbeats, batch.lazy).items():
                marks = ",".join("?" * size)
                conn.executemany(
                    "UPDATE devices SET observed_at = max(observed_at, ?) "
                    f"WHERE node = ? AND device IN ({marks})",
                    rows,
                )
        if batch.pods:
            conn.executemany(
                "INSERT OR REPLACE INTO pods (uid, namespace, name, resource_version) VALUES (?,?,?,?)",
                [(p.uid, p.namespace, p.name, p.resource_version) for p in batch.pods.values() if p],
            )
            conn.executemany(
                "DELETE FROM pods WHERE uid = ?", [(uid,) for uid, p in batch.pods.items() if p is None]
            )
        if batch.leases:
            conn.executemany(
                "INSERT OR REPLACE INTO nodes (node, lease_renewed_at) VALUES (?, ?)",
                [(n, t) for n, t in batch.leases.items() if t is not None],
            )
            conn.executemany(
                "DELETE FROM nodes WHERE node = ?", [(n,) for n, t in batch.leases.items() if t is None]
            )

    def close(self) -> None:
        try:
            self.flush(force=True)
            if self._writer is not None:
                self._queue.put(None)
                self._writer.join()
                self._writer = None
            for batch in self._failed:
                self._write(batch)
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
            version, latest = _schema_version(self._conn), _latest_version()
            if version == 0:
                raise DirectoryError("schema version 0: no exporter has written this file")
            if version < latest:
                # Read-only, and an exporter may be writing it: only the writer upgrades.
                raise DirectoryError(
                    f"schema version {version} is older than this gpuhealth's {latest}: start the "
                    "exporter on the file once (it upgrades it in place), or read it with the "
                    "release that wrote it"
                )
            _check_columns(self._conn)
        except (sqlite3.Error, DirectoryError) as exc:
            if hasattr(self, "_conn"):
                self._conn.close()
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


def _latest_version() -> int:
    """The version `MIGRATIONS` leads to (read at call time: tests add a step of their own)."""
    if sorted(MIGRATIONS) != list(range(BASE_VERSION, BASE_VERSION + len(MIGRATIONS))):
        raise AssertionError(f"MIGRATIONS must step from {BASE_VERSION} on, one by one: {sorted(MIGRATIONS)}")
    return BASE_VERSION + len(MIGRATIONS)


def _schema_version(conn: sqlite3.Connection) -> int:
    """The file's version; DirectoryError for one newer than this code or none of ours.

    0 is SQLite's default: a new file (or one another program made, which
    `_check_columns` refuses)."""
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    latest = _latest_version()
    if version > latest:
        raise DirectoryError(
            f"schema version {version} is newer than this gpuhealth knows ({latest}): a later release "
            "wrote it; run that release or a later one, or give this one a new --directory file"
        )
    if version < 0 or 0 < version < BASE_VERSION:
        raise DirectoryError(
            f"schema version {version} is no device directory's ({BASE_VERSION} to {latest})"
        )
    return version


def _prepare_schema(conn: sqlite3.Connection, path: str) -> None:
    """Create the layout in a new file or upgrade an older one in place; refuse anything else."""
    version = _schema_version(conn)
    latest = _latest_version()
    if version == 0:
        # In one transaction: a foreign file that fails the check is left as it was.
        with _transaction(conn):
            for statement in _SCHEMA:
                conn.execute(statement)
            _check_columns(conn)
            conn.execute(f"PRAGMA user_version = {latest}")
        return
    for start in range(version, latest):
        step = MIGRATIONS[start]
        try:
            if isinstance(step, str):
                # executescript commits any open transaction first: the script carries its own.
                conn.executescript(f"BEGIN;\n{step};\nPRAGMA user_version = {start + 1};\nCOMMIT;")
            else:
                with _transaction(conn):
                    step(conn)
                    conn.execute(f"PRAGMA user_version = {start + 1}")
        except Exception as exc:  # a step's own bug too: the file must stay usable at `start`
            raise DirectoryError(
                f"schema upgrade from version {start} to {start + 1} failed, the file stays at "
                f"version {start}: {exc}"
            ) from exc
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    if version < latest:
        log.info("device directory %s: schema upgraded in place from version %d to %d", path, version, latest)
    _check_columns(conn)


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """Everything inside commits together or not at all (the connection is in autocommit mode)."""
    conn.execute("BEGIN")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _check_columns(conn: sqlite3.Connection) -> None:
    """DirectoryError unless every column the queries name is there (a file another program
    made with tables of the same names would otherwise fail on the first query, not here)."""
    for table, columns in (
        ("devices", _DEVICE_COLUMNS),
        ("observations", _LOG_COLUMNS),
        ("pods", "uid, namespace, name, resource_version"),
        ("nodes", "node, lease_renewed_at"),
    ):
        try:
            conn.execute(f"SELECT {columns} FROM {table} LIMIT 0").fetchall()
        except sqlite3.OperationalError as exc:
            raise DirectoryError(f"table {table} is not a device directory's: {exc}") from exc


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
    directory: Directory | None,
    clock: Clock,
    *,
    node_name: str | None = None,
    nvml: bool = False,
    slice_health_drivers: Iterable[str] = (),
    shard: Shard = UNSHARDED,
) -> DeviceStateStore:
    """A state that persists into `directory`, starting from what it already holds (of its shard)."""
    store = DeviceStateStore(
        clock,
        sink=directory,
        node_name=node_name,
        nvml=nvml,
        slice_health_drivers=slice_health_drivers,
        shard=shard,
    )
    if directory is not None:
        restored = directory.load()
        store.restore(
            restored.devices,
            removed_versions=restored.removed_versions,
            pods=restored.pods,
            leases=restored.leases,
        )
    return store
