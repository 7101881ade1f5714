"""The baseline both exporter benchmarks measure against: device series in labelled Gauges.

One definition, so the fleet exposition benchmark and the node-mode scrape benchmark compare
the renderer with the same prometheus_client layout.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge

from exporter.snapshot import DeviceState


class DeviceGauges:
    """The device and node families of the metrics contract, held as labelled Gauges."""

    def __init__(self, registry: CollectorRegistry) -> None:
        dev = ["node", "device"]
        self.health = Gauge("gpu_device_health", "h", [*dev, "status"], registry=registry)
        self.age = Gauge("gpu_device_status_age_seconds", "a", dev, registry=registry)
        self.observed = Gauge("gpu_device_status_observed_timestamp_seconds", "o", dev, registry=registry)
        self.version = Gauge("gpu_device_status_version", "v", dev, registry=registry)
        self.info = Gauge(
            "gpu_device_info",
            "i",
            [*dev, "uuid", "driver", "pool", "device_name", "resource", "source"],
            registry=registry,
        )
        self.alloc = Gauge(
            "gpu_device_allocation_info",
            "a",
            [*dev, "namespace", "pod", "container", "resource", "claim"],
            registry=registry,
        )
        self.taint = Gauge("gpu_device_driver_taint", "t", [*dev, "key", "effect"], registry=registry)
        self.lease = Gauge("gpu_node_kubelet_lease_age_seconds", "l", ["node"], registry=registry)
        self.producer = Gauge("gpu_node_health_producer_up", "p", ["node", "driver"], registry=registry)

    def add(self, d: DeviceState, age: float) -> None:
        """Every series of one device, with the values the renderer gives it."""
        for status in ("Healthy", "Unhealthy", "Unknown"):
            self.health.labels(d.node, d.device, status).set(int(status == d.health))
        self.age.labels(d.node, d.device).set(age)
        self.observed.labels(d.node, d.device).set(d.observed_at)
        self.version.labels(d.node, d.device).set(d.status_version)
        self.info.labels(d.node, d.device, d.uuid, d.driver, d.pool, d.device_name, d.resource, d.source).set(
            1
        )
        for a in d.allocations:
            self.alloc.labels(d.node, d.device, a.namespace, a.pod, a.container, a.resource, a.claim).set(1)
        for t in d.driver_taints:
            self.taint.labels(d.node, d.device, t.key, t.effect).set(1)
