"""The fault timeline: a scenario's faults (and injected ones) applied in simulated time.

The timeline plays the hardware and the outside world, people included (a person's `scale` or
`delete-pods` is handed to `act`, `simulator.fleet.person`, which does it through the API): a
GPU's driver reporting it unhealthy or going silent, XIDs and ECC counters in NVML, a lost GPU,
a kubelet that stops or a node cut off, a broken health stream or one that dies unnoticed
(stale), and the recovery of each. It
changes the device and node state, then tells the components that would notice: the node's
device plugin or DRA driver reports, the kubelet syncs, the node lifecycle controller sees the
kubelet back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from simulator.fleet.events import Emit, FaultApplied, NodeChanged
from simulator.fleet.health import HEALTHY, UNHEALTHY, Gpu
from simulator.fleet.state import PARTITIONED, RUNNING, STOPPED, DeviceDriver, SimNode
from simulator.fleet.timers import Timers
from simulator.model import Fault

XID_DESCRIPTIONS = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
}


class NodeAgent(Protocol):
    """What the timeline needs from the kubelet."""

    def push(self, node: SimNode, *, resync: bool = False) -> None: ...

    def renew(self, node: SimNode) -> None: ...

    def resync(self, node: SimNode) -> None: ...


class Timeline:
    """Applies faults to the nodes and GPUs at their simulated time; keeps what was applied.

    Owns the fault-driven state of `Gpu` (NVML counters, lost, silence, the tokens that let a
    later fault cancel an earlier one's end), `SimNode.kubelet`/`stream_ok`/`health_frozen` and the
    XID log.
    """

    def __init__(
        self,
        faults: Sequence[Fault],
        timers: Timers,
        nodes: Mapping[str, SimNode],
        drivers: Mapping[str, DeviceDriver],
        kubelet: NodeAgent,
        kubelet_back: Callable[[SimNode], None],
        emit: Emit,
        plugin_failing: Callable[[SimNode, bool], None] = lambda node, failing: None,
        plugin_restart: Callable[[SimNode], None] = lambda node: None,
        act: Callable[[Fault], object] = lambda action: None,
    ) -> None:
        """`plugin_failing(node, failing)`: the node's DRA kubelet plugin stops serving (its
        probes fail: the kubelet restarts it, not Ready) or works again; `plugin_restart(node)`:
        the node's DRA kubelet plugin or device plugin is restarted (an operator rolled its
        DaemonSet); `act(action)`: a person does a timeline action through the API."""
        self._timers = timers
        self._nodes = nodes
        self._drivers = drivers
        self._kubelet = kubelet
        self._kubelet_back = kubelet_back
        self._emit = emit
        self._plugin_failing = plugin_failing
        self._plugin_restart = plugin_restart
        self._act = act
        self.applied: list[FaultApplied] = []
        self.xid_seq = 0
        """Sequence number of the last XID event in the fleet (NVML event readers resume after it)."""
        self._faults = faults
        self._done = 0

    def schedule(self) -> None:
        """Set every fault of the scenario's timeline at its `at`."""
        for fault in self._faults:
            self._timers.at(fault.at, self._apply_scheduled, fault)

    def inject(self, fault: Fault) -> None:
        """Apply `fault` at its `at` (simulated seconds since start); now if that has passed."""
        self._timers.at(max(fault.at, self._timers.now()), self._apply, fault)
        self._timers.wake()

    def progress(self) -> tuple[int, int]:
        """(applied, total) of the scheduled timeline; injected faults are not counted."""
        return self._done, len(self._faults)

    def _apply_scheduled(self, fault: Fault) -> None:
        self._done += 1
        self._apply(fault)

    def _apply(self, fault: Fault) -> None:
        now = self._timers.now()
        applied = FaultApplied(now, self._timers.wall(), fault)
        self.applied.append(applied)
        self._emit(applied)
        kind = fault.kind
        at = self._timers.at
        if fault.is_action:
            self._act(fault)
            return
        if fault.device is not None:
            node = self._nodes[fault.device.node]
            gpu = node.gpus[fault.device.gpu]
            if kind == "device-unhealthy":
                if fault.reset is not None:
                    gpu.needs_reset = True
                    gpu.reset_fails = fault.reset == "fails"
                self._report(node, gpu, UNHEALTHY, fault.message or "device reported unhealthy by the driver")
                if fault.duration is not None:
                    gpu.unhealthy_token += 1
                    at(now + fault.duration, self._end_unhealthy, node, gpu, gpu.unhealthy_token)
            elif kind == "device-unknown":
                gpu.unknown_token += 1
                if gpu.reporting:
                    gpu.reporting = False
                    gpu.silent_since = now
                at(now + (fault.duration or 0), self._end_unknown, node, gpu, gpu.unknown_token)
            elif kind == "flap":
                period = fault.period or 1.0
                for i in range(fault.times or 1):
                    at(now + i * period, self._report, node, gpu, UNHEALTHY, "device flapping")
                    at(now + i * period + period / 2, self._report, node, gpu, HEALTHY, None)
            elif kind == "xid":
                self._xid(node, gpu, fault.xid or 0, fault.unhealthy, fault.message)
            elif kind == "ecc":
                gpu.ecc_corrected += fault.corrected
                gpu.ecc_uncorrected += fault.uncorrected
            elif kind == "health-watch":
                gpu.failed_watches.add(fault.watch or "ALL")
            elif kind == "row-remap-failure":
                gpu.rows_uncorrectable += 1
                gpu.rows_failure = True
                gpu.rows_pending = False
            elif kind == "gpu-lost":
                gpu.lost = True
                self._xid(node, gpu, 79, True, fault.message or "GPU is lost (NVML_ERROR_GPU_IS_LOST)")
                self._drivers[node.group.path].taint(node, gpu, "gpu.nvidia.com/gpu-lost", "true")
            elif kind == "recover":
                self._recover_gpu(node, gpu)
            return
        assert fault.node is not None
        node = self._nodes[fault.node]
        if kind in (STOPPED, PARTITIONED):
            node.kubelet = kind
            node.kubelet_token += 1
            self._emit(
                NodeChanged(
                    now, self._timers.wall(), node.name, f"{kind}: lease renewals and status writes stop"
                )
            )
            if fault.duration is not None:
                at(now + fault.duration, self._end_node_fault, node, node.kubelet_token)
        elif kind == "health-stream-broken":
            node.stream_ok = False
            node.stream_token += 1
            self._kubelet.push(node)
            if fault.duration is not None:
                at(now + fault.duration, self._end_stream, node, node.stream_token)
        elif kind == "health-stream-stale":
            driver = self._drivers[node.group.path]
            if node.health_frozen is None:
                # What the kubelet's cache holds the moment the stream dies: it keeps it.
                node.health_frozen = tuple(driver.health(node, g, now) for g in node.gpus)
            node.stale_token += 1
            self._plugin_failing(node, True)
            if fault.duration is not None:
                at(now + fault.duration, self._end_stale, node, node.stale_token)
        elif kind == "dra-plugin-restart":
            self._plugin_restart(node)
        elif kind == "device-plugin-restart":
            # It registers again: a new ListAndWatch stream, whatever broke the old one.
            node.stream_ok = True
            node.stream_token += 1
            self._plugin_restart(node)
        elif kind == "recover":
            self._end_node_fault(node, node.kubelet_token)
            self._end_stream(node, node.stream_token)
            self._end_stale(node, node.stale_token)

    def _report(self, node: SimNode, gpu: Gpu, health: str, message: str | None) -> None:
        self._drivers[node.group.path].report(node, gpu, health, message)

    def _end_unhealthy(self, node: SimNode, gpu: Gpu, token: int) -> None:
        if gpu.unhealthy_token == token and not gpu.lost:
            self._report(node, gpu, HEALTHY, None)

    def _end_unknown(self, node: SimNode, gpu: Gpu, token: int) -> None:
        if gpu.unknown_token != token:
            return
        gpu.reporting = True
        # The first report after the silence reaches the kubelet through the stream: prompt.
        self._kubelet.push(node, resync=True)

    def _end_node_fault(self, node: SimNode, token: int) -> None:
        if node.kubelet_token != token or node.kubelet == RUNNING:
            return
        node.kubelet = RUNNING
        self._kubelet.renew(node)
        self._kubelet_back(node)
        self._drivers[node.group.path].reconnect(node)
        self._emit(
            NodeChanged(
                self._timers.now(),
                self._timers.wall(),
                node.name,
                "kubelet back: lease renewed, status syncing",
            )
        )
        self._kubelet.resync(node)

    def _end_stream(self, node: SimNode, token: int) -> None:
        if node.stream_token != token or node.stream_ok:
            return
        node.stream_ok = True
        self._kubelet.push(node)

    def _end_stale(self, node: SimNode, token: int) -> None:
        if node.stale_token != token or node.health_frozen is None:
            return
        node.health_frozen = None
        self._plugin_failing(node, False)
        # The plugin's next start registers a new stream; its reports reach the kubelet again.
        self._kubelet.push(node, resync=True)

    def _xid(self, node: SimNode, gpu: Gpu, xid: int, unhealthy: bool | None, message: str | None) -> None:
        self.xid_seq += 1
        node.xids.append((self.xid_seq, gpu.uuid, xid, self._timers.wall()))
        text = message or f"XID {xid}: {XID_DESCRIPTIONS.get(xid, 'critical error')} on {gpu.uuid}"
        self._drivers[node.group.path].xid(node, gpu, xid, bool(unhealthy), text)

    def _recover_gpu(self, node: SimNode, gpu: Gpu) -> None:
        gpu.lost = False
        gpu.reporting = True
        gpu.unknown_token += 1
        gpu.unhealthy_token += 1
        # A reset clears the volatile ECC counters and any pending row remap.
        gpu.ecc_corrected = 0
        gpu.ecc_uncorrected = 0
        gpu.rows_pending = False
        gpu.rows_failure = False
        gpu.failed_watches.clear()
        self._drivers[node.group.path].reset(node, gpu)
        self._report(node, gpu, HEALTHY, None)
        self._kubelet.push(node, resync=True)
