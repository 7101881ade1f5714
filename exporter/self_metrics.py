"""The exporter's self metrics (`gpuhealth_exporter_*`) as prometheus_client instruments.

Built from the declarations in `exporter.metrics` (names, HELP, labels, units live there
only), in a registry the caller passes in.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from exporter.metrics import (
    DEVICES_TRACKED,
    DIRECTORY_WRITE,
    DIRECTORY_WRITE_BUCKETS,
    EVENTS_IGNORED,
    HTTP_REFUSED,
    LAST_EVENT,
    PARSE_ERRORS,
    POD_RESOURCES_FAILURES,
    SHARD_ORDINAL,
    STATUS_CHANGES,
    TOTAL_SHARDS,
    WATCH_EVENTS,
    WATCH_RESTARTS,
    WEB_CONFIG_RELOAD_FAILURES,
)
from exporter.sharding import UNSHARDED, Shard
from exporter.state import DeviceStateStore
from gpuhealth import instruments
from gpuhealth.web_guard import REFUSAL_REASONS


class ExporterMetrics:
    """The exporter's own metrics, in a private registry (tests read them with get_sample_value).

    Built through `gpuhealth.instruments`, which also turns off the `_created` series. The
    shard this exporter serves is two gauges, as kube-state-metrics exports its own: where
    `count(gpuhealth_exporter_shard_ordinal)` falls short of `gpuhealth_exporter_total_shards`,
    a shard is not being scraped and its nodes' devices are missing.
    """

    def __init__(self, registry: CollectorRegistry, shard: Shard = UNSHARDED) -> None:
        self._registry = registry
        instruments.gauge(SHARD_ORDINAL, registry).set(shard.index)
        instruments.gauge(TOTAL_SHARDS, registry).set(shard.total)
        self.watch_events = instruments.counter(WATCH_EVENTS, registry)
        self.http_refused = instruments.counter(HTTP_REFUSED, registry)
        for reason in REFUSAL_REASONS:
            self.http_refused.labels(reason)  # 0 from the start: a rate of refusals needs a baseline
        self.web_config_reload_failures = instruments.counter(WEB_CONFIG_RELOAD_FAILURES, registry)
        self.watch_restarts = instruments.counter(WATCH_RESTARTS, registry)
        self.last_event = instruments.gauge(LAST_EVENT, registry)
        self.directory_write = instruments.histogram(DIRECTORY_WRITE, registry, DIRECTORY_WRITE_BUCKETS)

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
        yield CounterMetricFamily(
            POD_RESOURCES_FAILURES.name, POD_RESOURCES_FAILURES.help, value=stats.pod_resources_failures
        )
        yield GaugeMetricFamily(DEVICES_TRACKED.name, DEVICES_TRACKED.help, value=self._store.devices_tracked)
