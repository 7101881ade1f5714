"""How `gpuhealth demo` stages a scenario: its `demo:` section and the responder's config.

Pure: parsing and arithmetic over plain data, no I/O. The pipeline (`demo.pipeline`) reads a
scenario's raw `demo:` mapping through `staging()` and builds the responders' `--config`
document with `responder_document()`.

The `demo:` section (times are scenario seconds, like the timeline; durations take a unit)::

    demo:
      responders: 2          # responder replicas, enforcing (default 2)
      alertmanagers: 1       # 1, or 2 for an HA pair gossiping on loopback (default 1)
      speed: 20              # default speed of this scenario (simulated seconds per second)
      settle: 3m             # simulated time to keep running after the last fault (default 3m)
      exporter: cluster      # node: one node-mode exporter per node (NVML from the simulator);
                             # cluster: one cluster-mode exporter, no NVML of gpuhealth's own
                             # (default: node up to 16 nodes, cluster beyond)
      kills:                 # processes killed with SIGKILL at a scenario time
        - {at: 2m30s, process: responder-leader, restart: 30s}   # restart absent: never
      releaseRequests:       # a person asks for a device's release at a scenario time
        - {at: 6m, node: gpu-dp-0, gpu: 1, reason: "riser replaced", via: command}
      healthSourceDown:      # the responders' Prometheus unreachable to them (alerts still flow)
        - {at: 2m, for: 3m}

`process` is one of `responder-leader`, `responder-follower` (who holds the leader Lease when
the kill is due), `exporter` (the first node exporter by name, or the cluster-mode one) and
`alertmanager` (the last of the pair). A release request names the device as the scenario does;
`via` is `command` (default: `gpuhealth quarantine release` against the run's cluster, which
refuses what the record itself shows before writing) or `patch` (the request written straight
into the record's spec, as a person with the operator role could with kubectl: the responder's
own answer is then what refuses or honours it); `actor` defaults to `on-call`. During a health
source outage the responders' queries to Prometheus are answered 503 (Prometheus itself keeps
evaluating rules and Alertmanager keeps delivering). Every error is a `StagingError` naming the
field path.

The responders' configuration: the shipped `deploy/responder-config.yaml` with the scenario's
`responder:` overrides on top (same schema, durations in SIMULATED time), then every duration
divided by the speed and every per-hour rate multiplied by it (`scaled_document`), so that the
responders, which run on the wall clock, keep pace with the simulated cluster.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuhealth.durations import DurationError, format_duration, parse_duration

PROCESSES = ("responder-leader", "responder-follower", "exporter", "alertmanager")
"""What a kill may name."""

DEFAULT_SETTLE_SECONDS = 180.0
DEFAULT_RESPONDERS = 2
DEFAULT_ALERTMANAGERS = 1
MAX_RESPONDERS = 5
"""More replicas than this only slow a 2-core machine down; the leader race needs two."""


class StagingError(ValueError):
    """The `demo:` section (or a responder override) cannot be used; the message names the field."""


@dataclass(frozen=True, slots=True)
class Kill:
    at: float
    """Scenario seconds when the process is killed."""
    process: str
    """One of PROCESSES."""
    restart: float | None = None
    """Scenario seconds after the kill when it starts again; None: never."""


@dataclass(frozen=True, slots=True)
class ReleaseAsk:
    """A person's release request at a scenario time."""

    at: float
    node: str
    gpu: int
    reason: str
    actor: str = "on-call"
    via: str = "command"
    """`command` (gpuhealth quarantine release) or `patch` (the spec written directly)."""


@dataclass(frozen=True, slots=True)
class Outage:
    """The responders' health source unreachable from `at` for `seconds` (scenario seconds)."""

    at: float
    seconds: float

    @property
    def end(self) -> float:
        return self.at + self.seconds


@dataclass(frozen=True, slots=True)
class Staging:
    responders: int = DEFAULT_RESPONDERS
    alertmanagers: int = DEFAULT_ALERTMANAGERS
    speed: float | None = None
    """The scenario's default speed (None: the command's default)."""
    settle: float = DEFAULT_SETTLE_SECONDS
    """Simulated seconds to run after the last fault."""
    kills: tuple[Kill, ...] = ()
    release_requests: tuple[ReleaseAsk, ...] = ()
    health_source_down: tuple[Outage, ...] = ()
    exporter: str | None = None
    """`node` or `cluster` (`EXPORTER_MODES`); None: chosen by the fleet's size."""

    @property
    def last_action(self) -> float:
        """Scenario seconds when the last staged action (a kill's restart, a request, an outage's
        end) is done: the run settles after it."""
        return max(
            [k.at + (k.restart or 0.0) for k in self.kills]
            + [r.at for r in self.release_requests]
            + [o.end for o in self.health_source_down],
            default=0.0,
        )


_KEYS = (
    "responders",
    "alertmanagers",
    "speed",
    "settle",
    "kills",
    "releaseRequests",
    "healthSourceDown",
    "exporter",
)
EXPORTER_MODES = ("node", "cluster")
_KILL_KEYS = ("at", "process", "restart")
_ASK_KEYS = ("at", "node", "gpu", "reason", "actor", "via")
_OUTAGE_KEYS = ("at", "for")
VIAS = ("command", "patch")


def _seconds(value: Any, path: str, *, zero: bool) -> float:
    try:
        seconds = parse_duration(value, bare_seconds=False)
    except DurationError as exc:
        raise StagingError(f"{path}: {exc}") from None
    if seconds <= 0 and not zero:
        raise StagingError(f"{path}: {value!r} must be longer than zero")
    return seconds


def _whole(value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise StagingError(f"{path}: expected a whole number from {low} to {high}, got {value!r}")
    return value


def staging(section: Mapping[str, Any] | None, *, source: str = "demo") -> Staging:
    """The scenario's `demo:` section, checked; `source` prefixes each field path in errors."""
    if section is None:
        return Staging()
    if not isinstance(section, Mapping):
        raise StagingError(f"{source}: expected a mapping, got {section!r}")
    unknown = sorted(set(section) - set(_KEYS))
    if unknown:
        raise StagingError(f"{source}.{unknown[0]}: unknown field (expected one of: {', '.join(_KEYS)})")
    responders = _whole(
        section.get("responders", DEFAULT_RESPONDERS), f"{source}.responders", 1, MAX_RESPONDERS
    )
    alertmanagers = _whole(
        section.get("alertmanagers", DEFAULT_ALERTMANAGERS), f"{source}.alertmanagers", 1, 2
    )
    speed: float | None = None
    if "speed" in section:
        raw = section["speed"]
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 0 < raw < math.inf:
            raise StagingError(f"{source}.speed: expected a number above 0, got {raw!r}")
        speed = float(raw)
    settle = DEFAULT_SETTLE_SECONDS
    if "settle" in section:
        settle = _seconds(section["settle"], f"{source}.settle", zero=True)
    kills_raw = section.get("kills", [])
    if not isinstance(kills_raw, list):
        raise StagingError(f"{source}.kills: expected a list, got {kills_raw!r}")
    kills = tuple(_kill(raw, f"{source}.kills[{i}]", responders) for i, raw in enumerate(kills_raw))
    asks = tuple(
        _ask(raw, f"{source}.releaseRequests[{i}]")
        for i, raw in enumerate(_list(section, "releaseRequests", source))
    )
    outages = tuple(
        _outage(raw, f"{source}.healthSourceDown[{i}]")
        for i, raw in enumerate(_list(section, "healthSourceDown", source))
    )
    ordered = sorted(outages, key=lambda o: o.at)
    for a, b in itertools.pairwise(ordered):
        if b.at < a.end:
            raise StagingError(
                f"{source}.healthSourceDown: the outage at {b.at:g}s starts before the one at {a.at:g}s ends"
            )
    exporter = section.get("exporter")
    if exporter is not None and exporter not in EXPORTER_MODES:
        raise StagingError(
            f"{source}.exporter: expected one of {', '.join(EXPORTER_MODES)}, got {exporter!r}"
        )
    return Staging(
        responders,
        alertmanagers,
        speed,
        settle,
        tuple(sorted(kills, key=lambda k: k.at)),
        tuple(sorted(asks, key=lambda a: a.at)),
        tuple(ordered),
        exporter,
    )


def _list(section: Mapping[str, Any], key: str, source: str) -> list[Any]:
    raw = section.get(key, [])
    if not isinstance(raw, list):
        raise StagingError(f"{source}.{key}: expected a list, got {raw!r}")
    return raw


def _fields(raw: Any, path: str, keys: tuple[str, ...], required: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise StagingError(f"{path}: expected a mapping with {', '.join(required)}, got {raw!r}")
    unknown = sorted(set(raw) - set(keys))
    if unknown:
        raise StagingError(f"{path}.{unknown[0]}: unknown field (expected one of: {', '.join(keys)})")
    for key in required:
        if key not in raw:
            raise StagingError(f"{path}.{key}: required")
    return raw


def _text(raw: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise StagingError(f"{path}.{key}: expected a non-empty string, got {value!r}")
    return value


def _ask(raw: Any, path: str) -> ReleaseAsk:
    data = _fields(raw, path, _ASK_KEYS, ("at", "node", "gpu", "reason"))
    via = data.get("via", "command")
    if via not in VIAS:
        raise StagingError(f"{path}.via: expected one of {', '.join(VIAS)}, got {via!r}")
    return ReleaseAsk(
        at=_seconds(data["at"], f"{path}.at", zero=True),
        node=_text(data, "node", path),
        gpu=_whole(data["gpu"], f"{path}.gpu", 0, 1023),
        reason=_text(data, "reason", path),
        actor=_text(data, "actor", path, "on-call"),
        via=str(via),
    )


def _outage(raw: Any, path: str) -> Outage:
    data = _fields(raw, path, _OUTAGE_KEYS, ("at", "for"))
    return Outage(
        _seconds(data["at"], f"{path}.at", zero=True), _seconds(data["for"], f"{path}.for", zero=False)
    )


def _kill(raw: Any, path: str, responders: int) -> Kill:
    if not isinstance(raw, Mapping):
        raise StagingError(f"{path}: expected a mapping with at, process and restart, got {raw!r}")
    unknown = sorted(set(raw) - set(_KILL_KEYS))
    if unknown:
        raise StagingError(f"{path}.{unknown[0]}: unknown field (expected one of: {', '.join(_KILL_KEYS)})")
    for required in ("at", "process"):
        if required not in raw:
            raise StagingError(f"{path}.{required}: required")
    at = _seconds(raw["at"], f"{path}.at", zero=True)
    process = raw["process"]
    if process not in PROCESSES:
        raise StagingError(f"{path}.process: expected one of {', '.join(PROCESSES)}, got {process!r}")
    if process == "responder-follower" and responders < 2:
        raise StagingError(f"{path}.process: a responder-follower needs demo.responders of 2 or more")
    restart = (
        _seconds(raw["restart"], f"{path}.restart", zero=False) if raw.get("restart") is not None else None
    )
    return Kill(at, str(process), restart)


# ----- the responders' configuration -------------------------------------------------------------

DURATION_KEYS = frozenset(
    {
        ("policy", "probe_timeout"),
        ("policy", "canary_timeout"),
        ("policy", "stability"),
        ("policy", "ramp"),
        ("policy", "requested_wait"),
        ("policy", "backoff"),
        ("policy", "max_backoff"),
        ("policy", "deferred_max_age"),
        ("breaker", "window"),
        ("escalation", "window"),
        ("migration", "checkpoint_timeout"),
        ("migration", "lease_margin"),
        ("migration", "lease_cap"),
        ("migration", "replacement_timeout"),
        ("intake", "expiry"),
        ("reset", "timeout"),
        ("hold", "fill_timeout"),
        ("hold", "refill"),
        ("hold", "ramp_fill"),
    }
)
"""(section, key) of every duration in the responder's config (`responder/config.py`) that
runs on the cluster's clock, scaled with the run's speed."""

CHECK_TIMEOUT_KEYS = frozenset(
    {("policy", "probe_timeout"), ("policy", "canary_timeout"), ("reset", "timeout")}
)
"""Durations scaled like the others but never below `CHECK_WALL_SECONDS`: the time a check may take.
A check's pod runs real processes on the simulated node (the probe's DCGM stand-ins and its judge,
`simulator.fleet.programs`) whose length is wall time at any speed, and is seen through
reconcile passes a few wall seconds apart: a 1m probe timeout at 20x is 3 wall seconds, which a
Python process starting on a loaded two-core machine can use up alone (CI's fleet-storm-unhealthy:
each release fell back to Quarantined on its probe's timeout, no check failed). A timeout is a
bound, not a wait: a check that ends ends as soon as it does, so the floor lengthens no run."""
CHECK_WALL_SECONDS = 30.0
"""The floor: the longest a check container's process may run on the simulated node
(`simulator.fleet.programs.TIMEOUT_SECONDS`, a test holds the two equal; staging does no I/O and
imports no runner)."""

UNSCALED_DURATION_KEYS = frozenset({("checks", "probe_wait")})
"""Durations that are not the cluster's time, kept as written: the probe's wait for its
hostengine runs inside the diagnostic's own process (on the simulated node, the stand-ins'
virtual clock, simulator/fleet/programs.py), where a scaled wait below the hostengine's start
would fail every probe."""

RATE_KEYS = frozenset(
    {
        ("new_quarantines", "per_hour"),
        ("migration", "node_per_hour"),
        ("migration", "namespace_evictions_per_hour"),
    }
)
"""(section, key) of every per-hour rate: an hour of simulated time passes `speed` times faster."""

WHOLE_RATES = frozenset({("migration", "node_per_hour"), ("migration", "namespace_evictions_per_hour")})
"""Rates the config takes as whole numbers (rounded up after scaling: never stricter)."""


def merged(defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """`defaults` with the scenario's `responder:` overrides on top, section by section.

    Structure errors (a section that is not a mapping) and unknown or removed keys are left for
    the config's own checks, which name the key.
    """
    doc: dict[str, Any] = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in defaults.items()}
    if overrides is None:
        return doc
    if not isinstance(overrides, Mapping):
        raise StagingError(f"responder: expected a mapping of config sections, got {overrides!r}")
    for section, body in overrides.items():
        if isinstance(body, Mapping) and isinstance(doc.get(section), dict):
            doc[section] = {**doc[section], **body}
        else:
            doc[section] = body
    return doc


def scaled_document(doc: Mapping[str, Any], speed: float) -> dict[str, Any]:
    """The config document at `speed`: durations divided by it, per-hour rates multiplied by it.

    A check's timeout is never below `CHECK_WALL_SECONDS` of wall time (nor above what the
    config gives). Durations keep the config's grammar (a unit, at least a millisecond); values that are not
    durations or rates pass through untouched, for the config's own checks to judge. A value
    that cannot be parsed as a duration is a StagingError naming `responder.<section>.<key>`.
    """
    if not (isinstance(speed, int | float) and 0 < speed < math.inf):
        raise StagingError(f"speed: expected a number above 0, got {speed!r}")
    out: dict[str, Any] = {}
    for section, body in doc.items():
        if not isinstance(body, Mapping):
            out[section] = body
            continue
        scaled: dict[str, Any] = {}
        for key, value in body.items():
            where = (section, key)
            if where in DURATION_KEYS:
                seconds = _seconds(value, f"responder.{section}.{key}", zero=False)
                wall = seconds / speed
                if where in CHECK_TIMEOUT_KEYS:
                    wall = max(wall, min(seconds, CHECK_WALL_SECONDS))
                scaled[key] = _duration_text(wall)
            elif where in RATE_KEYS and isinstance(value, int | float) and not isinstance(value, bool):
                rate = value * speed
                scaled[key] = math.ceil(rate) if where in WHOLE_RATES else float(rate)
            else:
                scaled[key] = value
        out[section] = scaled
    return out


def _duration_text(seconds: float) -> str:
    """`seconds` in the duration grammar, to the millisecond (never zero: the config refuses it)."""
    return format_duration(max(1, round(seconds * 1000)) / 1000)
