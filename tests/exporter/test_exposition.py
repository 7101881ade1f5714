"""The device metrics contract as rendered by `exporter.exposition`.

Aspects covered: an empty snapshot (HELP/TYPE only); exact samples for a device-plugin
device and a DRA device (info, allocations, driver taints); status age derived through
`snapshot.status_age` (lease older/newer than the observation, no lease, node mode with
NVML read times); lease age; label escaping (quote, backslash, newline) and the 1024-char
message never becoming a label; families contiguous with HELP and TYPE; node mode on/off
(NVML families, None readings absent, lost GPUs only `up 0`, XID counters); a malformed
device or reading dropping only itself; the line cache never serving stale lines across
snapshot swaps (also as a property against a fresh renderer); the body in pieces of at
most `PIECE_LINES` devices a family, the same body joined; value formatting.
Every output is parsed back with prometheus_client's parser.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter import exposition
from exporter.exposition import (
    MetricsRenderer,
    escape_label_value,
    format_value,
    render_metrics,
)
from exporter.metrics import CLUSTER_FAMILIES, NVML_FAMILIES
from exporter.snapshot import Allocation, DeviceState, DriverTaint, NodeState, NvmlView, Snapshot
from gpuhealth.nvml import DeviceReading
from tests.rules.support import require_tool

NOW = 1_800_000_100.0
UUID_A = "GPU-aaaaaaaa-0000-0000-0000-000000000001"
UUID_B = "GPU-bbbbbbbb-0000-0000-0000-000000000002"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(body: bytes) -> Samples:
    """Every sample as {(name, labels): value}; fails on duplicates or unparsable text."""
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples


def of(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def lbl(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def plugin_device(**changes: Any) -> DeviceState:
    state = DeviceState(
        node="node-a",
        device=UUID_A,
        health="Healthy",
        message="",
        status_version=3,
        first_seen=1_800_000_000.0,
        changed_at=1_800_000_010.0,
        observed_at=1_800_000_090.0,
        uuid=UUID_A,
        resource="nvidia.com/gpu",
        allocations=(Allocation("team-a", "trainer-0", "main", "nvidia.com/gpu"),),
    )
    return dataclasses.replace(state, **changes)


def dra_device(**changes: Any) -> DeviceState:
    state = DeviceState(
        node="node-b",
        device=UUID_B,
        health="Unhealthy",
        message="XID 79: GPU has fallen off the bus",
        status_version=7,
        first_seen=1_800_000_000.0,
        changed_at=1_800_000_050.0,
        observed_at=1_800_000_080.5,
        uuid=UUID_B,
        driver="gpu.nvidia.com",
        pool="node-b",
        device_name="gpu-1",
        resource="claim:gpus/gpu",
        allocations=(
            Allocation("team-b", "infer-0", "server", "claim:gpus/gpu", "infer-0-gpus-x7k2q"),
            Allocation("team-b", "infer-0", "sidecar", "claim:gpus/gpu", "infer-0-gpus-x7k2q"),
        ),
        driver_taints=(
            DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "79"),
            DriverTaint("gpu.nvidia.com/xid", "NoSchedule", "48"),  # same key+effect: one series
            DriverTaint("gpu.nvidia.com/gpu-lost", "NoExecute"),
        ),
    )
    return dataclasses.replace(state, **changes)


def cluster_snapshot(*devices: DeviceState, nodes: dict[str, NodeState] | None = None) -> Snapshot:
    return Snapshot(devices={(d.node, d.device): d for d in devices}, nodes=nodes or {})


def full_reading(uuid: str, index: int = 0) -> DeviceReading:
    return DeviceReading(
        uuid=uuid,
        index=index,
        reachable=True,
        name="NVIDIA H100 80GB HBM3",
        ecc_corrected_volatile=12,
        ecc_uncorrected_volatile=1,
        remapped_rows_correctable=2,
        remapped_rows_uncorrectable=0,
        remapped_rows_pending=True,
        remapped_rows_failure=False,
        temperature_celsius=61.5,
        power_watts=512.25,
    )


def test_empty_snapshot_has_help_and_type_of_every_cluster_family_and_no_samples() -> None:
    body = MetricsRenderer().render(Snapshot(), NOW)
    text = body.decode()
    for family in CLUSTER_FAMILIES:
        assert f"# HELP {family.exposed_name} " in text
        assert f"# TYPE {family.exposed_name} {family.text_type}\n" in text
    for family in NVML_FAMILIES:
        assert family.name not in text
    assert parse(body) == {}
    assert all(line.startswith("#") for line in text.splitlines())


def test_device_plugin_device_has_exact_samples() -> None:
    d = plugin_device()
    body = MetricsRenderer().render(cluster_snapshot(d), NOW)
    dev = {"node": "node-a", "device": UUID_A}
    assert parse(body) == {
        ("gpu_device_health", lbl(**dev, status="Healthy")): 1.0,
        ("gpu_device_health", lbl(**dev, status="Unhealthy")): 0.0,
        ("gpu_device_health", lbl(**dev, status="Unknown")): 0.0,
        ("gpu_device_status_age_seconds", lbl(**dev)): 10.0,  # no lease seen: age since the observation
        ("gpu_device_status_observed_timestamp_seconds", lbl(**dev)): 1_800_000_090.0,
        ("gpu_device_status_version", lbl(**dev)): 3.0,
        (
            "gpu_device_info",
            lbl(
                **dev,
                uuid=UUID_A,
                driver="",
                pool="",
                device_name="",
                resource="nvidia.com/gpu",
                source="pod",
            ),
        ): 1.0,
        (
            "gpu_device_allocation_info",
            lbl(
                **dev,
                namespace="team-a",
                pod="trainer-0",
                container="main",
                resource="nvidia.com/gpu",
                claim="",
            ),
        ): 1.0,
    }


def test_dra_device_has_info_allocations_and_deduplicated_driver_taints() -> None:
    d = dra_device()
    samples = parse(render_metrics(cluster_snapshot(d), NOW))
    dev = {"node": "node-b", "device": UUID_B}
    assert of(samples, "gpu_device_health") == {
        lbl(**dev, status="Healthy"): 0.0,
        lbl(**dev, status="Unhealthy"): 1.0,
        lbl(**dev, status="Unknown"): 0.0,
    }
    assert of(samples, "gpu_device_info") == {
        lbl(
            **dev,
            uuid=UUID_B,
            driver="gpu.nvidia.com",
            pool="node-b",
            device_name="gpu-1",
            resource="claim:gpus/gpu",
            source="pod",
        ): 1
    }
    claim = {
        "resource": "claim:gpus/gpu",
        "claim": "infer-0-gpus-x7k2q",
        "namespace": "team-b",
        "pod": "infer-0",
    }
    assert of(samples, "gpu_device_allocation_info") == {
        lbl(**dev, **claim, container="server"): 1.0,
        lbl(**dev, **claim, container="sidecar"): 1.0,
    }
    assert of(samples, "gpu_device_driver_taint") == {
        lbl(**dev, key="gpu.nvidia.com/xid", effect="NoSchedule"): 1.0,
        lbl(**dev, key="gpu.nvidia.com/gpu-lost", effect="NoExecute"): 1.0,
    }
    assert of(samples, "gpu_device_status_observed_timestamp_seconds") == {lbl(**dev): 1_800_000_080.5}
    assert of(samples, "gpu_device_status_version") == {lbl(**dev): 7.0}


def test_repeated_allocation_is_one_series() -> None:
    a = Allocation("ns", "pod", "c", "nvidia.com/gpu")
    samples = parse(render_metrics(cluster_snapshot(plugin_device(allocations=(a, a))), NOW))
    assert len(of(samples, "gpu_device_allocation_info")) == 1


def test_pod_labels_appear_only_on_info_series() -> None:
    samples = parse(render_metrics(cluster_snapshot(plugin_device(), dra_device()), NOW))
    for (name, labels), _ in samples.items():
        keys = {k for k, _ in labels}
        if name != "gpu_device_allocation_info":
            assert not keys & {"namespace", "pod", "container", "claim"}, name
        assert {"node", "device"} <= keys or name == "gpu_node_kubelet_lease_age_seconds"


@pytest.mark.parametrize(
    ("lease", "expected_age"),
    [
        (None, 10.0),  # no Lease seen: the observation alone confirms the status
        (1_800_000_095.0, 5.0),  # kubelet alive after the observation: fresh since the renewal
        (1_800_000_060.0, 10.0),  # lease stopped before the observation: the observation still counts
    ],
)
def test_status_age_follows_the_kubelet_lease(lease: float | None, expected_age: float) -> None:
    d = plugin_device(observed_at=1_800_000_090.0)
    snapshot = cluster_snapshot(d, nodes={"node-a": NodeState("node-a", lease)})
    samples = parse(render_metrics(snapshot, NOW))
    assert of(samples, "gpu_device_status_age_seconds") == {lbl(node="node-a", device=UUID_A): expected_age}


def test_status_age_grows_while_the_lease_stops_and_resets_when_it_resumes() -> None:
    renderer = MetricsRenderer()
    d = plugin_device(observed_at=1_800_000_000.0)
    key = lbl(node="node-a", device=UUID_A)

    def age(lease: float, now: float) -> float:
        snapshot = cluster_snapshot(d, nodes={"node-a": NodeState("node-a", lease)})
        return of(parse(renderer.render(snapshot, now)), "gpu_device_status_age_seconds")[key]

    assert age(1_800_000_050.0, 1_800_000_055.0) == 5.0
    assert age(1_800_000_050.0, 1_800_000_095.0) == 45.0  # lease stopped: the age grows
    assert age(1_800_000_094.0, 1_800_000_095.0) == 1.0  # renewed again: reset


def test_status_age_in_node_mode_is_bounded_by_the_nvml_read_time() -> None:
    d = plugin_device(observed_at=1_800_000_050.0)
    nvml = NvmlView(readings={UUID_A: full_reading(UUID_A)}, read_at={UUID_A: 1_800_000_070.0})
    snapshot = Snapshot(
        devices={(d.node, d.device): d},
        nodes={"node-a": NodeState("node-a", 1_800_000_099.0)},
        nvml=nvml,
        node_name="node-a",
    )
    samples = parse(render_metrics(snapshot, NOW))
    # The lease is fresh, but NVML last answered at ...070: the older source bounds freshness.
    assert of(samples, "gpu_device_status_age_seconds") == {lbl(node="node-a", device=UUID_A): 30.0}


def test_lease_age_only_for_nodes_with_a_lease_and_never_negative() -> None:
    nodes = {
        "node-a": NodeState("node-a", 1_800_000_090.0),
        "node-b": NodeState("node-b", None),
        "node-c": NodeState("node-c", NOW + 2.0),  # kubelet clock ahead of ours
    }
    samples = parse(render_metrics(Snapshot(nodes=nodes), NOW))
    assert of(samples, "gpu_node_kubelet_lease_age_seconds") == {
        lbl(node="node-a"): 10.0,
        lbl(node="node-c"): 0.0,
    }


def test_label_values_are_escaped_and_parse_back_exactly() -> None:
    pod = 'we"ird\\pod\nname'
    d = plugin_device(
        node='node"x',
        message="m" * 1024,
        allocations=(Allocation("ns\\1", pod, 'c"', "nvidia.com/gpu"),),
        driver_taints=(DriverTaint("k\nx", "NoSchedule"),),
    )
    body = render_metrics(cluster_snapshot(d, nodes={'node"x': NodeState('node"x', NOW - 1)}), NOW)
    samples = parse(body)
    assert of(samples, "gpu_device_allocation_info") == {
        lbl(
            node='node"x',
            device=UUID_A,
            namespace="ns\\1",
            pod=pod,
            container='c"',
            resource="nvidia.com/gpu",
            claim="",
        ): 1
    }
    assert of(samples, "gpu_device_driver_taint") == {
        lbl(node='node"x', device=UUID_A, key="k\nx", effect="NoSchedule"): 1
    }
    assert of(samples, "gpu_node_kubelet_lease_age_seconds") == {lbl(node='node"x'): 1.0}
    assert b"m" * 1024 not in body  # the message is state for the directory, not a label
    assert b"\n\n" not in body  # no raw newline leaked out of a label value


def test_escape_label_value() -> None:
    assert escape_label_value("plain-GPU-1") == "plain-GPU-1"
    assert escape_label_value('a\\b"c\nd') == 'a\\\\b\\"c\\nd'


def test_families_are_contiguous_with_help_and_type_before_samples() -> None:
    nvml = NvmlView(
        readings={UUID_A: full_reading(UUID_A), UUID_B: full_reading(UUID_B, 1)},
        read_at={UUID_A: NOW, UUID_B: NOW},
        xid_counts={(UUID_A, 79): 2, (UUID_B, 48): 1},
    )
    d1, d2 = plugin_device(), dra_device(node="node-a")
    snapshot = Snapshot(
        devices={(d.node, d.device): d for d in (d1, d2)},
        nodes={"node-a": NodeState("node-a", NOW - 3)},
        nvml=nvml,
        node_name="node-a",
    )
    lines = render_metrics(snapshot, NOW).decode().splitlines()
    seen: list[str] = []
    typed: set[str] = set()
    for line in lines:
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert name not in typed, f"family {name} typed twice"
            typed.add(name)
            seen.append(name)
        elif line.startswith("# HELP "):
            assert line.split()[2] not in typed, "HELP must come before TYPE"
        else:
            name = line.split("{", 1)[0].split(" ", 1)[0]
            assert name == seen[-1], f"sample {name} outside its family {seen[-1]}"
    assert typed == {f.exposed_name for f in CLUSTER_FAMILIES + NVML_FAMILIES}


def test_node_mode_renders_every_nvml_reading_by_uuid_and_node_name() -> None:
    lost = DeviceReading(uuid=UUID_B, index=1, reachable=False, error="GPU is lost")
    nvml = NvmlView(
        readings={UUID_A: full_reading(UUID_A), UUID_B: lost},
        read_at={UUID_A: NOW},
        xid_counts={(UUID_A, 79): 2, (UUID_A, 48): 1, (UUID_B, 79): 5},
    )
    samples = parse(render_metrics(Snapshot(nvml=nvml, node_name="node-a"), NOW))
    a = {"node": "node-a", "device": UUID_A}
    b = {"node": "node-a", "device": UUID_B}
    assert {k: v for k, v in samples.items() if k[0].startswith("gpu_nvml_")} == {
        ("gpu_nvml_up", lbl(**a)): 1.0,
        ("gpu_nvml_up", lbl(**b)): 0.0,  # lost: up 0 and no other reading
        ("gpu_nvml_ecc_errors_total", lbl(**a, type="corrected")): 12.0,
        ("gpu_nvml_ecc_errors_total", lbl(**a, type="uncorrected")): 1.0,
        ("gpu_nvml_remapped_rows", lbl(**a, type="correctable")): 2.0,
        ("gpu_nvml_remapped_rows", lbl(**a, type="uncorrectable")): 0.0,
        ("gpu_nvml_remapped_rows", lbl(**a, type="pending")): 1.0,
        ("gpu_nvml_remapped_rows", lbl(**a, type="failure")): 0.0,
        ("gpu_nvml_temperature_celsius", lbl(**a)): 61.5,
        ("gpu_nvml_power_watts", lbl(**a)): 512.25,
        ("gpu_nvml_xid_errors_total", lbl(**a, xid="79")): 2.0,
        ("gpu_nvml_xid_errors_total", lbl(**a, xid="48")): 1.0,
        ("gpu_nvml_xid_errors_total", lbl(**b, xid="79")): 5.0,
    }
    families = {
        f.name: f.type
        for f in text_string_to_metric_families(render_metrics(Snapshot(nvml=nvml), NOW).decode())
    }
    assert families["gpu_nvml_xid_errors"] == "counter"
    assert families["gpu_nvml_ecc_errors"] == "counter"


def test_none_readings_are_absent_not_zero() -> None:
    sparse = DeviceReading(uuid=UUID_A, index=0, reachable=True, temperature_celsius=40.0)
    samples = parse(render_metrics(Snapshot(nvml=NvmlView(readings={UUID_A: sparse}), node_name="n"), NOW))
    nvml = {k: v for k, v in samples.items() if k[0].startswith("gpu_nvml_")}
    assert nvml == {
        ("gpu_nvml_up", lbl(node="n", device=UUID_A)): 1.0,
        ("gpu_nvml_temperature_celsius", lbl(node="n", device=UUID_A)): 40.0,
    }


def test_cluster_mode_renders_no_nvml_family() -> None:
    body = render_metrics(cluster_snapshot(plugin_device()), NOW)
    assert b"gpu_nvml_" not in body


def test_node_mode_with_no_reading_yet_has_nvml_help_and_type_only() -> None:
    body = render_metrics(Snapshot(nvml=NvmlView(), node_name="n"), NOW)
    for family in NVML_FAMILIES:
        assert f"# TYPE {family.exposed_name} {family.text_type}\n".encode() in body
    assert parse(body) == {}


def test_a_malformed_device_drops_only_its_own_lines(caplog: pytest.LogCaptureFixture) -> None:
    good = plugin_device()
    bad = dra_device(observed_at="yesterday")  # a broken snapshot entry: age cannot be computed
    renderer = MetricsRenderer()
    with caplog.at_level(logging.WARNING, logger="exporter.exposition"):
        samples = parse(renderer.render(cluster_snapshot(good, bad), NOW))
    assert {dict(labels)["device"] for (_, labels) in samples} == {UUID_A}
    assert len(of(samples, "gpu_device_health")) == 3
    assert "dropped 1 device(s)" in caplog.text
    # Fixed in the next snapshot: rendered again, nothing stale kept.
    fixed = parse(renderer.render(cluster_snapshot(good, dra_device()), NOW))
    assert len(of(fixed, "gpu_device_health")) == 6


def test_a_malformed_nvml_reading_drops_only_that_device() -> None:
    broken: Any = "hot"  # what a faulty adapter might hand over
    bad = dataclasses.replace(full_reading(UUID_B, 1), temperature_celsius=broken)
    nvml = NvmlView(readings={UUID_A: full_reading(UUID_A), UUID_B: bad}, xid_counts={(UUID_B, broken): 1})
    samples = parse(render_metrics(Snapshot(nvml=nvml, node_name="n"), NOW))
    assert {dict(labels)["device"] for (name, labels) in samples if name.startswith("gpu_nvml_")} == {UUID_A}


def test_cache_follows_every_change_across_snapshot_swaps() -> None:
    renderer = MetricsRenderer()
    d = dra_device()
    renderer.render(cluster_snapshot(d), NOW)
    changed = dataclasses.replace(
        d,
        health="Unknown",
        status_version=8,
        observed_at=NOW,
        device_name="gpu-9",
        allocations=(Allocation("team-c", "p", "c", "claim:gpus/gpu", "cl"),),
        driver_taints=(),
    )
    samples = parse(renderer.render(cluster_snapshot(changed), NOW + 5))
    assert samples == parse(MetricsRenderer().render(cluster_snapshot(changed), NOW + 5))
    assert of(samples, "gpu_device_health")[lbl(node="node-b", device=UUID_B, status="Unknown")] == 1.0
    assert of(samples, "gpu_device_driver_taint") == {}
    # A device gone from the snapshot is gone from the exposition.
    assert (
        parse(renderer.render(cluster_snapshot(plugin_device()), NOW)).keys()
        == parse(MetricsRenderer().render(cluster_snapshot(plugin_device()), NOW)).keys()
    )


_text = st.text(alphabet=st.sampled_from('ab"\\\n-'), max_size=4)
_states = st.builds(
    DeviceState,
    node=st.sampled_from(["n1", "n2"]),
    device=st.sampled_from([UUID_A, UUID_B, "drv/pool/dev"]),
    health=st.sampled_from(["Healthy", "Unhealthy", "Unknown"]),
    message=_text,
    status_version=st.integers(0, 3),
    first_seen=st.just(0.0),
    changed_at=st.just(0.0),
    observed_at=st.floats(NOW - 100, NOW),
    uuid=_text,
    driver=_text,
    pool=_text,
    device_name=_text,
    resource=_text,
    allocations=st.lists(st.builds(Allocation, _text, _text, _text, _text, _text), max_size=2).map(tuple),
    driver_taints=st.lists(st.builds(DriverTaint, _text, _text, _text), max_size=2).map(tuple),
)


class _GrowsWhileWalked(dict[Any, Any]):
    """A line cache that another thread's render adds an entry to while this render walks it."""

    def items(self) -> Any:
        for n, item in enumerate(super().items()):
            self[("node-late", f"GPU-late-{n}")] = item[1]
            yield item

    def __iter__(self) -> Any:
        for n, key in enumerate(super().__iter__()):
            self[("node-late", f"GPU-late-{n}")] = self[key]
            yield key


def test_pruning_gone_devices_survives_a_concurrent_render_adding_entries() -> None:
    renderer = MetricsRenderer()
    both = cluster_snapshot(plugin_device(), dra_device())
    renderer.render(both, NOW)
    renderer._cache = _GrowsWhileWalked(renderer._cache)
    one = cluster_snapshot(plugin_device())  # dra_device is gone: its lines are pruned
    assert renderer.render(one, NOW) == MetricsRenderer().render(one, NOW)
    assert set(renderer._cache) == {("node-a", UUID_A)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_states, max_size=4), min_size=1, max_size=4))
def test_a_reused_renderer_renders_exactly_what_a_fresh_one_does(sequence: list[list[DeviceState]]) -> None:
    renderer = MetricsRenderer()
    for states in sequence:
        snapshot = cluster_snapshot(*states)
        assert renderer.render(snapshot, NOW) == MetricsRenderer().render(snapshot, NOW)


def test_the_body_comes_in_pieces_of_at_most_piece_lines_devices_a_family(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    states = [dataclasses.replace(plugin_device(), node=f"node-{n}", device=f"GPU-{n}") for n in range(5)]
    snapshot = cluster_snapshot(*states)
    whole = MetricsRenderer().render(snapshot, NOW)
    monkeypatch.setattr(exposition, "PIECE_LINES", 2)
    pieces = list(MetricsRenderer().pieces(snapshot, NOW))
    assert b"".join(pieces) == whole

    # Each family: pieces of 2, 2 and 1 devices (health: 3 lines each), the first with HELP and TYPE.
    def counts(series: bytes) -> list[int]:
        return [p.count(series) for p in pieces if series in p]

    assert counts(b"gpu_device_health{") == [6, 6, 3]
    assert counts(b"gpu_device_status_age_seconds{") == [2, 2, 1]
    assert counts(b"gpu_device_info{") == [2, 2, 1]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (3, "3"),
        (0, "0"),
        (True, "1.0"),
        (2.5, "2.5"),
        (1_800_000_090.0, "1800000090.0"),
        (1e22, "1e+22"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (math.nan, "NaN"),
    ],
)
def test_format_value(value: float, text: str) -> None:
    assert format_value(value) == text
    parsed = parse(f"# TYPE x gauge\nx {text}\n".encode())[("x", frozenset())]
    assert parsed == value or (math.isnan(parsed) and math.isnan(value))


def test_promtool_accepts_the_exposition() -> None:
    nvml = NvmlView(
        readings={UUID_A: full_reading(UUID_A)}, read_at={UUID_A: NOW}, xid_counts={(UUID_A, 79): 1}
    )
    snapshot = Snapshot(
        devices={(d.node, d.device): d for d in (plugin_device(), dra_device())},
        nodes={"node-a": NodeState("node-a", NOW - 1)},
        nvml=nvml,
        node_name="node-a",
    )
    done = subprocess.run(
        [require_tool("promtool"), "check", "metrics"],
        input=render_metrics(snapshot, NOW),
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
