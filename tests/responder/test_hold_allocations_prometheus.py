"""The hold's fallback read through a real Prometheus scraping the exporter's own exposition.

Aspects: `PrometheusAllocations` asks a real Prometheus for one node's device-plugin allocations
as the exporter renders them (`exporter.exposition`): each pod's devices, a pod on two devices
with both, another node's pods and a DRA claim's left out; through the hold's reading, a running
holder with no kubelet report gets the device the exporter names.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exporter.exposition import MetricsRenderer
from exporter.snapshot import Allocation, DeviceState, Snapshot
from gpuhealth.testing.loopback import ScrapeJob, run_prometheus, wait_until
from responder.enforce.hold import device_ids
from responder.enforce.hold_allocations import PrometheusAllocations
from responder.enforce.hold_devices import PodDevices
from responder.enforce.hold_plan import Card
from tests.responder.test_hold_devices import pod

pytestmark = pytest.mark.integration

NS = "gpuhealth-system"


def device(node: str, uuid: str, *allocations: Allocation) -> DeviceState:
    return DeviceState(
        node=node,
        device=uuid,
        health="Healthy",
        message="",
        status_version=1,
        first_seen=0.0,
        changed_at=0.0,
        observed_at=0.0,
        uuid=uuid,
        resource="nvidia.com/gpu",
        allocations=allocations,
    )


SNAPSHOT = Snapshot(
    devices={
        (d.node, d.device): d
        for d in (
            device("n1", "GPU-0", Allocation(NS, "hold-a", "hold", "nvidia.com/gpu")),
            device("n1", "GPU-1", Allocation(NS, "hold-b", "hold", "nvidia.com/gpu")),
            device("n1", "GPU-2", Allocation("team", "train", "main", "nvidia.com/gpu")),
            device("n1", "GPU-3", Allocation("team", "train", "main", "nvidia.com/gpu")),
            device("n1", "GPU-4", Allocation("team", "dra", "main", "claim:gpu", "dra-gpu-x")),
            device("n2", "GPU-5", Allocation(NS, "hold-c", "hold", "nvidia.com/gpu")),
        )
    }
)


class Exporter(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = MetricsRenderer().render(SNAPSHOT, 0.0)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def exporter() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_nodes_allocations_as_the_exporter_exposes_them(tmp_path: Path, exporter: int) -> None:
    job = ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{exporter}"])
    with run_prometheus(tmp_path / "prometheus", [job]) as prometheus:
        source = PrometheusAllocations(prometheus.base_url)
        answer = wait_until("the exporter scraped", lambda: source.devices("n1") or None, timeout=60)
        assert answer == {
            (NS, "hold-a"): ("GPU-0",),
            (NS, "hold-b"): ("GPU-1",),
            ("team", "train"): ("GPU-2", "GPU-3"),
        }
        holder = pod("hold-b")
        holder["metadata"]["namespace"] = NS
        seen = PodDevices(device_ids, source).read("n1", [holder], 1.0, Card("GPU-1"))
        assert seen.of(holder) == ("GPU-1",)
