"""What the shipped rules cost the real Prometheus: a fleet of node-mode exporters, scraped and evaluated.

For each fleet size (nodes of 8 GPUs, half device-plugin, half DRA, 4 pods of 2 GPUs each,
all Healthy), every node's exporter scrape is built once by the exporter's own store and
renderer with NVML readings and its self metrics (`bench.bench_series.Exporter`, the same
bodies `python -m bench series` counts). The pinned Prometheus 3 scrapes them every 15 s and
evaluates the shipped rule files unchanged (`rules/prometheus/*.yaml`, every group at its
shipped 1-minute interval).

Synthetic targets, each serving the scrapes of 125 nodes (`--nodes-per-target`): every sample
of a node's scrape carries that node's exporter as `instance` and the job honours it
(`honor_labels`), so the head holds the same series as one target per node would, the
exporters' self metrics included. Why not one target per node: on this 2-core machine,
shared with other runs, a Python server answering 12,500 scrapes every 15 s falls behind and
Prometheus times them out (a first run at 1,250 nodes, one target each, already broke pipes).
What differs from one target per node: Prometheus's per-target series (`up`, `scrape_*`: 5
per target) and the cost of a scrape per target (fewer, larger scrapes here), and the node
rule that reads `up` by `node` sees no exporter (the synthetic targets carry no `node`).

What is read, from Prometheus's own `/metrics`, once every target is up and every group has
been evaluated twice after a whole scrape cycle was in: `prometheus_rule_group_last_duration_seconds`
per group against `prometheus_rule_group_interval_seconds`, `prometheus_tsdb_head_series`,
`process_resident_memory_bytes` and `go_memstats_heap_inuse_bytes`; and its CPU share
(`process_cpu_seconds_total`) over the span between those two evaluations (scrapes and rules).

Baseline, in the same run: the smallest size named (125 nodes, 1,000 GPUs, by default);
every other size prints its ratios against it. Each size runs its own Prometheus, one after
the other, so each reading is that size's alone.

What this leaves out, so the figures are a floor for a real one: the bodies do not change
between scrapes (a real exporter's ages and readings do, so its chunks compress less), the
TSDB head is minutes old (a real one holds up to 3 hours of samples), and no dcgm-exporter
series or responder series are served (their rules evaluate over nothing).

Run: `python -m bench prometheus_rules [--nodes 125,1250,3125]` (about 3 minutes a size;
needs the pinned Prometheus, `make upstream`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bench.bench_series import GPUS, RULES, Exporter, ExpositionBodies
from gpuhealth.clock import ManualClock
from gpuhealth.testing.loopback import (
    LoopbackError,
    LoopbackHttpServer,
    Prometheus,
    ScrapeJob,
    run_prometheus,
    wait_until,
)

NODES = (125, 1250, 3125)
"""Fleet sizes by default, in nodes of 8 GPUs: the first is the baseline."""
SCRAPE_INTERVAL = 15.0
"""Seconds between scrapes of a target: kube-prometheus-stack's default."""
JOB = "gpuhealth-exporter"
NODES_PER_TARGET = 125
"""Nodes whose scrapes one synthetic target serves (1,000 GPUs: 3 MB of text)."""
EXPORTER_PORT = 9842
"""The node exporter's port (`exporter.settings.DEFAULT_PORT`): each node's `instance` is NODE:PORT."""
START_TIMEOUT = 300.0
"""Every target up: the first scrape of a large fleet creates all its series at once."""
EVALUATION_TIMEOUT = 200.0
"""Every group evaluated again: at most a 1-minute interval, plus a slow evaluation, on a loaded machine."""


def node_names(nodes: int) -> list[tuple[str, bool]]:
    """(name, DRA) of each node: every other node a DRA node."""
    return [(f"gpu-node-{'dra' if i % 2 else 'dp'}-{i:05d}", bool(i % 2)) for i in range(nodes)]


def with_instance(body: bytes, instance: str, comments: set[bytes]) -> bytes:
    """`body`'s samples labelled `instance`; its comment lines only where not in `comments` yet."""
    label = f'instance="{instance}"'.encode()
    out = []
    for line in body.splitlines(keepends=True):
        if line.startswith(b"#"):
            if line not in comments:
                comments.add(line)
                out.append(line)
            continue
        brace, space = line.find(b"{"), line.find(b" ")
        if 0 <= brace < space:
            out.append(line[: brace + 1] + label + b"," + line[brace + 1 :])
        elif space >= 0:
            out.append(line[:space] + b"{" + label + b"}" + line[space:])
    return b"".join(out)


def bodies(nodes: int, per_target: int, clock: ManualClock) -> dict[str, bytes]:
    """The synthetic targets by path (`/t0`, `/t1`, ...): each one the scrapes of `per_target`
    node-mode exporters, built by their own store and renderer, each labelled with its `instance`."""
    names = node_names(nodes)
    served = {}
    for t, first in enumerate(range(0, nodes, per_target)):
        comments: set[bytes] = set()
        served[f"/t{t}"] = b"".join(
            with_instance(
                Exporter([(name, dra)], clock, node_mode=True).scrape(), f"{name}:{EXPORTER_PORT}", comments
            )
            for name, dra in names[first : first + per_target]
        )
    return served


def own_metrics(prometheus: Prometheus) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus's own `/metrics` (not stored: read over HTTP), by sample name and labels."""
    with urllib.request.urlopen(f"{prometheus.base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(found: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str) -> float:
    return next(v for (n, _), v in found.items() if n == name)


@dataclass(frozen=True)
class Reading:
    nodes: int
    targets_bytes: int
    """Text bytes of one scrape of every target."""
    head_series: float
    rss: float
    heap: float
    cpu_share: float
    """Prometheus's CPU seconds per wall second between two evaluations: scrapes and rules."""
    window: float
    groups: dict[str, tuple[float, float]]
    """Rule group (file;name) -> (last evaluation's duration, interval), seconds."""

    @property
    def gpus(self) -> int:
        return self.nodes * GPUS

    @property
    def rules_share(self) -> float:
        """Evaluation seconds of every group per wall second: the rules' share of a core."""
        return sum(duration / interval for duration, interval in self.groups.values())


@contextmanager
def serving(
    nodes: int, per_target: int, clock: ManualClock, workdir: Path
) -> Iterator[tuple[Prometheus, int]]:
    """Prometheus scraping `nodes` node-mode exporters and evaluating the shipped rules; (it, bytes)."""
    ExpositionBodies.bodies = bodies(nodes, per_target, clock)
    size = sum(len(b) for b in ExpositionBodies.bodies.values())
    with LoopbackHttpServer(ExpositionBodies, "exporter-bodies") as server:
        host = server.url.removeprefix("http://")
        jobs = [
            # Its own `instance` keeps each target's `up` apart (all share one host and port).
            ScrapeJob(
                JOB, [host], labels={"__metrics_path__": path, "instance": f"bodies{path}"}, honor_labels=True
            )
            for path in ExpositionBodies.bodies
        ]
        with run_prometheus(
            workdir, jobs, rule_files=sorted(RULES.glob("*.yaml")), interval=f"{SCRAPE_INTERVAL:g}s"
        ) as prometheus:
            yield prometheus, size
    ExpositionBodies.bodies = {}


def measure(nodes: int, per_target: int, clock: ManualClock) -> Reading:
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="bench-prometheus-rules-") as tmp,
        serving(nodes, per_target, clock, Path(tmp)) as (prometheus, size),
    ):
        print(f"  {nodes:,} nodes: {size / 2**20:,.1f} MiB of text a scrape cycle, built and served "
              f"after {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
        targets = len(range(0, nodes, per_target))
        exporters = f'count(count by (instance) (gpuhealth_exporter_total_shards{{job="{JOB}"}}))'
        wait_until(
            f"all {targets:,} targets up, every one of {nodes:,} exporters' series in",
            lambda: (
                (prometheus.value(f'count(up{{job="{JOB}"}} == 1)') or 0) >= targets
                and (prometheus.value(exporters) or 0) >= nodes
            ),
            timeout=START_TIMEOUT,
            interval=2.0,
        )
        full = time.time() + SCRAPE_INTERVAL
        wait_until(
            "every group evaluated after a whole scrape cycle",
            lambda: prometheus.evaluated_since(full),
            timeout=EVALUATION_TIMEOUT,
            interval=1.0,
        )
        first = own_metrics(prometheus)
        since, cpu_since = time.time(), sample(first, "process_cpu_seconds_total")
        wait_until(
            "every group evaluated again",
            lambda: prometheus.evaluated_since(since),
            timeout=EVALUATION_TIMEOUT,
            interval=1.0,
        )
        found = own_metrics(prometheus)
        window = time.time() - since
        durations = {
            dict(labels)["rule_group"]: value
            for (name, labels), value in found.items()
            if name == "prometheus_rule_group_last_duration_seconds"
        }
        intervals = {
            dict(labels)["rule_group"]: value
            for (name, labels), value in found.items()
            if name == "prometheus_rule_group_interval_seconds"
        }
        reading = Reading(
            nodes=nodes,
            targets_bytes=size,
            head_series=sample(found, "prometheus_tsdb_head_series"),
            rss=sample(found, "process_resident_memory_bytes"),
            heap=sample(found, "go_memstats_heap_inuse_bytes"),
            cpu_share=(sample(found, "process_cpu_seconds_total") - cpu_since) / window,
            window=window,
            groups={g: (durations[g], intervals[g]) for g in sorted(durations)},
        )
    slowest = max(d for d, _ in reading.groups.values())
    print(f"  {nodes:,} nodes measured after {time.monotonic() - started:.0f} s: "
          f"{reading.head_series:,.0f} head series, RSS {_mib(reading.rss)}, heap {_mib(reading.heap)}, "
          f"CPU {reading.cpu_share:.1%} of a core over {reading.window:.0f} s, "
          f"rules {reading.rules_share:.2%}, slowest group {slowest * 1000:,.0f} ms", flush=True)  # fmt: skip
    return reading


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


def report(readings: list[Reading]) -> None:
    base = readings[0]
    print()
    print(f"baseline: {base.nodes:,} nodes ({base.gpus:,} GPUs); every exporter scraped each "
          f"{SCRAPE_INTERVAL:g} s; ratios are x baseline")  # fmt: skip
    header = f"  {'measure':34}" + "".join(f"{r.gpus:>13,} GPUs" for r in readings)
    print(header)

    def row(label: str, values: list[str]) -> None:
        print(f"  {label:34}" + "".join(f"{v:>18}" for v in values))

    def ratio(value: float, of: float) -> str:
        return f"{value / of:.2f}x" if of else "-"

    row("nodes (targets)", [f"{r.nodes:,}" for r in readings])
    row("  x baseline", [ratio(r.nodes, base.nodes) for r in readings])
    row("head series", [f"{r.head_series:,.0f}" for r in readings])
    row("  x baseline", [ratio(r.head_series, base.head_series) for r in readings])
    row("RSS (process_resident_memory)", [_mib(r.rss) for r in readings])
    row("  x baseline", [ratio(r.rss, base.rss) for r in readings])
    row("Go heap in use", [_mib(r.heap) for r in readings])
    row("  x baseline", [ratio(r.heap, base.heap) for r in readings])
    row("CPU, share of a core", [f"{r.cpu_share:.1%}" for r in readings])
    row("  x baseline", [ratio(r.cpu_share, base.cpu_share) for r in readings])
    row("  over (s)", [f"{r.window:.0f}" for r in readings])
    row("rules' share of a core", [f"{r.rules_share:.2%}" for r in readings])
    row("  x baseline", [ratio(r.rules_share, base.rules_share) for r in readings])
    row("scrape cycle, text", [_mib(r.targets_bytes) for r in readings])
    print("\n  rule group: last evaluation's duration (share of its interval)")
    for group, (_, interval) in base.groups.items():
        cells = []
        for r in readings:
            duration = r.groups.get(group, (0.0, interval))[0]
            cells.append(f"{duration * 1000:,.1f} ms ({duration / interval:.2%})")
        name = group.rsplit("/", 1)[-1]
        print(f"  {name:58} {interval:3.0f}s" + "".join(f"{c:>24}" for c in cells))
    print("\n  per 1,000 GPUs beyond the baseline (the difference over the baseline, divided out):")
    for r in readings[1:]:
        per = 1000 / (r.gpus - base.gpus)
        print(f"    {r.gpus:,} GPUs: RSS {_mib((r.rss - base.rss) * per)}, "
              f"heap {_mib((r.heap - base.heap) * per)}, "
              f"CPU {(r.cpu_share - base.cpu_share) * per:.2%} of a core, "
              f"{(r.head_series - base.head_series) * per:,.0f} head series")  # fmt: skip


def node_counts(text: str) -> list[int]:
    """`125,1250` -> [125, 1250]: at least one size, each at least 1, the baseline first."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"node counts are whole numbers, comma-separated: {text!r}") from exc
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"each node count must be at least 1: {text!r}")
    return counts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench prometheus_rules",
        description="The real Prometheus scraping node-mode exporters and evaluating the shipped rules.",
    )
    parser.add_argument(
        "--nodes",
        type=node_counts,
        default=list(NODES),
        help=f"fleet sizes in nodes of {GPUS} GPUs, the baseline first "
        f"(default {','.join(str(n) for n in NODES)})",
    )
    parser.add_argument(
        "--nodes-per-target",
        type=int,
        default=NODES_PER_TARGET,
        help=f"nodes whose scrapes one synthetic target serves (default {NODES_PER_TARGET})",
    )
    args = parser.parse_args(argv if argv is not None else [])
    clock = ManualClock(time.time())
    files = ", ".join(p.name for p in sorted(RULES.glob("*.yaml")))
    print(f"fleets of {', '.join(f'{n:,}' for n in args.nodes)} nodes x {GPUS} GPUs (half DRA), "
          f"node mode, all Healthy; shipped rule files {files}")  # fmt: skip
    try:
        readings = [measure(nodes, args.nodes_per_target, clock) for nodes in args.nodes]
    except LoopbackError as exc:
        raise SystemExit(f"bench prometheus_rules: {exc}") from exc
    report(readings)


if __name__ == "__main__":
    main(sys.argv[1:])
