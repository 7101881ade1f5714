"""The exporter's self metrics (`gpuhealth_exporter_*`) as prometheus_client instruments.

Built from the declarations in `exporter.metrics` (names, HELP, labels, units live there
only), in a registry the caller passes in.
"""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter.metrics import (
    DEVICES_TRACKED,
    DIRECTORY_WRITE,
    DIRECTORY_WRITE_BUCKETS,
    EVENTS_IGNORED,
    LAST_EVENT,
    PARSE_ERRORS,
    STATUS_CHANGES,
    WATCH_EVENTS,
    WATCH_RESTARTS,
)
from exporter.state import DeviceStateStore
from gpuhealth.metrics import MetricFamily


def _counter(family: MetricFamily, registry: CollectorRegistry) -> Counter:
    return Counter(family.name, family.help, family.labels, unit=family.unit, registry=registry)


class ExporterMetrics:
    """The exporter's own metrics, in a private registry (tests read them with get_sample_value).

    Building them turns off client_python's `_created` series process-wide (its documented
    switch, `disable_created_metrics`): one more series beside every counter and histogram
    that no rule or dashboard reads, and the service and its tests then expose the same.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        prometheus_client.disable_created_metrics()
        self._registry = registry
        self.watch_events = _counter(WATCH_EVENTS, registry)
        self.watch_restarts = _counter(WATCH_RESTARTS, registry)
        self.last_event = Gauge(LAST_EVENT.name, LAST_EVENT.help, unit=LAST_EVENT.unit, registry=registry)
        self.directory_write = Histogram(
            DIRECTORY_WRITE.name,
            DIRECTORY_WRITE.help,
            unit=DIRECTORY_WRITE.unit,
            buckets=DIRECTORY_WRITE_BUCKETS,
            registry=registry,
        )

    def track(self, store: DeviceStateStore) -> None:
        """Expose the store's counters (parse errors, ignored events, devices tracked)."""
        self._registry.register(_StateCollector(store))


class _StateCollector(Collector):
    """Counters kept as plain data by the state, read at scrape time."""

    def __init__(self, store: DeviceStateStore) -> None:
        self._store = store

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._store.stats
        for family, counts in ((PARSE_ERRORS, stats.parse_errors), (EVENTS_IGNORED, stats.events_ignored)):
            by_reason = CounterMetricFamily(family.name, family.help, labels=family.labels)
            for reason, count in sorted(counts.items()):
                by_reason.add_metric([reason], count)
            yield by_reason
        yield CounterMetricFamily(STATUS_CHANGES.name, STATUS_CHANGES.help, value=stats.status_changes)
        yield GaugeMetricFamily(DEVICES_TRACKED.name, DEVICES_TRACKED.help, value=self._store.devices_tracked)
