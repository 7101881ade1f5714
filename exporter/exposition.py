"""Render a `Snapshot` as the Prometheus text exposition format (version 0.0.4).

This module owns how each device and NVML sample is derived from the snapshot and written;
the families themselves (names, labels, HELP and TYPE) are declared in `exporter.metrics`,
read once at import. It is pure (no I/O, no clock reads): the caller passes the snapshot
and the time to render at.

Why not prometheus_client collectors: a cluster-mode exporter renders 80,000 devices
(about 650,000 series) per scrape, and building `Metric`/`Sample` objects for each
costs seconds and hundreds of MB. Instead, what is costly to write about a device and
constant while its `DeviceState` stays the same (its escaped label pairs, the info,
allocation and taint lines, the observed time and version as text) is rendered once and
cached across snapshot swaps; a scrape then formats the status age (it moves with `now`)
and fills those fragments into a few fixed line templates, one family at a time, in
pieces (`MetricsRenderer.pieces`), so a scrape never holds the whole body. The cache keeps
fragments, not whole lines: at 80,000 devices it is about 55 MiB, where caching every
line took about 130 MiB; filling the templates costs a warm scrape about 0.05 s more
(measured 0.27 s against 0.23 s, the same body byte for byte).

Rules kept here:
- every per-device series carries `node` and `device`; pod and tenant labels only on
  `_info` series, so series do not churn when pods move;
- every sample of a family is contiguous, each family has HELP and TYPE lines;
- a device whose data cannot be rendered drops its own lines (and is logged), never the
  scrape; NVML readings that are `None` are simply absent.
"""

from __future__ import annotations

import gc
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from exporter.metrics import (
    DEVICE_ALLOCATION,
    DEVICE_DRIVER_TAINT,
    DEVICE_FAMILIES,
    DEVICE_HEALTH,
    DEVICE_INFO,
    DEVICE_OBSERVED,
    DEVICE_STATUS_AGE,
    DEVICE_STATUS_VERSION,
    NODE_HEALTH_PRODUCER_UP,
    NODE_LEASE_AGE,
    NVML_ECC,
    NVML_FAMILIES,
    NVML_MIG_DEVICE,
    NVML_POWER,
    NVML_REMAPPED,
    NVML_TEMPERATURE,
    NVML_UP,
    NVML_XID,
)
from exporter.snapshot import (
    HEALTH_VALUES,
    Allocation,
    DeviceState,
    DriverTaint,
    NodeState,
    NvmlView,
    ProducerState,
    Snapshot,
    status_age,
)
from gpuhealth.metrics import MetricFamily
from gpuhealth.nvml import DeviceReading

log = logging.getLogger(__name__)

PIECE_LINES = 4096
"""Per-device fragments joined into one piece of a streamed body: about 0.4-1.3 MiB."""


# Names and HELP/TYPE lines come from the catalog once, at import: a scrape only joins them.
_HEALTH = DEVICE_HEALTH.exposed_name
_STATUS_AGE = DEVICE_STATUS_AGE.exposed_name
_OBSERVED = DEVICE_OBSERVED.exposed_name
_STATUS_VERSION = DEVICE_STATUS_VERSION.exposed_name
_INFO = DEVICE_INFO.exposed_name
_ALLOCATION = DEVICE_ALLOCATION.exposed_name
_DRIVER_TAINT = DEVICE_DRIVER_TAINT.exposed_name
_LEASE_AGE = NODE_LEASE_AGE.exposed_name
_PRODUCER_UP = NODE_HEALTH_PRODUCER_UP.exposed_name
_NVML_UP = NVML_UP.exposed_name
_NVML_XID = NVML_XID.exposed_name
_NVML_MIG = NVML_MIG_DEVICE.exposed_name
_NVML_ECC = NVML_ECC.exposed_name
_NVML_REMAPPED = NVML_REMAPPED.exposed_name
_NVML_TEMPERATURE = NVML_TEMPERATURE.exposed_name
_NVML_POWER = NVML_POWER.exposed_name


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _header(family: MetricFamily) -> str:
    name = family.exposed_name
    return f"# HELP {name} {_escape_help(family.help)}\n# TYPE {name} {family.text_type}\n"


_DEVICE_HEADERS = tuple(_header(f).encode() for f in DEVICE_FAMILIES)
"""HELP and TYPE of the per-device families, in the order `_render_devices` writes them."""
_LEASE_AGE_HEADER = _header(NODE_LEASE_AGE)
_PRODUCER_UP_HEADER = _header(NODE_HEALTH_PRODUCER_UP)
_NVML_HEADERS = tuple((f.exposed_name, _header(f)) for f in NVML_FAMILIES)
"""(name, HELP and TYPE) of the NVML families, in rendering order."""


def escape_label_value(value: str) -> str:
    """Escape a label value for the text format: backslash, double quote and newline."""
    # Most values (node names, UUIDs) need nothing; three `in` scans beat three replaces.
    if "\\" in value or '"' in value or "\n" in value:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def format_value(value: float) -> str:
    """A sample value as Prometheus parses it (Go ParseFloat); repr is exact and fast."""
    kind = type(value)
    if kind is int:
        return str(value)
    text = repr(value if kind is float else float(value))
    if text[-1] in "fn":  # inf, -inf, nan: spell them as Prometheus documents them
        if math.isnan(value):
            return "NaN"
        return "+Inf" if value > 0 else "-Inf"
    return text


class _DeviceLines:
    """What a scrape reuses for one device while its `DeviceState` object stays the same.

    `state` is the state the fragments were rendered from: holding it keeps the identity
    check sound (an object id cannot be reused while we hold the object) and lets a new
    state be compared field by field to rebuild only what moved.
    """

    __slots__ = ("alloc_lines", "core", "health", "info_line", "observed", "state", "taint_lines", "version")

    state: DeviceState
    core: bytes
    """The escaped `node="...",device="..."` label pairs every device series starts with."""
    health: bytes
    """The template of its three health lines (one of `_HEALTH_LINES`, shared)."""
    observed: bytes
    """`observed_at` as sample text."""
    version: bytes
    """`status_version` as sample text."""
    info_line: bytes
    alloc_lines: bytes
    taint_lines: bytes


# Line templates a scrape fills with a device's fragments (bytes %-formatting, in C).
_HEALTH_LINES = {
    health: "".join(
        f'{_HEALTH}{{%b,status="{value}"}} {1 if value == health else 0}\n' for value in HEALTH_VALUES
    ).encode()
    for health in (*HEALTH_VALUES, None)
}
"""By reported health, the three health lines; under None, all three 0 (a value outside
HEALTH_VALUES, a broken snapshot)."""
_AGE_LINE = f"{_STATUS_AGE}{{%b}} %b\n".encode()
_OBSERVED_LINE = f"{_OBSERVED}{{%b}} %b\n".encode()
_VERSION_LINE = f"{_STATUS_VERSION}{{%b}} %b\n".encode()


# The builders below are the cold path of a scrape (once per device state). They format
# with plain f-strings and avoid temporary containers, and return bytes, which the scrape
# joins without encoding again.


def _core(d: DeviceState) -> bytes:
    return f'node="{escape_label_value(d.node)}",device="{escape_label_value(d.device)}"'.encode()


def _info_line(core: str, d: DeviceState) -> bytes:
    esc = escape_label_value
    return (
        f'{_INFO}{{{core},uuid="{esc(d.uuid)}",driver="{esc(d.driver)}",pool="{esc(d.pool)}",'
        f'device_name="{esc(d.device_name)}",resource="{esc(d.resource)}",source="{esc(d.source)}"}} 1\n'
    ).encode()


def _same_info(a: DeviceState, b: DeviceState) -> bool:
    return (
        a.uuid == b.uuid
        and a.driver == b.driver
        and a.pool == b.pool
        and a.device_name == b.device_name
        and a.resource == b.resource
        and a.source == b.source
    )


def _allocation_lines(core: str, allocations: tuple[Allocation, ...]) -> bytes:
    esc = escape_label_value
    lines: list[str] = []
    for a in allocations:
        line = (
            f'{_ALLOCATION}{{{core},namespace="{esc(a.namespace)}",pod="{esc(a.pod)}",'
            f'container="{esc(a.container)}",resource="{esc(a.resource)}",claim="{esc(a.claim)}"}} 1\n'
        )
        if line not in lines:  # a repeated allocation must not become a duplicate series
            lines.append(line)
    return "".join(lines).encode()


def _taint_lines(core: str, taints: tuple[DriverTaint, ...]) -> bytes:
    esc = escape_label_value
    lines: list[str] = []
    for t in taints:
        # Only key and effect are labels: two taints differing by value are one series.
        line = f'{_DRIVER_TAINT}{{{core},key="{esc(t.key)}",effect="{esc(t.effect)}"}} 1\n'
        if line not in lines:
            lines.append(line)
    return "".join(lines).encode()


def _health_lines(health: str) -> bytes:
    return _HEALTH_LINES.get(health, _HEALTH_LINES[None])


def _sample(value: float) -> bytes:
    return format_value(value).encode()


def _build_lines(d: DeviceState, old: _DeviceLines | None) -> _DeviceLines:
    """Fragments for a device state, reusing the parts of `old` whose inputs did not change.

    Always a new object (never mutated in place), so two scrapes rendering at once in
    different threads can only race to store equally correct entries.
    """
    e = _DeviceLines()
    e.state = d
    o = old.state if old is not None else None
    if old is None or o is None or o.node != d.node or o.device != d.device:
        e.core = _core(d)
        core = e.core.decode()
        e.health = _health_lines(d.health)
        e.observed = _sample(d.observed_at)
        e.version = _sample(d.status_version)
        e.info_line = _info_line(core, d)
        e.alloc_lines = _allocation_lines(core, d.allocations) if d.allocations else b""
        e.taint_lines = _taint_lines(core, d.driver_taints) if d.driver_taints else b""
        return e

    # Same device, new state object (a heartbeat or a change): rebuild only what moved.
    e.core = old.core
    e.health = old.health if o.health == d.health else _health_lines(d.health)
    e.observed = old.observed if o.observed_at == d.observed_at else _sample(d.observed_at)
    e.version = old.version if o.status_version == d.status_version else _sample(d.status_version)
    same_info, same_allocs, same_taints = (
        _same_info(o, d),
        o.allocations == d.allocations,
        o.driver_taints == d.driver_taints,
    )
    core = "" if same_info and same_allocs and same_taints else old.core.decode()
    e.info_line = old.info_line if same_info else _info_line(core, d)
    e.alloc_lines = old.alloc_lines if same_allocs else _allocation_lines(core, d.allocations)
    e.taint_lines = old.taint_lines if same_taints else _taint_lines(core, d.driver_taints)
    return e


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a render allocates.

    A cold render creates one cache entry per device; at 80,000 devices the collector
    would otherwise run several full passes over the whole heap mid-render (measured: the
    first render takes twice as long). Everything a render allocates is freed by reference
    counting, so nothing is lost by deferring the collector. If the collector was already
    off (the application's choice), it stays off.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class MetricsRenderer:
    """Renders snapshots, keeping per-device line caches across snapshot swaps.

    The cache is keyed by the snapshot's device key; an entry is reused as is while the
    snapshot holds the very same `DeviceState` object, and partly rebuilt when it does
    not. Entries of devices gone from the snapshot are dropped at the end of a render.
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str], _DeviceLines] = {}

    def render(self, snapshot: Snapshot, now: float) -> bytes:
        """The exposition of `snapshot` at wall time `now`."""
        return b"".join(self.pieces(snapshot, now))

    def pieces(self, snapshot: Snapshot, now: float) -> Iterator[bytes]:
        """The exposition of `snapshot` at `now`, in pieces of at most `PIECE_LINES` devices' lines.

        What a streamed scrape writes as it goes: at 80,000 devices the body is about 86 MiB,
        and building it whole (then gzipping it) held it twice over during every scrape. The
        first piece costs the walk that refreshes every device's fragments and computes its
        status age; each family is then written from them, piece by piece.
        """
        with _collector_paused():  # only around the walk: never left off while suspended
            entries, ages = self._walk_devices(snapshot, now)
        n = len(entries)
        age_line, observed_line, version_line = _AGE_LINE, _OBSERVED_LINE, _VERSION_LINE
        families: tuple[Callable[[int, int], list[bytes]], ...] = (
            lambda a, b: [e.health % (e.core, e.core, e.core) for e in entries[a:b]],
            lambda a, b: [age_line % (e.core, age) for e, age in zip(entries[a:b], ages[a:b], strict=True)],
            lambda a, b: [observed_line % (e.core, e.observed) for e in entries[a:b]],
            lambda a, b: [version_line % (e.core, e.version) for e in entries[a:b]],
            lambda a, b: [e.info_line for e in entries[a:b]],
            lambda a, b: [e.alloc_lines for e in entries[a:b] if e.alloc_lines],
            lambda a, b: [e.taint_lines for e in entries[a:b] if e.taint_lines],
        )
        for header, lines in zip(_DEVICE_HEADERS, families, strict=True):
            for start in range(0, max(n, 1), PIECE_LINES):
                piece = lines(start, start + PIECE_LINES)
                yield b"".join([header, *piece] if start == 0 else piece)
        yield _render_nodes(snapshot.nodes, now)
        yield _render_producers(snapshot.producers)
        if snapshot.nvml is not None:
            yield _render_nvml(snapshot.nvml, snapshot.node_name or "")

    def _walk_devices(self, snapshot: Snapshot, now: float) -> tuple[list[_DeviceLines], list[bytes]]:
        """Every renderable device's fresh cache entry and status age, in snapshot order.

        Everything that can fail for one device (its fragments, its age) is done here, so a
        device that cannot be rendered is left out of every family, never of some only.
        """
        cache = self._cache
        cache_get = cache.get
        nodes_get = snapshot.nodes.get
        nvml = snapshot.nvml
        producers_get = snapshot.producers.get if snapshot.producers else None
        entries: list[_DeviceLines] = []
        ages: list[bytes] = []
        failed = 0
        first_error: BaseException | None = None
        for key, d in snapshot.devices.items():
            try:
                e = cache_get(key)
                if e is None or e.state is not d:
                    e = cache[key] = _build_lines(d, e)
                producer = producers_get((d.node, d.driver)) if producers_get and d.driver else None
                down_since = producer.down_since if producer is not None else None
                age = format_value(status_age(d, nodes_get(d.node), nvml, now, down_since)).encode()
            except Exception as exc:  # one malformed device drops its own lines, never the scrape
                failed += 1
                first_error = first_error or exc
                cache.pop(key, None)
                continue
            entries.append(e)
            ages.append(age)
        if failed:
            log.warning("dropped %d device(s) from the scrape; first error: %r", failed, first_error)
        if len(cache) > len(snapshot.devices):
            # Walk the snapshot's keys, never the shared cache: a render in another thread (two
            # scrapes at once) may be adding to `cache`, and walking a growing dict raises.
            self._cache = {k: e for k in snapshot.devices if (e := cache_get(k)) is not None}
        return entries, ages


def _render_nodes(nodes: Mapping[str, NodeState], now: float) -> bytes:
    out = [_LEASE_AGE_HEADER]
    for node in nodes.values():
        if node.lease_renewed_at is None:
            continue
        try:
            # Clock skew between kubelet and exporter must not show as a negative age.
            age = format_value(max(0.0, now - node.lease_renewed_at))
        except Exception as exc:  # a malformed node drops its own line
            log.warning("dropped node %r from the scrape: %r", node.node, exc)
            continue
        out.append(f'{_LEASE_AGE}{{node="{escape_label_value(node.node)}"}} {age}\n')
    return "".join(out).encode()


def _render_producers(producers: Mapping[tuple[str, str], ProducerState]) -> bytes:
    out = [_PRODUCER_UP_HEADER]
    for (node, driver), producer in sorted(producers.items()):
        labels = f'node="{escape_label_value(node)}",driver="{escape_label_value(driver)}"'
        out.append(f"{_PRODUCER_UP}{{{labels}}} {1 if producer.ready else 0}\n")
    return "".join(out).encode()


def _reading_lines(core: str, r: DeviceReading) -> dict[str, list[str]]:
    """One reachable device's NVML samples by family name (None readings are absent)."""
    lines: dict[str, list[str]] = {}

    def add(name: str, extra: str, value: float | None) -> None:
        if value is not None:
            labels = f"{core},{extra}" if extra else core
            lines.setdefault(name, []).append(f"{name}{{{labels}}} {format_value(value)}\n")

    add(_NVML_ECC, 'type="corrected"', r.ecc_corrected_volatile)
    add(_NVML_ECC, 'type="uncorrected"', r.ecc_uncorrected_volatile)
    add(_NVML_REMAPPED, 'type="correctable"', r.remapped_rows_correctable)
    add(_NVML_REMAPPED, 'type="uncorrectable"', r.remapped_rows_uncorrectable)
    add(_NVML_REMAPPED, 'type="pending"', _flag(r.remapped_rows_pending))
    add(_NVML_REMAPPED, 'type="failure"', _flag(r.remapped_rows_failure))
    add(_NVML_TEMPERATURE, "", r.temperature_celsius)
    add(_NVML_POWER, "", r.power_watts)
    for m in r.mig_devices:
        # The partitions stay on their card's series: the card is the device gpuhealth governs.
        extra = (
            f'mig_uuid="{escape_label_value(m.uuid)}",gpu_instance_id="{int(m.gpu_instance_id)}",'
            f'profile="{escape_label_value(m.profile)}"'
        )
        add(_NVML_MIG, extra, 1)
    return lines


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(bool(value))


def _render_nvml(nvml: NvmlView, node: str) -> bytes:
    node_label = f'node="{escape_label_value(node)}"'

    def core(uuid: str) -> str:
        return f'{node_label},device="{escape_label_value(uuid)}"'

    by_family: dict[str, list[str]] = {name: [] for name, _ in _NVML_HEADERS}
    for uuid, reading in nvml.readings.items():
        try:
            c = core(uuid)
            up = f"{_NVML_UP}{{{c}}} {1 if reading.reachable else 0}\n"
            lines = _reading_lines(c, reading) if reading.reachable else {}
        except Exception as exc:  # one device's bad reading drops that device, never the scrape
            log.warning("dropped NVML readings of %r from the scrape: %r", uuid, exc)
            continue
        by_family[_NVML_UP].append(up)
        for name, family_lines in lines.items():
            by_family[name].extend(family_lines)
    for (uuid, xid), count in nvml.xid_counts.items():
        try:
            line = f'{_NVML_XID}{{{core(uuid)},xid="{int(xid)}"}} {format_value(count)}\n'
        except Exception as exc:
            log.warning("dropped XID count %r of %r from the scrape: %r", xid, uuid, exc)
            continue
        by_family[_NVML_XID].append(line)
    out: list[str] = []
    for name, header in _NVML_HEADERS:
        out.append(header)
        out.extend(by_family[name])
    return "".join(out).encode()


_default_renderer = MetricsRenderer()


def metrics_pieces(snapshot: Snapshot, now: float) -> Iterator[bytes]:
    """`render_metrics` in pieces (`MetricsRenderer.pieces`), with the same process-wide cache."""
    return _default_renderer.pieces(snapshot, now)


def render_metrics(snapshot: Snapshot, now: float) -> bytes:
    """The device metrics of `snapshot` at wall time `now`, as text exposition format 0.0.4.

    Uses one process-wide `MetricsRenderer`, so the per-device line cache survives the
    observer swapping snapshots between scrapes.
    """
    return _default_renderer.render(snapshot, now)
