"""The exporter's device view as documents and tables: what `gpuhealth devices`, the exporter's
`GET /api/v1/devices` and `kubectl gpuhealth devices` print.

Pure: plain data in, plain data out. One document shape serves all three, so a device reads
the same from the local directory file, from a running exporter, and through the plugin:

- `device_document(device, age)`: one device (identity, health, message, status age, versions,
  times in RFC 3339, allocations, driver taints, the source vouching for the status);
- `devices_document(snapshot, now)`: the exporter's current immutable snapshot as a
  `DeviceList` (status ages from `exporter.snapshot.status_age` with the node Leases and, in
  node mode, NVML, exactly as `/metrics` computes them);
- `read_devices_document(doc)`: the inverse, for a client: `(DeviceState, age)` rows, with a
  `ViewError` naming the first field that does not fit;
- the table columns (`COLUMNS`, later parts add their own `Column`s) and `render_table`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

from exporter.snapshot import (
    HEALTH_VALUES,
    STATUS_SOURCES,
    Allocation,
    DeviceState,
    DriverTaint,
    NodeState,
    Snapshot,
    producer_down_since,
    status_age,
)
from gpuhealth.kube.meta import parse_rfc3339, rfc3339_seconds
from gpuhealth.tables import human_duration, truncate, write_table

API_VERSION: Final = "gpuhealth.io/v1alpha1"
KIND: Final = "DeviceList"
PATH: Final = "/api/v1/devices"
"""Where the exporter serves `devices_document` (read-only, from its current snapshot)."""

Row = tuple[DeviceState, float]
"""A device and its status age in seconds."""


class ViewError(ValueError):
    """A devices document that does not have the shape `devices_document` writes."""


def iso(ts: float | None) -> str:
    """RFC 3339 in UTC to the second (`2026-11-30T10:00:00Z`); empty for None."""
    if ts is None:
        return ""
    return rfc3339_seconds(ts)


# ----- documents -----------------------------------------------------------------------


def device_document(device: DeviceState, age: float) -> dict[str, Any]:
    return {
        "node": device.node,
        "device": device.device,
        "health": device.health,
        "message": device.message,
        "statusAgeSeconds": round(age, 3),
        "statusVersion": device.status_version,
        "firstSeen": iso(device.first_seen),
        "changedAt": iso(device.changed_at),
        "observedAt": iso(device.observed_at),
        "unknownSince": iso(device.unknown_since) if device.unknown_since is not None else None,
        "uuid": device.uuid,
        "driver": device.driver,
        "pool": device.pool,
        "deviceName": device.device_name,
        "resource": device.resource,
        "source": device.source,
        "allocations": [
            {
                "namespace": a.namespace,
                "pod": a.pod,
                "container": a.container,
                "resource": a.resource,
                "claim": a.claim,
            }
            for a in device.allocations
        ],
        "driverTaints": [{"key": t.key, "value": t.value, "effect": t.effect} for t in device.driver_taints],
    }


def snapshot_rows(snapshot: Snapshot, now: float) -> list[Row]:
    """Every device of the snapshot with its status age, as `/metrics` computes it."""
    return [
        (d, status_age(d, snapshot.nodes.get(d.node), snapshot.nvml, now, producer_down_since(snapshot, d)))
        for _, d in sorted(snapshot.devices.items())
    ]


def devices_document(snapshot: Snapshot, now: float) -> dict[str, Any]:
    """The exporter's `GET /api/v1/devices`: its current snapshot, nothing read at request time."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "node": snapshot.node_name,
        "time": iso(now),
        "devices": [device_document(d, age) for d, age in snapshot_rows(snapshot, now)],
    }


def read_devices_document(doc: Any) -> tuple[str | None, list[Row]]:
    """(the serving exporter's node or None in cluster mode, its rows) from `devices_document`."""
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
        raise ViewError(f"expected a {KIND} document, found {kind!r}")
    node = doc.get("node")
    if node is not None and not isinstance(node, str):
        raise ViewError("node: expected a string or null")
    items = doc.get("devices")
    if not isinstance(items, list):
        raise ViewError("devices: expected a list")
    return node, [_row(item, f"devices[{i}]") for i, item in enumerate(items)]


def _row(item: Any, where: str) -> Row:
    if not isinstance(item, dict):
        raise ViewError(f"{where}: expected an object")
    field = _Fields(item, where)
    health = field.text("health")
    if health not in HEALTH_VALUES:
        raise ViewError(f"{where}.health: {health!r} is not one of {', '.join(HEALTH_VALUES)}")
    source = field.text("source", default="pod")
    if source not in STATUS_SOURCES:
        raise ViewError(f"{where}.source: {source!r} is not one of {', '.join(STATUS_SOURCES)}")
    unknown = item.get("unknownSince")
    device = DeviceState(
        node=field.text("node", required=True),
        device=field.text("device", required=True),
        health=health,
        message=field.text("message"),
        status_version=field.integer("statusVersion"),
        first_seen=field.time("firstSeen"),
        changed_at=field.time("changedAt"),
        observed_at=field.time("observedAt"),
        unknown_since=None if unknown is None else field.time("unknownSince"),
        uuid=field.text("uuid"),
        driver=field.text("driver"),
        pool=field.text("pool"),
        device_name=field.text("deviceName"),
        resource=field.text("resource"),
        allocations=tuple(
            Allocation(
                namespace=a.text("namespace"),
                pod=a.text("pod"),
                container=a.text("container"),
                resource=a.text("resource"),
                claim=a.text("claim"),
            )
            for a in field.objects("allocations")
        ),
        driver_taints=tuple(
            DriverTaint(key=t.text("key"), effect=t.text("effect"), value=t.text("value"))
            for t in field.objects("driverTaints")
        ),
        source=source,
    )
    age = item.get("statusAgeSeconds")
    if isinstance(age, bool) or not isinstance(age, int | float) or age < 0:
        raise ViewError(f"{where}.statusAgeSeconds: expected a number of seconds, found {age!r}")
    return device, float(age)


@dataclass(frozen=True, slots=True)
class _Fields:
    """Typed reads of one object, errors naming the field's path."""

    item: dict[str, Any]
    where: str

    def text(self, key: str, *, required: bool = False, default: str = "") -> str:
        value = self.item.get(key, default)
        if not isinstance(value, str) or (required and not value):
            raise ViewError(f"{self.where}.{key}: expected a {'non-empty ' if required else ''}string")
        return value

    def integer(self, key: str) -> int:
        value = self.item.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ViewError(f"{self.where}.{key}: expected an integer, found {value!r}")
        return value

    def time(self, key: str) -> float:
        value = parse_rfc3339(self.item.get(key))
        if value is None:
            raise ViewError(f"{self.where}.{key}: expected an RFC 3339 time, found {self.item.get(key)!r}")
        return value

    def objects(self, key: str) -> list[_Fields]:
        values = self.item.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
            raise ViewError(f"{self.where}.{key}: expected a list of objects")
        return [_Fields(v, f"{self.where}.{key}[{i}]") for i, v in enumerate(values)]


# ----- tables ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    """One column of the devices table; later parts (the plugin's quarantine state) add their own."""

    header: str
    value: Callable[[DeviceState, float], str]
    """(device, status age) -> cell text."""
    wide_only: bool = False


def _pods(device: DeviceState) -> str:
    names = sorted({f"{a.namespace}/{a.pod}" for a in device.allocations})
    return ",".join(names) if names else "<none>"


COLUMNS: list[Column] = [
    Column("NODE", lambda d, _: d.node),
    Column("DEVICE", lambda d, _: d.device),
    Column("HEALTH", lambda d, _: d.health),
    Column("AGE", lambda _, age: human_duration(age)),
    Column("VERSION", lambda d, _: str(d.status_version), wide_only=True),
    Column("CHANGED", lambda d, _: iso(d.changed_at), wide_only=True),
    Column("UNKNOWN-SINCE", lambda d, _: iso(d.unknown_since) if d.unknown_since else "-", wide_only=True),
    Column(
        "DRIVER/POOL/NAME",
        lambda d, _: f"{d.driver}/{d.pool}/{d.device_name}" if d.driver else "-",
        wide_only=True,
    ),
    Column(
        "TAINTS",
        lambda d, _: ",".join(f"{t.key}={t.value}:{t.effect}" for t in d.driver_taints) or "-",
        wide_only=True,
    ),
    Column("PODS", lambda d, _: _pods(d)),
]
MESSAGE = Column("MESSAGE", lambda d, _: d.message or "-")


def device_rows(devices: Iterable[DeviceState], leases: dict[str, float | None], now: float) -> list[Row]:
    """Devices with their status age from the node Leases alone (the directory file has no NVML
    and no health producers: a live exporter's `/api/v1/devices` ages them by those too)."""
    rows = []
    for device in devices:
        renewed = leases.get(device.node)
        node = NodeState(node=device.node, lease_renewed_at=renewed) if renewed is not None else None
        rows.append((device, status_age(device, node, None, now)))
    return rows


def render_table(
    rows: Sequence[Row],
    *,
    wide: bool,
    out: TextIO,
    extra: Sequence[Column] = (),
    no_headers: bool = False,
    width: int = 48,
) -> None:
    """`COLUMNS` (and `extra` before the message), the message last so it may run on."""
    columns = [c for c in [*COLUMNS, *extra] if wide or not c.wide_only]
    headers = [c.header for c in columns] + [MESSAGE.header]
    cells = [
        [c.value(d, age) for c in columns]
        + [MESSAGE.value(d, age) if wide else truncate(MESSAGE.value(d, age), width)]
        for d, age in rows
    ]
    if not wide:
        # PODS can be long for shared devices.
        pods_at = headers.index("PODS")
        for row in cells:
            row[pods_at] = truncate(row[pods_at], 40)
    write_table(headers, cells, out, no_headers=no_headers)
