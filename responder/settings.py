"""The responder's settings: one tree, each field with its default, unit and reasons.

The command line builds it (`responder.cli`); tests build it directly. Nothing here reads the
environment or a file: the token is read by the entry point and handed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpuhealth import fields, yaml_keys
from gpuhealth.http import ServerSettings
from gpuhealth.kube.lease import ElectionSettings
from gpuhealth.tls import TlsSettings
from responder.checks.jobs import CheckSettings
from responder.enforce.hold import HoldSettings
from responder.extender.capacity import CacheSettings
from responder.migrate.executor import MigratorSettings
from responder.migrate.plan import Mode
from responder.reconcile.reconciler import ReconcilerSettings
from responder.reset.handoff import ResetSettings
from responder.webhook.intake import IntakeSettings

DEFAULT_PORT = 8080
"""The port the shipped Alertmanager route and the extender snippet name (`docs/quarantine.md`)."""


def _server() -> ServerSettings:
    return ServerSettings(port=DEFAULT_PORT)


def _mode(value: Any) -> Mode:
    try:
        return Mode(value)
    except ValueError:
        choices = ", ".join(m.value for m in Mode)
        raise yaml_keys.Invalid(f"{value!r} is not a migration mode ({choices})") from None


def _modes(value: Any) -> dict[str, Mode]:
    if not isinstance(value, dict):
        raise yaml_keys.Invalid(f"{value!r} must map namespaces to modes")
    out = {}
    for namespace, mode in value.items():
        if not isinstance(namespace, str) or not namespace:
            raise yaml_keys.Invalid(f"{namespace!r} is not a namespace name")
        try:
            out[namespace] = _mode(mode)
        except yaml_keys.Invalid as exc:
            raise yaml_keys.Invalid(f"{namespace}: {exc}") from None
    return out


_MIGRATION_KEYS = yaml_keys.inner(
    migration__checkpoint_timeout_seconds=("migration.checkpoint_timeout", yaml_keys.duration),
    migration__lease_margin_seconds=("migration.lease_margin", yaml_keys.duration),
    migration__lease_cap_seconds=("migration.lease_cap", yaml_keys.duration),
    migration__replacement_timeout_seconds=("migration.replacement_timeout", yaml_keys.duration),
    default_mode=("migration.default_mode", _mode),
    modes=("migration.namespace_modes", _modes),
    node_in_flight=("migration.node_in_flight", yaml_keys.whole(1)),
    node_per_hour=("migration.node_per_hour", yaml_keys.whole(1)),
    namespace_evictions_per_hour=("migration.namespace_evictions_per_hour", yaml_keys.whole(1)),
)
"""`migration`'s keys, named on the field holding the migrator's settings: their classes
(`responder.migrate`) are the migrator's own and carry no keys."""
_HOLD_KEYS = yaml_keys.inner(
    enabled=("hold.enabled", yaml_keys.flag),
    image=("hold.image", yaml_keys.text),
    priority_class=("hold.priority_class", yaml_keys.object_name("a PriorityClass name, or empty for none")),
    fill_timeout_seconds=("hold.fill_timeout", yaml_keys.duration),
    refill_seconds=("hold.refill", yaml_keys.duration),
    ramp_fill_seconds=("hold.ramp_fill", yaml_keys.duration),
)
"""`hold`'s keys, named on the field holding the hold's settings (`responder.enforce.hold`,
enforcement's own, carries none)."""


@dataclass(frozen=True)
class ResponderSettings:
    token: str
    """The webhook's bearer token (the content of `--token-file`). There is no open mode."""
    identity: str
    """This replica's name among the candidates for leadership (a Pod's name is unique)."""
    prometheus_url: str
    """Where the device health the reconciler reads comes from (the shipped recording rules)."""
    namespace: str = "gpuhealth-system"
    """The responder's own namespace: its leader Lease, the breaker's ConfigMap, check Jobs."""
    kubeconfig: str | None = None
    """Kubeconfig file; None uses the in-cluster service account (or the default kubeconfig)."""
    dry_run: bool = False
    """Record and decide everything, enforce nothing (DRA rules with effect None)."""
    server: ServerSettings = field(default_factory=_server)
    tls: TlsSettings | None = None
    """Serve HTTPS with this certificate and key (reloaded when rotated); None: plain HTTP."""
    webhook_max_body_bytes: int = 1024 * 1024
    """Largest webhook delivery accepted (413 beyond)."""
    extender_max_body_bytes: int = 64 * 1024 * 1024
    """Largest scheduler extender request accepted (413 beyond). Without nodeCacheCapable the
    scheduler sends every candidate Node object (a few KiB each, more with many images): 64 MiB
    holds thousands; nodeCacheCapable (names only) is the configuration we ship."""
    capacity: CacheSettings = field(default_factory=CacheSettings)
    """The extender's Node and Pod cache (list+watch)."""
    election: ElectionSettings = field(default_factory=ElectionSettings)
    intake: IntakeSettings = field(default_factory=IntakeSettings)
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)
    migrator: MigratorSettings = field(default_factory=MigratorSettings, metadata=_MIGRATION_KEYS)
    checks: CheckSettings = field(default_factory=CheckSettings)
    hold: HoldSettings = field(default_factory=HoldSettings, metadata=_HOLD_KEYS)
    """Device plugins: the holder pods that keep a quarantined card allocated to gpuhealth."""
    reset: ResetSettings = field(default_factory=ResetSettings)
    """The reset controller's request kind, used only where the ladder has the reset rung
    (`reset.enabled`: `responder.ladder.with_reset`)."""
    ramp_pods: int = field(default=1, metadata=yaml_keys.key("policy.ramp_pods", yaml_keys.whole(1)))
    """Device plugins: pods labelled `gpuhealth.io/canary-ok: "true"` the scheduler extender admits
    to a node for each of its devices on the ramp, at a time (every other pod still counts the
    device out); on DRA the device's one allocation is the bound. 1: one workload's bounded load
    before the release opens the device to all."""

    def __post_init__(self) -> None:
        for name in ("token", "identity", "prometheus_url", "namespace"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise fields.SettingsError(f"ResponderSettings.{name} must not be empty")
        if not self.prometheus_url.startswith(("http://", "https://")):
            raise fields.SettingsError(
                f"ResponderSettings.prometheus_url must be an http(s) URL, not {self.prometheus_url!r}"
            )
        fields.within(self, "webhook_max_body_bytes", "bytes", 1024, 64 * 1024 * 1024, whole=True)
        fields.within(self, "extender_max_body_bytes", "bytes", 1024, 1024 * 1024 * 1024, whole=True)
        fields.within(self, "ramp_pods", "pods", 1, 64, whole=True)
        for rung in self.reconciler.policy.ladder.checks():
            self.checks.spec(rung.name)  # every check rung has what its pod runs, or no start
