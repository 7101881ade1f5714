"""Series per GPU that gpuhealth adds to Prometheus, beside dcgm-exporter's default per-GPU series.

Three sources, each counted from the real code:
- the node-mode exporter: a `DeviceStateStore` fed the objects a node's watches deliver
  (8 GPUs in 4 pods of 2, a kubelet Lease, NVML readings of every GPU; the device-plugin
  node as `nvidia.com/gpu`, the DRA node through ResourceSlice, ResourceClaims and the DRA
  driver's kubelet plugin pod), rendered by the exporter's renderer plus its self metrics;
- the shipped recording rules (`rules/prometheus/*.yaml`), evaluated by the pinned real
  Prometheus scraping those expositions for 4 nodes (2 of each kind); every group's
  interval is set to 1s so that the bench takes seconds, the expressions are unchanged, and
  how many series a rule writes does not depend on how often it runs;
- the responder's catalog (`responder/metrics.py`): the families labelled by device exist
  once per quarantine record, so a healthy fleet has none of them.

Churn: a pod on 2 GPUs of a node replaced by another (a move, a rollout): the series of
the exporter's scrape that end and start, then the recorded series (which carry no pod).

The yardstick: the fields enabled in dcgm-exporter's `etc/default-counters.csv`, one series
each per GPU (NVIDIA/dcgm-exporter at commit 00d6d344ea4a39112b211b9ff5af3d97e0bb51c2,
read 2026-12-06; lines that are commented out are not counted). dcgm-exporter labels each with
the pod on the GPU when its Kubernetes mapping is on, so all of them churn on a pod move.

Run: `python -m bench series` (about 15 s; needs the pinned Prometheus,
`python tools/upstream/fetch.py` or `make upstream`).
"""

from __future__ import annotations

import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import prometheus_client
import yaml

from bench.bench_exporter_scrape import self_metrics_registry
from bench.series import (
    SCOPES,
    Series,
    churn,
    count_by_name_and_scope,
    count_by_scope,
    per_unit,
    series_of,
)
from exporter.exposition import MetricsRenderer
from exporter.state import DeviceStateStore, producer_resource
from gpuhealth.clock import ManualClock
from gpuhealth.kube.meta import rfc3339
from gpuhealth.nvml import DeviceReading
from gpuhealth.testing.loopback import LoopbackHttpServer, Prometheus, ScrapeJob, run_prometheus, wait_until
from responder import metrics as responder_metrics

GPUS = 8
GPUS_PER_POD = 2
DRIVER = "gpu.nvidia.com"
PLUGIN_NAMESPACE = "nvidia-dra-driver-gpu"
RULES = Path(__file__).resolve().parent.parent / "rules" / "prometheus"

DCGM_DEFAULT_FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
"""The uncommented fields of dcgm-exporter's default counters (commit in the module docstring)."""


# --- the objects a node's watches deliver ---------------------------------------------------


def _uuid(node: str, g: int) -> str:
    return f"GPU-{zlib.crc32(node.encode()):08x}-1f2e-4d3c-8b7a-{g:012d}"


def _pod(
    node: str,
    name: str,
    resources: list[tuple[str, str]],
    claim: str | None,
    health: tuple[str, ...] = (),
    rv: int = 1,
) -> dict[str, Any]:
    """A Running pod with one container allocated `resources` = [(resource name, resourceID)],
    each reported with its `health` (Healthy where none is given)."""
    groups: dict[str, list[dict[str, str]]] = {}
    for k, (resource, resource_id) in enumerate(resources):
        reported = health[k] if k < len(health) else "Healthy"
        groups.setdefault(resource, []).append({"resourceID": resource_id, "health": reported})
    status: dict[str, Any] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "server",
                "ready": True,
                "restartCount": 0,
                "image": "img",
                "allocatedResourcesStatus": [{"name": k, "resources": v} for k, v in groups.items()],
            }
        ],
    }
    if claim is not None:
        status["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claim}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "tenant-a", "uid": f"uid-{name}", "resourceVersion": str(rv)},
        "spec": {"nodeName": node, "containers": [{"name": "server"}]},
        "status": status,
    }


def _claim(node: str, name: str, devices: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "tenant-a", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpus"}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": DRIVER, "pool": node, "device": d} for d in devices
                    ]
                }
            }
        },
    }


def _slice(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": f"gpu-{g}", "attributes": {"uuid": {"string": _uuid(node, g)}}} for g in range(GPUS)
            ],
        },
    }


def _plugin_pod(node: str, since: float) -> dict[str, Any]:
    """The DRA driver's kubelet plugin on the node, Ready: the health producer of its devices."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"kubelet-plugin-{node}",
            "namespace": PLUGIN_NAMESPACE,
            "uid": f"uid-plugin-{node}",
            "resourceVersion": "1",
        },
        "spec": {"nodeName": node, "containers": [{"name": "gpus"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": rfc3339(since)}],
        },
    }


def _lease(node: str, renewed: float) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": rfc3339(renewed)},
    }


def _reading(node: str, g: int) -> DeviceReading:
    return DeviceReading(
        uuid=_uuid(node, g),
        index=g,
        reachable=True,
        name="NVIDIA H100 80GB HBM3",
        ecc_corrected_volatile=0,
        ecc_uncorrected_volatile=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=False,
        remapped_rows_failure=False,
        temperature_celsius=45.0 + g,
        power_watts=350.0 + g,
    )


class Exporter:
    """One exporter's store, fed the watch objects of its nodes, and its scrape.

    Node mode (`node_mode=True`): one node, with NVML readings of its GPUs. Cluster mode:
    every node given, no NVML (one shard's view).
    """

    def __init__(self, nodes: list[tuple[str, bool]], clock: ManualClock, *, node_mode: bool) -> None:
        self.clock = clock
        self.dra = dict(nodes)
        self.store = DeviceStateStore(clock, node_name=nodes[0][0] if node_mode else None, nvml=node_mode)
        self.renderer = MetricsRenderer()
        self.registry = self_metrics_registry()
        for node, dra in nodes:
            self.store.apply_lease("ADDED", _lease(node, clock.now()))
            if dra:
                self.store.apply_slice("ADDED", _slice(node))
                self.store.apply_event(
                    producer_resource(DRIVER), "ADDED", _plugin_pod(node, clock.now() - 3600)
                )
            for p in range(GPUS // GPUS_PER_POD):
                self.place(node, p, f"{node}-server-{p}")
            if node_mode:
                self.store.apply_nvml([_reading(node, g) for g in range(GPUS)], [])

    @property
    def node(self) -> str:
        return next(iter(self.dra))

    def _gpus(self, slot: int) -> range:
        return range(slot * GPUS_PER_POD, (slot + 1) * GPUS_PER_POD)

    def place(self, node: str, slot: int, name: str, health: tuple[str, ...] = (), rv: int = 1) -> None:
        """A pod named `name` on the GPUs of `slot` (its claim first, on DRA); `health` by GPU."""
        health = health or ("Healthy",) * GPUS_PER_POD
        if self.dra[node]:
            devices = [f"gpu-{g}" for g in self._gpus(slot)]
            self.store.apply_claim("ADDED", _claim(node, f"{name}-gpus", devices))
            ids = [("claim:gpus", f"{DRIVER}/{node}/{d}") for d in devices]
            self.store.apply_pod("ADDED", _pod(node, name, ids, f"{name}-gpus", health, rv))
        else:
            ids = [("nvidia.com/gpu", _uuid(node, g)) for g in self._gpus(slot)]
            self.store.apply_pod("ADDED", _pod(node, name, ids, None, health, rv))

    def move(self, node: str, slot: int, old: str, new: str) -> None:
        """The pod on `slot` deleted and another scheduled onto the same GPUs."""
        self.store.apply_pod("DELETED", _pod(node, old, [], None))
        if self.dra[node]:
            self.store.apply_claim("DELETED", _claim(node, f"{old}-gpus", []))
        self.place(node, slot, new)

    def scrape(self) -> bytes:
        """What a scrape of this exporter returns: the device (and NVML) families, then self metrics."""
        return self.renderer.render(
            self.store.snapshot(), self.clock.now()
        ) + prometheus_client.generate_latest(self.registry)


# --- Prometheus evaluating the shipped rules --------------------------------------------------


class ExpositionBodies(BaseHTTPRequestHandler):
    """Serves `bodies[path]` as a text exposition, 404 for any other path: one scrape target per path."""

    bodies: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = self.bodies.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def fast_rules(workdir: Path) -> list[Path]:
    """The shipped rule files with every group's interval at 1s (expressions untouched)."""
    paths = []
    for source in sorted(RULES.glob("*.yaml")):
        doc = yaml.safe_load(source.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
        path = workdir / source.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        paths.append(path)
    return paths


@contextmanager
def prometheus_over(exporters: list[Exporter], workdir: Path) -> Iterator[Prometheus]:
    for e in exporters:
        ExpositionBodies.bodies[f"/{e.node}"] = e.scrape()
    with LoopbackHttpServer(ExpositionBodies, "series-bodies") as server:
        host = server.url.removeprefix("http://")
        jobs = [
            ScrapeJob(
                "gpuhealth-exporter", [host], labels={"__metrics_path__": f"/{e.node}", "node_name": e.node}
            )
            for e in exporters
        ]
        with run_prometheus(workdir, jobs, rule_files=fast_rules(workdir), interval="1s") as prometheus:
            yield prometheus


def recorded(prometheus: Prometheus) -> set[Series]:
    """Every series the recording rules wrote at the latest evaluation (names with a colon)."""
    answer = prometheus.query('{__name__=~".+:.+"}')
    return {
        (r["metric"]["__name__"], frozenset((k, v) for k, v in r["metric"].items() if k != "__name__"))
        for r in answer
    }


def settle(prometheus: Prometheus, targets: int) -> None:
    """Wait until every target was scraped after now and every group evaluated twice after that."""
    since = time.time()
    wait_until(
        "every exporter scraped",
        lambda: (
            (prometheus.value(f'count(timestamp(up{{job="gpuhealth-exporter"}} == 1) > {since})') or 0)
            >= targets
        ),
        timeout=30,
    )
    scraped = time.time()
    wait_until("rules evaluated", lambda: prometheus.evaluated_since(scraped + 1.5), timeout=30)


# --- the report --------------------------------------------------------------------------------


def responder_per_record() -> tuple[int, int]:
    """(families labelled by device that every quarantine record has, those only a held card has)."""
    by_device = [f for f in responder_metrics.CATALOG if "device" in f.labels]
    held = [f for f in by_device if f is responder_metrics.DEVICE_HOLD]
    return len(by_device) - len(held), len(held)


@dataclass(frozen=True)
class Footprint:
    """Series of one source by scope, and what they come to per GPU and per 1,000 GPUs."""

    per_gpu: float
    """Series labelled by device, per GPU."""
    per_node: float
    """Series labelled by node only, per node."""
    fixed: int
    """Series of neither, per process (an exporter) or per Prometheus (the fleet records)."""
    processes_per_1000: float
    """How many processes (or Prometheus servers) 1,000 GPUs bring: 125 node-mode exporters, one shard."""

    def per_1000_gpus(self) -> float:
        return 1000 * self.per_gpu + 1000 / GPUS * self.per_node + self.processes_per_1000 * self.fixed


def footprint(series: set[Series], gpus: int, nodes: int, processes_per_1000: float) -> Footprint:
    scopes = count_by_scope(series)
    return Footprint(
        per_unit(scopes["device"], gpus), per_unit(scopes["node"], nodes), scopes["fixed"], processes_per_1000
    )


def print_families(title: str, series: set[Series], gpus: int, nodes: int) -> None:
    by_family = count_by_name_and_scope(series)
    print(f"\n{title}: {len(series)} series (GPUs: {gpus}, nodes: {nodes})")
    print(f"  {'family (sample name)':56} {'per GPU':>8} {'per node':>9} {'fixed':>6}")
    for scope in SCOPES:
        for (name, where), n in sorted(by_family.items()):
            if where != scope:
                continue
            cells = {
                "device": f"{per_unit(n, gpus):8.2f} {'':>9} {'':>6}",
                "node": f"{'':>8} {per_unit(n, nodes):9.2f} {'':>6}",
                "fixed": f"{'':>8} {'':>9} {n:6d}",
            }
            print(f"  {name:56} {cells[scope]}")


def main(argv: list[str] | None = None) -> None:
    clock = ManualClock(time.time())
    fleet = [
        ("gpu-node-dp-0", False),
        ("gpu-node-dp-1", False),
        ("gpu-node-dra-0", True),
        ("gpu-node-dra-1", True),
    ]
    nodes = [Exporter([node], clock, node_mode=True) for node in fleet]
    cluster = Exporter(fleet, clock, node_mode=False)
    dcgm = len(DCGM_DEFAULT_FIELDS)
    print(f"{GPUS} GPUs a node, {GPUS // GPUS_PER_POD} pods of {GPUS_PER_POD}, all Healthy; node mode: NVML")
    print(
        f"yardstick: dcgm-exporter's default counters, {dcgm} series per GPU (default-counters.csv @ 00d6d34)"
    )

    dp, dra = series_of(nodes[0].scrape().decode()), series_of(nodes[2].scrape().decode())
    shard = series_of(cluster.scrape().decode())
    print_families("exporter, node mode, device-plugin node", dp, GPUS, 1)
    print_families("exporter, node mode, DRA node", dra, GPUS, 1)
    print_families(
        "exporter, cluster mode (one shard of these 4 nodes)", shard, GPUS * len(fleet), len(fleet)
    )

    moved: dict[str, tuple[int, int]] = {}
    for e in nodes[0], nodes[2]:
        before = series_of(e.scrape().decode())
        e.move(e.node, 0, f"{e.node}-server-0", f"{e.node}-server-0-moved")
        change = churn(before, series_of(e.scrape().decode()))
        moved["DRA" if e.dra[e.node] else "device plugin"] = (change.ended, change.started)
        e.move(e.node, 0, f"{e.node}-server-0-moved", f"{e.node}-server-0")  # back, for the rules

    faulty = nodes[0]
    sick = {_uuid(faulty.node, 2): "Unhealthy", _uuid(faulty.node, 3): "Unknown"}
    with (
        tempfile.TemporaryDirectory(prefix="bench-series-") as tmp,
        prometheus_over(nodes, Path(tmp)) as prometheus,
    ):
        settle(prometheus, len(nodes))
        rules_before = recorded(prometheus)
        groups = len(prometheus.rule_groups())
        for e in nodes:
            e.move(e.node, 0, f"{e.node}-server-0", f"{e.node}-server-0-moved")
            ExpositionBodies.bodies[f"/{e.node}"] = e.scrape()
        settle(prometheus, len(nodes))
        rules_after = recorded(prometheus)
        faulty.place(faulty.node, 1, f"{faulty.node}-server-1", tuple(sick.values()), rv=2)
        ExpositionBodies.bodies[f"/{faulty.node}"] = faulty.scrape()
        settle(prometheus, len(nodes))
        rules_faulty = recorded(prometheus)
        alerts = prometheus.query("ALERTS")

    gpus = GPUS * len(nodes)
    print_families(f"recording rules (real Prometheus, {groups} groups)", rules_before, gpus, len(nodes))
    rules_churn = churn(rules_before, rules_after)
    episode: dict[str, Counter[str]] = {status: Counter() for status in sick.values()}
    for name, labels in rules_faulty - rules_after:
        device = dict(labels).get("device")
        if device in sick:
            episode[sick[device]][name] += 1
    for status, names in episode.items():
        listed = ", ".join(sorted(names))
        print(f"  while a device is {status}: +{sum(names.values())} per device ({listed})")
    by_alert = Counter(
        (a["metric"]["alertname"], a["metric"]["alertstate"])
        for a in alerts
        if a["metric"].get("device") in sick
    )
    print(f"  ALERTS series of those two devices: {dict(by_alert)} (one per alert and state)")

    records, held = responder_per_record()
    node_fp = footprint(dp, GPUS, 1, 1000 / GPUS)
    dra_fp = footprint(dra, GPUS, 1, 1000 / GPUS)
    shard_fp = footprint(shard, gpus, len(fleet), 1)
    rules_fp = footprint(rules_before, gpus, len(nodes), 0)
    print("\nseries by component, all GPUs Healthy")
    print(f"  {'component':44} {'per GPU':>8} {'vs dcgm':>8} {'per 1,000 GPUs':>15}")
    rows = [
        ("exporter, node mode (device plugin)", node_fp),
        ("exporter, node mode (DRA)", dra_fp),
        ("exporter, cluster mode (one shard)", shard_fp),
        ("recording rules (no dcgm-exporter series)", rules_fp),
    ]
    for name, fp in rows:
        print(f"  {name:44} {fp.per_gpu:8.2f} {fp.per_gpu / dcgm:7.2f}x {fp.per_1000_gpus():15,.0f}")
    total = node_fp.per_gpu + rules_fp.per_gpu
    total_1000 = node_fp.per_1000_gpus() + rules_fp.per_1000_gpus()
    print(f"  {'responder (no quarantine record)':44} {0:8.2f} {0:7.2f}x {'':>15}")
    print(f"  {'node-mode exporter + rules':44} {total:8.2f} {total / dcgm:7.2f}x {total_1000:15,.0f}")
    print(f"  {'dcgm-exporter default counters (yardstick)':44} {dcgm:8.2f} {1:7.2f}x {1000 * dcgm:15,}")
    print(
        "  per 1,000 GPUs: device series, the node's shared over its 8 GPUs, each exporter process's "
        "fixed ones (125 node-mode exporters; one shard); not the rules' fixed ones (once per Prometheus)"
    )
    print(f"  responder: {records} series per quarantine record, +{held} while it holds a device-plugin card")

    print(f"\nchurn when the pod on {GPUS_PER_POD} GPUs is replaced (series ended / started)")
    for kind, (ended, started) in moved.items():
        print(
            f"  exporter, {kind:13}: {ended} / {started} "
            f"({per_unit(ended, GPUS_PER_POD):.1f} / {per_unit(started, GPUS_PER_POD):.1f} per moved GPU)"
        )
    moved_gpus = GPUS_PER_POD * len(nodes)
    print(
        f"  recording rules, {moved_gpus} GPUs moved: {rules_churn.ended} / {rules_churn.started} "
        f"({per_unit(rules_churn.ended, moved_gpus):.1f} / {per_unit(rules_churn.started, moved_gpus):.1f} "
        "per moved GPU)"
    )
    print(
        f"  dcgm-exporter, pod mapping on (--kubernetes): {dcgm} / {dcgm} per moved GPU (pod on every series)"
    )


if __name__ == "__main__":
    main()
