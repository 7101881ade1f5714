"""The device view as documents and tables (`exporter.devices_view`).

Aspects: `devices_document` is the snapshot in device order with status ages computed as
`/metrics` computes them (node Lease, NVML in node mode); `read_devices_document` gives back
the same devices and ages (round trip over every field, to the second the times are written
with); a document of the wrong kind or with a field of the wrong type is refused naming the
field's path; the table shows the extra columns a caller adds before the message, and
`--no-headers` leaves the header line out.
"""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.devices_view import (
    Column,
    ViewError,
    devices_document,
    read_devices_document,
    render_table,
)
from exporter.snapshot import DeviceState, NodeState, NvmlView, Snapshot
from tests.exporter.fixtures.strategies import devices

T0 = 1_800_000_000.0

whole_seconds = st.integers(min_value=1_700_000_000, max_value=1_900_000_000).map(float)
"""Times as the document writes them: RFC 3339 to the second, within datetime's range."""
in_whole_seconds = st.builds(
    lambda d, first, changed, observed, unknown: replace(
        d,
        first_seen=first,
        changed_at=changed,
        observed_at=observed,
        unknown_since=None if d.unknown_since is None else unknown,
    ),
    devices.filter(lambda d: d.node and d.device),
    whole_seconds,
    whole_seconds,
    whole_seconds,
    whole_seconds,
)


@given(st.lists(in_whole_seconds, max_size=5, unique_by=lambda d: (d.node, d.device)))
def test_a_document_reads_back_as_the_same_devices_and_ages(items: list[DeviceState]) -> None:
    snapshot = Snapshot(devices={(d.node, d.device): d for d in items})
    node, rows = read_devices_document(devices_document(snapshot, T0 + 3600))
    assert node is None
    assert [d for d, _ in rows] == [d for _, d in sorted(snapshot.devices.items())]
    assert all(age >= 0 for _, age in rows)


def device(node: str, name: str, *, uuid: str = "", observed: float = T0) -> DeviceState:
    return DeviceState(node, name, "Healthy", "", 1, T0, T0, observed, uuid=uuid)


def test_status_ages_are_those_of_the_metrics_lease_and_nvml_bound_freshness() -> None:
    snapshot = Snapshot(
        devices={
            ("n1", "GPU-b"): device("n1", "GPU-b", uuid="GPU-b", observed=T0 + 50),
            ("n1", "GPU-a"): device("n1", "GPU-a", uuid="GPU-a", observed=T0 + 50),
        },
        nodes={"n1": NodeState("n1", lease_renewed_at=T0 + 90)},
        nvml=NvmlView(read_at={"GPU-a": T0 + 80, "GPU-b": T0 + 95}),
        node_name="n1",
    )
    doc = devices_document(snapshot, T0 + 100)
    assert doc["node"] == "n1" and doc["time"] == "2027-01-15T08:01:40Z"
    # Sorted by (node, device); NVML's last reading bounds GPU-a, the Lease bounds GPU-b.
    ages = [(d["device"], d["statusAgeSeconds"]) for d in doc["devices"]]
    assert ages == [("GPU-a", 20.0), ("GPU-b", 10.0)]


def good() -> dict[str, Any]:
    return devices_document(Snapshot(devices={("n", "GPU-a"): device("n", "GPU-a")}), T0)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(kind="PodList"), "expected a DeviceList document, found 'PodList'"),
        (lambda d: d.update(devices={}), "devices: expected a list"),
        (lambda d: d["devices"][0].update(health="Sick"), "devices[0].health: 'Sick' is not one of"),
        (lambda d: d["devices"][0].update(node=""), "devices[0].node: expected a non-empty string"),
        (lambda d: d["devices"][0].update(statusVersion="3"), "statusVersion: expected an integer"),
        (lambda d: d["devices"][0].update(changedAt="yesterday"), "changedAt: expected an RFC 3339"),
        (lambda d: d["devices"][0].update(statusAgeSeconds=-1), "devices[0].statusAgeSeconds"),
        (
            lambda d: d["devices"][0].update(allocations=[{"namespace": "ns", "pod": 3}]),
            "devices[0].allocations[0].pod: expected a string",
        ),
        (lambda d: d["devices"][0].update(source="guess"), "devices[0].source: 'guess' is not one of"),
    ],
)
def test_a_malformed_document_is_refused_naming_the_field(change: Any, message: str) -> None:
    doc = good()
    change(doc)
    with pytest.raises(ViewError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_devices_document(doc)


def test_the_table_takes_extra_columns_and_can_leave_out_the_headers() -> None:
    rows = [(device("n", "GPU-a"), 75.0)]
    extra = [Column("QUARANTINE", lambda d, _: "Probing")]
    out = io.StringIO()
    render_table(rows, wide=False, out=out, extra=extra)
    header, line = out.getvalue().splitlines()
    assert header.split() == ["NODE", "DEVICE", "HEALTH", "AGE", "PODS", "QUARANTINE", "MESSAGE"]
    assert line.split() == ["n", "GPU-a", "Healthy", "1m15s", "<none>", "Probing", "-"]
    bare = io.StringIO()
    render_table(rows, wide=False, out=bare, extra=extra, no_headers=True)
    # Without headers the columns are as wide as their cells.
    assert bare.getvalue() == "n   GPU-a   Healthy   1m15s   <none>   Probing   -\n"
