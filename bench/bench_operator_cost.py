"""What an operator pays: the cluster-mode exporter watching the 10,000-node fleet, scraped every 15 s.

Three processes, so each one's cost is its own:

- the simulated cluster, `gpuhealth sim --scenario fleet-10k --speed 1` (10,000 nodes x 8
  GPUs, 15,000 pods holding every GPU): its churn is the kubelets' Lease renewals (every node
  every 10 s, spread: about 1,000 Lease updates a second) and the scenario's faults (an XID
  at 1 min, a 10-minute Unknown at 1.5 min, a 5-minute node partition at 2 min of simulated
  time); the kubelets' status syncs write a pod only when something in it changed;
- the exporter as deployed in cluster mode, `gpuhealth exporter` with no `--node`, watching
  pods, claims, slices and Leases of the whole fleet and writing its SQLite device directory;
- this process: a scraper thread that GETs `/metrics` every 15 s, as Prometheus would (gzip
  accepted, so the exporter compresses as it does for Prometheus), and the sampler that
  reads the other two from /proc.

The figure is steady state: it starts after the exporter is ready, tracks all 80,000
devices, and a warm-up (default 1 min) has passed, so the initial lists and the first folds
are not in it (they are reported apart). Over the window (default 10 min): CPU as a share of
one core, from the utime+stime deltas of /proc/PID/stat (all threads of the process), and
resident memory from /proc/PID/status (VmRSS sampled every second: the maximum and the last
value; VmHWM, the peak since start, includes the initial lists).

Baseline, in the same run: the simulator's own CPU and memory over the same window (it
produces the churn and serves the exporter's watches and nothing else), and the event rate
the exporter saw (its `gpuhealth_exporter_watch_events_total`, read from the scrapes).
Targets (issue 10): at most 10 % of a core and 500 MiB.

Sharded (`--shards M`, issue 25): one shard of a fleet M times the shard's size pays the
whole fleet's watch stream (the API cannot select by hash) and keeps only its nodes
(`exporter/sharding.py`). Two measurements one after the other, each with a simulator of its
own serving a fleet without faults (half device-plugin, half DRA nodes of 8 GPUs, every GPU
allocated): the baseline, an unsharded exporter over `--shard-nodes` nodes (12,500 by
default), then `gpuhealth exporter --shard 0 --total-shards M` over M times as many; both
print their rows and the shard's ratios against the unsharded exporter. Targets: at most
10 % of a core and 1 GiB.

Run: `python -m bench operator_cost [--duration 10m] [--warmup 1m] [--shards 4
[--shard-nodes 12500]]`; a line of progress every minute.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen
from typing import Any

import yaml

from exporter.sharding import Shard
from gpuhealth.cliargs import duration_seconds, positive_duration_seconds
from gpuhealth.testing.loopback import (
    LoopbackError,
    ProcessExited,
    child_process,
    free_port,
    http_ok,
    log_tail,
    wait_until,
)
from simulator.scenario import resolve

SCENARIO = "fleet-10k"
DEVICES = 80_000
"""GPUs in the scenario: every one is tracked once the initial lists are in."""
NODES = 10_000
SHARD_NODES = 12_500
"""Nodes in a shard of the sharded measurement (issue 25: 12,500 nodes x 8 GPUs a shard)."""
GPUS_PER_NODE = 8
SCRAPE_INTERVAL = 15.0
DURATION = 600.0
WARMUP = 60.0
PROGRESS_EVERY = 60.0
SAMPLE_EVERY = 1.0
CPU_TARGET = 0.10
RSS_TARGET = 500 * 2**20
SHARD_RSS_TARGET = 2**30
LEASE_PERIOD = 10.0
"""The simulated kubelets' Lease renewal period (`simulator.model.FleetSettings`)."""
START_TIMEOUT = 600.0
"""Building the fleet and the exporter's first lists of it, on a loaded 2-core machine."""
CLK_TCK = os.sysconf("SC_CLK_TCK")
_EVENTS = re.compile(rb"^gpuhealth_exporter_watch_events_total\{([^}]*)\} (\S+)$", re.M)
_DEVICES = re.compile(rb"^gpuhealth_exporter_devices_tracked (\S+)$", re.M)


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of `pid` so far (/proc/PID/stat fields 14 and 15)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) is in parentheses and may hold spaces: count after it.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in bytes."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found["VmRSS"], found["VmHWM"]


@dataclass(frozen=True)
class Fleet:
    """One measurement: the scenario the simulator serves and the exporter's part of it."""

    label: str
    scenario: str
    """A built-in scenario's name or a scenario file."""
    nodes: int
    devices: int
    """GPUs the exporter tracks once its initial lists are in (its shard's only)."""
    exporter_args: tuple[str, ...] = ()
    rss_target: int = RSS_TARGET


def steady_fleet(nodes: int) -> dict[str, Any]:
    """A scenario of `nodes` nodes x 8 GPUs, half device-plugin and half DRA, every GPU allocated
    (as fleet-10k's workloads do), and no faults: the churn is the kubelets' Lease renewals."""
    half = nodes // 2
    return {
        "name": f"steady-{nodes}",
        "description": f"{nodes:,} nodes x {GPUS_PER_NODE} GPUs, every GPU allocated, no faults.",
        "fleet": [
            {"name": "gpu-dp", "count": half, "gpusPerNode": GPUS_PER_NODE, "path": "device-plugin"},
            {"name": "gpu-dra", "count": nodes - half, "gpusPerNode": GPUS_PER_NODE, "path": "dra"},
        ],
        "workloads": [
            {"name": "llm-serve", "namespace": "inference", "replicas": half * 2, "gpusPerPod": 4,
             "checkpoint": "annotation", "topology": "shardable", "path": "device-plugin"},
            {"name": "train", "namespace": "research", "kind": "Job", "replicas": nodes - half,
             "gpusPerPod": 8, "checkpoint": "annotation", "topology": "fixed", "path": "dra"},
        ],
    }  # fmt: skip


def sharded_fleets(workdir: Path, shard_nodes: int, shards: int) -> list[Fleet]:
    """The baseline (an unsharded exporter over `shard_nodes` nodes) and shard 0 of `shards`
    over a fleet `shards` times as large, each with its scenario file written under `workdir`."""
    fleets = []
    for total in (1, shards):
        data = steady_fleet(shard_nodes * total)
        path = workdir / f"{data['name']}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        shard = Shard(0, total)
        nodes = resolve(data).nodes
        owned = [group.gpus_per_node for name, group in nodes.items() if shard.owns(name)]
        label = "unsharded" if total == 1 else f"shard 0 of {total}"
        args = ("--shard", "0", "--total-shards", str(total)) if shard.sharded else ()
        fleets.append(
            Fleet(f"{label} ({len(owned):,} of {len(nodes):,} nodes)", str(path), len(nodes), sum(owned),
                  args, SHARD_RSS_TARGET)
        )  # fmt: skip
    return fleets


@dataclass
class Usage:
    """One process over the measured window."""

    name: str
    pid: int
    cpu_start: float = 0.0
    cpu_end: float = 0.0
    rss_max: int = 0
    rss_end: int = 0
    hwm: int = 0

    def start(self) -> None:
        self.cpu_start = self.cpu_end = cpu_seconds(self.pid)
        self.rss_max = 0
        self.sample()

    def sample(self) -> None:
        rss, self.hwm = memory_bytes(self.pid)
        self.rss_end = rss
        self.rss_max = max(self.rss_max, rss)
        self.cpu_end = cpu_seconds(self.pid)

    def share(self, seconds: float) -> float:
        """CPU seconds per wall second over the window: the share of one core."""
        return (self.cpu_end - self.cpu_start) / seconds


@dataclass
class Scrape:
    at: float
    seconds: float
    sent: int
    """Bytes on the wire (gzip, as Prometheus asks for it)."""
    size: int
    events: float
    """The exporter's watch events so far, all resources and types."""
    leases: float


@dataclass
class Scraper:
    """GET /metrics every `interval` seconds in a thread, as Prometheus would."""

    url: str
    interval: float = SCRAPE_INTERVAL
    scrapes: list[Scrape] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def _request(self) -> urllib.request.Request:
        # What Prometheus sends: the text format, gzip accepted (the exporter compresses).
        headers = {"Accept": "text/plain;version=0.0.4", "Accept-Encoding": "gzip"}
        return urllib.request.Request(self.url, headers=headers)

    def run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += self.interval
            started = time.monotonic()
            try:
                with urllib.request.urlopen(self._request, timeout=self.interval) as response:
                    sent = response.read()
                    gzipped = response.headers.get("Content-Encoding") == "gzip"
            except OSError as exc:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {exc}")
                continue
            took = time.monotonic() - started
            body = gzip.decompress(sent) if gzipped else sent
            events = leases = 0.0
            for labels, value in _EVENTS.findall(body):
                events += float(value)
                if b'resource="leases"' in labels:
                    leases += float(value)
            self.scrapes.append(Scrape(started, took, len(sent), len(body), events, leases))

    def stop(self) -> None:
        self._stop.set()

    def since(self, at: float) -> list[Scrape]:
        return [s for s in self.scrapes if s.at >= at]


def rate(scrapes: list[Scrape], value: Callable[[Scrape], float]) -> float:
    """Per second between the first and the last of `scrapes` (0 with fewer than two)."""
    if len(scrapes) < 2 or scrapes[-1].at <= scrapes[0].at:
        return 0.0
    return (value(scrapes[-1]) - value(scrapes[0])) / (scrapes[-1].at - scrapes[0].at)


def _alive(proc: Popen[bytes], name: str, log: Path) -> None:
    if proc.poll() is not None:
        raise ProcessExited(f"{name} exited with status {proc.returncode}:\n{log_tail(log)}")


def _tracked(url: str) -> float | None:
    """devices_tracked from one /metrics scrape, None when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            found = _DEVICES.search(response.read())
    except OSError:
        return None
    return float(found.group(1)) if found else None


@contextmanager
def processes(workdir: Path, fleet: Fleet) -> Iterator[tuple[Popen[bytes], Popen[bytes], str, float]]:
    """(simulator, exporter, metrics URL, seconds from the exporter's start to all devices tracked)."""
    python = [sys.executable, "-m", "gpuhealth", "--log-level", "WARNING"]
    kubeconfig = workdir / "kubeconfig"
    sim_log, exporter_log = workdir / "sim.log", workdir / "exporter.log"
    with ExitStack() as stack:
        serve = ["sim", "--scenario", fleet.scenario, "--speed", "1", "--kubeconfig-out", str(kubeconfig)]
        sim = stack.enter_context(child_process([*python, *serve], sim_log))

        def sim_ready() -> bool:
            _alive(sim, "the simulator", sim_log)
            return "pods running" in sim_log.read_text(errors="replace")

        began = time.monotonic()
        wait_until("the simulated fleet to be built", sim_ready, timeout=START_TIMEOUT, interval=1.0)
        built = time.monotonic() - began
        print(f"  simulator: {fleet.label} built and serving after {built:.0f} s", flush=True)
        port = free_port()
        exporter = stack.enter_context(
            child_process(
                [*python, "exporter", "--kubeconfig", str(kubeconfig), "--listen", f"127.0.0.1:{port}",
                 "--directory", str(workdir / "directory.sqlite"), *fleet.exporter_args],
                exporter_log,
            )
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        began = time.monotonic()

        def exporter_ready() -> bool:
            _alive(exporter, "the exporter", exporter_log)
            _alive(sim, "the simulator", sim_log)
            return http_ok(f"{base}/readyz") and (_tracked(f"{base}/metrics") or 0) >= fleet.devices

        wait_until(f"the exporter to track all {fleet.devices:,} devices", exporter_ready,
                   timeout=START_TIMEOUT, interval=2.0)  # fmt: skip
        yield sim, exporter, f"{base}/metrics", time.monotonic() - began


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f} MiB"


@dataclass
class Window:
    """What one measurement saw over its steady-state window."""

    fleet: Fleet
    usage: list[Usage]
    """The exporter's, then the simulator's."""
    elapsed: float
    scrapes: list[Scrape]
    failures: list[str]


def measure(duration: float, warmup: float, fleet: Fleet) -> Window:
    print(f"fleet: {fleet.label}, {fleet.scenario} at speed 1 ({fleet.devices:,} GPUs tracked); scrape "
          f"every {SCRAPE_INTERVAL:g} s; warm-up {warmup:g} s, then {duration:g} s measured")  # fmt: skip
    with (
        tempfile.TemporaryDirectory(prefix="bench-operator-cost-") as tmp,
        processes(Path(tmp), fleet) as started,
    ):
        sim, exporter, url, ready_after = started
        start_cpu = cpu_seconds(exporter.pid)
        start_rss, start_hwm = memory_bytes(exporter.pid)
        print(f"  exporter: ready, all {fleet.devices:,} devices tracked after {ready_after:.0f} s "
              f"({start_cpu:.1f} CPU s; RSS {_mib(start_rss)}, peak so far {_mib(start_hwm)})",
              flush=True)  # fmt: skip
        scraper = Scraper(url)
        thread = threading.Thread(target=scraper.run, name="scraper", daemon=True)
        thread.start()
        try:
            time.sleep(warmup)
            usage = [Usage("exporter", exporter.pid), Usage("simulator", sim.pid)]
            for u in usage:
                u.start()
            window_start = time.monotonic()
            last_progress, last_cpu = window_start, [u.cpu_end for u in usage]
            end = window_start + duration
            while (now := time.monotonic()) < end:
                time.sleep(min(SAMPLE_EVERY, end - now))
                for proc, name in ((exporter, "exporter"), (sim, "simulator")):
                    if proc.poll() is not None:
                        raise ProcessExited(f"the {name} exited with status {proc.returncode} mid-run")
                for u in usage:
                    u.sample()
                now = time.monotonic()
                if now - last_progress >= PROGRESS_EVERY or now >= end:
                    span = now - last_progress
                    shares = [(u.cpu_end - c) / span for u, c in zip(usage, last_cpu, strict=True)]
                    recent = [s for s in scraper.scrapes if s.at >= last_progress]
                    print(f"  [{(now - window_start) / 60:4.1f}/{duration / 60:.1f} min] exporter "
                          f"{shares[0]:6.1%} of a core, RSS {_mib(usage[0].rss_end)}; simulator "
                          f"{shares[1]:6.1%}, RSS {_mib(usage[1].rss_end)}; "
                          f"{rate(scraper.since(last_progress - SCRAPE_INTERVAL), lambda s: s.events):,.0f} "
                          f"events/s; {len(recent)} scrapes, slowest "
                          f"{max((s.seconds for s in recent), default=0.0):.2f} s", flush=True)  # fmt: skip
                    last_progress, last_cpu = now, [u.cpu_end for u in usage]
            elapsed = time.monotonic() - window_start
        finally:
            scraper.stop()
            thread.join(timeout=SCRAPE_INTERVAL + 5)
    return Window(fleet, usage, elapsed, scraper.since(window_start), scraper.failures)


def report(window: Window) -> None:
    (ours, sim), elapsed, scrapes, failures = window.usage, window.elapsed, window.scrapes, window.failures
    rss_target = window.fleet.rss_target
    events = rate(scrapes, lambda s: s.events)
    leases = rate(scrapes, lambda s: s.leases)
    print()
    print(f"steady state over {elapsed:.0f} s: {len(scrapes)} scrapes ({len(failures)} failed), "
          f"{events:,.0f} watch events/s at the exporter, of which {leases:,.0f} Lease updates "
          f"(the fleet renews {window.fleet.nodes / LEASE_PERIOD:,.0f}/s when the simulator keeps up)"
          )  # fmt: skip
    if scrapes:
        took = sorted(s.seconds for s in scrapes)
        last = scrapes[-1]
        print(f"scrape: {last.size / 2**20:.1f} MiB of text, {last.sent / 2**20:.1f} MiB gzipped, "
              f"answered in median {took[len(took) // 2]:.2f} s, max {took[-1]:.2f} s")  # fmt: skip
    for line in failures[:5]:
        print(f"  scrape failed: {line}")
    print()
    print(f"{'measure':<48}{'ours':>12}{'baseline':>12}{'x base':>8}{'target':>14}")
    rows = [
        ("CPU, share of one core (exporter vs simulator)", ours.share(elapsed), sim.share(elapsed),
         f"{ours.share(elapsed):.1%}", f"{sim.share(elapsed):.1%}", f"<= {CPU_TARGET:.0%}"),
        ("RSS max in the window", ours.rss_max, sim.rss_max, _mib(ours.rss_max), _mib(sim.rss_max),
         f"<= {_mib(rss_target)}"),
        ("RSS at the end", ours.rss_end, sim.rss_end, _mib(ours.rss_end), _mib(sim.rss_end), ""),
        ("peak RSS since start (VmHWM, with the lists)", ours.hwm, sim.hwm, _mib(ours.hwm),
         _mib(sim.hwm), ""),
    ]  # fmt: skip
    for label, value, base, shown, shown_base, target in rows:
        ratio = f"{value / base:.2f}" if base else "-"
        print(f"{label:<48}{shown:>12}{shown_base:>12}{ratio:>8}{target:>14}")
    print()
    cpu_met = ours.share(elapsed) <= CPU_TARGET
    rss_met = ours.rss_max <= rss_target
    print(f"target: CPU <= {CPU_TARGET:.0%} of a core -> {ours.share(elapsed):.1%} "
          f"({'met' if cpu_met else 'NOT met'}); RSS <= {_mib(rss_target)} -> max {_mib(ours.rss_max)} "
          f"({'met' if rss_met else 'NOT met'})")  # fmt: skip


def compare(unsharded: Window, shard: Window) -> None:
    """The shard against the unsharded exporter of its size: what the rest of the fleet's stream costs."""
    base, ours = unsharded.usage[0], shard.usage[0]
    events = [rate(w.scrapes, lambda s: s.events) for w in (unsharded, shard)]
    print()
    print(f"{'the shard against the unsharded exporter':<48}{'shard':>12}{'unsharded':>12}{'x base':>8}")
    rows = [
        ("watch events/s at the exporter", events[1], events[0], f"{events[1]:,.0f}", f"{events[0]:,.0f}"),
        ("CPU, share of one core", ours.share(shard.elapsed), base.share(unsharded.elapsed),
         f"{ours.share(shard.elapsed):.1%}", f"{base.share(unsharded.elapsed):.1%}"),
        ("RSS max in the window", ours.rss_max, base.rss_max, _mib(ours.rss_max), _mib(base.rss_max)),
        ("peak RSS since start (VmHWM)", ours.hwm, base.hwm, _mib(ours.hwm), _mib(base.hwm)),
        ("devices tracked", shard.fleet.devices, unsharded.fleet.devices, f"{shard.fleet.devices:,}",
         f"{unsharded.fleet.devices:,}"),
    ]  # fmt: skip
    for label, value, of, shown, shown_base in rows:
        ratio = f"{value / of:.2f}" if of else "-"
        print(f"{label:<48}{shown:>12}{shown_base:>12}{ratio:>8}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench operator_cost",
        description="CPU and memory of the cluster-mode exporter watching the 10,000-node fleet.",
    )
    parser.add_argument(
        "--duration",
        type=positive_duration_seconds,
        default=DURATION,
        help=f"measured steady-state window (e.g. 10m, 90s; default {DURATION / 60:g}m)",
    )
    parser.add_argument(
        "--warmup",
        type=duration_seconds,
        default=WARMUP,
        help=f"excluded time after all devices are tracked (default {WARMUP:g}s)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help="measure one shard of a fleet this many shards large against an unsharded exporter "
        "of the shard's size (default: the unsharded fleet-10k only)",
    )
    parser.add_argument(
        "--shard-nodes",
        type=int,
        default=SHARD_NODES,
        help=f"with --shards: nodes of {GPUS_PER_NODE} GPUs in a shard (default {SHARD_NODES:,})",
    )
    args = parser.parse_args(argv if argv is not None else [])
    if not Path("/proc/self/stat").exists():
        raise SystemExit("bench operator_cost: reads CPU and memory from /proc (Linux); none here")
    if args.shards == 1 or args.shards < 0 or args.shard_nodes < 2:
        parser.error("--shards takes 2 or more, --shard-nodes 2 or more")
    try:
        if not args.shards:
            report(measure(args.duration, args.warmup, Fleet(SCENARIO, SCENARIO, NODES, DEVICES)))
            return
        with tempfile.TemporaryDirectory(prefix="bench-operator-cost-fleets-") as tmp:
            fleets = sharded_fleets(Path(tmp), args.shard_nodes, args.shards)
            windows = [measure(args.duration, args.warmup, fleet) for fleet in fleets]
        for window in windows:
            print(f"\n-- {window.fleet.label}")
            report(window)
        compare(*windows)
    except LoopbackError as exc:
        raise SystemExit(f"bench operator_cost: {exc}") from exc


if __name__ == "__main__":
    main(sys.argv[1:])
