"""The gpuhealth dashboards: Fleet, Device, Remediation, Pipeline health and Workload layers.

Every query reads only series that exist: the exporter's catalog (`exporter.metrics`), the
responder's (`responder.metrics`), the recording rules of rules/prometheus (preferred where
one exists: Grafana then reads what the alerts read), and Prometheus' and Alertmanager's own
series. Every selector names its scrape job, or is a recording rule built on job-filtered
selectors; `cluster="$cluster"` on every selector keeps one dashboard per cluster when several
share a Prometheus (an empty `cluster` matches series without the label, the single-cluster
case). Counters appear only inside rate()/increase() (or resets(), which counts restarts),
over `$__rate_interval`. Per-device legends start with the node: GPU indexes repeat on
every node, so "GPU 0" alone names nothing.

The UIDs are stable: links, bookmarks and alert annotations point at them.
"""

from __future__ import annotations

from dashboards.sdk import Dashboard, Panel, Query, QueryVariable, Row
from dashboards.settings import Settings
from responder.ladder import KNOWN
from responder.reconcile.measures import measured_phases
from responder.records import ENDED_PHASES, PHASES, Phase
from responder.verdicts import QuarantineVerdict

CLUSTER = 'cluster="$cluster"'
"""Every query's cluster matcher. The label name is fixed at `cluster`, the shipped
rules/config.yaml `selectors.cluster_label` (tests/dashboards check that they agree): a site whose
Prometheus names its clusters by another label relabels it to `cluster` for the dashboards
(docs/multi-cluster.md)."""
DEVICE = 'cluster="$cluster", node="$node", device="$device"'
RATE = "[$__rate_interval]"
PER_DEVICE = "{{node}} {{device}}"

UIDS = {
    "fleet": "gpuhealth-fleet",
    "device": "gpuhealth-device",
    "remediation": "gpuhealth-remediation",
    "pipeline": "gpuhealth-pipeline",
    "workload": "gpuhealth-workload",
}
"""File stem -> dashboard UID (dashboards/<stem>.json)."""

RELEASE_PHASES = "|".join((Phase.QUARANTINED, *KNOWN.phases))
"""Phases of an enforced quarantine on its way back (Quarantined and the release ladder's rungs,
the optional reset's included: a responder without it never reports that phase)."""
REPORTED_PHASES = ", ".join(p for p in PHASES if p not in ENDED_PHASES)
"""Phases the responder reports a series for (a released or abandoned record has none)."""
WAY_BACK = f"{Phase.QUARANTINED}, then {', '.join(KNOWN.phases[:-1])} and {KNOWN.phases[-1]}"


def _job(job: str, extra: str = "") -> str:
    return f'job="{job}", {CLUSTER}' + (f", {extra}" if extra else "")


def _cluster_variable(settings: Settings) -> QueryVariable:
    return QueryVariable(
        name="cluster",
        label="Cluster",
        query=f'label_values(up{{job="{settings.exporter_job}"}}, cluster)',
        description=(
            "The cluster label of a Prometheus shared by several clusters; hidden, and empty "
            "(matching series without the label) where Prometheus serves one cluster."
        ),
        hidden=True,
    )


def fleet(settings: Settings) -> Dashboard:
    r = settings.responder_job
    health = Row(
        "Device health",
        (
            Panel(
                "timeseries",
                "Devices by effective state",
                "GPU devices counted by effective state (recording rule state:gpu_devices_effective:count): "
                "Unhealthy as reported, Unknown when reported Unknown or when the report is older than the "
                "heartbeat limit, Healthy otherwise. A Healthy report that went stale counts as Unknown.",
                "short",
                (Query(f"state:gpu_devices_effective:count{{{CLUSTER}}}", "{{state}}"),),
                stacked=True,
                min=0,
            ),
            Panel(
                "heatmap",
                "Status age distribution",
                "How old each device's last confirmed status report is, as a distribution over devices "
                "(node_device:gpu_device_status_age_seconds:min). A band moving up is a fleet whose reports "
                "go stale: past the heartbeat limit those devices count as Unknown.",
                "s",
                (Query(f"node_device:gpu_device_status_age_seconds:min{{{CLUSTER}}}", PER_DEVICE),),
            ),
            Panel(
                "timeseries",
                "Status age quantiles",
                "Fleet quantiles and maximum of the per-device status age "
                "(fleet:gpu_device_status_age_seconds:*).",
                "s",
                (
                    Query(f"fleet:gpu_device_status_age_seconds:quantile{{{CLUSTER}}}", "p{{quantile}}"),
                    Query(f"fleet:gpu_device_status_age_seconds:max{{{CLUSTER}}}", "max"),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Unknown duration",
                "How long each effectively Unknown device has been Unknown "
                "(node_device:gpu_device_unknown_duration:seconds), and the fleet's longest. Allocation is "
                "restricted only once a device stays Unknown for the whole tolerance window.",
                "s",
                (
                    Query(f"node_device:gpu_device_unknown_duration:seconds{{{CLUSTER}}}", PER_DEVICE),
                    Query(f"fleet:gpu_device_unknown_duration_seconds:max{{{CLUSTER}}}", "longest"),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Quarantined (idle) capacity",
                "Devices whose quarantine is enforced (every phase but Pending and Deferred): capacity that "
                "takes no new work. Fleet total and per node (recording rules "
                "*:gpuhealth_devices_quarantined:count).",
                "short",
                (
                    Query(f"fleet:gpuhealth_devices_quarantined:count{{{CLUSTER}}}", "fleet"),
                    Query(f"node:gpuhealth_devices_quarantined:count{{{CLUSTER}}}", "{{node}}"),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "GPU-hours lost to quarantine (last day)",
                "GPU-hours of capacity that enforced quarantines kept out of service over the last day, for "
                f"the fleet and by phase ({', '.join(measured_phases())}): Ramp takes opted-in work and "
                "DeviceInUse its holder's, so they are shown apart (recording rules "
                "*:gpuhealth_quarantined_device_hours:increase1d).",
                "h",
                (
                    Query(f"fleet:gpuhealth_quarantined_device_hours:increase1d{{{CLUSTER}}}", "fleet"),
                    Query(
                        "sum by (phase) "
                        f"(reason_phase:gpuhealth_quarantined_device_hours:increase1d{{{CLUSTER}}})",
                        "{{phase}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "stat",
                "Remediation breaker",
                "1 while the responder's circuit breaker is tripped: new automatic quarantines and "
                "migrations are paused until a person resets it (`gpuhealth breaker reset`).",
                "bool",
                (Query(f"max(gpuhealth_breaker_tripped{{{_job(r)}}})", "tripped"),),
                width=6,
            ),
            Panel(
                "bargauge",
                "Top nodes by trouble",
                "Nodes with the most devices effectively Unknown or reported Unhealthy right now "
                "(node:gpu_devices_effective_unknown:sum + node:gpu_devices_reported_unhealthy:sum).",
                "short",
                (
                    Query(
                        f"topk(10, node:gpu_devices_effective_unknown:sum{{{CLUSTER}}} "
                        f"+ on (node) node:gpu_devices_reported_unhealthy:sum{{{CLUSTER}}})",
                        "{{node}}",
                        instant=True,
                    ),
                ),
                width=6,
            ),
        ),
    )
    business = Row(
        "Business SLO: the workloads' own errors (not device health)",
        (
            Panel(
                "timeseries",
                "Workload error ratio",
                "Failed over all requests of the workloads, fleet-wide and by namespace, from their own "
                "counters (rules/config.yaml `workloads`; recording rules *:workload_error_ratio:rate5m). "
                "Read apart from device health: a healthy fleet can serve errors, and a quarantine need not "
                "cost any.",
                "percentunit",
                (
                    Query(f"fleet:workload_error_ratio:rate5m{{{CLUSTER}}}", "fleet"),
                    Query(f"namespace:workload_error_ratio:rate5m{{{CLUSTER}}}", "{{namespace}}"),
                ),
                min=0,
                max=1,
            ),
            Panel(
                "timeseries",
                "Workload error ratio by device held",
                "The error ratio of the pods each GPU holds (node_device:workload_error_ratio:rate5m, "
                "joined through gpu_device_allocation_info; a multi-GPU pod counts on each of its devices), "
                "the ten highest. A device whose holders fail while it reports Healthy is worth a look; "
                "nothing acts on this panel.",
                "percentunit",
                (
                    Query(
                        f"topk(10, node_device:workload_error_ratio:rate5m{{{CLUSTER}}})",
                        PER_DEVICE,
                    ),
                ),
                min=0,
                max=1,
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["fleet"],
        title="gpuhealth / Fleet",
        description=(
            "GPU device health across the fleet, quarantined capacity, and apart from it the business SLO."
        ),
        tags=("gpuhealth",),
        variables=(_cluster_variable(settings),),
        rows=(health, business),
    )


def device(settings: Settings) -> Dashboard:
    e, r = settings.exporter_job, settings.responder_job
    dev = f'job="{e}", {DEVICE}'
    state = Row(
        "State",
        (
            Panel(
                "state-timeline",
                "State timeline",
                "The status the kubelet reports (1 while it is the current one), whether the device counts "
                "as "
                "effectively Unknown (1) under the heartbeat limit, and whether NVML answers for it (node "
                "mode).",
                "none",
                (
                    Query(
                        f"max by (node, device, status) (gpu_device_health{{{dev}}}) == 1",
                        PER_DEVICE + " reported {{status}}",
                    ),
                    Query(
                        f"node_device:gpu_device_effective_unknown:bool{{{DEVICE}}}",
                        PER_DEVICE + " effectively Unknown",
                    ),
                    Query(f"gpu_nvml_up{{{dev}}}", PER_DEVICE + " NVML up"),
                ),
                width=24,
            ),
            Panel(
                "timeseries",
                "Status age",
                "Seconds since the device's status was last confirmed fresh, and the age of its node's "
                "kubelet "
                "Lease. Past the heartbeat limit the device counts as Unknown, whatever it last reported.",
                "s",
                (
                    Query(
                        f"node_device:gpu_device_status_age_seconds:min{{{DEVICE}}}", PER_DEVICE + " status"
                    ),
                    Query(
                        f'gpu_node_kubelet_lease_age_seconds{{job="{e}", {CLUSTER}, node="$node"}}',
                        "{{node}} kubelet Lease",
                    ),
                ),
                width=24,
                min=0,
            ),
        ),
    )
    nvml = Row(
        "NVML readings (node-mode exporter)",
        (
            Panel(
                "timeseries",
                "XID events",
                "XID critical errors NVML reported per interval, by code. Fatal codes (rules/config.yaml "
                "device.fatal_xids) quarantine the device; application codes (13, 31, 43, 45, 68) never do.",
                "short",
                (
                    Query(
                        f"sum by (node, device, xid) (increase(gpu_nvml_xid_errors_total{{{dev}}}{RATE}))",
                        PER_DEVICE + " XID {{xid}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "ECC errors",
                "Volatile ECC errors per interval, corrected and uncorrected. Any uncorrected error "
                "quarantines the device.",
                "short",
                (
                    Query(
                        f"sum by (node, device, type) (increase(gpu_nvml_ecc_errors_total{{{dev}}}{RATE}))",
                        PER_DEVICE + " {{type}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Remapped rows",
                "Remapped memory rows (correctable, uncorrectable) and the pending and failure flags; a "
                "remapping failure quarantines the device.",
                "short",
                (Query(f"gpu_nvml_remapped_rows{{{dev}}}", PER_DEVICE + " {{type}}"),),
                width=8,
                min=0,
            ),
            Panel(
                "timeseries",
                "Temperature",
                "GPU core temperature.",
                "celsius",
                (Query(f"gpu_nvml_temperature_celsius{{{dev}}}", PER_DEVICE),),
                width=8,
            ),
            Panel(
                "timeseries",
                "Power",
                "GPU power draw.",
                "watt",
                (Query(f"gpu_nvml_power_watts{{{dev}}}", PER_DEVICE),),
                width=8,
                min=0,
            ),
        ),
    )
    holders = Row(
        "Holders and quarantine",
        (
            Panel(
                "table",
                "Pods and claims that held it",
                "Every container allocated the device within the dashboard's time range, with its "
                "resource and DRA claim (gpu_device_allocation_info).",
                "none",
                (
                    Query(
                        "max by (node, device, namespace, pod, container, resource, claim) "
                        f"(max_over_time(gpu_device_allocation_info{{{dev}}}[$__range]))",
                        PER_DEVICE + " {{namespace}}/{{pod}}",
                        instant=True,
                        table=True,
                    ),
                ),
                width=24,
            ),
            Panel(
                "timeseries",
                "Error ratio of the workloads on it",
                "The business SLO beside the device, never mixed into its health: failed over all requests "
                "of the pods that hold it (node_device:workload_error_ratio:rate5m) and of each of them "
                "(namespace_pod:workload_error_ratio:rate5m), from the workloads' own counters "
                "(rules/config.yaml `workloads`). Errors that stop when a pod moves off the device point "
                "at the device; errors that follow the pod point at the workload.",
                "percentunit",
                (
                    Query(f"node_device:workload_error_ratio:rate5m{{{DEVICE}}}", PER_DEVICE + " holders"),
                    Query(
                        f"namespace_pod:workload_error_ratio:rate5m{{{CLUSTER}}} "
                        f"and on (namespace, pod) gpu_device_allocation_info{{{dev}}}",
                        "{{namespace}}/{{pod}}",
                    ),
                ),
                width=24,
                min=0,
                max=1,
            ),
            Panel(
                "state-timeline",
                "Quarantine history",
                "The device's quarantine phase over time, with the reason (one series per phase the "
                f"responder reported: {REPORTED_PHASES}).",
                "none",
                (
                    Query(
                        "max by (node, device, phase, reason) "
                        f'(gpuhealth_device_quarantined{{job="{r}", {DEVICE}}})',
                        PER_DEVICE + " {{phase}} ({{reason}})",
                    ),
                ),
                width=16,
            ),
            Panel(
                "stat",
                "Quarantine opened",
                "When the device's current quarantine opened (its record is reused for the next one).",
                "dateTimeAsIso",
                (
                    Query(
                        "max by (node, device) "
                        f'(gpuhealth_quarantine_created_timestamp_seconds{{job="{r}", {DEVICE}}}) * 1000',
                        PER_DEVICE,
                    ),
                ),
                width=8,
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["device"],
        title="gpuhealth / Device",
        description=(
            "One GPU device: reported and effective state, status age, NVML readings, holders, quarantine."
        ),
        tags=("gpuhealth",),
        variables=(
            _cluster_variable(settings),
            QueryVariable(
                "node",
                "Node",
                f'label_values(gpu_device_info{{job="{e}", {CLUSTER}}}, node)',
                "The node the device is on.",
            ),
            QueryVariable(
                "device",
                "Device",
                f'label_values(gpu_device_info{{job="{e}", {CLUSTER}, node="$node"}}, device)',
                "The device: GPU UUID (device plugins) or driver/pool/device (DRA).",
            ),
        ),
        rows=(state, nvml, holders),
    )


def remediation(settings: Settings) -> Dashboard:
    r = settings.responder_job
    unconfirmed = _job(r, f'verdict="{QuarantineVerdict.UNCONFIRMED}"')
    on_the_way_back = _job(r, f'phase=~"{RELEASE_PHASES}"')
    quarantines = Row(
        "Quarantines",
        (
            Panel(
                "timeseries",
                "Quarantines by reason and phase",
                "Quarantine records that are not over, by the alert that opened them and their phase.",
                "short",
                (
                    Query(
                        f"count by (reason, phase) (gpuhealth_device_quarantined{{{_job(r)}}})",
                        "{{phase}}: {{reason}}",
                    ),
                ),
                stacked=True,
                min=0,
            ),
            Panel(
                "timeseries",
                "False-quarantine rate",
                "Share of ended quarantines whose evidence never confirmed a fault (verdict unconfirmed: "
                "the triggering alert was all there was, and the device passed its checks at the first "
                "attempt), against every enforced quarantine that ended (docs/quarantine.md, Verdicts).",
                "percentunit",
                (
                    Query(
                        f"sum(increase(gpuhealth_quarantines_ended_total{{{unconfirmed}}}{RATE}))"
                        f" / sum(increase(gpuhealth_quarantines_ended_total{{{_job(r)}}}{RATE}))",
                        "unconfirmed",
                    ),
                ),
                min=0,
                max=1,
            ),
            Panel(
                "timeseries",
                "Ended quarantines by verdict",
                "Enforced quarantines that ended per interval, by what their evidence says: confirmed (a "
                "check failed, a relapse, the device's own error record, a corroborating Unhealthy report), "
                "unconfirmed, restricted-unknown (a restriction for Unknown that recovered).",
                "short",
                (
                    Query(
                        f"sum by (verdict) (increase(gpuhealth_quarantines_ended_total{{{_job(r)}}}{RATE}))",
                        "{{verdict}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "GPU-hours lost by reason and phase (last day)",
                "GPU-hours of capacity enforced quarantines kept out of service over the last day, by the "
                "reason that opened them and the phase they stood in "
                "(reason_phase:gpuhealth_quarantined_device_hours:increase1d).",
                "h",
                (
                    Query(
                        f"reason_phase:gpuhealth_quarantined_device_hours:increase1d{{{CLUSTER}}}",
                        "{{phase}}: {{reason}}",
                    ),
                ),
                stacked=True,
                min=0,
            ),
            Panel(
                "timeseries",
                "Rate-limited quarantines",
                "Records waiting in Pending for a token of the new-quarantine rate limit.",
                "short",
                (Query(f"max(gpuhealth_responder_rate_limited_quarantines{{{_job(r)}}})", "waiting"),),
                min=0,
            ),
            Panel(
                "timeseries",
                "Breaker trips",
                "1 while the remediation circuit breaker is tripped (new quarantines and migrations paused), "
                "0 while it is closed; only a person resets it.",
                "short",
                (Query(f"max(gpuhealth_breaker_tripped{{{_job(r)}}})", "tripped"),),
                min=0,
                max=1,
            ),
        ),
    )
    flows = Row(
        "Migrations and releases",
        (
            Panel(
                "timeseries",
                "Migrations by outcome",
                "Checkpointed workload migrations off quarantined devices per interval, and over the last "
                "hour "
                "(recording rule outcome:gpuhealth_migrations:increase1h).",
                "short",
                (
                    Query(
                        f"sum by (outcome) (increase(gpuhealth_migrations_total{{{_job(r)}}}{RATE}))",
                        "{{outcome}}",
                    ),
                    Query(f"outcome:gpuhealth_migrations:increase1h{{{CLUSTER}}}", "{{outcome}} (last hour)"),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Migration duration",
                "Time from a job's move starting to its outcome (checkpoint, eviction, re-placement), "
                "50th and 99th percentile by outcome. Long moves are checkpoints that take long or "
                "evictions a PodDisruptionBudget holds back.",
                "s",
                tuple(
                    Query(
                        f"histogram_quantile({q}, sum by (le, outcome) "
                        f"(rate(gpuhealth_migration_duration_seconds_bucket{{{_job(r)}}}{RATE})))",
                        f"{{{{outcome}}}} p{round(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Migration recovery",
                "Time from the first eviction of a job's move to its replacement pods running on "
                "healthy devices (the job serving again), 50th and 99th percentile by path. Moves "
                "whose replacements never ran count as failed migrations instead.",
                "s",
                tuple(
                    Query(
                        f"histogram_quantile({q}, sum by (le, path) "
                        f"(rate(gpuhealth_migration_recovery_seconds_bucket{{{_job(r)}}}{RATE})))",
                        f"{{{{path}}}} p{round(q * 100)}",
                    )
                    for q in (0.5, 0.99)
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Release pipeline phases",
                f"Enforced quarantines by phase on the way back: {WAY_BACK}. A Healthy report alone "
                "never moves a device along.",
                "short",
                (
                    Query(
                        f"count by (phase) (gpuhealth_device_quarantined{{{on_the_way_back}}})",
                        "{{phase}}",
                    ),
                ),
                stacked=True,
                min=0,
            ),
            Panel(
                "timeseries",
                "Releases by outcome",
                "Quarantines that ended per interval: released (walked every check), dismissed (never "
                "enforced).",
                "short",
                (
                    Query(
                        f"sum by (outcome) (increase(gpuhealth_responder_releases_total{{{_job(r)}}}{RATE}))",
                        "{{outcome}}",
                    ),
                ),
                min=0,
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["remediation"],
        title="gpuhealth / Remediation",
        description="What the responder does: quarantines, migrations, releases, rate limits, the breaker.",
        tags=("gpuhealth",),
        variables=(_cluster_variable(settings),),
        rows=(quarantines, flows),
    )


def pipeline(settings: Settings) -> Dashboard:
    e, r, a = settings.exporter_job, settings.responder_job, settings.alertmanager_job
    ours = f'job=~"{e}|{r}", {CLUSTER}'
    webhooks = _job(a, 'integration="webhook"')
    exporter = Row(
        "Exporter",
        (
            Panel(
                "timeseries",
                "Watch lag",
                "Seconds since each exporter applied its latest watch event. It grows while the cluster is "
                "quiet, too; read it with the event rate beside it.",
                "s",
                (
                    Query(
                        f"time() - (gpuhealth_exporter_last_event_timestamp_seconds{{{_job(e)}}} > 0)",
                        "{{node}} {{instance}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Watch events",
                "Watch events received per second, by resource and event type.",
                "ops",
                (
                    Query(
                        f"sum by (node, instance, resource, type) "
                        f"(rate(gpuhealth_exporter_watch_events_total{{{_job(e)}}}{RATE}))",
                        "{{node}} {{resource}} {{type}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Watch restarts and relists",
                "Watches restarted per interval, by reason: expired (410 Gone: a full relist), closed (the "
                "server ended the watch; it resumes), error.",
                "short",
                (
                    Query(
                        f"sum by (node, instance, resource, reason) "
                        f"(increase(gpuhealth_exporter_watch_restarts_total{{{_job(e)}}}{RATE}))",
                        "{{node}} {{resource}} {{reason}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Exporter restarts",
                "Exporter process restarts per interval, seen as resets of its watch event counters.",
                "short",
                (
                    Query(
                        "max by (node, instance) "
                        f"(resets(gpuhealth_exporter_watch_events_total{{{_job(e)}}}{RATE}))",
                        "{{node}} {{instance}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Scrape duration",
                "How long Prometheus takes to scrape each exporter and responder target.",
                "s",
                (Query(f"scrape_duration_seconds{{{ours}}}", "{{job}} {{node}} {{instance}}"),),
                min=0,
            ),
            Panel(
                "timeseries",
                "Scrape size",
                "Samples each exporter and responder target exposes per scrape.",
                "short",
                (Query(f"scrape_samples_scraped{{{ours}}}", "{{job}} {{node}} {{instance}}"),),
                min=0,
            ),
        ),
    )
    responder = Row(
        "Responder and Alertmanager",
        (
            Panel(
                "timeseries",
                "Webhook outcomes",
                "Alertmanager deliveries the responder answered, by outcome (recording rule "
                "outcome:gpuhealth_responder_webhook_requests:rate5m): accepted, rejected (400), retry (503: "
                "Alertmanager delivers again), unauthorized, too_large.",
                "reqps",
                (Query(f"outcome:gpuhealth_responder_webhook_requests:rate5m{{{CLUSTER}}}", "{{outcome}}"),),
                min=0,
            ),
            Panel(
                "timeseries",
                "Alerts in deliveries",
                "Alerts in webhook deliveries per second, by what recording came to.",
                "ops",
                (
                    Query(
                        "sum by (result) "
                        f"(rate(gpuhealth_responder_webhook_alerts_total{{{_job(r)}}}{RATE}))",
                        "{{result}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Alertmanager webhook notifications",
                "Webhook notifications Alertmanager sent and those that failed after its retries. "
                "Alertmanager 0.35 labels these by integration, not by receiver, so this covers every "
                "webhook receiver, the responder's included.",
                "ops",
                (
                    Query(
                        "sum by (instance) "
                        f"(rate(alertmanager_notifications_failed_total{{{webhooks}}}{RATE}))",
                        "failed {{instance}}",
                    ),
                    Query(
                        f"sum by (instance) (rate(alertmanager_notifications_total{{{webhooks}}}{RATE}))",
                        "sent {{instance}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Responder leader",
                "1 for the replica that holds the leader Lease and reconciles; exactly one should, at all "
                "times. Leader transitions per interval beside it.",
                "short",
                (
                    Query(
                        f"max by (instance) (gpuhealth_responder_leader{{{_job(r)}}})", "leader {{instance}}"
                    ),
                    Query(
                        "sum by (instance) "
                        f"(increase(gpuhealth_responder_leader_transitions_total{{{_job(r)}}}{RATE}))",
                        "transitions {{instance}}",
                    ),
                ),
                min=0,
            ),
            Panel(
                "timeseries",
                "Targets up",
                "Scrape targets up, per job: the exporters, the responder replicas and Alertmanager.",
                "short",
                (Query(f'sum by (job) (up{{job=~"{e}|{r}|{a}", {CLUSTER}}})', "{{job}}"),),
                width=24,
                min=0,
            ),
        ),
    )
    return Dashboard(
        uid=UIDS["pipeline"],
        title="gpuhealth / Pipeline health",
        description=(
            "Whether gpuhealth itself works: exporter watches and scrapes, webhook deliveries, the leader."
        ),
        tags=("gpuhealth",),
        variables=(_cluster_variable(settings),),
        rows=(exporter, responder),
    )


WORKLOAD = 'cluster="$cluster", namespace=~"$namespace", pod=~"$pod"'
PER_POD = "{{namespace}}/{{pod}}"


def _layer(title: str, description: str, unit: str, query: Query, maximum: float | None = None) -> Panel:
    return Panel("timeseries", title, description, unit, (query,), width=6, min=0, max=maximum)


def workload(settings: Settings) -> Dashboard:
    """One row per GPU pod with its four layers, one panel each, never two in one (docs/layers.md)."""
    layers = Row(
        "$namespace / $pod: allocation, device health, readiness, business SLO",
        (
            _layer(
                "Allocation (platform)",
                "1 while the pod asks for GPUs and is unscheduled or refused at the kubelet's admission "
                "(kube-state-metrics; namespace_pod:gpu_workload_unallocated:bool). The platform's: "
                "capacity, quarantines, device classes. GPUWorkloadUnallocated.",
                "bool",
                Query(f"namespace_pod:gpu_workload_unallocated:bool{{{WORKLOAD}}}", PER_POD),
                1,
            ),
            _layer(
                "Device health (platform)",
                "Devices the pod holds that are Unhealthy or effectively Unknown, 0 when all are Healthy "
                "(gpuhealth's devices joined through gpu_device_allocation_info; "
                "namespace_pod:gpu_workload_devices_not_healthy:count). The platform's; the GPUDevice* "
                "alerts and the responder act on the devices.",
                "short",
                Query(f"namespace_pod:gpu_workload_devices_not_healthy:count{{{WORKLOAD}}}", PER_POD),
            ),
            _layer(
                "Readiness (tenant)",
                "Containers of the running pod that are not ready (kube-state-metrics; "
                "namespace_pod:gpu_workload_containers_unready:count). The tenant's: its probes. "
                "GPUWorkloadNotReady, only while every device the pod holds is Healthy.",
                "short",
                Query(f"namespace_pod:gpu_workload_containers_unready:count{{{WORKLOAD}}}", PER_POD),
            ),
            _layer(
                "Business SLO (tenant)",
                "Failed over all requests of the pod, from the workloads' own counters "
                "(namespace_pod:gpu_workload_error_ratio:rate5m). The tenant's. GPUWorkloadErrorRatioHigh, "
                "only while the pod is ready on Healthy devices.",
                "percentunit",
                Query(f"namespace_pod:gpu_workload_error_ratio:rate5m{{{WORKLOAD}}}", PER_POD),
                1,
            ),
        ),
        repeat="pod",
    )
    gpu_pods = f'namespace_pod:gpu_workload:info{{{CLUSTER}, namespace=~"$namespace"}}'
    return Dashboard(
        uid=UIDS["workload"],
        title="gpuhealth / Workload layers",
        description=(
            "A GPU workload's four layers side by side: allocation success and device health (the "
            "platform's), container readiness and the business SLO (the tenant's)."
        ),
        tags=("gpuhealth",),
        variables=(
            _cluster_variable(settings),
            QueryVariable(
                name="namespace",
                label="Namespace",
                query=f"label_values(namespace_pod:gpu_workload:info{{{CLUSTER}}}, namespace)",
                description="Namespaces with GPU workloads (pods that ask for or hold a GPU).",
                include_all=True,
                all_value=".+",
            ),
            QueryVariable(
                name="pod",
                label="Pod",
                query=f"label_values({gpu_pods}, pod)",
                description="GPU pods of the namespaces picked: one row each.",
                include_all=True,
                all_value=".+",
                multi=True,
            ),
        ),
        rows=(layers,),
    )


DASHBOARDS = {
    "fleet": fleet,
    "device": device,
    "remediation": remediation,
    "pipeline": pipeline,
    "workload": workload,
}
"""File stem -> the function that builds that dashboard."""
