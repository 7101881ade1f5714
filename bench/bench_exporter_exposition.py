"""Exposition at fleet scale: `render_metrics` against prometheus_client's `generate_latest`.

A cluster-mode exporter over 10,000 nodes x 8 GPUs holds 80,000 devices, each with the
contract's series (three health lines, status age, observed time, status version, info,
one allocation) plus one lease age per node. The candidate renders a `Snapshot` of them;
the baseline holds the very same series in labelled `Gauge`s of a private registry and
calls `generate_latest`. Each side runs in its own subprocess so that its memory figures
are clean: "held" is resident memory after building the state and rendering it once, less
the interpreter's resident memory before building; "peak" is the high-water mark less the
same baseline.

Targets (issue 3): render time at most 0.2x `generate_latest`, memory held at most 0.5x.
Gzip is reported separately (the server compresses only when the scraper asks).

Run: `python -m bench exporter_exposition` (or this module with `--nodes N` for a smaller
fleet).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import gzip
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench.gauges import DeviceGauges
from exporter.exposition import MetricsRenderer
from exporter.snapshot import Allocation, DeviceState, DriverTaint, NodeState, Snapshot, status_age

NOW = 1_800_000_000.0
GPUS_PER_NODE = 8


def _memory_kib() -> tuple[int, int]:
    """(resident, high-water mark) in KiB from /proc/self/status."""
    rss = hwm = 0
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    return rss, hwm


def fleet(nodes: int) -> Iterator[DeviceState]:
    """A deterministic fleet: half the nodes on device plugins, half on DRA; a few faults."""
    for n in range(nodes):
        node = f"gpu-node-{n:05d}"
        dra = n % 2 == 1
        for g in range(GPUS_PER_NODE):
            i = n * GPUS_PER_NODE + g
            uuid = f"GPU-{i:08x}-1f2e-4d3c-8b7a-{n:06x}{g:06x}"
            health = "Healthy"
            message = ""
            if i % 997 == 0:
                health, message = "Unhealthy", f"XID 79: GPU has fallen off the bus (node {node})"
            elif i % 211 == 0:
                health = "Unknown"
            job = f"train-{n // 4:04d}"
            if dra:
                resource = "claim:gpus/gpu"
                claim = f"{job}-{g // 4}-gpus-{i % 9973:05x}"
                allocation = Allocation(f"tenant-{n % 37}", f"{job}-{g // 4}", "trainer", resource, claim)
                xid = DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79")
                taints = (xid,) if health == "Unhealthy" else ()
                state = DeviceState(
                    node=node,
                    device=uuid,
                    health=health,
                    message=message,
                    status_version=1 + i % 3,
                    first_seen=NOW - 86_400,
                    changed_at=NOW - 3_600,
                    observed_at=NOW - (i % 30),
                    uuid=uuid,
                    driver="gpu.nvidia.com",
                    pool=node,
                    device_name=f"gpu-{g}",
                    resource=resource,
                    allocations=(allocation,),
                    driver_taints=taints,
                )
            else:
                resource = "nvidia.com/gpu"
                allocation = Allocation(f"tenant-{n % 37}", f"{job}-{g // 4}", "trainer", resource)
                state = DeviceState(
                    node=node,
                    device=uuid,
                    health=health,
                    message=message,
                    status_version=1 + i % 3,
                    first_seen=NOW - 86_400,
                    changed_at=NOW - 3_600,
                    observed_at=NOW - (i % 30),
                    uuid=uuid,
                    resource=resource,
                    allocations=(allocation,),
                )
            yield state


def lease_renewed_at(n: int) -> float:
    return NOW - (n % 10) - 0.25


def build_snapshot(nodes: int) -> Snapshot:
    devices = {(d.node, d.device): d for d in fleet(nodes)}
    node_states = {
        f"gpu-node-{n:05d}": NodeState(f"gpu-node-{n:05d}", lease_renewed_at(n)) for n in range(nodes)
    }
    return Snapshot(devices=devices, nodes=node_states)


def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def child_candidate(nodes: int) -> dict[str, Any]:
    gc.collect()
    base_rss, _ = _memory_kib()
    snapshot = build_snapshot(nodes)
    renderer = MetricsRenderer()
    cold, body = _timed(renderer.render, snapshot, NOW)
    warm = [_timed(renderer.render, snapshot, NOW + k)[0] for k in range(1, 4)]
    del body
    gc.collect()
    held_rss, _ = _memory_kib()
    # Heartbeats: every device observed again, so every DeviceState object is new.
    churned_devices = {
        key: dataclasses.replace(d, observed_at=d.observed_at + 10) for key, d in snapshot.devices.items()
    }
    churned = dataclasses.replace(snapshot, devices=churned_devices)
    del churned_devices
    churn, body = _timed(renderer.render, churned, NOW + 10)
    _, peak = _memory_kib()
    gzip1, compressed1 = _timed(gzip.compress, body, 1)
    gzip6, compressed6 = _timed(gzip.compress, body, 6)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "series": series,
        "bytes": len(body),
        "cold_s": cold,
        "warm_s": statistics.median(warm),
        "churn_s": churn,
        "held_mib": (held_rss - base_rss) / 1024,
        "peak_mib": (peak - base_rss) / 1024,
        "gzip1_s": gzip1,
        "gzip1_bytes": len(compressed1),
        "gzip6_s": gzip6,
        "gzip6_bytes": len(compressed6),
    }


def baseline_registry(nodes: int) -> CollectorRegistry:
    """The fleet's series held in labelled Gauges, with the same values the renderer gives."""
    registry = CollectorRegistry()
    gauges = DeviceGauges(registry)
    for d in fleet(nodes):
        n = int(d.node.rsplit("-", 1)[1])
        gauges.add(d, status_age(d, NodeState(d.node, lease_renewed_at(n)), None, NOW))
    for n in range(nodes):
        gauges.lease.labels(f"gpu-node-{n:05d}").set(NOW - lease_renewed_at(n))
    return registry


def child_baseline(nodes: int) -> dict[str, Any]:
    gc.collect()
    base_rss, _ = _memory_kib()
    registry = baseline_registry(nodes)
    gc.collect()
    held_rss, _ = _memory_kib()
    elapsed, body = _timed(generate_latest, registry)
    _, peak = _memory_kib()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "series": series,
        "bytes": len(body),
        "generate_s": elapsed,
        "held_mib": (held_rss - base_rss) / 1024,
        "peak_mib": (peak - base_rss) / 1024,
    }


def _run_child(kind: str, nodes: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_exporter_exposition", "--child", kind, "--nodes", str(nodes)],
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=10_000, help="simulated nodes (8 GPUs each)")
    parser.add_argument("--child", choices=["candidate", "baseline"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv if argv is not None else [])
    if args.child:
        run = child_candidate if args.child == "candidate" else child_baseline
        print(json.dumps(run(args.nodes)))
        return

    ours = _run_child("candidate", args.nodes)
    base = _run_child("baseline", args.nodes)
    if ours["series"] != base["series"]:
        print(f"WARNING: series differ: candidate {ours['series']}, baseline {base['series']}")
    gen = base["generate_s"]
    print(
        f"fleet: {args.nodes} nodes x {GPUS_PER_NODE} GPUs = {args.nodes * GPUS_PER_NODE} devices, "
        f"{ours['series']} series, {ours['bytes'] / 2**20:.1f} MiB of text "
        f"(baseline {base['bytes'] / 2**20:.1f} MiB)"
    )
    print(f"{'measure':50} {'value':>10} {'ratio':>8}  target")

    def row(
        name: str, value: float, unit: str, baseline: float, target: float | None = None, note: str = ""
    ) -> None:
        ratio = value / baseline
        verdict = "" if target is None else f"<= {target}x {'met' if ratio <= target else 'MISSED'}"
        print(f"{name:50} {value:>8.3f} {unit:1} {ratio:>7.3f}x  {verdict}{note}")

    row("generate_latest (baseline)", gen, "s", gen)
    row("render_metrics, first scrape (cold cache)", ours["cold_s"], "s", gen, 0.2)
    row("render_metrics, steady state (warm cache)", ours["warm_s"], "s", gen, 0.2)
    row("render_metrics, every device re-observed", ours["churn_s"], "s", gen, 0.2)
    row("memory held, baseline (labelled Gauges), MiB", base["held_mib"], "", base["held_mib"])
    row("memory held, candidate (snapshot + cache), MiB", ours["held_mib"], "", base["held_mib"], 0.5)
    row("peak memory, baseline, MiB", base["peak_mib"], "", base["peak_mib"])
    row("peak memory, candidate, MiB", ours["peak_mib"], "", base["peak_mib"])
    for level in (1, 6):
        size = ours[f"gzip{level}_bytes"] / 2**20
        row(
            f"gzip level {level} of the body (separate)",
            ours[f"gzip{level}_s"],
            "s",
            gen,
            note=f"-> {size:.1f} MiB",
        )


if __name__ == "__main__":
    main(sys.argv[1:])
