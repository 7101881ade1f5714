"""A simulated dcgm-exporter: one node's `/metrics` as NVIDIA's dcgm-exporter writes it.

Most GPU clusters already run dcgm-exporter (the GPU Operator installs it), and a fleet may ask
gpuhealth not to run a second privileged NVML agent beside it: gpuhealth's exporter then runs in
cluster mode and the hardware signals come from dcgm-exporter's series (rules/prometheus/
gpu-dcgm.yaml). This module renders those series from the simulator's model of each GPU (the same
state `simulator.nvml` reads), with dcgm-exporter's names, types, label names and value meanings
(checked against NVIDIA/dcgm-exporter: `etc/default-counters.csv`, its XID and health collectors
and its exposition template):

- every series carries `gpu` (index), `UUID`, `pci_bus_id`, `device` (`nvidia<index>`),
  `modelName` and the node's name under `hostname` (dcgm-exporter since its 2026 rename) or
  `Hostname` (before), per node group (`dcgmExporter` in the scenario); its value is the NODE_NAME
  dcgm-exporter's Helm chart sets from the pod's node;
- `DCGM_FI_DEV_XID_ERRORS` (gauge): the last XID the GPU reported, 0 before the first;
- `DCGM_EXP_XID_ERRORS_COUNT` (declared a counter, but a count over a sliding window): per XID
  value, the events of the last `window_size_in_ms` (dcgm-exporter's `--xid-count-window-size`,
  5 minutes by default; here simulated minutes), and one series without `xid` at 0 for a GPU
  with none in the window;
- `DCGM_EXP_GPU_HEALTH_STATUS`: per health watch (PCIE ... DRIVER, and ALL) the result, PASS 0 or
  FAIL 20 (DCGM's WARN 10 is not simulated), with `health_error_code` (`DCGM_FR_OK` while it
  passes, else the code DCGM gives that watch's typical failure);
- `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL` / `DCGM_FI_DEV_ECC_DBE_VOL_TOTAL` (counters; not in the default
  counters, a fleet enables them), `DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS` /
  `DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS` (counters) and `DCGM_FI_DEV_ROW_REMAP_FAILURE`
  (gauge, 1 once remapping failed).

A GPU lost to the driver is left out (DCGM cannot read it), as dcgm-exporter drops it. Not
simulated: pod, namespace and container labels (dcgm-exporter's kubernetes mapping; the rules
read per-device series and never need them), the DRA labels, MIG instances, and the health
incidents DCGM itself raises for XIDs (a scenario fails a watch with the `health-watch` fault).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from simulator.fleet import Fleet
from simulator.fleet.health import Gpu
from simulator.model import DCGM_HEALTH_WATCHES

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JOB = "dcgm-exporter"
"""The scrape job the demo gives these series (rules/config.yaml's default `dcgm.matchers`)."""
XID_WINDOW_SECONDS = 300.0
"""dcgm-exporter's default --xid-count-window-size (5 minutes), in simulated seconds."""
PASS, FAIL = 0, 20
"""DCGM's health results as dcgm-exporter writes them (DCGM_HEALTH_RESULT_PASS, _FAIL)."""
ERROR_CODES: Mapping[str, str] = {
    "PCIE": "DCGM_FR_PCI_REPLAY_RATE",
    "NVLINK": "DCGM_FR_NVLINK_DOWN",
    "PMU": "DCGM_FR_SXID_ERROR",
    "MCU": "DCGM_FR_SXID_ERROR",
    "MEM": "DCGM_FR_VOLATILE_DBE_DETECTED",
    "SM": "DCGM_FR_XID_ERROR",
    "INFOROM": "DCGM_FR_CORRUPT_INFOROM",
    "THERMAL": "DCGM_FR_CLOCK_THROTTLE_THERMAL",
    "POWER": "DCGM_FR_POWER_UNREADABLE",
    "DRIVER": "DCGM_FR_DENYLISTED_DRIVER",
    "ALL": "DCGM_FR_XID_ERROR",
}
"""The error code DCGM reports with each watch's failure (one typical code per watch)."""


@dataclass(frozen=True, slots=True)
class Field:
    """One series name dcgm-exporter writes, with its declared type and help."""

    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()
    """Labels beyond the per-GPU ones (`GPU_LABELS` and the host label)."""


GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName")
"""The labels of every per-GPU series, in dcgm-exporter's order (the host label follows)."""
HOST_LABELS = ("hostname", "Hostname")
XID_LAST = Field("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
XID_COUNT = Field(
    "DCGM_EXP_XID_ERRORS_COUNT", "counter", "reported XIDs during last window", ("window_size_in_ms", "xid")
)
HEALTH = Field(
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "counter",
    "DCGM reported health status",
    ("health_watch", "health_error_code"),
)
ECC_SBE = Field("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.")
ECC_DBE = Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.")
ROWS_UNCORRECTABLE = Field(
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"
)
ROWS_CORRECTABLE = Field(
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"
)
ROW_REMAP_FAILURE = Field("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed")
FIELDS = (
    XID_LAST, XID_COUNT, HEALTH, ECC_SBE, ECC_DBE, ROWS_UNCORRECTABLE, ROWS_CORRECTABLE, ROW_REMAP_FAILURE,
)  # fmt: skip
"""Every series this module writes, in exposition order."""


OLD_UUID_LABEL = "uuid"
"""dcgm-exporter's name for `UUID` under its --use-old-namespace (never written here)."""


def series_labels() -> dict[str, frozenset[str]]:
    """Each series name with every label dcgm-exporter may give it (either host label spelling,
    either UUID label)."""
    return {f.name: frozenset((*GPU_LABELS, OLD_UUID_LABEL, *HOST_LABELS, *f.labels)) for f in FIELDS}


def pci_bus_id(index: int) -> str:
    """A stable PCI address per GPU index, in dcgm-exporter's 8-digit-domain form."""
    return f"00000000:{0x18 + 0x10 * index:02X}:00.0"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def exposition(
    gpus: Iterable[Gpu],
    *,
    node: str,
    host_label: str,
    product: str,
    xids: Iterable[tuple[int, str, int, float]],
    now_wall: float,
    window_wall: float,
    window_ms: int,
) -> str:
    """The text a dcgm-exporter on `node` answers (pure).

    `xids`: the node's XID log as (seq, uuid, xid, wall time); the windowed count takes those at
    most `window_wall` wall seconds old (`window_ms` is the window as the exporter was configured,
    for its label).
    """
    if host_label not in HOST_LABELS:
        raise ValueError(f"host_label: {host_label!r} is not one of {', '.join(HOST_LABELS)}")
    log = list(xids)
    readable = [gpu for gpu in gpus if not gpu.lost]
    last: dict[str, int] = {}
    recent: dict[str, Counter[int]] = {}
    for _, uuid, xid, at in log:
        last[uuid] = xid
        if at >= now_wall - window_wall:
            recent.setdefault(uuid, Counter())[xid] += 1
    lines: list[str] = []
    for f in FIELDS:
        lines.append(f"# HELP {f.name} {f.help}")
        lines.append(f"# TYPE {f.name} {f.type}")
        for gpu in readable:
            base = (
                ("gpu", str(gpu.index)),
                ("UUID", gpu.uuid),
                ("pci_bus_id", pci_bus_id(gpu.index)),
                ("device", f"nvidia{gpu.index}"),
                ("modelName", product),
                (host_label, node),
            )
            for extra, value in _samples(f, gpu, last, recent, window_ms):
                lines.append(f"{f.name}{{{_labels((*base, *extra))}}} {value}")
    return "\n".join(lines) + "\n"


Sample = tuple[tuple[tuple[str, str], ...], int]
"""A sample's labels beyond the per-GPU ones, and its value."""


def _samples(
    f: Field, gpu: Gpu, last: Mapping[str, int], recent: Mapping[str, Counter[int]], window_ms: int
) -> list[Sample]:
    """(extra labels, value) of each sample of field `f` for `gpu`."""
    if f is XID_LAST:
        return [((), last.get(gpu.uuid, 0))]
    if f is XID_COUNT:
        window = ("window_size_in_ms", str(window_ms))
        counts = recent.get(gpu.uuid)
        if not counts:
            return [((window,), 0)]
        return [((window, ("xid", str(xid))), n) for xid, n in sorted(counts.items())]
    if f is HEALTH:
        out: list[Sample] = []
        for watch in DCGM_HEALTH_WATCHES:
            failed = watch in gpu.failed_watches
            code = ERROR_CODES[watch] if failed else "DCGM_FR_OK"
            out.append(((("health_watch", watch), ("health_error_code", code)), FAIL if failed else PASS))
        return out
    value = {
        ECC_SBE.name: gpu.ecc_corrected,
        ECC_DBE.name: gpu.ecc_uncorrected,
        ROWS_UNCORRECTABLE.name: gpu.rows_uncorrectable,
        ROWS_CORRECTABLE.name: gpu.rows_correctable,
        ROW_REMAP_FAILURE.name: int(gpu.rows_failure),
    }[f.name]
    return [((), value)]


def node_exposition(fleet: Fleet, node_name: str) -> str | None:
    """The `/metrics` of the dcgm-exporter on `node_name`; None where its group runs none
    (KeyError for an unknown node)."""
    node = fleet.nodes[node_name]
    host_label = node.group.dcgm_host_label
    if host_label is None:
        return None
    return exposition(
        node.gpus,
        node=node_name,
        host_label=host_label,
        product=node.group.product,
        xids=fleet.xid_events(node_name),
        now_wall=fleet.wall(),
        window_wall=XID_WINDOW_SECONDS / fleet.speed,
        window_ms=int(XID_WINDOW_SECONDS * 1000),
    )
