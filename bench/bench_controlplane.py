"""Start time and memory of the real control plane (`simulator.controlplane`), per Kubernetes version.

Cold: the first start on a fresh work directory (new certificates, an empty etcd: the
apiserver's post-start hooks create the bootstrap RBAC roles, priority classes and the rest).
Warm: the same work directory started again (etcd keeps what the first start wrote). Each is
the wall time from `ControlPlane.start()` until every component answers its readiness probe
(etcd `/health`, apiserver `/readyz`, controller-manager `/healthz`, scheduler `/readyz`), with
the per-component split. Memory: resident set (VmRSS) of the four processes, summed, right after
the start and after a settle period (the controllers' first resyncs), both on the warm run.
Baseline: the simulated cluster's start (`SimulatedCluster`, in-process, scenario `quiet`).

    python -m bench controlplane [--kubernetes 1.37] [--rounds 3] [--settle 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from simulator.controlplane import ControlPlane, ControlPlaneError, ControlPlaneSettings, binaries
from simulator.runner import SimulatedCluster

MIB = 1024 * 1024


def _start(workdir: Path, kubernetes: str) -> tuple[ControlPlane, float]:
    plane = ControlPlane(ControlPlaneSettings(kubernetes=kubernetes, workdir=workdir))
    started = time.monotonic()
    plane.start()
    return plane, time.monotonic() - started


def _split(plane: ControlPlane) -> str:
    return ", ".join(f"{k} {v:.2f} s" for k, v in plane.timings.items() if k != "total")


async def _simulated_start() -> float:
    started = time.monotonic()
    async with SimulatedCluster("quiet", speed=1.0):
        return time.monotonic() - started


def run(kubernetes: str, rounds: int, settle: float) -> None:
    try:
        binaries.binary("etcd")
        for name in binaries.KUBERNETES_BINARIES:
            binaries.binary(name, kubernetes)
    except ControlPlaneError as exc:
        print(f"skipped: {exc}")
        return
    cold: list[float] = []
    warm: list[float] = []
    rss_start: list[float] = []
    rss_settled: list[float] = []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="bench-controlplane-") as tmp:
            workdir = Path(tmp)
            plane, took = _start(workdir, kubernetes)
            cold.append(took)
            print(f"  cold start {took:.2f} s ({_split(plane)})")
            plane.stop()
            plane, took = _start(workdir, kubernetes)
            warm.append(took)
            rss_start.append(sum(plane.rss_bytes().values()))
            time.sleep(settle)
            rss = plane.rss_bytes()
            rss_settled.append(sum(rss.values()))
            print(f"  warm start {took:.2f} s ({_split(plane)})")
            print("  RSS after settling: " + ", ".join(f"{k} {v / MIB:.0f} MiB" for k, v in rss.items()))
            plane.stop()
    simulated = asyncio.run(_simulated_start())
    print(f"Kubernetes {kubernetes}, {rounds} rounds (median, min-max):")
    for name, values in (("cold start", cold), ("warm start", warm)):
        print(f"- {name}: {statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")
    for label, sizes in (("RSS at start", rss_start), (f"RSS after {settle:.0f} s", rss_settled)):
        print(f"- {label}, 4 processes: {statistics.median(sizes) / MIB:.0f} MiB")
    print(f"- baseline: the simulated cluster (scenario quiet) starts in {simulated:.2f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench controlplane")
    parser.add_argument("--kubernetes", default="1.37", choices=("1.36", "1.37"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds before the second RSS reading")
    args = parser.parse_args(argv or [])
    run(args.kubernetes, args.rounds, args.settle)


if __name__ == "__main__":
    main()
