"""prometheus_client instruments built from metric declarations (`gpuhealth.metrics`).

Services declare every family once in their catalog; this builds the live instrument for a
declaration, so a name, HELP text, label or unit is never written twice. Building one turns
off client_python's `_created` series process-wide (its documented switch,
`disable_created_metrics`): one more series beside every counter and histogram that no rule
or dashboard reads, so services and their tests expose the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuhealth.metrics import MetricFamily


def counter(family: MetricFamily, registry: CollectorRegistry) -> Counter:
    _check(family, "counter")
    return Counter(family.name, family.help, family.labels, unit=family.unit, registry=registry)


def gauge(family: MetricFamily, registry: CollectorRegistry) -> Gauge:
    _check(family, "gauge")
    return Gauge(family.name, family.help, family.labels, unit=family.unit, registry=registry)


def histogram(
    family: MetricFamily, registry: CollectorRegistry, buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS
) -> Histogram:
    _check(family, "histogram")
    return Histogram(
        family.name, family.help, family.labels, unit=family.unit, buckets=buckets, registry=registry
    )


def _check(family: MetricFamily, kind: str) -> None:
    prometheus_client.disable_created_metrics()
    if family.kind != kind:
        raise TypeError(f"{family.name} is declared a {family.kind}, not a {kind}")
