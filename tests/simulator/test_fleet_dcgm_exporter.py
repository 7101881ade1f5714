"""The simulated dcgm-exporter of a node: its series as NVIDIA's dcgm-exporter writes them.

Aspects: every per-GPU series carries dcgm-exporter's labels (`gpu`, `UUID`, `pci_bus_id`, `device`,
`modelName`) and the node under the group's host label spelling (`Hostname` or `hostname`); a
node whose group runs no dcgm-exporter has none; the last-XID gauge keeps the last XID while the
windowed XID count holds each XID for dcgm-exporter's 5-minute window and then shows the zero
series without `xid`; a health-watch fault fails that watch (20, with its error code) until the
card recovers, every other watch passing (0, DCGM_FR_OK); ECC and row-remap counters follow the
faults; a lost GPU is left out; every sample has a HELP and TYPE line (read with a reader of
its own: prometheus_client's parser renames counters without `_total`, as Prometheus does not).
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuhealth.clock import ManualClock
from simulator.apiserver.store import Store
from simulator.dcgm_exporter import exposition, node_exposition, series_labels
from simulator.fleet import Fleet
from simulator.fleet.objects import gpu_uuid
from simulator.scenario import DeviceRef, Fault, from_dict

DATA = {
    "fleet": [
        {"name": "old", "count": 1, "gpusPerNode": 2, "path": "dra", "dcgmExporter": "Hostname"},
        {"name": "new", "count": 1, "gpusPerNode": 2, "path": "device-plugin", "dcgmExporter": "hostname"},
        {"name": "none", "count": 1, "gpusPerNode": 1, "path": "dra"},
    ],
}


async def make() -> Fleet:
    clock = ManualClock()
    fleet = Fleet(from_dict(DATA), Store(clock), clock)
    await fleet.start()
    return fleet


def fault(fleet: Fleet, node: str, kind: str, gpu: int, **extra: Any) -> None:
    fleet.inject(Fault(at=fleet.now(), kind=kind, device=DeviceRef(node, gpu), **extra))


SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)\{(.*)\} (\S+)$")
PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition, after checking each one's family declares HELP and TYPE."""
    out: list[tuple[str, dict[str, str], float]] = []
    typed: set[str] = set()
    helped: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif line.startswith("# HELP "):
            helped.add(line.split()[2])
        else:
            match = SAMPLE.match(line)
            assert match, line
            name, pairs, value = match.groups()
            assert name in typed and name in helped, name
            out.append((name, dict(PAIR.findall(pairs)), float(value)))
    return out


def of(text: str, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
    return [
        (labels, value)
        for n, labels, value in samples(text)
        if n == name and all(labels.get(k) == v for k, v in match.items())
    ]


async def test_labels_follow_dcgm_exporter_and_the_groups_host_label_spelling() -> None:
    fleet = await make()
    old, new = node_exposition(fleet, "old-0"), node_exposition(fleet, "new-0")
    assert old is not None and new is not None
    assert node_exposition(fleet, "none-0") is None
    with pytest.raises(KeyError):
        node_exposition(fleet, "nope")
    [(labels, value)] = of(old, "DCGM_FI_DEV_XID_ERRORS", gpu="1")
    assert labels == {
        "gpu": "1",
        "UUID": gpu_uuid("old-0", 1),
        "pci_bus_id": "00000000:28:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "old-0",
    }
    assert value == 0
    assert {tuple(sorted(lbl)) for _, lbl, _ in samples(new)} >= {
        ("UUID", "device", "gpu", "hostname", "modelName", "pci_bus_id")
    }
    assert not any("Hostname" in lbl for _, lbl, _ in samples(new))
    # Every label written is one the rules' declaration allows for that series.
    declared = series_labels()
    for name, lbl, _ in samples(old) + samples(new):
        assert set(lbl) <= declared[name], name


async def test_xids_counted_in_the_window_and_the_last_one_kept() -> None:
    fleet = await make()
    fault(fleet, "old-0", "xid", 0, xid=79, unhealthy=True)
    fault(fleet, "old-0", "xid", 0, xid=13, unhealthy=False)
    fault(fleet, "old-0", "xid", 0, xid=13, unhealthy=False)
    await fleet.advance(1)
    text = node_exposition(fleet, "old-0") or ""
    assert of(text, "DCGM_FI_DEV_XID_ERRORS", gpu="0")[0][1] == 13
    counts = {lbl.get("xid"): v for lbl, v in of(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="0")}
    assert counts == {"79": 1, "13": 2}
    # A GPU without XIDs in the window: one series without `xid`, at 0.
    [(quiet, zero)] = of(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="1")
    assert ("xid" not in quiet, zero) == (True, 0)
    assert all(lbl["window_size_in_ms"] == "300000" for lbl, _ in of(text, "DCGM_EXP_XID_ERRORS_COUNT"))
    await fleet.advance(299)
    assert len(of(node_exposition(fleet, "old-0") or "", "DCGM_EXP_XID_ERRORS_COUNT", gpu="0")) == 2
    await fleet.advance(2)
    text = node_exposition(fleet, "old-0") or ""
    [(labels, value)] = of(text, "DCGM_EXP_XID_ERRORS_COUNT", gpu="0")
    assert ("xid" not in labels, value) == (True, 0)
    assert of(text, "DCGM_FI_DEV_XID_ERRORS", gpu="0")[0][1] == 13  # the gauge keeps the last XID


async def test_a_health_watch_fails_until_the_card_recovers_and_counters_follow_faults() -> None:
    fleet = await make()
    fault(fleet, "new-0", "health-watch", 1, watch="PCIE")
    fault(fleet, "new-0", "ecc", 1, corrected=3, uncorrected=1)
    fault(fleet, "new-0", "row-remap-failure", 1)
    await fleet.advance(1)
    text = node_exposition(fleet, "new-0") or ""
    health = {
        lbl["health_watch"]: (lbl["health_error_code"], v)
        for lbl, v in of(text, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="1")
    }
    assert health.pop("PCIE") == ("DCGM_FR_PCI_REPLAY_RATE", 20)
    assert set(health) == {
        "NVLINK",
        "PMU",
        "MCU",
        "MEM",
        "SM",
        "INFOROM",
        "THERMAL",
        "POWER",
        "DRIVER",
        "ALL",
    }
    assert set(health.values()) == {("DCGM_FR_OK", 0)}
    assert all(v == 0 for _, v in of(text, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="0"))
    assert of(text, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu="1")[0][1] == 3
    assert of(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1")[0][1] == 1
    assert of(text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1")[0][1] == 1
    assert of(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1")[0][1] == 1

    fault(fleet, "new-0", "recover", 1)
    fault(fleet, "new-0", "gpu-lost", 0)
    await fleet.advance(1)
    text = node_exposition(fleet, "new-0") or ""
    assert all(v == 0 for _, v in of(text, "DCGM_EXP_GPU_HEALTH_STATUS", gpu="1"))
    assert of(text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", gpu="1")[0][1] == 0  # volatile: reset
    assert of(text, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1")[0][1] == 1  # permanent
    assert of(text, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == []  # a lost GPU: DCGM cannot read it


def test_an_unknown_host_label_is_refused() -> None:
    with pytest.raises(ValueError, match="host_label: 'node' is not one of hostname, Hostname"):
        exposition(
            [], node="n", host_label="node", product="p", xids=[], now_wall=0, window_wall=1, window_ms=1
        )
