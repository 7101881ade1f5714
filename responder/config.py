"""`gpuhealth responder --config FILE`: the responder's tunables as a YAML document.

The document maps onto the settings tree (`responder.settings.ResponderSettings`); what is
not in it keeps its default, and the flags keep what is per deployment (where to listen,
which cluster, the token, TLS). The shipped example with every default and its reason is
`deploy/responder-config.yaml`. Which key sets which field, and how its value is read, is
declared on the field (`gpuhealth.yaml_keys`: a rung's length on the rung, `gpuhealth.ladder`);
this module keeps no table of keys, only the sections' order and the keys an earlier release
knew.

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
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuhealth import yaml_keys
from responder.settings import ResponderSettings

REMOVED_HEADER = ("apiVersion", "kind")
"""The earlier dialect's header (`gpuhealth.io/v1alpha1`, `ResponderConfiguration`): refused."""
SECTIONS = (
    "policy",
    "breaker",
    "new_quarantines",
    "escalation",
    "migration",
    "checks",
    "hold",
    "intake",
    "reset",
)
"""The document's sections, in the order they are listed; their keys are declared on the
settings' fields (`gpuhealth.yaml_keys`), the rungs' lengths on the ladder's rungs."""


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the file, the key path and why."""


@dataclass(frozen=True, slots=True)
class _Value:
    """A key's parsed value in the tree of changes (a mapping value, as `namespace_modes`, is a
    value, not more changes)."""

    value: Any


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


def apply(doc: Any, settings: ResponderSettings, source: str) -> ResponderSettings:
    """`settings` with the document's values in place (pure); ConfigError says what is wrong."""
    sections = yaml_keys.sections(settings, SECTIONS)
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
        keys = sections.get(section)
        if keys is None:
            known = ", ".join(sections)
            if _snake(str(section)) in sections:
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
                parsed = key.read(value)
            except yaml_keys.Invalid as exc:
                raise ConfigError(f"{source}: {section}.{name}: {exc}") from None
            node = changes
            for part in key.attribute[:-1]:
                node = node.setdefault(part, {})
            node[key.attribute[-1]] = _Value(parsed)
    try:
        return _replace(settings, changes)
    except ValueError as exc:
        raise ConfigError(f"{source}: {_in_file_terms(str(exc), sections)}") from None


def _snake(key: str) -> str:
    """`probeTimeout` -> `probe_timeout`: a key of the earlier dialect in the current one."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", lambda m: "_" + m.group(1).lower(), key)


def _replace(obj: Any, changes: Mapping[str, Any]) -> Any:
    """`obj` with `changes` applied, each dataclass rebuilt once (its own checks see every
    change together, so raising a cap and a value above the old cap is no contradiction)."""
    values = {
        name: change.value if isinstance(change, _Value) else _replace(getattr(obj, name), change)
        for name, change in changes.items()
    }
    return dataclasses.replace(obj, **values)


def _in_file_terms(message: str, sections: Mapping[str, Mapping[str, yaml_keys.Declared]]) -> str:
    """The settings' own contradiction message in the file's terms: each snake_case attribute
    name (unique across the sections; `image` and `command` are not, and are never reworded)
    as its key path."""
    key_of = {d.attribute[-1]: f"{d.section}.{d.name}" for keys in sections.values() for d in keys.values()}
    return re.sub(r"\b[a-z]+(?:_[a-z]+)+\b", lambda m: key_of.get(m.group(0), m.group(0)), message)


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
