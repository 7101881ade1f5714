"""Series counting for `bench_series`: pure helpers over exposition text and query answers.

A series is its metric name with its label set; these helpers sort series by what they grow
with (a device, a node, nothing: one per process or per fleet) and compare two scrapes to
count the series that end and start between them (the churn a pod move causes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Series = tuple[str, frozenset[tuple[str, str]]]
"""(metric name, its labels): one time series as Prometheus keys it (less job and instance)."""

SCOPES = ("device", "node", "fixed")
"""What a series grows with: one per (node, device), one per node, or a fixed number per process."""


def series_of(exposition: str) -> set[Series]:
    """Every series in a text exposition (format 0.0.4): histogram buckets and counters' `_total` apart."""
    return {
        (sample.name, frozenset(sample.labels.items()))
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def scope_of(labels: Mapping[str, str] | Iterable[tuple[str, str]]) -> str:
    """`device` when the series names a device, `node` when it names only a node, else `fixed`."""
    names = set(labels.keys()) if isinstance(labels, Mapping) else {name for name, _ in labels}
    if "device" in names:
        return "device"
    if "node" in names:
        return "node"
    return "fixed"


def count_by_scope(series: Iterable[Series]) -> Counter[str]:
    """How many of `series` fall in each scope (`SCOPES`)."""
    return Counter(scope_of(labels) for _, labels in series)


def count_by_name_and_scope(series: Iterable[Series]) -> Counter[tuple[str, str]]:
    """How many of `series` each (metric name, scope) holds."""
    return Counter((name, scope_of(labels)) for name, labels in series)


@dataclass(frozen=True)
class Churn:
    ended: int
    """Series in the first scrape and not the second: Prometheus marks them stale."""
    started: int
    """Series in the second scrape and not the first: new series in the head block."""


def churn(before: set[Series], after: set[Series]) -> Churn:
    return Churn(ended=len(before - after), started=len(after - before))


def per_unit(count: int, units: int) -> float:
    """`count` shared out over `units` (0 when there are none)."""
    return count / units if units else 0.0
