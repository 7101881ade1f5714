"""Resident memory and CPU of one node-mode exporter (the DaemonSet's pod) in steady state.

One device-plugin node of 8 GPUs with 4 pods of 2 on the simulated cluster (1x speed), and the
exporter as the DaemonSet runs it: `gpuhealth exporter --node` with NVML and the kubelet's
pod-resources read from the simulator, its watches of the node's pods, the node's Lease and
the ResourceSlices, and a scrape every `--scrape-seconds` (Prometheus' default 15 s) of
`/metrics`, gzip accepted. After a warm-up, the exporter's CPU time (utime + stime of its
process, `/proc/<pid>/stat`) over `--seconds` of that, and its resident set (VmRSS) and peak
(VmHWM) at the end.

Baseline, in the same run: an idle Python interpreter that imported what the exporter imports
(aiohttp, prometheus_client, the exporter's package): the floor any Python exporter pays, so
the ratio says what gpuhealth's state and work add on top. Per 1,000 GPUs: 125 such exporters.

Run: `python -m bench node_exporter_cost [--seconds 60] [--scrape-seconds 15]`.
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from gpuhealth.loopback_ports import free_port
from gpuhealth.testing.loopback import wait_until
from simulator.testing import running_cluster

SCENARIO = {
    "name": "node-exporter-cost",
    "fleet": [{"name": "gpu", "count": 1, "gpusPerNode": 8, "path": "device-plugin"}],
    "workloads": [{"name": "serve", "namespace": "inference", "replicas": 4, "gpusPerPod": 2}],
}
NODE = "gpu-0"
TICKS = os.sysconf("SC_CLK_TCK")
GPUS_PER_1000 = 1000 // 8


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15)


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of the process, MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found["VmRSS"], found["VmHWM"]


def scrape(url: str) -> int:
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return len(gzip.decompress(body)) if body[:2] == b"\x1f\x8b" else len(body)


def answers(url: str) -> bool:
    try:
        return scrape(url) > 0
    except OSError:
        return False


def baseline_rss() -> float:
    """VmRSS of an idle interpreter that imported the exporter's libraries and package."""
    code = (
        "import aiohttp, prometheus_client, exporter.server, exporter.state, time\n"
        "print('ready', flush=True)\ntime.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        return memory_mib(proc.pid)[0]
    finally:
        proc.kill()
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench node_exporter_cost")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window (default 60)")
    parser.add_argument("--scrape-seconds", type=float, default=15.0, help="scrape interval (default 15)")
    args = parser.parse_args(argv)
    floor = baseline_rss()
    with running_cluster(SCENARIO, speed=1.0) as cluster, tempfile.TemporaryDirectory() as work:
        port = free_port()
        argv_ = [
            sys.executable, "-m", "gpuhealth", "--log-level", "WARNING", "exporter",
            "--kubeconfig", str(cluster.kubeconfig_path), "--node", NODE,
            "--nvml", f"sim:{cluster.url}", "--pod-resources", f"sim:{cluster.url}",
            "--listen", f"127.0.0.1:{port}", "--directory", str(Path(work) / "directory.sqlite"),
        ]  # fmt: skip
        log = (Path(work) / "exporter.log").open("wb")
        proc = subprocess.Popen(argv_, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            wait_until("the exporter serving its node's 8 GPUs", lambda: answers(url), timeout=60)
            for _ in range(3):  # warm-up: the first reads and a few scrapes
                scrape(url)
                time.sleep(2)
            every = f"scrape every {args.scrape_seconds:g} s, window {args.seconds:g} s"
            print(f"node-mode exporter, 1 node x 8 GPUs (4 pods of 2), {every}", flush=True)
            start_cpu, start = cpu_seconds(proc.pid), time.monotonic()
            size = 0
            while time.monotonic() - start < args.seconds:
                size = scrape(url)
                time.sleep(max(0.0, min(args.scrape_seconds, args.seconds - (time.monotonic() - start))))
            used = cpu_seconds(proc.pid) - start_cpu
            wall = time.monotonic() - start
            rss, peak = memory_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
            log.close()
    share = used / wall
    print(f"  scrape body: {size:,} bytes")
    print(f"  CPU: {used:.2f} s over {wall:.0f} s = {share * 100:.2f} % of one core")
    print(f"  memory: VmRSS {rss:.1f} MiB (peak VmHWM {peak:.1f} MiB)")
    print(f"  baseline, an idle interpreter with the same imports: VmRSS {floor:.1f} MiB")
    print(f"  exporter / baseline: {rss / floor:.2f}x resident")
    total, above = rss * GPUS_PER_1000 / 1024, (rss - floor) * GPUS_PER_1000 / 1024
    cores = share * GPUS_PER_1000 * 100
    print(
        f"  per 1,000 GPUs ({GPUS_PER_1000} node exporters): {cores:.0f} % of one core, "
        f"{total:.1f} GiB resident in all ({above:.1f} GiB above the interpreter floor)"
    )


if __name__ == "__main__":
    main()
