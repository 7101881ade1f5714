"""`render_metrics` says exactly what prometheus_client would say for the same series.

Aspects covered: over the benchmark's fleet (both device-plugin and DRA nodes, faults,
driver taints, lease ages), the renderer's exposition and `generate_latest` over labelled
Gauges holding the same series parse to the same samples with the same values and the
same family types. This also keeps the exposition benchmark honest: it compares like
with like.
"""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.bench_exporter_exposition import NOW, baseline_registry, build_snapshot
from exporter.exposition import MetricsRenderer

Parsed = tuple[dict[str, str], dict[tuple[str, frozenset[tuple[str, str]]], float]]


def parsed(body: bytes) -> Parsed:
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return types, samples


def test_renderer_and_prometheus_client_agree_on_every_sample() -> None:
    nodes = 250  # enough for every fault kind of the fleet generator (Unhealthy every 997 devices)
    snapshot = build_snapshot(nodes)
    ours_types, ours = parsed(MetricsRenderer().render(snapshot, NOW))
    base_types, base = parsed(generate_latest(baseline_registry(nodes)))
    taints = sum(len(d.driver_taints) for d in snapshot.devices.values())
    assert taints > 0
    # 8 series per device (3 health, age, observed, version, info, 1 allocation), 1 lease per node.
    assert len(ours) == nodes * 8 * 8 + nodes + taints
    assert ours == base
    assert ours_types == base_types
    health = {labels: v for (name, labels), v in ours.items() if name == "gpu_device_health" and v == 1}
    statuses = {dict(labels)["status"] for labels in health}
    assert statuses == {"Healthy", "Unhealthy", "Unknown"}
