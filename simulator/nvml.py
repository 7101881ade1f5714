"""Fake NVML: the simulated fleet's GPUs behind `gpuhealth.nvml.NvmlSource`.

`FakeNvml(fleet, node)` reads one node's simulated GPUs (reachability, XID events, ECC and
row-remap counters, temperature and power with a little deterministic noise), exactly what an
exporter on that node would get from `pynvml`. `nvml_document()` is the same view as JSON for
the HTTP route `GET /simulator/v1/nodes/{node}/nvml?since=<seq>`, which lets an exporter in
another process read a simulated node.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict
from typing import Any

from gpuhealth.nvml import DeviceReading, XidEvent
from simulator.fleet import Fleet, mig
from simulator.fleet.health import Gpu
from simulator.model import MigLayout

log = logging.getLogger(__name__)

GPU_IS_LOST = "NVML_ERROR_GPU_IS_LOST"


def _noise(uuid: str, bucket: int, span: float) -> float:
    """Deterministic noise in [-span, span] for (device, time bucket)."""
    digest = hashlib.blake2b(f"{uuid}/{bucket}".encode(), digest_size=2).digest()
    return (int.from_bytes(digest, "big") / 65535.0 * 2 - 1) * span


def reading(gpu: Gpu, product: str, now: float, layout: MigLayout | None = None) -> DeviceReading:
    """One GPU's readings at simulated time `now` (`layout`: its MIG partitions, listed under it)."""
    if gpu.lost:
        return DeviceReading(uuid=gpu.uuid, index=gpu.index, reachable=False, error=GPU_IS_LOST)
    bucket = int(now // 5)
    busy = gpu.allocated > 0
    temperature = (62.0 if busy else 34.0) + _noise(gpu.uuid, bucket, 2.0)
    power = (520.0 if busy else 72.0) + _noise(gpu.uuid + "/p", bucket, 15.0)
    return DeviceReading(
        uuid=gpu.uuid,
        index=gpu.index,
        reachable=True,
        name=product,
        ecc_corrected_volatile=gpu.ecc_corrected,
        ecc_uncorrected_volatile=gpu.ecc_uncorrected,
        remapped_rows_correctable=gpu.rows_correctable,
        remapped_rows_uncorrectable=gpu.rows_uncorrectable,
        remapped_rows_pending=gpu.rows_pending,
        remapped_rows_failure=gpu.rows_failure,
        temperature_celsius=round(temperature, 1),
        power_watts=round(power, 1),
        mig_devices=mig.partitions(gpu.uuid, layout) if layout is not None else (),
    )


class FakeNvml:
    """`NvmlSource` over one simulated node; the fleet must be running in the same thread."""

    def __init__(self, fleet: Fleet, node: str) -> None:
        self._fleet = fleet
        self._node = node
        self._since = 0
        self._started = False

    def start(self) -> bool:
        if self._node not in self._fleet.nodes:
            log.warning("simulated NVML: no node %s in the fleet", self._node)
            return False
        self._started = True
        # Like a real driver, events from before this reader started are not replayed.
        self._since = self._fleet.xid_seq
        return True

    def read(self) -> list[DeviceReading]:
        if not self._started:
            return []
        node = self._fleet.nodes[self._node]
        now = self._fleet.now()
        return [reading(gpu, node.group.product, now, node.group.mig) for gpu in node.gpus]

    def drain_xid_events(self) -> list[XidEvent]:
        if not self._started:
            return []
        events = self._fleet.xid_events(self._node, self._since)
        if events:
            self._since = events[-1][0]
        return [XidEvent(uuid=uuid, xid=xid, timestamp=ts) for _, uuid, xid, ts in events]

    def close(self) -> None:
        self._started = False


def nvml_document(fleet: Fleet, node_name: str, since: int) -> dict[str, Any]:
    """The JSON body of `GET /simulator/v1/nodes/{node}/nvml?since=<seq>` (KeyError for an unknown node)."""
    node = fleet.nodes[node_name]
    now = fleet.now()
    events = fleet.xid_events(node_name, since)
    return {
        "node": node_name,
        "devices": [asdict(reading(gpu, node.group.product, now, node.group.mig)) for gpu in node.gpus],
        "xid_events": [{"uuid": u, "xid": x, "timestamp": ts, "seq": seq} for seq, u, x, ts in events],
        # Every event up to the fleet's latest sequence number is in this answer (or not this node's).
        "next_seq": max(since, fleet.xid_seq),
    }
