"""`gpuhealth responder --config FILE`: the responder's tunables as a YAML document.

The document maps onto the settings tree (`responder.settings.ResponderSettings`); what is
not in it keeps its default, and the flags keep what is per deployment (where to listen,
which cluster, the token, TLS). The shipped example with every default and its reason is
`deploy/responder-config.yaml`.

    policy:         {probe_timeout, canary_timeout, stability, ramp, requested_wait, backoff, max_backoff,
                     deferred_max_age, ramp_pods}
    breaker:        {window, rate_fraction, rate_floor, capacity_fraction, capacity_floor}
    new_quarantines: {burst, per_hour}
    migration:      {checkpoint_timeout, lease_margin, lease_cap, replacement_timeout, default_mode,
                     namespace_modes, node_in_flight, node_per_hour, namespace_evictions_per_hour}
    checks:         {namespace, probe_image, probe_level, probe_hostengine, probe_wait, judge_image,
                     canary_image, canary_command, runtime_class,
                     device_plugin_route}
    reset:          {enabled, timeout, group, version, kind, plural, namespace, node_field,
                     uuids_field, complete_condition, succeeded_reason}
    hold:           {enabled, image, priority_class, fill_timeout, refill, ramp_fill}
    intake:         {expiry}

One dialect with `rules/config.yaml`: sections of snake_case keys, no apiVersion/kind header.
A key of the earlier dialect (camelCase, the ResponderConfiguration header) is refused with its
new spelling, as is a renamed key (`checks.image` is now `checks.probe_image`: the canary has
its own) and a removed one, with what replaced it (`checks.probe_command`: the probe's pod runs
DCGM's diagnostic with a hostengine, configured by `probe_level`, `probe_hostengine` and
`probe_wait`). Durations are written in the one grammar (`gpuhealth.durations`) and need a unit (`90s`, not
`90`: a bare number in a file is too easily minutes in the writer's head). Unknown keys are
refused (a misspelt key would otherwise silently keep a default). Every error is a
`ConfigError` naming the file, the key path and what is wrong; contradictions between keys
(a backoff above its cap) are the settings' own checks, reported with the keys' names. Pure
apart from reading the file.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuhealth.durations import DurationError, parse_duration
from gpuhealth.fields import SettingsError
from responder.checks.probe_pod import EMBEDDED, DiagSettings
from responder.enforce.node_annotation import CHECK_ROUTES
from responder.ladder import LADDER, Ladder, with_reset
from responder.migrate.plan import Mode
from responder.settings import ResponderSettings

REMOVED_HEADER = ("apiVersion", "kind")
"""The earlier dialect's header (`gpuhealth.io/v1alpha1`, `ResponderConfiguration`): refused."""


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file, the key path and why."""


class _Invalid(ValueError):
    """A value's problem, before the file and key path are put in front of it."""


Parser = Callable[[Any], Any]
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""An object name (RFC 1123 subdomain); its 253-character limit is the API server's to enforce."""


def _duration(value: Any) -> float:
    try:
        seconds = parse_duration(value, bare_seconds=False)
    except DurationError as exc:
        raise _Invalid(str(exc)) from None
    if seconds <= 0:
        raise _Invalid(f"{value!r} must be longer than zero")
    return seconds


def _fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise _Invalid(f"{value!r} must be a fraction above 0 and at most 1 (e.g. 0.08 for 8 %)")
    return float(value)


def _whole(low: int) -> Parser:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise _Invalid(f"{value!r} must be a whole number of at least {low}")
        return value

    return parse


def _rate(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise _Invalid(f"{value!r} must be a number above 0")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(f"{value!r} must be a non-empty string")
    return value


def _runtime_class(value: Any) -> str:
    if not isinstance(value, str) or (value and not _DNS_SUBDOMAIN.fullmatch(value)):
        raise _Invalid(f"{value!r} must be a RuntimeClass name, or empty for the node's default runtime")
    return value


def _level(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 4:
        raise _Invalid(f"{value!r} must be a dcgmi diag level, 1 to 4")
    return value


def _hostengine(value: Any) -> str:
    try:
        return DiagSettings(hostengine=value).hostengine
    except (SettingsError, TypeError, AttributeError):
        raise _Invalid(
            f"{value!r} must be {EMBEDDED!r} or host:port (e.g. nvidia-dcgm.gpu-operator.svc:5555)"
        ) from None


def _check_route(value: Any) -> str:
    if value not in CHECK_ROUTES:
        raise _Invalid(f"{value!r} must be one of {', '.join(CHECK_ROUTES)}")
    return str(value)


def _command(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise _Invalid(f"{value!r} must be a non-empty list of strings (the argv)")
    return tuple(value)


def _reset_ladder(value: Any) -> Ladder:
    """`reset.enabled`: the shipped ladder, with the reset rung before the probe when true."""
    if not isinstance(value, bool):
        raise _Invalid(f"{value!r} must be true or false")
    return with_reset(LADDER) if value else LADDER


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(f"{value!r} must be true or false")
    return value


def _optional_class(value: Any) -> str:
    if not isinstance(value, str) or (value and not _DNS_SUBDOMAIN.fullmatch(value)):
        raise _Invalid(f"{value!r} must be a PriorityClass name, or empty for none")
    return value


def _optional_name(value: Any) -> str:
    if not isinstance(value, str) or (value and not _DNS_SUBDOMAIN.fullmatch(value)):
        raise _Invalid(f"{value!r} must be a namespace name, or empty for a cluster-scoped kind")
    return value


def _mode(value: Any) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        choices = ", ".join(m.value for m in Mode)
        raise _Invalid(f"{value!r} is not a migration mode ({choices})") from None


def _modes(value: Any) -> dict[str, Mode]:
    if not isinstance(value, dict):
        raise _Invalid(f"{value!r} must map namespaces to modes")
    out = {}
    for namespace, mode in value.items():
        if not isinstance(namespace, str) or not namespace:
            raise _Invalid(f"{namespace!r} is not a namespace name")
        try:
            out[namespace] = _mode(mode)
        except _Invalid as exc:
            raise _Invalid(f"{namespace}: {exc}") from None
    return out


@dataclass(frozen=True, slots=True)
class _Key:
    path: tuple[str, ...]
    """Where in ResponderSettings the value goes (attribute names)."""
    parse: Parser


_SECTIONS: dict[str, dict[str, _Key]] = {
    "policy": {
        "probe_timeout": _Key(("reconciler", "policy", "probe_timeout_seconds"), _duration),
        "canary_timeout": _Key(("reconciler", "policy", "canary_timeout_seconds"), _duration),
        "stability": _Key(("reconciler", "policy", "stability_seconds"), _duration),
        "ramp": _Key(("reconciler", "policy", "ramp_seconds"), _duration),
        "requested_wait": _Key(("reconciler", "policy", "requested_wait_seconds"), _duration),
        "backoff": _Key(("reconciler", "policy", "backoff_seconds"), _duration),
        "max_backoff": _Key(("reconciler", "policy", "max_backoff_seconds"), _duration),
        "deferred_max_age": _Key(("reconciler", "policy", "deferred_max_age_seconds"), _duration),
        "ramp_pods": _Key(("ramp_pods",), _whole(1)),
    },
    "breaker": {
        "window": _Key(("reconciler", "policy", "breaker", "window_seconds"), _duration),
        "rate_fraction": _Key(("reconciler", "policy", "breaker", "rate_fraction"), _fraction),
        "rate_floor": _Key(("reconciler", "policy", "breaker", "rate_floor"), _whole(0)),
        "capacity_fraction": _Key(("reconciler", "policy", "breaker", "capacity_fraction"), _fraction),
        "capacity_floor": _Key(("reconciler", "policy", "breaker", "capacity_floor"), _whole(0)),
    },
    "new_quarantines": {
        "burst": _Key(("reconciler", "bucket", "burst"), _whole(1)),
        "per_hour": _Key(("reconciler", "bucket", "per_hour"), _rate),
    },
    "migration": {
        "checkpoint_timeout": _Key(("migrator", "migration", "checkpoint_timeout_seconds"), _duration),
        "lease_margin": _Key(("migrator", "migration", "lease_margin_seconds"), _duration),
        "lease_cap": _Key(("migrator", "migration", "lease_cap_seconds"), _duration),
        "replacement_timeout": _Key(("migrator", "migration", "replacement_timeout_seconds"), _duration),
        "default_mode": _Key(("migrator", "default_mode"), _mode),
        "namespace_modes": _Key(("migrator", "modes"), _modes),
        "node_in_flight": _Key(("migrator", "node_in_flight"), _whole(1)),
        "node_per_hour": _Key(("migrator", "node_per_hour"), _whole(1)),
        "namespace_evictions_per_hour": _Key(("migrator", "namespace_evictions_per_hour"), _whole(1)),
    },
    "checks": {
        "namespace": _Key(("checks", "namespace"), _text),
        "probe_image": _Key(("checks", "probe", "image"), _text),
        "probe_level": _Key(("checks", "probe", "diag", "level"), _level),
        "probe_hostengine": _Key(("checks", "probe", "diag", "hostengine"), _hostengine),
        "probe_wait": _Key(("checks", "probe", "diag", "wait_seconds"), _duration),
        "judge_image": _Key(("checks", "probe", "diag", "judge_image"), _text),
        "canary_image": _Key(("checks", "canary", "image"), _text),
        "canary_command": _Key(("checks", "canary", "command"), _command),
        "runtime_class": _Key(("checks", "runtime_class"), _runtime_class),
        "device_plugin_route": _Key(("checks", "device_plugin_route"), _check_route),
    },
    "hold": {
        "enabled": _Key(("hold", "enabled"), _flag),
        "image": _Key(("hold", "image"), _text),
        "priority_class": _Key(("hold", "priority_class"), _optional_class),
        "fill_timeout": _Key(("hold", "fill_timeout_seconds"), _duration),
        "refill": _Key(("hold", "refill_seconds"), _duration),
        "ramp_fill": _Key(("hold", "ramp_fill_seconds"), _duration),
    },
    "intake": {
        "expiry": _Key(("intake", "expiry_seconds"), _duration),
    },
    "reset": {
        "enabled": _Key(("reconciler", "policy", "ladder"), _reset_ladder),
        "timeout": _Key(("reconciler", "policy", "reset_timeout_seconds"), _duration),
        "group": _Key(("reset", "group"), _text),
        "version": _Key(("reset", "version"), _text),
        "kind": _Key(("reset", "kind"), _text),
        "plural": _Key(("reset", "plural"), _text),
        "namespace": _Key(("reset", "namespace"), _optional_name),
        "node_field": _Key(("reset", "node_field"), _text),
        "uuids_field": _Key(("reset", "uuids_field"), _text),
        "complete_condition": _Key(("reset", "complete_condition"), _text),
        "succeeded_reason": _Key(("reset", "succeeded_reason"), _text),
    },
}

_RENAMED = {("checks", "image"): "probe_image"}
"""Keys an earlier release knew, refused with their current spelling."""
_REMOVED = {
    ("checks", "command"): "the probe runs DCGM's diagnostic with a hostengine: set checks.probe_level, "
    "checks.probe_hostengine, checks.probe_wait",
    ("checks", "probe_command"): "the probe runs DCGM's diagnostic with a hostengine (dcgmi alone has "
    "nothing to talk to): set checks.probe_level, checks.probe_hostengine, checks.probe_wait; a "
    "check of your own is the canary (canary_command) or a rung of its own",
}
"""Keys an earlier release knew that nothing replaces one for one: refused with what to do."""

_KEY_OF_FIELD = {
    key.path[-1]: f"{section}.{name}" for section, keys in _SECTIONS.items() for name, key in keys.items()
}
"""Attribute name -> key path, to word the settings' own contradiction messages in the file's
terms (the snake_case attribute names, the only words reworded, are unique across the sections;
`image` and `command` are not, and are never reworded)."""


def apply(doc: Any, settings: ResponderSettings, source: str) -> ResponderSettings:
    """`settings` with the document's values in place (pure); ConfigError says what is wrong."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: expected a mapping of sections, not {type(doc).__name__}")
    changes: dict[str, Any] = {}
    for section, body in doc.items():
        if section in REMOVED_HEADER:
            raise ConfigError(
                f"{source}: {section}: removed (the file is sections of snake_case keys, as "
                "rules/config.yaml: delete apiVersion and kind)"
            )
        keys = _SECTIONS.get(section)
        if keys is None:
            known = ", ".join(_SECTIONS)
            if _snake(str(section)) in _SECTIONS:
                raise ConfigError(f"{source}: {section}: removed; now spelt {_snake(str(section))}")
            raise ConfigError(f"{source}: {section}: unknown key (known: {known})")
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: {section}: expected a mapping, not {body!r}")
        for name, value in body.items():
            key = keys.get(name)
            removed = _REMOVED.get((section, str(name)))
            if removed is not None:
                raise ConfigError(f"{source}: {section}.{name}: removed; {removed}")
            renamed = _RENAMED.get((section, str(name)))
            if renamed is not None:
                raise ConfigError(f"{source}: {section}.{name}: removed; now spelt {section}.{renamed}")
            if key is None:
                if _snake(str(name)) in keys:
                    raise ConfigError(
                        f"{source}: {section}.{name}: removed; now spelt {section}.{_snake(str(name))}"
                    )
                raise ConfigError(f"{source}: {section}.{name}: unknown key (known: {', '.join(keys)})")
            try:
                parsed = key.parse(value)
            except _Invalid as exc:
                raise ConfigError(f"{source}: {section}.{name}: {exc}") from None
            node = changes
            for part in key.path[:-1]:
                node = node.setdefault(part, {})
            node[key.path[-1]] = parsed
    try:
        return _replace(settings, changes)
    except ValueError as exc:
        raise ConfigError(f"{source}: {_in_file_terms(str(exc))}") from None


def _snake(key: str) -> str:
    """`probeTimeout` -> `probe_timeout`: a key of the earlier dialect in the current one."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _replace(obj: Any, changes: Mapping[str, Any]) -> Any:
    """`obj` with `changes` applied, each dataclass rebuilt once (its own checks see every
    change together, so raising a cap and a value above the old cap is no contradiction)."""
    values = {
        name: _replace(getattr(obj, name), change)
        if isinstance(change, Mapping) and name != "modes"
        else change
        for name, change in changes.items()
    }
    return dataclasses.replace(obj, **values)


def _in_file_terms(message: str) -> str:
    return re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: _KEY_OF_FIELD.get(m.group(0), m.group(0)), message)


def load(path: str | Path, settings: ResponderSettings) -> ResponderSettings:
    """`settings` with the file's values; ConfigError for an unreadable or invalid file."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from exc
    return apply(doc, settings, str(path))
