"""End to end: the exporter against the simulated cluster, scraped by a real Prometheus.

Aspects covered: `gpuhealth exporter` (the real command, in its own process) lists and
watches the simulated apiserver; a real Prometheus 3 scrapes it every second; after
an Unhealthy fault on a device-plugin GPU and on a DRA GPU, Prometheus answers
`gpu_device_health{status="Unhealthy"} == 1` for exactly those devices (by GPU UUID);
after a kubelet stops, the node's Lease age and its devices' status age grow in
Prometheus while a healthy node's stay small, although the reported value stays Healthy;
the device directory records it all (`gpuhealth devices`), and the exporter stops cleanly
on SIGTERM.
"""

from __future__ import annotations

import json
import signal
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.cli import main
from gpuhealth.testing.loopback import ScrapeJob, child_process, free_port, run_prometheus, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO: dict[str, Any] = {
    "name": "exporter-integration",
    "description": "2 device-plugin nodes and 1 DRA node, 4 GPUs each; faults come from the test",
    "fleet": [
        {"name": "gpu-dp", "count": 2, "gpusPerNode": 4, "path": "device-plugin"},
        {"name": "gpu-dra", "count": 1, "gpusPerNode": 4, "path": "dra"},
    ],
    "workloads": [
        {"name": "serve", "namespace": "inference", "kind": "Deployment", "replicas": 4,
         "gpusPerPod": 2, "path": "device-plugin"},
        {"name": "train", "namespace": "research", "kind": "Job", "replicas": 1,
         "gpusPerPod": 4, "path": "dra"},
    ],
    "timeline": [],
}  # fmt: skip
DEVICES = 12
"""GPUs in SCENARIO: 3 nodes of 4."""
SPEED = 10.0
"""Simulated seconds per real second: kubelets renew their Lease every real second."""


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except OSError:
        return 0, b""


def test_exporter_metrics_reach_prometheus_through_faults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulator.testing import running_cluster

    exporter_port = free_port()
    directory = tmp_path / "directory.sqlite"
    with running_cluster(SCENARIO, speed=SPEED) as cluster:
        uuid = {
            (node, gpu): cluster.call(lambda c, node=node, gpu=gpu: c.fleet.gpu(node, gpu).uuid)  # type: ignore[misc]
            for node, gpu in [("gpu-dp-0", 1), ("gpu-dra-0", 2)]
        }
        exporter_argv = [
            sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(cluster.kubeconfig_path),
            "--listen", f"127.0.0.1:{exporter_port}", "--directory", str(directory),
        ]  # fmt: skip
        with (
            child_process(exporter_argv, tmp_path / "exporter.log") as exporter,
            run_prometheus(
                tmp_path / "prometheus", [ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{exporter_port}"])]
            ) as prom,
        ):
            wait_until(
                "the exporter to be ready", lambda: get(f"http://127.0.0.1:{exporter_port}/readyz")[0] == 200
            )
            wait_until(
                "Prometheus to scrape the exporter", lambda: prom.value('up{job="gpuhealth-exporter"}') == 1.0
            )
            # Every device Healthy (all of them, not the first few listed) before any fault:
            # only then does an empty answer for Unhealthy mean none is, not none yet.
            wait_until(
                "every device Healthy in Prometheus",
                lambda: len(prom.query('gpu_device_health{status="Healthy"} == 1')) == DEVICES,
            )
            assert prom.query('gpu_device_health{status="Unhealthy"} == 1') == []

            cluster.inject({"fault": "xid", "device": {"node": "gpu-dp-0", "gpu": 1}, "xid": 79})
            cluster.inject({"fault": "xid", "device": {"node": "gpu-dra-0", "gpu": 2}, "xid": 48})
            expected = {("gpu-dp-0", uuid[("gpu-dp-0", 1)]), ("gpu-dra-0", uuid[("gpu-dra-0", 2)])}

            def unhealthy() -> set[tuple[str, str]] | None:
                found = {
                    (r["metric"]["node"], r["metric"]["device"])
                    for r in prom.query('gpu_device_health{status="Unhealthy"} == 1')
                }
                return found if found == expected else None

            wait_until("both Unhealthy devices in Prometheus", unhealthy)

            # A kubelet stops: its Lease is no longer renewed, its pods' statuses no longer move.
            cluster.inject({"fault": "kubelet-stop", "node": "gpu-dp-1", "duration": "10m"})
            stopped = 'gpu_node_kubelet_lease_age_seconds{node="gpu-dp-1"}'
            first = wait_until(
                "the stopped node's lease age to grow", lambda: (v := prom.value(stopped)) and v > 4 and v
            )
            second = wait_until(
                "it to keep growing", lambda: (v := prom.value(stopped)) and v > first + 1.5 and v
            )
            assert second > first
            healthy_age = prom.value('gpu_node_kubelet_lease_age_seconds{node="gpu-dp-0"}')
            assert healthy_age is not None and healthy_age < 4
            ages = prom.query('gpu_device_status_age_seconds{node="gpu-dp-1"}')
            assert ages and all(float(r["value"][1]) > 3 for r in ages)
            # The reported value is left as the kubelet last wrote it: Healthy.
            assert prom.query('gpu_device_health{node="gpu-dp-1",status="Healthy"} == 1')

            exporter.send_signal(signal.SIGTERM)
            assert exporter.wait(15) == 0, (tmp_path / "exporter.log").read_text()[-3000:]

    assert main(["devices", "--directory", str(directory), "--health", "Unhealthy", "-o", "json"]) == 0
    recorded = {(d["node"], d["device"]) for d in json.loads(capsys.readouterr().out)["devices"]}
    assert recorded == expected


def test_node_mode_reads_nvml_and_a_lost_gpu_ages(tmp_path: Path) -> None:
    """Node mode: only that node's devices; NVML through the simulator; a lost GPU's status ages."""
    from simulator.testing import running_cluster

    port = free_port()
    with running_cluster(SCENARIO, speed=SPEED) as cluster:
        lost = cluster.call(lambda c: c.fleet.gpu("gpu-dp-0", 0).uuid)
        argv = [
            sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(cluster.kubeconfig_path),
            "--node", "gpu-dp-0", "--nvml", f"sim:{cluster.url}", "--nvml-poll-seconds", "0.2",
            "--listen", f"127.0.0.1:{port}", "--directory", str(tmp_path / "node.sqlite"),
        ]  # fmt: skip
        with child_process(argv, tmp_path / "exporter.log"):

            def samples() -> dict[str, float]:
                status, body = get(f"http://127.0.0.1:{port}/metrics")
                if status != 200:
                    return {}
                return {
                    line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in body.decode().splitlines()
                    if line.startswith("gpu_")
                }

            up = f'gpu_nvml_up{{node="gpu-dp-0",device="{lost}"}}'
            age = f'gpu_device_status_age_seconds{{node="gpu-dp-0",device="{lost}"}}'
            found = wait_until("NVML readings", lambda: (s := samples()).get(up) == 1.0 and s)
            assert {key.split('node="')[1].split('"')[0] for key in found} == {"gpu-dp-0"}
            cluster.inject({"fault": "gpu-lost", "device": {"node": "gpu-dp-0", "gpu": 0}})
            wait_until("the lost GPU to read as down", lambda: samples().get(up) == 0.0)
            grown = wait_until("its status age to grow", lambda: (v := samples().get(age)) and v > 2 and v)
            assert grown > 2
            others = [
                v
                for k, v in samples().items()
                if k.startswith("gpu_device_status_age_seconds") and lost not in k
            ]
            assert others and max(others) < grown
