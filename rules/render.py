"""Settings for the rules, their validation, and rendering them through the jinja2 templates.

Owns: the settings tree (frozen dataclasses whose keys, defaults and documentation are the
shipped `config.yaml`'s: `Section`), turning a parsed YAML mapping over those defaults into
settings with clear errors that name the offending key, and the pure function
`render(settings) -> {relative path: text}`. Reading and writing files is kept to
`load_config`, `shipped_config`, `write_files` and `compare_files`.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpuhealth.durations import DurationError, whole_seconds
from gpuhealth.ladder import KNOWN, LADDER, Kind, Rung

PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_CONFIG = PACKAGE_DIR / "config.yaml"
TEMPLATES_DIR = PACKAGE_DIR / "templates"

# Template name -> output path relative to the output directory.
OUTPUTS: dict[str, str] = {
    "gpu-device.yaml.j2": "prometheus/gpu-device.yaml",
    "gpu-node.yaml.j2": "prometheus/gpu-node.yaml",
    "gpu-fleet.yaml.j2": "prometheus/gpu-fleet.yaml",
    "gpuhealth-self.yaml.j2": "prometheus/gpuhealth-self.yaml",
    "gpu-dcgm.yaml.j2": "prometheus/gpu-dcgm.yaml",
    "gpu-workload.yaml.j2": "prometheus/gpu-workload.yaml",
    "alertmanager.yaml.j2": "alertmanager/alertmanager.yaml",
}

# NVIDIA marks these as application errors: the GPU is still healthy, and the NVIDIA device
# plugin skips them. Quarantining on them would let one tenant's bug take away capacity.
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})


class ConfigError(ValueError):
    """A configuration value is missing, malformed or inconsistent; the message names the key."""


_JOB_RE = re.compile(r"^[A-Za-z0-9_.:-]+$")
_METRIC_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_MATCHER = r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS_RE = re.compile(rf"^(?:{_MATCHER}(?:,{_MATCHER})*)?$")
_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, order=True)
class Duration:
    """A whole number of seconds, written in Prometheus syntax when rendered."""

    seconds: int

    @classmethod
    def parse(cls, text: object, key: str) -> Duration:
        try:
            return cls(whole_seconds(text))
        except DurationError as exc:
            raise ConfigError(f"{key}: {exc}") from exc

    def times(self, factor: int) -> Duration:
        """This duration `factor` times over (templates derive one window from another)."""
        return Duration(self.seconds * factor)

    def __str__(self) -> str:
        if self.seconds == 0:
            return "0s"
        hours, rest = divmod(self.seconds, 3600)
        minutes, seconds = divmod(rest, 60)
        parts = [f"{v}{unit}" for v, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if v]
        return "".join(parts)


@dataclass(frozen=True)
class Section:
    """One mapping of `config.yaml`: its typed fields, and the keys of the shipped file it declares
    beyond them (`extra`).

    The shipped `config.yaml` is the declaration of every key: its value is the default, its
    comment the documentation, and for a key that is no field here its value's form the type (a
    duration such as 5m, a whole number, a number, true/false, a string, a list of those). Fields
    are declared, without defaults, for the keys this module's own code reads (validation, the
    ladder's rows); a threshold only a template reads needs none: `[[ cfg.self.<key> ]]` reaches it
    through `__getitem__` (jinja2 tries an item when no attribute has the name).
    """

    extra: Mapping[str, Any] = field(default_factory=dict, kw_only=True, repr=False, hash=False)

    def __getitem__(self, name: str) -> Any:
        if name in self.extra:
            return self.extra[name]
        if name in {f.name for f in dataclasses.fields(self)} - {"extra"}:
            return getattr(self, name)
        raise KeyError(name)


@dataclass(frozen=True)
class Selectors(Section):
    exporter_job: str
    responder_job: str
    cluster_label: str


@dataclass(frozen=True)
class DeviceSettings(Section):
    heartbeat_limit: Duration
    unhealthy_for: Duration
    unknown_for: Duration
    unknown_tolerance: Duration
    unknown_tolerance_factor: float
    unknown_tolerance_floor: Duration
    unknown_tolerance_cap: Duration
    unknown_repeat_window: Duration
    unknown_restriction: Duration
    unknown_restriction_factor: float
    unknown_restriction_cap: Duration
    flapping_episodes: int
    flapping_window: Duration
    unhealthy_flapping_episodes: int
    unhealthy_flapping_window: Duration
    event_window: Duration
    fatal_xids: tuple[int, ...]
    ecc_uncorrectable_min_increase: int


@dataclass(frozen=True)
class NodeSettings(Section):
    lease_age_limit: Duration
    unreachable_for: Duration
    devices_seen_within: Duration


@dataclass(frozen=True)
class FleetSettings(Section):
    unknown_storm_fraction: float
    unknown_storm_min_devices: int
    unknown_storm_for: Duration


@dataclass(frozen=True)
class SelfSettings(Section):
    down_for: Duration
    webhook_failure_ratio: float
    webhook_failing_for: Duration
    quarantine_max_age: Duration
    migration_window: Duration
    probing_stuck_for: Duration
    canary_stuck_for: Duration
    resetting_stuck_for: Duration
    pending_stuck_for: Duration
    deferred_stuck_for: Duration
    reconcile_stalled_for: Duration
    no_leader_for: Duration
    health_source_down_for: Duration
    hold_missing_for: Duration
    webhook_retry_ratio: float
    webhook_retrying_for: Duration
    extender_expected: bool
    extender_silent_for: Duration


@dataclass(frozen=True)
class WorkloadSettings(Section):
    """The business SLO: the workloads' own request counters, read beside device health."""

    requests_metric: str
    errors_metric: str
    matchers: str
    namespace_label: str
    pod_label: str


@dataclass(frozen=True)
class LayerSettings(Section):
    """A GPU workload's four layers side by side: allocation success and device health (the
    platform's), container readiness and the business SLO (the tenant's). docs/layers.md."""

    kube_state_metrics_matchers: str
    gpu_resources: tuple[str, ...]
    unallocated_for: Duration
    not_ready_for: Duration
    error_ratio: float
    error_ratio_for: Duration


DCGM_HEALTH_WATCHES: frozenset[str] = frozenset(
    {"PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER", "DRIVER",
     "NVSWITCH_NONFATAL", "NVSWITCH_FATAL", "CONNECTX", "ALL"}
)  # fmt: skip
"""The `health_watch` values dcgm-exporter writes on DCGM_EXP_GPU_HEALTH_STATUS (its names of DCGM's
health systems)."""


@dataclass(frozen=True)
class DcgmSettings(Section):
    """dcgm-exporter as a signal source: its series joined to gpuhealth's devices by UUID and node."""

    matchers: str
    health_watches: tuple[str, ...]
    health_fail_value: int
    health_failed_for: Duration


@dataclass(frozen=True)
class Tenant:
    namespace: str
    """Kubernetes namespace of the tenant; alerts with this `namespace` label reach `url`."""
    url: str
    """Webhook of the tenant's receiver."""

    @property
    def receiver(self) -> str:
        return f"tenant-{self.namespace}"


@dataclass(frozen=True)
class AlertmanagerSettings(Section):
    responder_url: str
    responder_credentials_file: str
    responder_group_wait: Duration
    responder_group_interval: Duration
    responder_repeat_interval: Duration
    oncall_page_url: str
    oncall_ticket_url: str
    group_wait: Duration
    group_interval: Duration
    repeat_interval: Duration
    tenant_default_url: str
    tenants: tuple[Tenant, ...]


@dataclass(frozen=True)
class Settings(Section):
    selectors: Selectors
    evaluation_interval: Duration
    device: DeviceSettings
    node: NodeSettings
    fleet: FleetSettings
    self: SelfSettings
    workloads: WorkloadSettings
    dcgm: DcgmSettings
    runbook_base_url: str
    alertmanager: AlertmanagerSettings
    layers: LayerSettings

    def runbook_url(self, alertname: str) -> str:
        return f"{self.runbook_base_url}#{runbook_anchor(alertname)}"


def runbook_anchor(alertname: str) -> str:
    """The anchor GitHub gives the heading `## <alertname>` in docs/runbooks.md."""
    return alertname.lower()


# ---------------------------------------------------------------------------------------
# Parsing: a mapping from YAML into settings, every error naming its key.


def _convert(value: Any, hint: Any, key: str) -> Any:
    if hint is Duration:
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ConfigError(f"{key}: expected a duration such as 30s or 5m, got {value!r}")
        # A bare 0 is the only number that is unambiguous as a duration.
        if value == 0:
            return Duration(0)
        return Duration.parse(value, key)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected a whole number, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
        return value
    origin = typing.get_origin(hint)
    if origin is tuple:
        (item_hint, _ellipsis) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_convert(item, item_hint, f"{key}[{i}]") for i, item in enumerate(value))
    if dataclasses.is_dataclass(hint):
        required = dict.fromkeys((f.name for f in dataclasses.fields(hint)), _REQUIRED)
        return _parse_section(value, hint, key, required)
    raise TypeError(f"no converter for {hint!r} at {key}")  # a programming error, not bad input


def _parse_section(data: Any, cls: Any, key: str, shipped: Mapping[str, Any]) -> Any:
    """`cls` from `data`, every key of which the shipped file declares (`shipped`, the same
    section of it); keys `data` leaves out take the shipped values."""
    where = f"{key}: " if key else ""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where or 'config: '}expected a mapping, got {data!r}")
    unknown = sorted(str(k) for k in data if k not in shipped)
    if unknown:
        known = ", ".join(sorted(str(k) for k in shipped))
        raise ConfigError(f"{where}unknown key(s) {', '.join(unknown)}; known: {known}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name in fields - set(shipped):
        # A field the shipped file does not declare: a programming error, found at the first load.
        raise ConfigError(f"{key + '.' if key else ''}{name}: required (declare it in {DEFAULT_CONFIG.name})")
    for name, default in shipped.items():
        name = str(name)
        child = f"{key + '.' if key else ''}{name}"
        value = data.get(name, default)
        if value is _REQUIRED:
            raise ConfigError(f"{child}: required")
        if name in fields:
            hint = hints[name]
            values[name] = (
                _parse_section(value, hint, child, default)
                if isinstance(hint, type) and issubclass(hint, Section)
                else _convert(value, hint, child)
            )
        else:
            extra[name] = _convert_like(value, default, child)
    return cls(**values, extra=extra) if issubclass(cls, Section) else cls(**values)


_REQUIRED: Any = object()
"""The shipped value of a key every item of a list must give (a tenant's namespace and url)."""
_DURATION_RE = re.compile(r"^(?:[0-9]+(?:ms|s|m|h|d|w|y))+$")


def _convert_like(value: Any, default: Any, key: str) -> Any:
    """`value` of a key no field declares, read as the shipped `default`'s kind: a duration such
    as 5m, a whole number, a number, true/false, a string, a list, or a mapping of those."""
    if isinstance(default, Mapping):
        return _parse_section(value, Section, key, default)
    if isinstance(default, list):
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        if not default:
            raise ConfigError(f"{key}: the shipped list is empty, so its items' kind is unknown")
        return tuple(_convert_like(item, default[0], f"{key}[{i}]") for i, item in enumerate(value))
    hint: Any
    if isinstance(default, bool):
        hint = bool
    elif isinstance(default, int):
        hint = int
    elif isinstance(default, float):
        hint = float
    elif isinstance(default, str):
        hint = Duration if _DURATION_RE.match(default) else str
    else:
        raise ConfigError(f"{key}: the shipped value {default!r} is of no kind a key may have")
    return _convert(value, hint, key)


def _check_url(url: str, key: str) -> None:
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"{key}: {url!r} is not an http(s) URL")


def validate(settings: Settings) -> None:
    """Reject values that would render rules which are wrong, unsafe or contradictory."""
    for name in ("exporter_job", "responder_job"):
        value = getattr(settings.selectors, name)
        if not _JOB_RE.match(value):
            raise ConfigError(f"selectors.{name}: {value!r} may only hold letters, digits and _ . : -")
    # A label name is also a Go template field name: annotations read `$labels.<name>`. A
    # reserved (__) name never survives to an external label.
    if not _LABEL_RE.match(settings.selectors.cluster_label) or settings.selectors.cluster_label.startswith(
        "__"
    ):
        raise ConfigError(
            f"selectors.cluster_label: {settings.selectors.cluster_label!r} is not a Prometheus label name"
        )

    if settings.evaluation_interval.seconds <= 0:
        raise ConfigError("evaluation_interval: must be longer than 0s")
    _validate_workloads(settings.workloads)
    _validate_dcgm(settings.dcgm)
    _validate_layers(settings.layers)

    dev = settings.device
    for name in (
        "heartbeat_limit",
        "unhealthy_for",
        "unknown_for",
        "unknown_tolerance",
        "unknown_tolerance_floor",
        "unknown_repeat_window",
        "unknown_restriction",
        "event_window",
    ):
        if getattr(dev, name).seconds <= 0:
            raise ConfigError(f"device.{name}: must be longer than 0s")
    _validate_unknown_window(dev)
    if dev.flapping_episodes < 2:
        raise ConfigError(
            f"device.flapping_episodes: {dev.flapping_episodes} is below 2; one episode is no flap"
        )
    if dev.flapping_window <= dev.unknown_tolerance:
        raise ConfigError(
            f"device.flapping_window ({dev.flapping_window}) must be longer than device.unknown_tolerance "
            f"({dev.unknown_tolerance}), or no flapping could be told apart from an expiry"
        )
    _validate_unhealthy_flapping(dev, settings.evaluation_interval)
    if not dev.fatal_xids:
        raise ConfigError("device.fatal_xids: empty; list at least one XID (NVIDIA's catalog: 48, 79, ...)")
    seen: set[int] = set()
    for i, xid in enumerate(dev.fatal_xids):
        if xid in APPLICATION_XIDS:
            raise ConfigError(
                f"device.fatal_xids[{i}]: XID {xid} is an application error (NVIDIA: "
                f"{', '.join(map(str, sorted(APPLICATION_XIDS)))}); the GPU stays healthy and must "
                "never be quarantined for it"
            )
        if not 0 < xid < 1000:
            raise ConfigError(f"device.fatal_xids[{i}]: {xid} is not an XID number")
        if xid in seen:
            raise ConfigError(f"device.fatal_xids[{i}]: XID {xid} is listed twice")
        seen.add(xid)
    if dev.ecc_uncorrectable_min_increase < 1:
        raise ConfigError("device.ecc_uncorrectable_min_increase: must be at least 1")

    node = settings.node
    if node.lease_age_limit.seconds <= 0:
        raise ConfigError("node.lease_age_limit: must be longer than 0s")
    # A dead node's device reports age with its Lease; the first device alert that can follow
    # is GPUDeviceStatusStale, right at the heartbeat limit. The node alert must come first.
    node_alert = node.lease_age_limit.seconds + node.unreachable_for.seconds
    if node_alert >= dev.heartbeat_limit.seconds:
        raise ConfigError(
            f"node.lease_age_limit + node.unreachable_for ({Duration(node_alert)}) must be shorter than "
            f"device.heartbeat_limit ({dev.heartbeat_limit}): GPUNodeUnreachable has to fire before a "
            "dead node's device reports go stale, or its inhibition comes too late"
        )
    if node.devices_seen_within <= settings.evaluation_interval:
        raise ConfigError("node.devices_seen_within: must be longer than evaluation_interval")

    fleet = settings.fleet
    if not 0 < fleet.unknown_storm_fraction < 1:
        raise ConfigError(
            f"fleet.unknown_storm_fraction: {fleet.unknown_storm_fraction} is not between 0 and 1"
        )
    if fleet.unknown_storm_min_devices < 1:
        raise ConfigError("fleet.unknown_storm_min_devices: must be at least 1")
    if fleet.unknown_storm_for >= dev.unknown_tolerance_floor:
        raise ConfigError(
            f"fleet.unknown_storm_for ({fleet.unknown_storm_for}) must be shorter than "
            f"device.unknown_tolerance_floor ({dev.unknown_tolerance_floor}): the storm has to inhibit "
            "restrict actions before the first device's tolerance window ends, and a repeated Unknown's "
            "window may be as short as the floor"
        )

    own = settings.self
    if not 0 <= own.webhook_failure_ratio < 1:
        raise ConfigError(f"self.webhook_failure_ratio: {own.webhook_failure_ratio} is not in [0, 1)")
    if not 0 <= own.webhook_retry_ratio < 1:
        raise ConfigError(f"self.webhook_retry_ratio: {own.webhook_retry_ratio} is not in [0, 1)")
    for name in (
        "quarantine_max_age",
        "migration_window",
        "probing_stuck_for",
        "canary_stuck_for",
        "resetting_stuck_for",
        "pending_stuck_for",
        "deferred_stuck_for",
        "no_leader_for",
        "health_source_down_for",
        "hold_missing_for",
        "extender_silent_for",
    ):
        if getattr(own, name).seconds <= 0:
            raise ConfigError(f"self.{name}: must be longer than 0s")
    # increase() over a window needs two scrapes in it, and a window no longer than one
    # evaluation would read a leader between two scrapes as stalled.
    if own.reconcile_stalled_for <= settings.evaluation_interval:
        raise ConfigError(
            f"self.reconcile_stalled_for ({own.reconcile_stalled_for}) must be longer than "
            f"evaluation_interval ({settings.evaluation_interval})"
        )
    # A phase that ends the whole quarantine sooner than it can be stuck is no stuck phase.
    stuck = {f"{s.phase.lower()}_stuck_for": s.after for s in stuck_phases(own)}
    stuck.update(pending_stuck_for=own.pending_stuck_for, deferred_stuck_for=own.deferred_stuck_for)
    for name, after in stuck.items():
        if after >= own.quarantine_max_age:
            raise ConfigError(
                f"self.{name} ({after}) must be shorter than self.quarantine_max_age "
                f"({own.quarantine_max_age}): GPUDeviceQuarantineStuck would always come first"
            )

    _check_url(settings.runbook_base_url, "runbook_base_url")
    if "#" in settings.runbook_base_url:
        raise ConfigError("runbook_base_url: must not hold an anchor; the alert name is appended as one")
    am = settings.alertmanager
    for name in ("responder_url", "oncall_page_url", "oncall_ticket_url", "tenant_default_url"):
        _check_url(getattr(am, name), f"alertmanager.{name}")
    if not am.responder_credentials_file.startswith("/"):
        raise ConfigError("alertmanager.responder_credentials_file: must be an absolute path")
    namespaces: set[str] = set()
    for i, tenant in enumerate(am.tenants):
        if not _DNS_LABEL_RE.match(tenant.namespace):
            raise ConfigError(
                f"alertmanager.tenants[{i}].namespace: {tenant.namespace!r} is not a namespace name"
            )
        if tenant.namespace in namespaces:
            raise ConfigError(f"alertmanager.tenants[{i}].namespace: {tenant.namespace!r} is listed twice")
        namespaces.add(tenant.namespace)
        _check_url(tenant.url, f"alertmanager.tenants[{i}].url")


def _validate_unknown_window(dev: DeviceSettings) -> None:
    """The Unknown tolerance window's schedule: the warning inside the shortest window, the base
    between floor and cap, a repeat window that can hold an earlier episode, and a restriction that
    never shortens with repeats."""
    if not 0 < dev.unknown_tolerance_factor < math.inf:
        raise ConfigError(
            f"device.unknown_tolerance_factor: {dev.unknown_tolerance_factor} must be above 0 (below 1 "
            "shortens the window per repeat, above 1 lengthens it)"
        )
    if dev.unknown_tolerance_floor > dev.unknown_tolerance:
        raise ConfigError(
            f"device.unknown_tolerance_floor ({dev.unknown_tolerance_floor}) must not be longer than "
            f"device.unknown_tolerance ({dev.unknown_tolerance}): a first episode's window is within the "
            "floor and the cap"
        )
    if dev.unknown_tolerance_factor > 1 and dev.unknown_tolerance_cap < dev.unknown_tolerance:
        raise ConfigError(
            f"device.unknown_tolerance_cap ({dev.unknown_tolerance_cap}) must not be shorter than "
            f"device.unknown_tolerance ({dev.unknown_tolerance}) where the factor is above 1: a first "
            "episode's window is within the floor and the cap"
        )
    if dev.unknown_for >= dev.unknown_tolerance_floor:
        raise ConfigError(
            f"device.unknown_for ({dev.unknown_for}) must be shorter than device.unknown_tolerance_floor "
            f"({dev.unknown_tolerance_floor}): the warning belongs inside every tolerance window, the "
            "shortest included"
        )
    if dev.unknown_repeat_window <= dev.unknown_tolerance:
        raise ConfigError(
            f"device.unknown_repeat_window ({dev.unknown_repeat_window}) must be longer than "
            f"device.unknown_tolerance ({dev.unknown_tolerance}), or an earlier episode could never "
            "change a later one's window"
        )
    if not 1 <= dev.unknown_restriction_factor < math.inf:
        raise ConfigError(
            f"device.unknown_restriction_factor: {dev.unknown_restriction_factor} must be at least 1: "
            "a repeated Unknown's restriction lasts longer, never shorter"
        )
    if dev.unknown_restriction_cap < dev.unknown_restriction:
        raise ConfigError(
            f"device.unknown_restriction_cap ({dev.unknown_restriction_cap}) must not be shorter than "
            f"device.unknown_restriction ({dev.unknown_restriction})"
        )


def _promql_round(value: float) -> int:
    """PromQL's round(): to the nearest whole number, halves up."""
    return math.floor(value + 0.5)


def _power(factor: float, repeats: int) -> float:
    if repeats < 0:
        raise ValueError(f"repeats: {repeats} is negative")
    # A count past a few hundred saturates at the floor or the cap either way (and 0.5 ** 2000
    # underflows to 0, 2.0 ** 2000 overflows): stop where the clamp has long taken over.
    return float(factor ** min(repeats, 256))


def unknown_window(dev: DeviceSettings, repeats: int) -> float:
    """Seconds of the tolerance window of an Unknown episode with `repeats` earlier episodes of the
    device still seen within unknown_repeat_window before it: what
    node_device:gpu_device_unknown_tolerance:seconds records (unknown_tolerance x factor ^ repeats,
    rounded, between the floor and the cap)."""
    base = dev.unknown_tolerance.seconds * _power(dev.unknown_tolerance_factor, repeats)
    low, high = dev.unknown_tolerance_floor.seconds, unknown_tolerance_cap(dev).seconds
    return float(min(max(_promql_round(min(base, 1e15)), low), high))


def unknown_tolerance_cap(dev: DeviceSettings) -> Duration:
    """The longest tolerance window: unknown_tolerance_cap where repeats lengthen the window
    (a factor above 1), else unknown_tolerance itself (repeats only shorten it, and a site that
    raised unknown_tolerance alone keeps a valid config)."""
    return dev.unknown_tolerance_cap if dev.unknown_tolerance_factor > 1 else dev.unknown_tolerance


def unknown_restriction(dev: DeviceSettings, repeats: int) -> float:
    """Seconds the restriction of such an episode lasts at least, from its start: what
    node_device:gpu_device_unknown_restriction:seconds records and GPUDeviceUnknownExpired carries
    (annotation restrict_for): unknown_restriction x its factor ^ repeats, rounded, up to its cap."""
    base = dev.unknown_restriction.seconds * _power(dev.unknown_restriction_factor, repeats)
    return float(min(_promql_round(min(base, 1e15)), dev.unknown_restriction_cap.seconds))


@dataclass(frozen=True)
class ScheduleRow:
    """One repeat of an Unknown episode: its tolerance window and the restriction after it."""

    repeats: int
    window: Duration
    restriction: Duration


def unknown_schedule(dev: DeviceSettings, rows: int = 6) -> list[ScheduleRow]:
    """The first `rows` repeats' windows and restrictions (the table of docs/runbooks.md)."""
    return [
        ScheduleRow(n, Duration(int(unknown_window(dev, n))), Duration(int(unknown_restriction(dev, n))))
        for n in range(rows)
    ]


def unknown_schedule_table(dev: DeviceSettings, rows: int = 6) -> str:
    """`unknown_schedule` as the Markdown table the docs print (a test holds them equal)."""
    lines = [
        "| Repeat (earlier episodes within " + str(dev.unknown_repeat_window) + ") | Tolerance window "
        "| Restriction lasts at least |",
        "|---|---|---|",
    ]
    for row in unknown_schedule(dev, rows):
        label = f"{row.repeats} (first episode)" if row.repeats == 0 else str(row.repeats)
        lines.append(f"| {label} | {row.window} | {row.restriction} |")
    return "\n".join(lines) + "\n"


def _validate_workloads(w: WorkloadSettings) -> None:
    for name in ("requests_metric", "errors_metric"):
        value = getattr(w, name)
        if not _METRIC_RE.match(value):
            raise ConfigError(f"workloads.{name}: {value!r} is not a Prometheus metric name")
    if w.requests_metric == w.errors_metric:
        raise ConfigError(
            f"workloads.errors_metric: the same series as workloads.requests_metric ({w.requests_metric!r}); "
            "the error ratio would always be 1"
        )
    for name in ("namespace_label", "pod_label"):
        value = getattr(w, name)
        if not _LABEL_RE.match(value) or value.startswith("__"):
            raise ConfigError(f"workloads.{name}: {value!r} is not a Prometheus label name")
    if w.namespace_label == w.pod_label:
        raise ConfigError(
            f"workloads.pod_label: the same label as workloads.namespace_label ({w.pod_label!r})"
        )
    if not _MATCHERS_RE.match(w.matchers):
        raise ConfigError(
            f"workloads.matchers: {w.matchers!r} is not a comma-separated list of label matchers "
            'such as job="inference", namespace=~"prod-.*"'
        )


def _validate_layers(layers: LayerSettings) -> None:
    if (
        not _MATCHERS_RE.match(layers.kube_state_metrics_matchers)
        or not layers.kube_state_metrics_matchers.strip()
    ):
        raise ConfigError(
            f"layers.kube_state_metrics_matchers: {layers.kube_state_metrics_matchers!r} is not a "
            'comma-separated list of label matchers such as job="kube-state-metrics"'
        )
    if not layers.gpu_resources:
        raise ConfigError("layers.gpu_resources: empty; list at least one (nvidia_com_gpu)")
    for i, resource in enumerate(layers.gpu_resources):
        if not _LABEL_RE.match(resource):
            raise ConfigError(
                f"layers.gpu_resources[{i}]: {resource!r} is not as kube-state-metrics writes a resource "
                "(nvidia.com/gpu is nvidia_com_gpu)"
            )
    for name in ("unallocated_for", "not_ready_for", "error_ratio_for"):
        if getattr(layers, name).seconds <= 0:
            raise ConfigError(f"layers.{name}: must be longer than 0s")
    if not 0 < layers.error_ratio < 1:
        raise ConfigError(f"layers.error_ratio: {layers.error_ratio} is not between 0 and 1")


def _validate_dcgm(d: DcgmSettings) -> None:
    if not _MATCHERS_RE.match(d.matchers) or not d.matchers.strip():
        raise ConfigError(
            f"dcgm.matchers: {d.matchers!r} is not a comma-separated list of label matchers "
            'such as job="dcgm-exporter"'
        )
    seen: set[str] = set()
    for i, watch in enumerate(d.health_watches):
        if watch not in DCGM_HEALTH_WATCHES:
            raise ConfigError(
                f"dcgm.health_watches[{i}]: {watch!r} is not a health watch dcgm-exporter reports; "
                f"known: {', '.join(sorted(DCGM_HEALTH_WATCHES))}"
            )
        if watch in seen:
            raise ConfigError(f"dcgm.health_watches[{i}]: {watch!r} is listed twice")
        seen.add(watch)
    if d.health_fail_value <= 0:
        raise ConfigError(
            f"dcgm.health_fail_value: {d.health_fail_value} must be above 0 (PASS): every passing "
            "watch would quarantine its card"
        )
    if d.health_failed_for.seconds <= 0:
        raise ConfigError("dcgm.health_failed_for: must be longer than 0s")


def _validate_unhealthy_flapping(dev: DeviceSettings, evaluation_interval: Duration) -> None:
    """GPUDeviceUnhealthyFlapping's thresholds against what the rules can see.

    Episodes are read from the Unhealthy state recorded at each evaluation, so two episodes are
    two evaluations that saw Unhealthy with at least one between them that did not. Episodes
    longer than unhealthy_for are GPUDeviceUnhealthy's (the alert leaves such devices to it), so
    the counted ones need not fit the window end to end: only their starts must.
    """
    episodes = dev.unhealthy_flapping_episodes
    if episodes < 2:
        raise ConfigError(
            f"device.unhealthy_flapping_episodes: {episodes} is below 2; one short Unhealthy is a "
            "transient, and a long one is GPUDeviceUnhealthy's"
        )
    # N episodes parted by a Healthy evaluation start at least 2 evaluations apart; the window
    # is open at its start (Prometheus 3), so it must be longer than the span of their starts.
    tightest = Duration(2 * (episodes - 1) * evaluation_interval.seconds)
    if dev.unhealthy_flapping_window <= tightest:
        raise ConfigError(
            f"device.unhealthy_flapping_window ({dev.unhealthy_flapping_window}) must be longer than "
            f"{tightest}: {episodes} Unhealthy episodes, each parted from the next by a Healthy "
            f"evaluation every {evaluation_interval}, cannot start closer together, so "
            "GPUDeviceUnhealthyFlapping could never fire"
        )


def parse_config(data: Any) -> Settings:
    """Settings from a parsed YAML document over the shipped `config.yaml`: keys it leaves out
    take the shipped values, keys the shipped file does not declare are refused."""
    settings: Settings = _parse_section({} if data is None else data, Settings, "", shipped_config())
    validate(settings)
    return settings


_shipped: dict[str, Any] = {}


def shipped_config() -> Mapping[str, Any]:
    """The shipped `config.yaml`, parsed (once): every key, its default and, in its value's form,
    the kind of a key no field declares."""
    if not _shipped:
        try:
            data = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:  # pragma: no cover - the package is broken
            raise ConfigError(f"{DEFAULT_CONFIG}: cannot read the shipped config: {exc}") from exc
        if not isinstance(data, dict):  # pragma: no cover
            raise ConfigError(f"{DEFAULT_CONFIG}: expected a mapping")
        _shipped.update(data)
    return _shipped


def load_config(path: Path) -> Settings:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


# ---------------------------------------------------------------------------------------
# Rendering.


@dataclass(frozen=True)
class StuckPhase:
    """One row of GPUHealthQuarantinePhaseStuck for a rung that ends by its timeout."""

    phase: str
    after: Duration
    why: str


_MOVES_ON = {Kind.CHECK: "the Job", Kind.RESET: "the reset controller"}
"""What the record moves on whatever of, per kind of rung that ends by a timeout."""
_WHAT = {Kind.RESET: "GPU reset"}
"""A rung's name in the alert where the rung's own name is too short to read alone."""


def stuck_phases(own: SelfSettings) -> list[StuckPhase]:
    """The ladder's rungs that end by a timeout (a check's Job, a reset): the shipped ladder's in
    its order, then the optional ones (`KNOWN`'s others). The release ladder is declared once
    (`gpuhealth.ladder`); the rules read it rather than list its phases. Each threshold is
    `self.<phase>_stuck_for`, or twice the rung's declared length for a rung the settings give
    none."""
    optional_last = sorted(KNOWN.timed_out(), key=lambda rung: LADDER.rung(rung.phase) is None)
    return [
        StuckPhase(
            rung.phase,
            getattr(own, f"{rung.phase.lower()}_stuck_for", None) or Duration(int(2 * rung.seconds)),
            _stuck_why(rung),
        )
        for rung in optional_last
    ]


def _stuck_why(rung: Rung) -> str:
    return (
        f"The {_WHAT.get(rung.kind, rung.name)} ends by its timeout (the responder's {rung.setting}) and "
        f"the record moves on whatever {_MOVES_ON[rung.kind]} does: the reconciler is not advancing "
        "this record."
    )


def _environment() -> jinja2.Environment:
    # Prometheus and Alertmanager templates use {{ }} themselves, so jinja2 gets [[ ]] and
    # [% %]: both pass through the rule files untouched and neither occurs in PromQL.
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        block_start_string="[%",
        block_end_string="%]",
        variable_start_string="[[",
        variable_end_string="]]",
        comment_start_string="[#",
        comment_end_string="#]",
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # YAML, not HTML
    )
    env.filters["quote"] = _yaml_quote
    env.filters["number"] = _number
    return env


def _number(value: float) -> str:
    """A number as PromQL and people read it: 2 rather than 2.0, 0.7 as it is."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _yaml_quote(value: object) -> str:
    """A YAML double-quoted scalar (JSON strings are valid YAML)."""
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(settings: Settings) -> dict[str, str]:
    """Every output file's text, keyed by its path relative to the output directory."""
    env = _environment()
    # A global rather than a context entry: the macros of _macros.j2 are imported without
    # the caller's context, and every label list they build carries the cluster label too.
    env.globals["cl"] = settings.selectors.cluster_label
    context = {
        "cfg": settings,
        "sel": settings.selectors,
        "fatal_xid_regex": "|".join(str(x) for x in settings.device.fatal_xids),
        "dcgm_watch_regex": "|".join(settings.dcgm.health_watches),
        "runbook_url": settings.runbook_url,
        "unknown_cap": unknown_tolerance_cap(settings.device),
        "timed_out": [(s.phase, s.after, "", s.why) for s in stuck_phases(settings.self)],
    }
    files: dict[str, str] = {}
    for template_name, out_path in OUTPUTS.items():
        text = env.get_template(template_name).render(context)
        # Fail here, with the template's name, rather than in promtool or Alertmanager.
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:  # pragma: no cover - guards template edits
            raise RuntimeError(f"template {template_name} rendered invalid YAML: {exc}") from exc
        files[out_path] = text
    return files


def write_files(files: Mapping[str, str], out_dir: Path) -> list[Path]:
    written: list[Path] = []
    for rel, text in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def compare_files(files: Mapping[str, str], out_dir: Path, context_lines: int = 2) -> list[str]:
    """Differences between a fresh render and the files under out_dir, as readable lines.

    Empty when they match. A missing file or differing lines each produce a short entry
    with a unified diff, so a failing check says what to re-render.
    """
    problems: list[str] = []
    for rel, text in files.items():
        path = out_dir / rel
        if not path.exists():
            problems.append(f"{rel}: missing (run `gpuhealth rules render`)")
            continue
        current = path.read_text(encoding="utf-8")
        if current == text:
            continue
        diff = list(
            difflib.unified_diff(
                current.splitlines(),
                text.splitlines(),
                fromfile=f"{rel} (committed)",
                tofile=f"{rel} (rendered)",
                n=context_lines,
                lineterm="",
            )
        )
        changed = sum(1 for line in diff if line[:1] in "+-" and not line.startswith(("+++", "---")))
        problems.append(f"{rel}: {changed} line(s) differ\n" + "\n".join(diff[:60]))
    return problems


__all__ = [
    "APPLICATION_XIDS",
    "DEFAULT_CONFIG",
    "ConfigError",
    "Duration",
    "Settings",
    "compare_files",
    "load_config",
    "parse_config",
    "render",
    "runbook_anchor",
    "scaled",
    "unknown_restriction",
    "unknown_schedule",
    "unknown_schedule_table",
    "unknown_window",
    "validate",
    "write_files",
]


def scaled(settings: Settings, speed: float) -> Settings:
    """The same settings with every duration divided by `speed` (at least 1s unless it was 0s).

    For a simulated cluster that runs `speed` times faster than wall time (the demo): the
    rules then mean in wall seconds what they mean in simulated seconds. The result is
    validated again, since rounding to whole seconds can break an ordering.
    """
    if speed <= 0:
        raise ConfigError(f"speed: {speed} must be above 0")

    def shrink(value: Any) -> Any:
        if isinstance(value, Duration):
            return value if value.seconds == 0 else Duration(max(1, round(value.seconds / speed)))
        if isinstance(value, Mapping):
            return {k: shrink(v) for k, v in value.items()}
        if isinstance(value, tuple):
            return tuple(shrink(v) for v in value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return dataclasses.replace(
                value, **{f.name: shrink(getattr(value, f.name)) for f in dataclasses.fields(value)}
            )
        return value

    result: Settings = shrink(settings)
    validate(result)
    return result
