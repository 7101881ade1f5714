"""The exporter's metric catalog: every family it exposes, declared once, and its self metrics.

Three groups, all in `CATALOG`:
- device families (`gpu_device_*`, `gpu_node_*`), rendered in every mode by
  `exporter.exposition`, which takes names and HELP from here at import time;
- NVML families (`gpu_nvml_*`), rendered by the same module in node mode only;
- self metrics (`gpuhealth_exporter_*`), prometheus_client instruments that
  `exporter.self_metrics` builds from these declarations in a registry the caller passes in.

Pure declarations (no prometheus_client), so rules tests and the pure renderer read them.

Rules, dashboards and the responder rely on these names and labels: renaming one is a
change of contract (tests/rules check every rule against this catalog, and
tests/exporter/test_metrics_catalog.py checks `/metrics` against it).
"""

from __future__ import annotations

from gpuhealth.metrics import Catalog, MetricFamily

_DEVICE = ("node", "device")
"""Every per-device series carries these; pod and tenant labels only on `_info` families."""

DEVICE_HEALTH = MetricFamily(
    "gpu_device_health",
    "gauge",
    "Reported device health from allocatedResourcesStatus: 1 for the reported status, 0 for the other two.",
    (*_DEVICE, "status"),
)
DEVICE_STATUS_AGE = MetricFamily(
    "gpu_device_status_age_seconds",
    "gauge",
    "Seconds since the reported status was last confirmed fresh (pod status observation, kept fresh "
    "by the node's kubelet Lease, in node mode NVML answering and, for a DRA device, its driver's "
    "health producer on the node being Ready).",
    _DEVICE,
    unit="seconds",
)
DEVICE_OBSERVED = MetricFamily(
    "gpu_device_status_observed_timestamp_seconds",
    "gauge",
    "Unix time of the latest pod status observation that reported the current status.",
    _DEVICE,
    unit="seconds",
)
DEVICE_STATUS_VERSION = MetricFamily(
    "gpu_device_status_version",
    "gauge",
    "Increases by one on every change of the reported (health, message); survives exporter restarts.",
    _DEVICE,
)
# The two `_info` families are gauges of value 1 (as written since the first release), not
# client_python's info kind, which would add a second `_info` to their names.
DEVICE_INFO = MetricFamily(
    "gpu_device_info",
    "gauge",
    "Device identity (UUID, DRA driver/pool/device, resource name) and the source of its current "
    "status (pod: allocatedResourcesStatus; resourceslice: the DRA driver's taints on a device no pod "
    "holds; nvml: NVML reachability of a GPU no pod holds; node: its node's device-plugin GPU "
    "allocatable against capacity, for an idle device-plugin GPU); always 1.",
    (*_DEVICE, "uuid", "driver", "pool", "device_name", "resource", "source"),
)
DEVICE_ALLOCATION = MetricFamily(
    "gpu_device_allocation_info",
    "gauge",
    "One series (value 1) per container currently allocated the device.",
    (*_DEVICE, "namespace", "pod", "container", "resource", "claim"),
)
DEVICE_DRIVER_TAINT = MetricFamily(
    "gpu_device_driver_taint",
    "gauge",
    "Taints a DRA driver put on the device in its ResourceSlice; 1 per taint.",
    (*_DEVICE, "key", "effect"),
)
NODE_LEASE_AGE = MetricFamily(
    "gpu_node_kubelet_lease_age_seconds",
    "gauge",
    "Seconds since the node's kubelet Lease in kube-node-lease was last renewed.",
    ("node",),
    unit="seconds",
)
NODE_HEALTH_PRODUCER_UP = MetricFamily(
    "gpu_node_health_producer_up",
    "gauge",
    "1 while a pod of the DRA driver's health producer (its kubelet plugin) on the node is Ready, 0 when "
    "none is (not Ready or gone); absent for nodes where none was ever seen. While 0, the driver's "
    "devices on the node are confirmed no later than when it stopped (their status age grows).",
    ("node", "driver"),
)
NVML_UP = MetricFamily(
    "gpu_nvml_up",
    "gauge",
    "1 when NVML answers for the GPU, 0 when it is lost or unreadable (its other readings are then absent).",
    _DEVICE,
)
NVML_XID = MetricFamily(
    "gpu_nvml_xid_errors",
    "counter",
    "XID critical error events reported by NVML since the exporter started, by XID code.",
    (*_DEVICE, "xid"),
)
NVML_ECC = MetricFamily(
    "gpu_nvml_ecc_errors",
    "counter",
    "Volatile ECC error counts (since the last driver load), by type corrected|uncorrected.",
    (*_DEVICE, "type"),
)
NVML_REMAPPED = MetricFamily(
    "gpu_nvml_remapped_rows",
    "gauge",
    "Remapped memory rows: counts for correctable|uncorrectable, 0/1 flags for pending|failure.",
    (*_DEVICE, "type"),
)
NVML_TEMPERATURE = MetricFamily(
    "gpu_nvml_temperature_celsius",
    "gauge",
    "GPU core temperature in degrees Celsius.",
    _DEVICE,
    unit="celsius",
)
NVML_POWER = MetricFamily("gpu_nvml_power_watts", "gauge", "GPU power draw in watts.", _DEVICE, unit="watts")
NVML_MIG_DEVICE = MetricFamily(
    "gpu_nvml_mig_device_info",
    "gauge",
    "One series (value 1) per MIG device (partition) of a MIG-enabled card, on the card's device: "
    "its MIG UUID (the device plugin's device ID), GPU instance id and profile; always 1.",
    (*_DEVICE, "mig_uuid", "gpu_instance_id", "profile"),
)

WATCH_EVENTS = MetricFamily(
    "gpuhealth_exporter_watch_events",
    "counter",
    "Watch events received, by resource and event type.",
    ("resource", "type"),
)
WATCH_RESTARTS = MetricFamily(
    "gpuhealth_exporter_watch_restarts",
    "counter",
    "Watches restarted, by resource and reason (expired: 410 relist, closed: server timeout, error).",
    ("resource", "reason"),
)
LAST_EVENT = MetricFamily(
    "gpuhealth_exporter_last_event_timestamp_seconds",
    "gauge",
    "Wall time of the latest watch event applied.",
    unit="seconds",
)
DIRECTORY_WRITE = MetricFamily(
    "gpuhealth_exporter_directory_write_seconds",
    "histogram",
    "Duration of one directory write (a transaction of batched changes).",
    unit="seconds",
)
DIRECTORY_WRITE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
"""Upper bounds (seconds) of `DIRECTORY_WRITE`: SQLite commits of a batch, sub-millisecond to 1 s."""
PARSE_ERRORS = MetricFamily(
    "gpuhealth_exporter_parse_errors",
    "counter",
    "Malformed or unresolvable pieces of watched objects, by reason (skipped, or read as Unknown).",
    ("reason",),
)
EVENTS_IGNORED = MetricFamily(
    "gpuhealth_exporter_events_ignored",
    "counter",
    "Pod events not applied: duplicate or older resourceVersion than one already processed.",
    ("reason",),
)
STATUS_CHANGES = MetricFamily(
    "gpuhealth_exporter_status_changes", "counter", "Device status changes recorded."
)
POD_RESOURCES_FAILURES = MetricFamily(
    "gpuhealth_exporter_pod_resources_failures",
    "counter",
    "Reads of the kubelet's pod-resources API (node mode) that gave no answer; idle GPUs kept evidence.",
)
DEVICES_TRACKED = MetricFamily(
    "gpuhealth_exporter_devices_tracked", "gauge", "Devices in the directory's current state."
)
SHARD_ORDINAL = MetricFamily(
    "gpuhealth_exporter_shard_ordinal",
    "gauge",
    "This exporter's shard (--shard), from 0; 0 when unsharded.",
)
TOTAL_SHARDS = MetricFamily(
    "gpuhealth_exporter_total_shards",
    "gauge",
    "How many shards the cluster-mode exporters split the nodes into (--total-shards); 1 when unsharded.",
)

DEVICE_FAMILIES = (
    DEVICE_HEALTH,
    DEVICE_STATUS_AGE,
    DEVICE_OBSERVED,
    DEVICE_STATUS_VERSION,
    DEVICE_INFO,
    DEVICE_ALLOCATION,
    DEVICE_DRIVER_TAINT,
)
"""The per-device families, in the order the exposition writes a device's series."""
CLUSTER_FAMILIES = (*DEVICE_FAMILIES, NODE_LEASE_AGE, NODE_HEALTH_PRODUCER_UP)
"""Rendered in every mode (HELP and TYPE even when there is no sample), in this order."""
NVML_FAMILIES = (NVML_UP, NVML_XID, NVML_ECC, NVML_REMAPPED, NVML_TEMPERATURE, NVML_POWER, NVML_MIG_DEVICE)
"""Rendered only in node mode, in this order."""
HTTP_REFUSED = MetricFamily(
    "gpuhealth_exporter_http_requests_refused",
    "counter",
    "Requests refused by the web configuration (--web.config.file), by reason: unauthorized, "
    "rate_limited, client_certificate.",
    ("reason",),
)
WEB_CONFIG_RELOAD_FAILURES = MetricFamily(
    "gpuhealth_exporter_web_config_reload_failures",
    "counter",
    "Changes of the web configuration file not applied (bad, or needing a restart); the previous one serves.",
)
SELF_FAMILIES = (
    WATCH_EVENTS,
    WATCH_RESTARTS,
    LAST_EVENT,
    DIRECTORY_WRITE,
    PARSE_ERRORS,
    EVENTS_IGNORED,
    STATUS_CHANGES,
    POD_RESOURCES_FAILURES,
    DEVICES_TRACKED,
    SHARD_ORDINAL,
    TOTAL_SHARDS,
    HTTP_REFUSED,
    WEB_CONFIG_RELOAD_FAILURES,
)
"""The exporter's own metrics (`ExporterMetrics`)."""

CATALOG = Catalog((*CLUSTER_FAMILIES, *NVML_FAMILIES, *SELF_FAMILIES))
"""Every family the exporter exposes."""
