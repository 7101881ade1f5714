"""The exporter's settings: a tree of dataclasses, each field with a default and its reasons.

Code receives these; nothing reads the environment itself. The command line builds them
(`exporter.cli`); tests build them directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.server import ServerSettings

DEFAULT_DIRECTORY = "gpuhealth-directory.sqlite"
"""Where the device directory lives when no `--directory` is given (a DaemonSet mounts a
hostPath there so the directory survives pod restarts)."""

DEFAULT_LISTEN = "0.0.0.0:9842"
"""Not 9400: that is dcgm-exporter's port, and both run on GPU nodes."""


@dataclass(frozen=True)
class BackoffSettings:
    """The one throttling helper's parameters (watch and list retries)."""

    initial_seconds: float = 0.5
    """First retry delay; short, since most watch failures are a dropped connection."""
    max_seconds: float = 30.0
    """Cap on the delay, so an API outage is noticed within half a minute of its end."""
    factor: float = 2.0
    """Growth per consecutive failure."""
    jitter: float = 0.5
    """Fraction of each delay drawn at random, so a fleet of exporters does not retry in step."""


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


@dataclass(frozen=True)
class DirectorySettings:
    path: str | None = DEFAULT_DIRECTORY
    """SQLite file of the device directory; None keeps state in memory only (lost on restart)."""
    heartbeat_flush_seconds: float = 5.0
    """Heartbeats (confirmations without change) are written at most this often."""
    change_flush_seconds: float = 0.25
    """Status changes are written at most this often (so within this long): one transaction
    per quarter second rather than per batch keeps SQLite commits off a burst's path, and
    alerts read the metrics, not the file."""


@dataclass(frozen=True)
class NvmlSettings:
    """NVML in node mode."""

    source: str = "auto"
    """auto (pynvml where a driver is present, else none), none, pynvml, or sim:URL (the
    simulated cluster's fake NVML for that node)."""
    poll_seconds: float = 5.0
    """Readings poll period. Status age in node mode grows from the last reachable
    reading, so this bounds how fresh a healthy device can look (5 s << the 30 s DRA
    health timeout)."""


@dataclass(frozen=True)
class ExporterSettings:
    observer: ObserverSettings = field(default_factory=ObserverSettings)
    directory: DirectorySettings = field(default_factory=DirectorySettings)
    nvml: NvmlSettings = field(default_factory=NvmlSettings)
    server: ServerSettings = field(default_factory=ServerSettings)
    kubeconfig: str | None = None
    """Kubeconfig file; None uses the in-cluster service account (or the default kubeconfig)."""


def parse_listen(value: str) -> tuple[str, int]:
    """`HOST:PORT` (or `:PORT`, `[v6]:PORT`) as (host, port); ValueError with the reason."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ValueError(f"--listen {value!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"--listen {value!r}: port must be 0-65535")
    host = host.strip("[]") or "0.0.0.0"
    return host, port
