"""The scale benchmarks' fleets: the Prometheus rules bench's synthetic targets, the shard bench's fleets.

Aspects: a synthetic target serving several node-mode exporters' scrapes holds exactly their
series, each labelled with its exporter's `instance`, and each HELP and TYPE line once; a
sample without labels gets `instance` as its only one; the sharded operator-cost bench
compares an unsharded exporter of the shard's size with shard 0 of a fleet M times larger,
whose tracked devices are 8 per node it owns by the FNV-1a hash, and only the shard is started
with `--shard 0 --total-shards M`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from bench.bench_operator_cost import sharded_fleets
from bench.bench_prometheus_rules import EXPORTER_PORT, bodies, node_names, with_instance
from bench.bench_series import Exporter
from bench.series import series_of
from exporter.sharding import shard_of
from gpuhealth.clock import ManualClock


def test_a_target_serves_each_exporters_series_under_its_own_instance() -> None:
    clock = ManualClock(1_000_000.0)
    served = bodies(4, 2, clock)
    assert list(served) == ["/t0", "/t1"]
    expected = set()
    for name, dra in node_names(4)[:2]:
        instance = ("instance", f"{name}:{EXPORTER_PORT}")
        own = series_of(Exporter([(name, dra)], clock, node_mode=True).scrape().decode())
        expected |= {(metric, labels | {instance}) for metric, labels in own}
    assert series_of(served["/t0"].decode()) == expected
    comments = Counter(line for line in served["/t0"].splitlines() if line.startswith(b"#"))
    assert set(comments.values()) == {1}


def test_a_sample_without_labels_gets_instance_as_its_only_label() -> None:
    body = b'# TYPE up gauge\nup 1\nx{a="b c"} 2\n'
    assert (
        with_instance(body, "n:1", set())
        == b'# TYPE up gauge\nup{instance="n:1"} 1\nx{instance="n:1",a="b c"} 2\n'
    )


def test_the_shard_is_compared_with_an_unsharded_exporter_of_its_size(tmp_path: Path) -> None:
    unsharded, shard = sharded_fleets(tmp_path, 20, 4)
    assert (unsharded.nodes, unsharded.devices, unsharded.exporter_args) == (20, 160, ())
    fleet = yaml.safe_load(Path(shard.scenario).read_text())["fleet"]
    names = [f"{group['name']}-{i}" for group in fleet for i in range(group["count"])]
    assert shard.nodes == len(names) == 80
    assert shard.devices == 8 * sum(1 for name in names if shard_of(name, 4) == 0)
    assert shard.exporter_args == ("--shard", "0", "--total-shards", "4")
