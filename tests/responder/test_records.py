"""The DeviceQuarantine record (responder.records).

Aspects: deterministic names that are valid DNS-1123 subdomains and never shared by two
devices; a record survives the trip to an API object and back unchanged; history and
idempotency keys stay bounded; the episode counts every entry into Quarantined from another
phase and nothing else (property); the moves kept within their bound keep the latest
episode's finished moves over earlier ones'; a hand-edited object that cannot be read is a
RecordError naming the field, never another exception.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.enforce.taint_rules import DRA
from responder.records import (
    MAX_EVIDENCE,
    MAX_EXCERPT,
    MAX_HISTORY,
    MAX_KEYS,
    MAX_MIGRATIONS,
    MAX_TARGETS,
    Evidence,
    Migration,
    MigrationOutcome,
    Phase,
    Quarantine,
    QuarantineSpec,
    RecordError,
    SourceAlert,
    from_object,
    record_name,
    to_object,
)

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

names = st.text(min_size=1, max_size=300)


@given(names, names)
def test_record_names_are_dns_subdomains(node: str, device: str) -> None:
    name = record_name(node, device)
    assert len(name) <= 253
    assert DNS_SUBDOMAIN.match(name), name
    assert record_name(node, device) == name  # deterministic: racing replicas meet on one object


def test_record_names_keep_devices_apart_and_stay_readable() -> None:
    upper = record_name("node-1", "GPU-AB")
    lower = record_name("node-1", "gpu-ab")
    assert upper != lower
    assert record_name("gpu-node-1", "GPU-4a1c").startswith("gpu-node-1-gpu-4a1c-")
    assert record_name("n", "gpu.nvidia.com/pool-a/gpu-0").startswith("n-gpu.nvidia.com-pool-a-gpu-0-")
    assert record_name("a-b", "c") != record_name("a", "b-c")


def spec(**changes: Any) -> QuarantineSpec:
    base = QuarantineSpec(
        node="gpu-node-1",
        device="gpu.nvidia.com/gpu-node-1/gpu-3",
        path=DRA,
        reason="Unhealthy",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2026-12-01T10:00:00Z",
        uuid="GPU-4a1c",
        driver="gpu.nvidia.com",
        pool="gpu-node-1",
        device_name="gpu-3",
        source_alerts=(
            SourceAlert("GPUDeviceUnhealthy", "c2a5", "2026-11-30T10:00:00Z"),
            SourceAlert(
                "GPUDeviceFatalXid", "77aa", "2026-11-30T09:00:00Z", resolved_at="2026-11-30T09:30:00Z"
            ),
        ),
    )
    return replace(base, **changes)


@given(st.lists(st.sampled_from(list(Phase)), max_size=80), st.lists(st.text(max_size=10), max_size=100))
def test_records_round_trip_and_stay_bounded(phases: list[Phase], keys: list[str]) -> None:
    record = Quarantine(name=record_name("gpu-node-1", "gpu-3"), spec=spec())
    for i, phase in enumerate(phases):
        record = record.with_phase(
            phase, time=f"2026-11-30T10:{i % 60:02d}:00Z", actor="responder", message="m"
        )
    for key in keys:
        record = record.with_key(key)
    assert len(record.status.history) <= MAX_HISTORY
    assert len(record.status.processed_keys) <= MAX_KEYS
    assert len(set(record.status.processed_keys)) == len(record.status.processed_keys)
    if keys:
        assert record.seen(keys[-1])
    assert from_object(to_object(record)) == record


def test_a_mig_cards_partitions_round_trip() -> None:
    record = Quarantine(name="q", spec=spec(path="device-plugin", partitions=("MIG-1", "MIG-2")))
    assert to_object(record)["spec"]["partitions"] == ["MIG-1", "MIG-2"]
    assert from_object(to_object(record)) == record
    assert "partitions" not in to_object(Quarantine(name="q", spec=spec()))["spec"]
    profiled = Quarantine(
        name="q",
        spec=spec(
            path="device-plugin",
            partitions=("MIG-1", "MIG-2"),
            profiles=(("MIG-1", "3g.40gb"), ("MIG-2", "3g.40gb")),
        ),
    )
    assert to_object(profiled)["spec"]["partitionProfiles"] == {"MIG-1": "3g.40gb", "MIG-2": "3g.40gb"}
    assert from_object(to_object(profiled)) == profiled
    assert "partitionProfiles" not in to_object(record)["spec"]


@given(st.lists(st.sampled_from([*Phase, "Probing", "Ramp"]), max_size=40))
def test_the_episode_counts_every_entry_into_quarantined_from_another_phase(phases: list[str]) -> None:
    record = Quarantine(name="q", spec=spec())
    entries, before = 0, str(record.status.phase)
    for i, phase in enumerate(phases):
        record = record.with_phase(phase, time=f"2026-11-30T10:{i:02d}:00Z", actor="responder", message="m")
        entries += phase == Phase.QUARANTINED and before != Phase.QUARANTINED
        before = phase
    assert record.status.episode == entries
    assert from_object(to_object(record)).status.episode == entries


def test_the_episode_of_a_device_that_fails_released_and_fails_again() -> None:
    record = Quarantine(name="q", spec=spec())
    walk = [Phase.QUARANTINED, Phase.QUARANTINED, "Probing", Phase.QUARANTINED, "Probing", "Canary"]
    walk += ["Stabilizing", "Ramp", Phase.RELEASED, Phase.PENDING, Phase.QUARANTINED]
    episodes = []
    for i, phase in enumerate(walk):
        record = record.with_phase(phase, time=f"2026-11-30T10:{i:02d}:00Z", actor="responder", message="m")
        episodes.append(record.status.episode)
    # Enforced (1); a failed probe sends it back (2); released, re-opened and enforced (3).
    assert episodes == [1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3]


def test_the_bound_keeps_the_latest_episodes_finished_moves_over_earlier_ones() -> None:
    done = MigrationOutcome.SUCCEEDED
    earlier = [Migration("ml", f"Job/j{i}", f"u{i}", f"k{i}", episode=1, outcome=done) for i in range(20)]
    latest = [Migration("ml", f"Job/l{i}", f"v{i}", f"m{i}", episode=2, outcome=done) for i in range(20)]
    # The latest episode's moves written first: the bound goes by episode, not by position.
    kept = Quarantine(name="q", spec=spec()).with_migrations([*latest, *earlier]).status.migrations
    assert len(kept) == MAX_MIGRATIONS
    assert [m for m in kept if m.episode == 2] == latest
    assert [m for m in kept if m.episode == 1] == earlier[len(earlier) - (MAX_MIGRATIONS - len(latest)) :]


texts = st.text(min_size=1, max_size=12)
migrations = st.builds(
    Migration,
    namespace=texts,
    owner=texts,
    owner_uid=texts,
    key=texts,
    episode=st.integers(min_value=0, max_value=3),
    targets=st.lists(texts, max_size=80).map(tuple),
    started_at=st.text(max_size=12),
    requested_at=st.text(max_size=12),
    retry_at=st.text(max_size=12),
    evictions=st.lists(texts, max_size=80).map(tuple),
    outcome=st.sampled_from(list(MigrationOutcome)),
    detail=st.text(max_size=20),
    evidence=st.lists(
        st.builds(Evidence, pod=texts, reason=st.text(max_size=8), excerpt=st.text(max_size=5000)),
        max_size=12,
    ).map(tuple),
)


@given(st.lists(migrations, max_size=40))
def test_migrations_round_trip_within_bounds(entries: list[Migration]) -> None:
    record = Quarantine(name="q", spec=spec()).with_migrations(entries)
    kept = record.status.migrations
    assert len(kept) == min(len(entries), MAX_MIGRATIONS)
    for m in kept:
        assert len(m.targets) <= MAX_TARGETS and len(m.evictions) <= MAX_TARGETS
        assert len(m.evidence) <= MAX_EVIDENCE
        assert all(len(e.excerpt) <= MAX_EXCERPT for e in m.evidence)
    # A move in flight is never dropped while a finished one could go instead.
    in_flight = [m.owner_uid for m in entries if not m.outcome.finished]
    if len(in_flight) <= MAX_MIGRATIONS:
        assert sum(not m.outcome.finished for m in kept) == len(in_flight)
    assert from_object(to_object(record)) == record


def test_a_record_not_identified_yet_stores_no_path_and_reads_back_the_same() -> None:
    record = Quarantine(name="q", spec=spec(path=""))
    assert "path" not in to_object(record)["spec"]
    assert from_object(to_object(record)) == record
    identified = replace(record, spec=spec(path=DEVICE_PLUGIN))
    assert to_object(identified)["spec"]["path"] == DEVICE_PLUGIN
    assert from_object(to_object(identified)) == identified


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.pop("spec"), "spec: expected an object"),
        (lambda o: o["spec"].pop("node"), "spec.node: expected a non-empty string"),
        (lambda o: o["status"].update(phase="Broken"), "status.phase: 'Broken' is not a phase"),
        (lambda o: o["status"].update(history=[{"phase": "Nope"}]), "status.history[0].phase"),
        (lambda o: o["spec"].update(sourceAlerts="x"), "spec.sourceAlerts: expected a list"),
        (lambda o: o["spec"].update(sourceAlerts=[1]), "spec.sourceAlerts[0]: expected an object"),
        (lambda o: o["status"].update(migrations={}), "status.migrations: expected a list"),
        (
            lambda o: o["status"].update(migrations=[{"namespace": "ml", "owner": "Job/a", "key": "k"}]),
            "status.migrations[0].ownerUID: expected a non-empty string",
        ),
        (
            lambda o: o["status"].update(
                migrations=[{"namespace": "n", "owner": "Job/a", "ownerUID": "u", "key": "k", "outcome": "X"}]
            ),
            "status.migrations[0].outcome: 'X' is not an outcome",
        ),
    ],
)
def test_an_unreadable_object_names_its_field(mutate: Any, message: str) -> None:
    obj = to_object(Quarantine(name="q", spec=spec()))
    mutate(obj)
    with pytest.raises(RecordError, match=re.escape(message)):
        from_object(obj)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)


@given(st.sampled_from(["metadata", "spec", "status"]), json_values)
def test_junk_objects_raise_only_record_error(part: str, value: Any) -> None:
    obj = to_object(Quarantine(name="q", spec=spec()))
    obj[part] = value
    with contextlib.suppress(RecordError):
        from_object(obj)


@given(json_values, st.sampled_from(["targets", "evidence", "outcome", "owner", "evictions"]))
def test_junk_migrations_raise_only_record_error(value: Any, field: str) -> None:
    entry = Migration("ml", "Job/train", "uid-1", "k", evidence=(Evidence("p", "r", "{}"),))
    obj = to_object(Quarantine(name="q", spec=spec()).with_migrations([entry]))
    obj["status"]["migrations"][0][field] = value
    with contextlib.suppress(RecordError):
        from_object(obj)
