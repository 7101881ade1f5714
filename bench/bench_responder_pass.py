"""One reconcile pass of the responder over a breaker-held storm of 1,000 and 10,000 records.

The world is `bench_responder_cluster`'s: the real webhook, recorder and reconciler (the
leader's loop, enforcer, Job checks, Events, the breaker's ConfigMap, the migrator) against
the simulated apiserver in this same process, a static health source of a 12,000-GPU fleet.
A storm of Unknown alerts (`action=restrict`) for N devices is delivered, with the bucket of
new quarantines raised to 1,000 so that the breaker is what binds (at 10,000: 960 enforced,
the rest Deferred/BreakerOpen), and the loop is left to settle for two passes. Then the next
passes of the loop are measured as it runs them (a pass every 0.5 s at the most):
- wall time of `reconcile_once`, and the CPU time of the reconciler's thread alone (the
  apiserver serves the list and the writes from other threads of this process, so the wall
  time is pessimistic: its work shares the interpreter);
- memory: the peak of Python allocations (tracemalloc) during one more pass, less what was
  allocated before it; tracemalloc counts every thread, the apiserver's serving of the list
  included, so this too is an upper bound;
- where the time goes: one more pass under cProfile (the reconciler's thread only);
- resident memory: VmRSS of this process once the passes are measured (the records stored in
  the simulated apiserver and its serving included, and the earlier, smaller size's leftovers:
  an upper bound of the responder's, which runs alone in its pod).

Baselines, in the same run: the pass over 1,000 records (the ratio says how the pass grows), and
a bare paged list of the records through the reconciler's client, in its thread, just before
each timed pass (what any pass that reads every record pays, whatever it decides).
Target (issue 25): one pass over 10,000 records under 1 s.

Run: `python -m bench responder_pass` (about 2 min; `--records 1000` for one size only).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import logging
import pstats
import statistics
import threading
import time
import tracemalloc
from collections import Counter
from dataclasses import dataclass, field

from bench.bench_responder_cluster import (
    FAST_BUCKET,
    CountingReconciler,
    _failing_devices,
    deliver_restricts,
    passes_after,
    world,
)
from responder.reconcile.policy import Health
from responder.reconcile.reconciler import PassReport, ReconcilerSettings
from responder.records import QUARANTINES

TARGET_SECONDS = 1.0
MEASURED_PASSES = 3


@dataclass
class Measured:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    listed: list[float] = field(default_factory=list)
    """A bare paged list of the records, in the reconciler's thread just before each timed pass."""
    peak_bytes: int = 0
    rss_bytes: int = 0
    profile: str = ""


class MeasuredReconciler(CountingReconciler):
    """The reconciler, timing its passes once asked to (`mode`), one pass at a time."""

    mode = "off"
    """off | time | memory | profile; memory and profile fall back to off after their pass."""
    measured = Measured()

    def reconcile_once(self, fence: threading.Event | None = None) -> PassReport:
        mode = self.mode
        if mode == "memory":
            tracemalloc.start()
            before, _ = tracemalloc.get_traced_memory()
            report = super().reconcile_once(fence)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            self.measured.peak_bytes = peak - before
            self.mode = "off"
            return report
        if mode == "profile":
            profiler = cProfile.Profile()
            profiler.enable()
            report = super().reconcile_once(fence)
            profiler.disable()
            out = io.StringIO()
            stats = pstats.Stats(profiler, stream=out)
            stats.sort_stats("tottime").print_stats(12)
            # Which of our functions the time is spent under (the requests they make included).
            stats.sort_stats("cumulative").print_stats(r"(responder|gpuhealth)/", 16)
            self.measured.profile = out.getvalue()
            self.mode = "off"
            return report
        if mode == "time":
            started = time.perf_counter()
            self._client.list(QUARANTINES, page_size=self.settings.page_size)
            self.measured.listed.append(time.perf_counter() - started)
        wall, cpu = time.perf_counter(), time.thread_time()
        report = super().reconcile_once(fence)
        if mode == "time":
            self.measured.wall.append(time.perf_counter() - wall)
            self.measured.cpu.append(time.thread_time() - cpu)
        return report


def resident_bytes() -> int:
    """VmRSS of this process (Linux); 0 where /proc does not say."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def _wait_mode_done(reconciler: MeasuredReconciler) -> None:
    deadline = time.perf_counter() + 300
    while reconciler.mode != "off" and time.perf_counter() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)


async def one_size(records: int, profile: bool) -> tuple[Measured, Counter[str]]:
    settings = ReconcilerSettings(bucket=FAST_BUCKET, max_recheck_seconds=0.5)
    failing = _failing_devices(records)
    MeasuredReconciler.measured = Measured()
    async with world(failing, Health.UNKNOWN, settings, MeasuredReconciler) as w:
        reconciler = w.reconciler
        assert isinstance(reconciler, MeasuredReconciler)
        await asyncio.sleep(0.5)
        statuses = await deliver_restricts(w.url, failing)
        assert set(statuses) == {200}, statuses
        await passes_after(reconciler, 2)
        reconciler.mode = "time"
        await passes_after(reconciler, MEASURED_PASSES)
        reconciler.mode = "memory"
        await _wait_mode_done(reconciler)
        reconciler.measured.rss_bytes = resident_bytes()
        if profile:
            reconciler.mode = "profile"
            await _wait_mode_done(reconciler)
        listed = w.client.list(QUARANTINES, page_size=500).items
        phases = Counter(
            f"{(r.get('status') or {}).get('phase', '?')}/{(r.get('status') or {}).get('phaseReason') or '-'}"
            for r in listed
        )
    return MeasuredReconciler.measured, phases


async def _run(sizes: list[int]) -> None:
    results: dict[int, Measured] = {}
    for records in sizes:
        measured, phases = await one_size(records, profile=records == max(sizes))
        results[records] = measured
        listed = ", ".join(f"{k} {v:,}" for k, v in phases.most_common())
        print(f"{records:,} records after the storm: {listed}")
    print(f"\none reconcile pass, median of {MEASURED_PASSES} passes of the running loop (min-max)")
    print(
        f"  {'records':>8} {'wall s':>18} {'thread CPU s':>18} {'peak alloc MiB':>15} "
        f"{'RSS MiB':>8} {'vs 1,000':>9} {'bare list s':>12}"
    )
    base = results.get(1_000)
    for records, m in results.items():
        wall = statistics.median(m.wall)
        ratio = f"{wall / statistics.median(base.wall):8.1f}x" if base and records != 1_000 else ""
        print(
            f"  {records:8,} {wall:8.3f} ({min(m.wall):.3f}-{max(m.wall):.3f}) "
            f"{statistics.median(m.cpu):8.3f} ({min(m.cpu):.3f}-{max(m.cpu):.3f}) "
            f"{m.peak_bytes / 2**20:15.1f} {m.rss_bytes / 2**20:8.0f} {ratio:>9} "
            f"{statistics.median(m.listed):12.3f}"
        )
    if base is not None:
        per = statistics.median(base.wall) / 1_000 * 1e6
        print(f"  per record at 1,000: {per:.0f} us wall")
    biggest = max(results)
    wall = statistics.median(results[biggest].wall)
    verdict = "met" if wall < TARGET_SECONDS else "MISSED"
    print(f"target: one pass over {biggest:,} records under {TARGET_SECONDS:.0f} s: {verdict} ({wall:.2f} s)")
    if results[biggest].profile:
        print(f"\nwhere the time goes: one pass over {biggest:,} records under cProfile (reconciler thread)")
        lines = results[biggest].profile.splitlines()
        print("\n".join(line for line in lines if line.strip() and "List reduced" not in line))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench responder_pass")
    parser.add_argument(
        "--records", type=int, action="append", help="record counts (default: 1,000 and 10,000)"
    )
    args = parser.parse_args(argv or [])
    # The storm logs a line per deferred record and per refused status write; the table counts them.
    logging.getLogger().setLevel(logging.ERROR)
    asyncio.run(_run(args.records or [1_000, 10_000]))


if __name__ == "__main__":
    main()
