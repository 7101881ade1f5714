"""The kubelet's `List` answer (`ListPodResourcesResponse`) decoded by hand.

Aspects covered: a round trip against the simulated kubelet's encoder (fuzzed: any pods,
containers, resources and device IDs, time-slicing replicas and MIG UUIDs among them); any bytes
decode or are refused with a reason (fuzzed); the parts of the schema the exporter does not read
(CPU ids, memory, topology, DRA `dynamic_resources`, fields newer than it) are skipped; a pod or
container without devices holds nothing; malformed answers are refused naming the field.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.podresources import (
    GPU_RESOURCE,
    Assigned,
    Assignments,
    PodResourcesError,
    decode_assignments,
)
from gpuhealth.protowire import encode_field
from simulator.pod_resources import Listed, encode_list

U0 = "GPU-00000000-0000-0000-0000-000000000000"

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
device_ids = st.one_of(
    text,
    st.builds(lambda n: f"{U0}::{n}", st.integers(0, 15)),  # a time-slicing replica
    st.uuids().map(lambda u: f"MIG-{u}"),
)
containers = st.lists(
    st.tuples(text, st.text(min_size=1, max_size=20), st.lists(device_ids, max_size=4)), max_size=3
)
pods = st.lists(
    st.tuples(text, st.text(min_size=1, max_size=20), containers),
    max_size=4,
    unique_by=lambda p: (p[0], p[1]),
)


def _expected(listed: Listed) -> Assignments:
    out: dict[tuple[str, str], tuple[Assigned, ...]] = {}
    for namespace, name, held in listed:
        devices = [Assigned(c, r, i) for c, r, ids in held for i in ids]
        if devices:
            out[(namespace, name)] = tuple(dict.fromkeys(devices))
    return Assignments(out)


@given(pods)
def test_the_answer_round_trips_through_the_wire_format(listed: Listed) -> None:
    assert decode_assignments(encode_list(listed)) == _expected(listed)


@given(st.binary(max_size=96))
def test_any_bytes_decode_or_are_refused_with_a_reason(data: bytes) -> None:
    try:
        decode_assignments(data)
    except PodResourcesError as exc:
        assert str(exc)


def test_the_parts_of_the_schema_not_read_are_skipped() -> None:
    topology = encode_field(3, encode_field(1, encode_field(1, 0)))  # TopologyInfo{nodes: [{ID: 0}]}
    devices = encode_field(1, GPU_RESOURCE) + encode_field(2, U0) + topology
    dynamic = encode_field(2, "claim-a") + encode_field(3, "team-a")  # a DRA claim's devices
    memory = encode_field(1, "memory") + encode_field(2, 1 << 30)
    container = (
        encode_field(1, "main")
        + encode_field(2, devices)
        + encode_field(3, b"\x01\x02")  # cpu_ids, packed
        + encode_field(4, memory)
        + encode_field(5, dynamic)
        + encode_field(9, 7)  # a field newer than this reader
    )
    pod = encode_field(1, "train-0") + encode_field(2, "team-a") + encode_field(3, container)
    data = encode_field(1, pod) + encode_field(1, encode_field(1, "idle") + encode_field(2, "team-a"))
    assert decode_assignments(data) == Assignments(
        {("team-a", "train-0"): (Assigned("main", GPU_RESOURCE, U0),)}
    )


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x0a\x05ab", "5 bytes announced"),
        (b"\x08\x01", r"pod_resources \(field 1\) is not a message"),
        (b"\x0a\x02\x12\x00", "PodResources entry without name"),
        (b"\x0a\x04\x0a\x02\xff\xfe", "PodResources.name is not UTF-8"),
        (b"\x0a\x05\x0a\x01p\x18\x01", r"PodResources.containers \(field 3\) is not a message"),
        (b"\x0a\x07\x0a\x01p\x1a\x02\x10\x01", r"ContainerResources.devices \(field 2\) is not a message"),
        (b"\x0a\x09\x0a\x01p\x1a\x04\x12\x02\x12\x00", "ContainerDevices entry without resource_name"),
        (b"\x0b", "groups"),
    ],
)
def test_malformed_answers_are_refused_naming_the_field(data: bytes, reason: str) -> None:
    with pytest.raises(PodResourcesError, match=reason):
        decode_assignments(data)
