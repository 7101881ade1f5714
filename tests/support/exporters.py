"""One cluster-mode exporter watching a simulated cluster, for the exporter's integration tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuhealth.testing.loopback import child_process, free_port


@contextmanager
def cluster_exporter(
    scenario: dict[str, Any],
    node: str,
    gpus: int,
    tmp_path: Path,
    *,
    speed: float = 10.0,
    args: tuple[str, ...] = (),
) -> Iterator[tuple[Any, int, dict[str, int]]]:
    """The running cluster of `scenario`, the port of an exporter watching it (its directory and
    log under `tmp_path`, `args` added to its command line), and `node`'s first `gpus` GPUs by
    UUID (uuid -> index)."""
    from simulator.testing import running_cluster

    port = free_port()
    with running_cluster(scenario, speed=speed) as cluster:
        uuids = {
            cluster.call(lambda c, gpu=gpu: c.fleet.gpu(node, gpu).uuid): gpu  # type: ignore[misc]
            for gpu in range(gpus)
        }
        argv = [
            sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(cluster.kubeconfig_path),
            "--listen", f"127.0.0.1:{port}", "--directory", str(tmp_path / "devices.sqlite"), *args,
        ]  # fmt: skip
        with child_process(argv, tmp_path / "exporter.log"):
            yield cluster, port, uuids


def health_and_source(port: int, device: str) -> tuple[str, str] | None:
    """(health, source) of `device` in one scrape of the exporter on `port`; None until it has both."""
    from tests.exporter.fixtures.scrapes import ones as scrape

    found = scrape(port)
    if found is None:
        return None
    health = next((h["status"] for h in found.get("gpu_device_health", []) if h["device"] == device), None)
    source = next((i["source"] for i in found.get("gpu_device_info", []) if i["device"] == device), None)
    return (health, source) if health and source else None
