"""`NvmlSource` over the simulated cluster's HTTP endpoint (an exporter reading a simulated node).

`GET {base_url}/simulator/v1/nodes/{node}/nvml?since=<seq>` answers
`{"node", "devices": [DeviceReading fields], "xid_events": [{"uuid", "xid", "timestamp",
"seq"}], "next_seq"}`. This client keeps the event cursor (`since`), so every XID event is
delivered once; like a real driver, events from before `start()` are not replayed.

Failure policy: a simulator that cannot be reached is not a GPU fault. `start()` returns
False (one log line) when the endpoint or the node is not there; after a successful start,
a failed request makes `read()` return `[]` (logged when it starts failing and when it
recovers), never devices marked unreachable. With no readings the exporter's NVML read
times stop advancing, so status ages grow, which is what a silent source should do.

Synchronous (stdlib urllib with a timeout): call it from a worker thread, like the real one.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeGuard

from gpuhealth.nvml import DeviceReading, MigDevice, XidEvent
from simulator.node_routes import node_route

log = logging.getLogger(__name__)

_OPTIONAL_NUMBERS = (
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "temperature_celsius",
    "power_watts",
)
_OPTIONAL_FLAGS = ("remapped_rows_pending", "remapped_rows_failure")
_OPTIONAL_TEXTS = ("error", "name")
READ_FIELDS = frozenset(
    {"uuid", "index", "reachable", "mig_devices", *_OPTIONAL_NUMBERS, *_OPTIONAL_FLAGS, *_OPTIONAL_TEXTS}
)
"""The DeviceReading fields taken from the document (a test keeps this equal to all of them)."""


class RemoteNvmlError(Exception):
    """The endpoint could not be read or answered something that is not its document."""


def _number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


_OPTIONAL_KINDS: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (_OPTIONAL_NUMBERS, _number, "a number"),
    (_OPTIONAL_FLAGS, lambda value: isinstance(value, bool), "true, false"),
    (_OPTIONAL_TEXTS, lambda value: isinstance(value, str), "a string"),
)
"""Optional DeviceReading fields by kind: (names, check, what the error says they must be)."""


def reading_from_json(obj: Any) -> DeviceReading:
    """One device of the document as a `DeviceReading`; ValueError names what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError(f"device entry is {type(obj).__name__}, not an object")
    uuid, index, reachable = obj.get("uuid"), obj.get("index"), obj.get("reachable")
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"device uuid must be a non-empty string, got {uuid!r}")
    if not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(f"device {uuid}: index must be an integer, got {index!r}")
    if not isinstance(reachable, bool):
        raise ValueError(f"device {uuid}: reachable must be true or false, got {reachable!r}")
    values: dict[str, Any] = {}
    for names, valid, what in _OPTIONAL_KINDS:
        for name in names:
            value = obj.get(name)
            if value is not None and not valid(value):
                raise ValueError(f"device {uuid}: {name} must be {what} or null, got {value!r}")
            values[name] = value
    return DeviceReading(
        uuid=uuid,
        index=index,
        reachable=reachable,
        mig_devices=_mig_devices(uuid, obj.get("mig_devices")),
        **values,
    )


def _mig_devices(card: str, raw: Any) -> tuple[MigDevice, ...]:
    """The card's MIG devices from the document (absent or null: none); ValueError names what is wrong."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ValueError(f"device {card}: mig_devices must be a list or null, got {raw!r}")
    out = []
    for i, item in enumerate(raw):
        uuid = item.get("uuid") if isinstance(item, dict) else None
        if not isinstance(uuid, str) or not uuid:
            raise ValueError(f"device {card}: mig_devices[{i}].uuid must be a non-empty string, got {item!r}")
        ids = [item.get("gpu_instance_id"), item.get("compute_instance_id")]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in ids):
            raise ValueError(f"device {card}: mig_devices[{i}] instance ids must be integers, got {item!r}")
        profile = item.get("profile") or ""
        if not isinstance(profile, str):
            raise ValueError(f"device {card}: mig_devices[{i}].profile must be a string, got {profile!r}")
        out.append(MigDevice(uuid=uuid, gpu_instance_id=ids[0], compute_instance_id=ids[1], profile=profile))
    return tuple(out)


def event_from_json(obj: Any) -> XidEvent:
    if not isinstance(obj, dict):
        raise ValueError(f"xid event is {type(obj).__name__}, not an object")
    uuid, xid, timestamp = obj.get("uuid"), obj.get("xid"), obj.get("timestamp")
    if not isinstance(uuid, str) or not uuid:
        raise ValueError(f"xid event uuid must be a non-empty string, got {uuid!r}")
    if not isinstance(xid, int) or isinstance(xid, bool):
        raise ValueError(f"xid event of {uuid}: xid must be an integer, got {xid!r}")
    if not _number(timestamp):
        raise ValueError(f"xid event of {uuid}: timestamp must be a number, got {timestamp!r}")
    return XidEvent(uuid=uuid, xid=xid, timestamp=float(timestamp))


class RemoteNvmlSource:
    """Reads one simulated node's NVML over HTTP; see the module docstring for failures."""

    def __init__(self, base_url: str, node: str, *, timeout: float = 2.0) -> None:
        self._url = node_route(base_url, node, "nvml", timeout)
        self._node = node
        self._timeout = timeout
        self._lock = threading.Lock()
        self._started = False
        self._since = 0
        self._events: list[XidEvent] = []
        self._fetched_since_drain = False
        self._failing = False
        self._unavailable_logged = False

    def start(self) -> bool:
        with self._lock:
            if self._started:
                return True
            try:
                document = self._fetch(0)
            except RemoteNvmlError as exc:
                if not self._unavailable_logged:
                    self._unavailable_logged = True
                    log.warning("NVML not available: %s; NVML readings disabled", exc)
                return False
            self._since = document[2]  # earlier events are not replayed, as with a real driver
            self._started = True
            log.info("simulated NVML of node %s at %s: %d device(s)", self._node, self._url, len(document[0]))
            return True

    def read(self) -> list[DeviceReading]:
        with self._lock:
            if not self._started:
                return []
            return self._poll()

    def drain_xid_events(self) -> list[XidEvent]:
        with self._lock:
            if not self._started:
                return []
            if not self._fetched_since_drain:
                # Events arrive with readings; poll when nobody read since the last drain.
                self._poll()
            events, self._events = self._events, []
            self._fetched_since_drain = False
            return events

    def close(self) -> None:
        with self._lock:
            self._started = False
            self._events = []

    def _poll(self) -> list[DeviceReading]:
        try:
            devices, events, next_seq = self._fetch(self._since)
        except RemoteNvmlError as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "simulated NVML of node %s unreadable: %s; no readings until it answers", self._node, exc
                )
            return []
        if self._failing:
            self._failing = False
            log.info("simulated NVML of node %s answers again", self._node)
        self._events.extend(events)
        self._since = next_seq
        self._fetched_since_drain = True
        return devices

    def _fetch(self, since: int) -> tuple[list[DeviceReading], list[XidEvent], int]:
        url = f"{self._url}?since={since}"
        request = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise RemoteNvmlError(f"GET {url}: HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, timed out
            raise RemoteNvmlError(f"GET {url}: {getattr(exc, 'reason', exc)}") from exc
        except http.client.HTTPException as exc:  # not HTTP, or the body cut short
            raise RemoteNvmlError(f"GET {url}: broken HTTP answer: {exc!r}") from exc
        try:
            document = json.loads(raw)
        except ValueError as exc:
            raise RemoteNvmlError(f"GET {url}: not JSON: {exc}") from exc
        return self._parse(document, url)

    def _parse(self, document: Any, url: str) -> tuple[list[DeviceReading], list[XidEvent], int]:
        if not isinstance(document, dict):
            raise RemoteNvmlError(f"GET {url}: expected an object, got {type(document).__name__}")
        if document.get("node") != self._node:
            raise RemoteNvmlError(
                f"GET {url}: answered for node {document.get('node')!r}, not {self._node!r}"
            )
        raw_devices, raw_events, next_seq = (document.get(k) for k in ("devices", "xid_events", "next_seq"))
        if not isinstance(raw_devices, list) or not isinstance(raw_events, list):
            raise RemoteNvmlError(f"GET {url}: devices and xid_events must be lists")
        if not isinstance(next_seq, int) or isinstance(next_seq, bool) or next_seq < 0:
            raise RemoteNvmlError(f"GET {url}: next_seq must be a non-negative integer, got {next_seq!r}")
        devices: list[DeviceReading] = []
        for obj in raw_devices:
            try:
                devices.append(reading_from_json(obj))
            except ValueError as exc:  # one malformed device is skipped, not the node
                log.warning("simulated NVML of node %s: %s; device skipped", self._node, exc)
        events: list[XidEvent] = []
        for obj in raw_events:
            try:
                events.append(event_from_json(obj))
            except ValueError as exc:
                log.warning("simulated NVML of node %s: %s; event skipped", self._node, exc)
        return devices, events, next_seq
