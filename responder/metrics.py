"""The responder's metric catalog: every family it exposes, declared once.

The rules (`rules/templates/gpu-fleet.yaml.j2`, `gpu-node.yaml.j2`, `gpuhealth-self.yaml.j2`)
already query these names and labels, so they are a contract before the service exists:
tests/rules check every rule against this catalog. The service builds its instruments
from these declarations.
"""

from __future__ import annotations

from gpuhealth.metrics import Catalog, MetricFamily

MIGRATION_OUTCOMES = ("succeeded", "failed", "unrecoverable")
"""Values of `outcome` on `MIGRATIONS` (GPUDeviceMigrationFailed fires on `failed`)."""

WEBHOOK_OUTCOMES = ("accepted", "rejected", "retry", "unauthorized", "too_large")
"""Values of `outcome` on `WEBHOOK_REQUESTS`: accepted (2xx: recorded, duplicate or skipped),
rejected (400: malformed), retry (503: not recorded, Alertmanager delivers again),
unauthorized (401), too_large (413)."""

ALERT_RESULTS = ("recorded", "duplicate", "skipped", "other_cluster", "rejected", "retry")
"""Values of `result` on `WEBHOOK_ALERTS`: other_cluster is an alert of another cluster than the
responder's own (`intake.cluster`), refused and answered 200."""

WEBHOOK_REQUESTS = MetricFamily(
    "gpuhealth_responder_webhook_requests",
    "counter",
    "Alertmanager webhook deliveries handled, by outcome.",
    ("outcome",),
)
BREAKER_TRIPPED = MetricFamily(
    "gpuhealth_breaker_tripped",
    "gauge",
    "1 while the remediation circuit breaker is tripped (quarantines and migrations paused), else 0.",
)
DEVICE_QUARANTINED = MetricFamily(
    "gpuhealth_device_quarantined",
    "gauge",
    "One series (value 1) per device with a quarantine record, by reason and remediation phase.",
    ("node", "device", "reason", "phase"),
)
QUARANTINE_CREATED = MetricFamily(
    "gpuhealth_quarantine_created_timestamp_seconds",
    "gauge",
    "Unix time the device's current quarantine opened (its record is reused for its next one).",
    ("node", "device"),
    unit="seconds",
)
EXTENDER_REQUESTS = MetricFamily(
    "gpuhealth_extender_requests",
    "counter",
    "Scheduler extender filter requests this replica answered, by outcome (ok, error: not "
    "ExtenderArgs). Summed over replicas: whether kube-scheduler calls the extender at all.",
    ("outcome",),
)
EXTENDER_SCHEDULED = MetricFamily(
    "gpuhealth_extender_scheduled_gpu_pods",
    "counter",
    "Pods requesting nvidia.com/gpu that kube-scheduler (schedulerName default-scheduler) bound to "
    "a node, as this replica's capacity cache saw them (every replica sees all: take the max). "
    "Against the extender's requests: pods scheduled while the extender is never called.",
)
DEVICE_HOLD = MetricFamily(
    "gpuhealth_device_hold",
    "gauge",
    "1 per quarantined device-plugin card whose hold gpuhealth keeps (`docs/quarantine.md`, "
    "'The hold'), labelled with where it stands: Held (a holder pod has the card), Filling, "
    "CardBusy (its pods being moved), NotAllocatable (its plugin excludes it), "
    "AllocationUnreadable (the kubelet names no device: only counted out).",
    ("node", "device", "state"),
)
HOLDER_PODS = MetricFamily(
    "gpuhealth_holder_pods",
    "gauge",
    "Holder pods keeping quarantined device-plugin cards, as the leader's last pass counted them "
    "(those of a fill in progress included).",
)
NODE_ESCALATIONS = MetricFamily(
    "gpuhealth_node_escalations",
    "counter",
    "Nodes the leader escalated (tainted gpuhealth.io/node-escalated: no new GPU work), by the "
    "justification that held (cards-failing, driver-gpu-lost; docs/quarantine.md, 'Escalation to "
    "the node').",
    ("justification",),
)
NODES_ESCALATED = MetricFamily(
    "gpuhealth_nodes_escalated",
    "gauge",
    "One series (value 1) per node escalated now, by its justification, as the leader's last pass saw it.",
    ("node", "justification"),
)
MIGRATIONS = MetricFamily(
    "gpuhealth_migrations",
    "counter",
    "Checkpointed workload migrations off quarantined devices, by outcome (succeeded|failed|unrecoverable).",
    ("outcome",),
)
MIGRATION_SECONDS = MetricFamily(
    "gpuhealth_migration_duration_seconds",
    "histogram",
    "Time from a job's move starting to its outcome (succeeded|failed|unrecoverable).",
    ("outcome",),
    unit="seconds",
)
MIGRATION_BUCKETS = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
"""Checkpoint waits run to 10 minutes by default; eviction retries after 429 add minutes more."""
MIGRATION_RECOVERY_SECONDS = MetricFamily(
    "gpuhealth_migration_recovery_seconds",
    "histogram",
    "Time from the first eviction of a job's move to its replacement pods running on healthy devices, "
    "by the quarantined device's path (device-plugin|dra); moves that never recover are not observed.",
    ("path",),
    unit="seconds",
)
MIGRATION_RECOVERY_BUCKETS = (5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0)
"""A replacement is scheduled, pulls its image and restores its checkpoint: seconds to minutes;
the replacement timeout (15 minutes by default) bounds it."""
LEADER = MetricFamily(
    "gpuhealth_responder_leader",
    "gauge",
    "1 while this replica holds the leader Lease and its reconciler may act, else 0.",
)
LEADER_TRANSITIONS = MetricFamily(
    "gpuhealth_responder_leader_transitions",
    "counter",
    "Times this replica started or stopped leading (stopped: after its leader tasks finished).",
)

WEBHOOK_ALERTS = MetricFamily(
    "gpuhealth_responder_webhook_alerts",
    "counter",
    "Alerts in webhook deliveries, by what recording came to "
    "(recorded|duplicate|skipped|other_cluster|rejected|retry).",
    ("result",),
)
WEBHOOK_TRUNCATED = MetricFamily(
    "gpuhealth_responder_webhook_truncated_alerts",
    "counter",
    "Alerts Alertmanager left out of deliveries (truncatedAlerts; the shipped route sets max_alerts: 0).",
)
WEBHOOK_SECONDS = MetricFamily(
    "gpuhealth_responder_webhook_duration_seconds",
    "histogram",
    "Time from a delivery's arrival to its answer, recording included.",
    unit="seconds",
)
RELEASE_OUTCOMES = ("released", "dismissed")
"""Values of `outcome` on `RELEASES`: released (walked Probing..Ramp and the enforcement was
removed), dismissed (deferred while the breaker was open and, re-evaluated after it closed, no
longer failing: nothing was ever enforced). The reconciler ends no record Abandoned (what a
person removes is put back), so no outcome counts it."""

RECORD_OUTCOMES = ("unchanged", "written", "conflict", "error")
"""Values of `outcome` on `RECONCILE_RECORDS`: what one record's turn in a pass came to."""

RELEASES = MetricFamily(
    "gpuhealth_responder_releases",
    "counter",
    "Quarantines that ended, by outcome (released|dismissed).",
    ("outcome",),
)
RATE_LIMITED = MetricFamily(
    "gpuhealth_responder_rate_limited_quarantines",
    "gauge",
    "Quarantine records waiting in Pending for a token of the new-quarantine rate limit.",
)
DECISION_SECONDS = MetricFamily(
    "gpuhealth_responder_decision_duration_seconds",
    "histogram",
    "Time one record's turn in a reconcile pass took: observe, decide, apply the effects, write.",
    unit="seconds",
)
RECONCILE_PASSES = MetricFamily(
    "gpuhealth_responder_reconcile_passes",
    "counter",
    "Reconcile passes over every quarantine record that the leader completed.",
)
RECONCILE_RECORDS = MetricFamily(
    "gpuhealth_responder_reconcile_records",
    "counter",
    "Records handled by reconcile passes, by outcome (unchanged|written|conflict|error).",
    ("outcome",),
)

HEALTH_SOURCE_UP = MetricFamily(
    "gpuhealth_responder_health_source_up",
    "gauge",
    "1 when the leader's last reconcile pass read device health from its source (Prometheus), "
    "0 when that read failed (firing alerts are still enforced and moved, releases wait); "
    "0 on replicas that do not lead.",
)
QUARANTINED_SECONDS = MetricFamily(
    "gpuhealth_quarantined_device_seconds",
    "counter",
    "Device-seconds of capacity the leader saw excluded by enforced quarantines, by node, reason and "
    "phase (Quarantined, DeviceInUse, each rung of the release ladder); counted by the leader from its "
    "passes (responder.reconcile.measures).",
    ("node", "reason", "phase"),
    unit="seconds",
)
QUARANTINES_ENDED = MetricFamily(
    "gpuhealth_quarantines_ended",
    "counter",
    "Enforced quarantines that ended (released or abandoned), by the verdict of their evidence "
    "(confirmed|unconfirmed|restricted-unknown: responder.verdicts) and reason.",
    ("verdict", "reason"),
)
MIGRATION_WORK_LOST = MetricFamily(
    "gpuhealth_migration_work_lost_seconds",
    "histogram",
    "Work each evicted pod of a move had done since its last checkpoint (since=checkpoint, from the "
    "gpuhealth.io/last-checkpoint-time annotation) or, without one, since it started (since=start).",
    ("since",),
    unit="seconds",
)
WORK_LOST_BUCKETS = (1.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
"""A checkpoint taken for the move loses seconds; a pod that never checkpoints loses its whole run."""

CHECK_VERDICTS = ("passed", "failed")
RELEASE_CHECKS = MetricFamily(
    "gpuhealth_release_checks",
    "counter",
    "Verdicts of the release ladder's checks on quarantined devices: the probe, the canary and, where "
    "the reset hand-off is on, the GPU reset (check=probe|canary|reset), passed or failed (a timeout "
    "fails); counted by the leader once per attempt, when it records the verdict (status.lastCheck).",
    ("check", "verdict"),
)

HTTP_REFUSED = MetricFamily(
    "gpuhealth_http_requests_refused",
    "counter",
    "Requests refused by the web configuration (--web.config.file), by reason: unauthorized, "
    "rate_limited, client_certificate (the webhook's own bearer token refusals are webhook_requests').",
    ("reason",),
)
WEB_CONFIG_RELOAD_FAILURES = MetricFamily(
    "gpuhealth_web_config_reload_failures",
    "counter",
    "Changes of the web configuration file not applied (bad, or needing a restart); the previous one serves.",
)

CATALOG = Catalog(
    (
        HTTP_REFUSED,
        WEB_CONFIG_RELOAD_FAILURES,
        WEBHOOK_REQUESTS,
        WEBHOOK_ALERTS,
        WEBHOOK_TRUNCATED,
        WEBHOOK_SECONDS,
        BREAKER_TRIPPED,
        DEVICE_QUARANTINED,
        QUARANTINE_CREATED,
        MIGRATIONS,
        MIGRATION_SECONDS,
        MIGRATION_RECOVERY_SECONDS,
        LEADER,
        LEADER_TRANSITIONS,
        RELEASES,
        RATE_LIMITED,
        DECISION_SECONDS,
        RECONCILE_PASSES,
        RECONCILE_RECORDS,
        HEALTH_SOURCE_UP,
        DEVICE_HOLD,
        HOLDER_PODS,
        NODE_ESCALATIONS,
        NODES_ESCALATED,
        EXTENDER_REQUESTS,
        EXTENDER_SCHEDULED,
        QUARANTINED_SECONDS,
        QUARANTINES_ENDED,
        MIGRATION_WORK_LOST,
        RELEASE_CHECKS,
    )
)
"""Every family the responder exposes."""
