"""The exporter's settings: a tree of dataclasses, each field with a default and its reasons.

Code receives these; nothing reads the environment itself. The command line builds them
(`exporter.cli`); tests build them directly. Each class checks its own fields when built
(`gpuhealth.fields`), so a value the exporter cannot run with is refused at start-up with
the field and its unit named.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from exporter import sources
from exporter.sharding import UNSHARDED, Shard
from gpuhealth import fields
from gpuhealth.http import ServerSettings
from gpuhealth.kube.backoff import BackoffSettings

DEFAULT_DIRECTORY = "gpuhealth-directory.sqlite"
"""Where the device directory lives when no `--directory` is given (a DaemonSet mounts a
hostPath there so the directory survives pod restarts)."""

DEFAULT_PORT = 9842
"""Not 9400: that is dcgm-exporter's port, and both run on GPU nodes."""

DEFAULT_LISTEN = f"0.0.0.0:{DEFAULT_PORT}"


def check_nvml_source(value: str) -> str:
    """`value` if it names an NVML source (`exporter.sources.NVML`); ValueError saying what is expected."""
    sources.NVML.choice(value)
    return value


HEALTH_PRODUCER_FORM = "DRIVER=NAMESPACE/LABEL-SELECTOR"
_LABEL_REQUIREMENT = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_./]*(?:(?:==?|!=)[-A-Za-z0-9_.]*)?")
"""One equality-based requirement of a label selector (`key`, `key=value`, `key!=value`)."""


@dataclass(frozen=True)
class HealthProducer:
    """The pods that produce one DRA driver's per-device health: its kubelet plugin, one per node.

    The kubelet reads a DRA driver's health stream from the plugin on its node; a plugin that is
    not Ready (its probe fails, it is restarting) or gone cannot be confirming the Healthy the
    kubelet keeps in pod status (the kubelet expires reports lazily, so that Healthy can linger).
    The pod's Ready condition is the liveness signal the API offers for it.
    """

    driver: str
    """The DRA driver name (a device's `driver` label), e.g. gpu.nvidia.com."""
    namespace: str
    """Where the plugin's DaemonSet runs."""
    selector: str
    """Label selector of the plugin's pods (equality-based requirements, comma-separated)."""

    def __post_init__(self) -> None:
        for name in ("driver", "namespace", "selector"):
            if not getattr(self, name):
                raise fields.SettingsError(f"HealthProducer.{name} must not be empty")
        for requirement in self.selector.split(","):
            if not _LABEL_REQUIREMENT.fullmatch(requirement.strip()):
                raise fields.SettingsError(
                    f"HealthProducer.selector {self.selector!r}: {requirement!r} is not a label requirement "
                    "(key, key=value or key!=value)"
                )


DEFAULT_HEALTH_PRODUCERS = (
    HealthProducer(
        driver="gpu.nvidia.com",
        namespace="dra-driver-nvidia-gpu",
        selector="dra-driver-nvidia-gpu-component=kubelet-plugin",
    ),
)
"""The NVIDIA DRA driver's kubelet plugin as its Helm chart (dra-driver-nvidia-gpu) installs it:
DaemonSet `dra-driver-nvidia-gpu-kubelet-plugin` in the namespace its install guide uses, its pods
labelled `<chart>-component: kubelet-plugin` (the chart's per-component selector label). Its
containers carry gRPC startup and liveness probes, so a plugin that stops serving is restarted and
not Ready meanwhile."""


def parse_health_producer(text: str) -> HealthProducer:
    """`DRIVER=NAMESPACE/SELECTOR` as a HealthProducer; ValueError saying what is expected."""
    driver, eq, rest = text.partition("=")
    namespace, slash, selector = rest.partition("/")
    if not (eq and slash and driver and namespace and selector):
        raise ValueError(f"{text!r}: expected {HEALTH_PRODUCER_FORM}")
    try:
        return HealthProducer(driver.strip(), namespace.strip(), selector.strip())
    except fields.SettingsError as exc:
        raise ValueError(f"{text!r}: {exc}") from None


@dataclass(frozen=True)
class ObserverSettings:
    """How the observer lists and watches the API."""

    node_name: str | None = None
    """Node mode: watch only this node's pods, slices and Lease (a DaemonSet passes
    spec.nodeName). None: cluster mode, everything."""
    watch_timeout_seconds: int = 300
    """timeoutSeconds asked of each watch; the server ends it then and we resume from the
    last resourceVersion. Shorter than the apiserver's limit so connections rotate."""
    connect_timeout_seconds: float = 10.0
    """TCP/TLS connect timeout for list and watch requests."""
    read_slack_seconds: float = 30.0
    """A watch read with no byte for timeoutSeconds plus this long is a dead connection."""
    list_page_size: int = 500
    """`limit` of list requests: the apiserver's recommended page size, bounding memory."""
    flush_interval_seconds: float = 1.0
    """How often the processor wakes when idle, to write due heartbeats to the directory."""
    backoff: BackoffSettings = field(default_factory=BackoffSettings)
    """Delays between retries of failed lists and watches."""
    health_producers: tuple[HealthProducer, ...] = DEFAULT_HEALTH_PRODUCERS
    """The pods whose readiness vouches for each DRA driver's device health (one watch each,
    that node's only in node mode). While a node's producer is not Ready or gone, its driver's
    devices on that node are confirmed no later than when it stopped: their status age grows."""
    slice_health_drivers: tuple[str, ...] = ()
    """DRA drivers that report device health only as their ResourceSlice's device taints, with
    no KEP-4680 stream to the kubelet (the NVIDIA DRA driver, `gpu.nvidia.com`: the kubelet then
    reports each of its allocated devices Unknown, meaning only that it heard nothing). For their
    devices, held by a pod or idle, the slice's taints are the health (`identity.slice_health`);
    the pods' entries give the allocation only. Empty: every driver streams its health."""
    shard: Shard = UNSHARDED
    """Cluster mode split across several exporters (`exporter.sharding`): keep and export only
    the nodes whose name hashes to this shard. Node mode is one node already: unsharded only."""

    def __post_init__(self) -> None:
        if self.node_name is not None and self.shard.sharded:
            raise fields.SettingsError(
                "ObserverSettings.shard splits cluster mode across exporters; node mode "
                f"(node_name {self.node_name!r}) watches one node already: leave it unsharded"
            )
        if any(not driver or driver != driver.strip() for driver in self.slice_health_drivers):
            raise fields.SettingsError(
                f"ObserverSettings.slice_health_drivers: {list(self.slice_health_drivers)!r} holds an "
                "empty or space-padded driver name"
            )
        if self.node_name is not None and not self.node_name:
            raise fields.SettingsError("ObserverSettings.node_name must be a node name or None, got ''")
        drivers = [p.driver for p in self.health_producers]
        if len(set(drivers)) != len(drivers):
            raise fields.SettingsError(
                f"ObserverSettings.health_producers names a driver twice: {', '.join(sorted(drivers))}"
            )
        fields.positive(self, "watch_timeout_seconds", "seconds", whole=True)
        fields.positive(self, "connect_timeout_seconds", "seconds")
        fields.positive(self, "read_slack_seconds", "seconds")
        fields.positive(self, "list_page_size", "objects", whole=True)
        fields.positive(self, "flush_interval_seconds", "seconds")


@dataclass(frozen=True)
class DirectorySettings:
    """Where and how often the device directory is written."""

    path: str | None = DEFAULT_DIRECTORY
    """SQLite file of the device directory; None keeps state in memory only (lost on restart)."""
    heartbeat_flush_seconds: float = 5.0
    """Heartbeats (confirmations without change) are written at most this often."""
    change_flush_seconds: float = 0.25
    """Status changes are written at most this often (so within this long): one transaction
    per quarter second rather than per batch keeps SQLite commits off a burst's path, and
    alerts read the metrics, not the file."""

    def __post_init__(self) -> None:
        if self.path is not None and not self.path:
            raise fields.SettingsError("DirectorySettings.path must be a file name or None, got ''")
        # Zero is allowed for both: it writes with every batch, which costs commits, not a spin.
        fields.within(self, "heartbeat_flush_seconds", "seconds", 0.0)
        fields.within(self, "change_flush_seconds", "seconds", 0.0)


@dataclass(frozen=True)
class NvmlSettings:
    """NVML in node mode."""

    source: str = "auto"
    """auto (pynvml where a driver is present, else none), none, pynvml, or another choice the
    launcher added (`exporter.sources.NVML`: the test harness's sim:URL, a simulated node's NVML)."""
    poll_seconds: float = 1.0
    """Readings poll period. Status age in node mode grows from the last reachable
    reading, so this bounds how fresh a healthy device can look (1 s << the 30 s DRA
    health timeout). It also delays faults only NVML sees (uncorrectable ECC, a row-remap
    failure) by up to one period on top of the alerting pipeline's floor: at 5 s their median
    detection missed floor + 2 s, at 1 s every kind met it (docs/latency.md). A poll is a
    handful of NVML reads per device."""

    def __post_init__(self) -> None:
        try:
            check_nvml_source(self.source)
        except ValueError as exc:
            raise fields.SettingsError(f"NvmlSettings.source {exc}") from None
        fields.positive(self, "poll_seconds", "seconds")  # zero would spin the NVML loop


@dataclass(frozen=True)
class ExporterServerSettings(ServerSettings):
    """The core HTTP settings with the exporter's port and its scrape rendering threshold."""

    port: int = DEFAULT_PORT
    """Listen port (0 picks a free one, for tests)."""
    offload_min_devices: int = 2_000
    """Render in a worker thread from this many devices up; below it inline (node mode has 8)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        fields.within(self, "offload_min_devices", "devices", 0, math.inf, whole=True)


@dataclass(frozen=True)
class ExporterSettings:
    """The whole exporter: what it watches, where it records, NVML, and how it serves."""

    observer: ObserverSettings = field(default_factory=ObserverSettings)
    """Lists and watches of the API."""
    directory: DirectorySettings = field(default_factory=DirectorySettings)
    """The device directory (SQLite)."""
    nvml: NvmlSettings = field(default_factory=NvmlSettings)
    """NVML readings in node mode."""
    pod_resources: str = "none"
    """Node mode, with NVML: the kubelet's allocatable devices as an idle device-plugin GPU's
    evidence; none, unix:///PATH (the kubelet's pod-resources socket), or another choice the
    launcher added (`exporter.sources.POD_RESOURCES`: the test harness's sim:URL). A GPU NVML
    reaches that the kubelet does not offer reads Unhealthy.
    Only for device-plugin nodes (DRA devices are never in the kubelet's allocatable list: their
    slice speaks for them, and on a DRA node every idle GPU would read Unhealthy until it does),
    so `none` unless asked: the DaemonSet on device-plugin nodes asks."""
    server: ExporterServerSettings = field(default_factory=ExporterServerSettings)
    """`/metrics`, `/healthz`, `/readyz`."""
    kubeconfig: str | None = None
    """Kubeconfig file; None uses the in-cluster service account (or the default kubeconfig)."""
    collector_young_threshold: int = 20_000
    """Net allocations of tracked objects between two collections of Python's youngest
    generation (the interpreter's default: 700; the older generations keep their defaults).
    The event path allocates containers by the thousand that live for a batch or a pod
    replacement; collected every 700 they are traversed while still alive, often twice. At
    20,000 the event benchmark ran 6-9 % faster (bench/bench_exporter_events.py), and the
    garbage it defers is what 20,000 allocations leave: kilobytes next to 80,000 devices."""

    def __post_init__(self) -> None:
        fields.positive(self, "collector_young_threshold", "allocations", whole=True)
        try:
            sources.POD_RESOURCES.choice(self.pod_resources)
        except ValueError as exc:
            raise fields.SettingsError(f"ExporterSettings.pod_resources {exc}") from None
        if self.pod_resources != "none" and (self.observer.node_name is None or self.nvml.source == "none"):
            raise fields.SettingsError(
                "ExporterSettings.pod_resources reads one node's kubelet beside its NVML: "
                "give ObserverSettings.node_name (--node) and an NVML source"
            )
        nvml = sources.NVML.choice(self.nvml.source)
        if nvml.one_node and self.observer.node_name is None:
            raise fields.SettingsError(
                f"NvmlSettings.source {nvml.form} reads one node's NVML: "
                "give ObserverSettings.node_name (--node) too"
            )
