"""Device health as the reconciler reads it: a `HealthSource`, over Prometheus or static.

An adapter. The reconciler asks once per pass for a `HealthSnapshot` of every device the
source knows (how many there are is the breaker's `eligible` count) and looks each record's
device up in it; a device with no series is Unknown, never Healthy.

`PrometheusHealth` reads the device recording rules (`rules/prometheus/gpu-device.yaml`)
through `/api/v1/query`, one instant query per metric per pass, never one per device:
- `node_device:gpu_device_reported_unhealthy:bool` == 1: Unhealthy;
- `node_device:gpu_device_effective_unknown:bool` == 1 (a stale or missing report): Unknown;
- both present and 0: Healthy; a device missing from either is Unknown (an absent series is
  no evidence). The set of devices is the union of both series' (node, device).
`healthy_since` has no recording rule: the source remembers when it first saw each device
Healthy without a break, in memory. A restart therefore starts every stability window again,
which errs on the safe side (a release waits longer, never less).

A responder of one cluster among several (`intake.cluster`) reads only its cluster's devices:
each query selects the series whose cluster label is its cluster's or absent (`cluster_selector`):
a Prometheus of one cluster sets none on its own series, a central one (federation, a
Thanos-style querier) carries every cluster's, where two clusters may name a node and a device
alike (docs/multi-cluster.md).

A failing query, or an answer without a single device, raises `HealthUnavailable`. The
reconciler then decides the pass over `HealthSnapshot.unavailable()`: every device reads
`Health.UNAVAILABLE` (no evidence either way, never Unknown, which would fail releases), so
firing alerts are still enforced and their work moved while every step towards a release
waits (`responder.reconcile.policy`), and the breaker counts against the last fleet size seen
(`eligible` None before any: its floors only), never against zero, which would switch it off.
An outage also breaks every healthy run: nothing vouched for the devices meanwhile, so a
stability window starts again once the source answers.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from responder.reconcile.policy import Health

UNHEALTHY_RULE = "node_device:gpu_device_reported_unhealthy:bool"
UNKNOWN_RULE = "node_device:gpu_device_effective_unknown:bool"
MIG_SERIES = "gpu_nvml_mig_device_info"


def cluster_selector(label: str, cluster: str) -> str:
    """`{label=~"<cluster>|"}`: this cluster's series and those without the label; "" for none."""
    if not cluster:
        return ""
    pattern = re.escape(cluster).replace("\\", "\\\\").replace('"', '\\"')
    return f'{{{label}=~"{pattern}|"}}'


def mig_query(selector: str = "") -> str:
    return f"max by (node, device, mig_uuid, profile) ({MIG_SERIES}{selector})"


MIG_QUERY = mig_query()
"""Each MIG card's partitions, as node-mode exporters read them from NVML: not health, but what
the device-plugin path needs to reach a card (`responder.enforce.node_annotation`)."""

DeviceKey = tuple[str, str]
"""(node, device) as the exporter labels them (the record's spec.node and spec.device)."""


class HealthUnavailable(RuntimeError):
    """The source could not say anything this pass (Prometheus down, an unreadable answer)."""


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    health: Health
    healthy_since: float | None = None


@dataclass(frozen=True, slots=True)
class HealthSnapshot:
    devices: Mapping[DeviceKey, DeviceHealth] = field(default_factory=dict)
    available: bool = True
    """False: the source gave no answer this pass; every device reads Unavailable."""
    partitions: Mapping[DeviceKey, tuple[str, ...]] = field(default_factory=dict)
    """Each MIG card's partitions (MIG UUIDs, sorted) as last exported; a card not here has none known."""
    profiles: Mapping[str, str] = field(default_factory=dict)
    """MIG UUID -> its MIG profile (`3g.40gb`), where the exporter named one."""

    def partitions_of(self, node: str, device: str) -> tuple[str, ...]:
        return self.partitions.get((node, device), ())

    def profiles_of(self, partitions: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
        """(MIG UUID, profile) of those of `partitions` whose profile is known."""
        return tuple((p, self.profiles[p]) for p in partitions if p in self.profiles)

    @classmethod
    def unavailable(cls) -> HealthSnapshot:
        return cls(available=False)

    @property
    def eligible(self) -> int:
        """Devices the source knows: what the breaker's fractions are of."""
        return len(self.devices)

    def of(self, node: str, device: str) -> DeviceHealth:
        """The device's health; Unknown when the source has no series for it, Unavailable when
        the source gave no answer at all."""
        if not self.available:
            return DeviceHealth(Health.UNAVAILABLE)
        return self.devices.get((node, device), DeviceHealth(Health.UNKNOWN))


class HealthSource(Protocol):
    def snapshot(self, now: float) -> HealthSnapshot:
        """Every known device's health at `now` (blocking: the reconciler calls it in a thread)."""
        ...


class StaticHealth:
    """A fixed answer that tests change between passes (`set`)."""

    def __init__(self, devices: Mapping[DeviceKey, DeviceHealth] | None = None) -> None:
        self.devices: dict[DeviceKey, DeviceHealth] = dict(devices or {})
        self.failing = False
        """True: `snapshot` raises HealthUnavailable (an outage)."""

    def set(self, node: str, device: str, health: Health, healthy_since: float | None = None) -> None:
        self.devices[(node, device)] = DeviceHealth(health, healthy_since)

    def snapshot(self, now: float) -> HealthSnapshot:
        if self.failing:
            raise HealthUnavailable("static health source set to fail")
        return HealthSnapshot(dict(self.devices))


def classify(
    unhealthy: Mapping[DeviceKey, float], unknown: Mapping[DeviceKey, float]
) -> dict[DeviceKey, Health]:
    """Each device's health from the two rules' values (pure)."""
    out: dict[DeviceKey, Health] = {}
    for key in {*unhealthy, *unknown}:
        if unhealthy.get(key, 0.0) >= 1.0:
            out[key] = Health.UNHEALTHY
        elif key not in unhealthy or unknown.get(key, 1.0) >= 1.0:
            # A device missing from either rule has no health report behind it (its series went
            # away, or only its report age is left): no evidence of health, never a release.
            out[key] = Health.UNKNOWN
        else:
            out[key] = Health.HEALTHY
    return out


def parse_vector(body: Any, query: str) -> dict[DeviceKey, float]:
    """(node, device) -> value from an instant-vector answer of `/api/v1/query` (pure)."""
    if not isinstance(body, dict) or body.get("status") != "success":
        error = body.get("error") if isinstance(body, dict) else None
        raise HealthUnavailable(f"query {query}: {error or 'not a success answer'}")
    data = body.get("data") or {}
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise HealthUnavailable(f"query {query}: expected an instant vector")
    out: dict[DeviceKey, float] = {}
    for sample in data["result"]:
        labels = sample.get("metric") or {}
        node, device = labels.get("node"), labels.get("device")
        try:
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue  # one unreadable sample drops that device, never the pass
        if isinstance(node, str) and isinstance(device, str):
            out[(node, device)] = value
    return out


def _mig_labels(body: Any) -> Iterator[dict[str, Any]]:
    """The label sets of an answer of `MIG_QUERY` (an unreadable answer or sample: none)."""
    data = body.get("data") if isinstance(body, dict) and body.get("status") == "success" else None
    result = data.get("result") if isinstance(data, dict) else None
    for sample in result if isinstance(result, list) else ():
        labels = sample.get("metric") if isinstance(sample, dict) else None
        if isinstance(labels, dict):
            yield labels


def parse_partitions(body: Any) -> dict[DeviceKey, tuple[str, ...]]:
    """(node, card) -> its MIG UUIDs, sorted, from an answer of `MIG_QUERY` (pure; an unreadable
    answer or sample gives nothing for it)."""
    found: dict[DeviceKey, set[str]] = {}
    for labels in _mig_labels(body):
        node, device, mig = labels.get("node"), labels.get("device"), labels.get("mig_uuid")
        if isinstance(node, str) and isinstance(device, str) and isinstance(mig, str) and mig:
            found.setdefault((node, device), set()).add(mig)
    return {key: tuple(sorted(migs)) for key, migs in found.items()}


def parse_profiles(body: Any) -> dict[str, str]:
    """MIG UUID -> its profile from an answer of `MIG_QUERY` (pure; a sample without a profile,
    or a partition named with two, gives none for it)."""
    found: dict[str, set[str]] = {}
    for labels in _mig_labels(body):
        mig, profile = labels.get("mig_uuid"), labels.get("profile")
        if isinstance(mig, str) and mig and isinstance(profile, str) and profile:
            found.setdefault(mig, set()).add(profile)
    return {mig: next(iter(names)) for mig, names in found.items() if len(names) == 1}


class PrometheusHealth:
    """Device health from Prometheus' HTTP API (urllib, blocking: call it in a thread)."""

    def __init__(self, url: str, *, timeout_seconds: float = 10.0, selector: str = "") -> None:
        """`selector`: a label selector every query carries (`cluster_selector`)."""
        self._url = url.rstrip("/")
        self._timeout = timeout_seconds
        self._selector = selector
        self._healthy_since: dict[DeviceKey, float] = {}

    def snapshot(self, now: float) -> HealthSnapshot:
        try:
            return self._snapshot(now)
        except HealthUnavailable:
            # Nothing vouched for any device while the source was away: every healthy run
            # starts again when it answers (a stability window never spans an outage).
            self._healthy_since = {}
            raise

    def _snapshot(self, now: float) -> HealthSnapshot:
        states = classify(
            self._query(UNHEALTHY_RULE + self._selector), self._query(UNKNOWN_RULE + self._selector)
        )
        if not states:
            # No device at all is a Prometheus without the rules (or without the exporter's
            # series), not a fleet without GPUs: zero eligible devices would switch the
            # breaker off, so it counts as an outage.
            raise HealthUnavailable(f"no series of {UNHEALTHY_RULE} or {UNKNOWN_RULE} at {self._url}")
        # A break (any other state, or no series) forgets the start of the healthy run.
        self._healthy_since = {
            key: self._healthy_since.get(key, now) for key, state in states.items() if state == Health.HEALTHY
        }
        partitions, profiles = self._partitions()
        return HealthSnapshot(
            {key: DeviceHealth(state, self._healthy_since.get(key)) for key, state in states.items()},
            partitions=partitions,
            profiles=profiles,
        )

    def _partitions(self) -> tuple[dict[DeviceKey, tuple[str, ...]], dict[str, str]]:
        """The MIG cards' partitions and their profiles; none when the query fails: it is no
        health evidence, and a record keeps what it knows (`responder.enforce.identity.Identity.applied`)."""
        try:
            body = self._get(mig_query(self._selector))
        except HealthUnavailable:
            return {}, {}
        return parse_partitions(body), parse_profiles(body)

    def _get(self, query: str) -> Any:
        address = f"{self._url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
        try:
            with urllib.request.urlopen(address, timeout=self._timeout) as response:
                return json.loads(response.read())
        except (OSError, ValueError) as exc:
            raise HealthUnavailable(f"query {query} at {self._url}: {exc}") from exc

    def _query(self, query: str) -> dict[DeviceKey, float]:
        return parse_vector(self._get(query), query)
