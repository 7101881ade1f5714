"""Alertmanager webhook deliveries (payload version 4) as plain, validated data.

Pure: no I/O. `parse_delivery` takes the decoded JSON body and returns a `Delivery`, or
raises `PayloadError` (a `PermanentError`: the webhook answers 400 and Alertmanager does
not retry) naming the field that is wrong, e.g. `alerts[2].labels.node: ...`.

What the responder relies on, and why:
- Each alert's own `labels` decide, never `commonLabels`/`groupLabels`: a group may mix
  devices, and the common labels of a one-alert group look like an alert's own.
- `status` says firing or resolved; `endsAt` does not (a firing alert carries a future
  `endsAt`, and Alertmanager's zero time is year 1).
- Unknown fields are ignored: Alertmanager adds fields between releases.
- `truncatedAlerts > 0` means Alertmanager dropped alerts from this delivery (`max_alerts`);
  it is carried so the webhook can count and log it.
- An alert is identified for idempotency by (fingerprint, startsAt, status) and acted on by
  its domain key (node, device, action): a replay, an HA peer's duplicate or a resolved that
  overtakes its firing then changes nothing twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.kube.meta import strict_rfc3339
from gpuhealth.outcomes import PermanentError

PAYLOAD_VERSION = "4"
FIRING = "firing"
RESOLVED = "resolved"

QUARANTINE = "quarantine"
"""A confirmed failure: quarantine the device and migrate checkpointed work off it."""
RESTRICT = "restrict"
"""Unknown past the tolerance, or flapping into Unknown: keep new work off the device, never evict."""
NONE = "none"
"""Information for people only."""
ACTIONS = (QUARANTINE, RESTRICT, NONE)

MAX_LABEL_VALUE = 1024
"""Longer label values are refused: they would become object names and annotations."""


class PayloadError(PermanentError):
    """The delivery is not a valid Alertmanager webhook payload; the message names the field."""


@dataclass(frozen=True, slots=True)
class DeviceKey:
    """Which device an alert is about: the unit of every gpuhealth action (never a node)."""

    node: str
    device: str


@dataclass(frozen=True, slots=True)
class Alert:
    status: str
    """`firing` or `resolved`."""
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    starts_at: float
    """Seconds since the epoch at which this firing episode began (the same in its resolved)."""
    ends_at: float | None
    """When Alertmanager considers it over; None for the zero time. Not a firing/resolved signal."""
    fingerprint: str
    generator_url: str = ""

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def action(self) -> str:
        """The `action` label; alerts without one are for people (`none`)."""
        return self.labels.get("action", NONE)

    @property
    def device_key(self) -> DeviceKey | None:
        node, device = self.labels.get("node", ""), self.labels.get("device", "")
        return DeviceKey(node, device) if node and device else None

    @property
    def idempotency_key(self) -> str:
        """(fingerprint, startsAt, status): the same key for every re-delivery of this state."""
        return f"{self.fingerprint}/{self.starts_at:.3f}/{self.status}"


@dataclass(frozen=True, slots=True)
class Delivery:
    receiver: str
    status: str
    group_key: str
    truncated_alerts: int
    alerts: tuple[Alert, ...]
    """The alerts that parsed, in delivery order."""
    rejected: tuple[str, ...] = ()
    """One message per alert that did not parse (`alerts[i].field: why`): one bad alert never
    costs the others, which are still recorded."""


def parse_delivery(body: Any) -> Delivery:
    """The delivery in `body` (decoded JSON), validated.

    A malformed envelope raises PayloadError; a malformed alert lands in `rejected`.
    """
    if not isinstance(body, dict):
        raise PayloadError(f"the body must be a JSON object, not {_kind(body)}")
    version = body.get("version")
    if version != PAYLOAD_VERSION:
        raise PayloadError(
            f"version: expected {PAYLOAD_VERSION!r} (Alertmanager webhook payload), got {version!r}"
        )
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError(f"alerts: expected a list, got {_kind(alerts)}")
    truncated = body.get("truncatedAlerts", 0)
    if isinstance(truncated, bool) or not isinstance(truncated, int) or truncated < 0:
        raise PayloadError(f"truncatedAlerts: expected a whole number >= 0, got {truncated!r}")
    parsed: list[Alert] = []
    rejected: list[str] = []
    for i, alert in enumerate(alerts):
        try:
            parsed.append(parse_alert(alert, f"alerts[{i}]"))
        except PayloadError as exc:
            rejected.append(str(exc))
    return Delivery(
        receiver=_optional_str(body, "receiver", "receiver"),
        status=_status(body.get("status"), "status"),
        group_key=_optional_str(body, "groupKey", "groupKey"),
        truncated_alerts=truncated,
        alerts=tuple(parsed),
        rejected=tuple(rejected),
    )


def parse_alert(data: Any, path: str = "alert") -> Alert:
    if not isinstance(data, dict):
        raise PayloadError(f"{path}: expected an object, got {_kind(data)}")
    labels = _string_map(data.get("labels"), f"{path}.labels", required=True)
    action = labels.get("action", NONE)
    if action not in ACTIONS:
        raise PayloadError(f"{path}.labels.action: expected one of {', '.join(ACTIONS)}, got {action!r}")
    if action != NONE:
        for name in ("node", "device"):
            if not labels.get(name):
                raise PayloadError(f"{path}.labels.{name}: required when action is {action}")
    starts_at = _time(data.get("startsAt"), f"{path}.startsAt")
    if starts_at is None:
        raise PayloadError(f"{path}.startsAt: required")
    fingerprint = data.get("fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise PayloadError(f"{path}.fingerprint: expected a non-empty string, got {fingerprint!r}")
    return Alert(
        status=_status(data.get("status"), f"{path}.status"),
        labels=labels,
        annotations=_string_map(data.get("annotations"), f"{path}.annotations", required=False),
        starts_at=starts_at,
        ends_at=_time(data.get("endsAt"), f"{path}.endsAt"),
        fingerprint=fingerprint,
        generator_url=_optional_str(data, "generatorURL", f"{path}.generatorURL"),
    )


def _status(value: Any, path: str) -> str:
    if value not in (FIRING, RESOLVED):
        raise PayloadError(f"{path}: expected {FIRING!r} or {RESOLVED!r}, got {value!r}")
    return str(value)


def _string_map(value: Any, path: str, *, required: bool) -> dict[str, str]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise PayloadError(f"{path}: expected an object of strings, got {_kind(value)}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise PayloadError(f"{path}.{key}: expected a string, got {_kind(item)}")
        if len(item) > MAX_LABEL_VALUE:
            raise PayloadError(f"{path}.{key}: longer than {MAX_LABEL_VALUE} characters")
    return dict(value)


def _optional_str(data: dict[str, Any], key: str, path: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise PayloadError(f"{path}: expected a string, got {_kind(value)}")
    return value


def _time(value: Any, path: str) -> float | None:
    """RFC 3339 as epoch seconds; None for absent or Alertmanager's zero time (year 1)."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise PayloadError(f"{path}: expected an RFC 3339 time, got {_kind(value)}")
    try:
        parsed = strict_rfc3339(value)
    except ValueError as exc:  # `'<value>' is not an RFC 3339 time` or `... has no time zone`
        raise PayloadError(f"{path}: {exc}") from None
    if parsed.year <= 1:
        return None
    return parsed.timestamp()


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )
