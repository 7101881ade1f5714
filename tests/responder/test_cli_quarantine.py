"""`gpuhealth quarantine list|show` against the simulated cluster with the shipped CRD.

Aspects: the CRD manifest in deploy/crds/ is accepted by the apiserver and the records the
responder writes validate against it; list shows one line per record (table, wide, json,
yaml; filters by node and phase; an unreadable record is skipped with a warning naming it);
show finds a record by name or by node and device and prints its history; a cluster
without the CRD, a missing record and an unreachable cluster are clear errors with exit 1,
through the real `gpuhealth` command as a user types it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.resources import Resource
from gpuhealth.kube.transport import KubeTransport
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.enforce.taint_rules import DRA
from responder.ladder import PROBING
from responder.reconcile.breaker import BreakerState
from responder.reconcile.breaker_store import AuditEntry, BreakerStore
from responder.records import (
    HELD,
    QUARANTINES,
    Condition,
    Phase,
    Quarantine,
    QuarantineSpec,
    SourceAlert,
    from_object,
    record_name,
    to_object,
)
from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration

CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", namespaced=False)


def gpuhealth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuhealth", *args], capture_output=True, text=True, timeout=60, check=False
    )


def record(node: str, device: str, phase: Phase, *, dra: bool = False) -> Quarantine:
    spec = QuarantineSpec(
        node=node,
        device=device,
        path=DRA if dra else DEVICE_PLUGIN,
        reason="Unhealthy" if phase != Phase.DEFERRED else "FatalXid",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2099-01-01T00:00:00Z",
        driver="gpu.nvidia.com" if dra else "",
        pool=node if dra else "",
        device_name="gpu-3" if dra else "",
        source_alerts=(SourceAlert("GPUDeviceUnhealthy", f"fp-{device}", "2026-11-30T10:00:00Z"),),
    )
    base = Quarantine(name=record_name(node, device), spec=spec)
    return base.with_phase(phase, time="2026-11-30T10:00:00Z", actor="responder", message=f"now {phase}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServedCluster, KubeClient]]:
    served = ServedCluster(tmp_path / "kubeconfig")
    client = KubeClient(KubeTransport(api_client(str(served.kubeconfig))))
    try:
        yield served, client
    finally:
        client.close()
        served.stop()


@pytest.fixture
def with_records(cluster: tuple[ServedCluster, KubeClient]) -> ServedCluster:
    served, client = cluster
    client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
    held = Condition(HELD, "True", "Held", "held by gpu-node-1-gpu-aaaa-hold-x7k2p", "2026-11-30T10:00:05Z")
    on_hold = record("gpu-node-1", "GPU-aaaa", Phase.QUARANTINED)
    on_hold = replace(on_hold, status=replace(on_hold.status, conditions=(held,)))
    for r in (
        on_hold,
        record("gpu-node-2", "gpu.nvidia.com/gpu-node-2/gpu-3", PROBING, dra=True),
        record("gpu-node-2", "GPU-bbbb", Phase.DEFERRED),
    ):
        obj = to_object(r)
        status = obj.pop("status")
        created = client.create(QUARANTINES, obj)
        client.update(QUARANTINES, {**created, "status": status}, subresource="status")
    return served


def test_list_shows_every_record_and_filters(with_records: ServedCluster) -> None:
    kubeconfig = str(with_records.kubeconfig)
    table = gpuhealth("quarantine", "list", "--kubeconfig", kubeconfig)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "NODE", "DEVICE", "PHASE", "REASON", "ACTION", "AGE", "EXPIRES"]
    assert [line.split()[1:4] for line in lines[1:]] == [
        ["gpu-node-1", "GPU-aaaa", "Quarantined"],
        ["gpu-node-2", "GPU-bbbb", "Deferred"],
        ["gpu-node-2", "gpu.nvidia.com/gpu-node-2/gpu-3", "Probing"],
    ]
    probing = gpuhealth("quarantine", "list", "--kubeconfig", kubeconfig, "--phase", "Probing", "-o", "wide")
    assert probing.returncode == 0 and len(probing.stdout.splitlines()) == 2
    assert "dra" in probing.stdout and "alert/GPUDeviceUnhealthy" in probing.stdout
    docs = orjson.loads(gpuhealth("quarantine", "list", "--kubeconfig", kubeconfig, "-o", "json").stdout)
    assert {d["spec"]["device"] for d in docs["quarantines"]} == {
        "GPU-aaaa",
        "GPU-bbbb",
        "gpu.nvidia.com/gpu-node-2/gpu-3",
    }
    node1 = yaml.safe_load(
        gpuhealth(
            "quarantine", "list", "--kubeconfig", kubeconfig, "--node", "gpu-node-1", "-o", "yaml"
        ).stdout
    )
    assert [d["status"]["phase"] for d in node1["quarantines"]] == ["Quarantined"]
    none = gpuhealth("quarantine", "list", "--kubeconfig", kubeconfig, "--node", "elsewhere")
    assert none.stdout == "No quarantined devices matching the filters.\n"


def test_show_by_node_and_device_prints_the_history(with_records: ServedCluster) -> None:
    kubeconfig = str(with_records.kubeconfig)
    shown = gpuhealth(
        "quarantine", "show", "--kubeconfig", kubeconfig, "gpu-node-2", "gpu.nvidia.com/gpu-node-2/gpu-3"
    )
    assert shown.returncode == 0, shown.stderr
    assert "DRA device:" in shown.stdout and "gpu.nvidia.com/gpu-node-2/gpu-3" in shown.stdout
    assert "Phase:" in shown.stdout and "Probing" in shown.stdout
    assert "now Probing" in shown.stdout  # the history
    by_name = gpuhealth(
        "quarantine", "show", "--kubeconfig", kubeconfig, record_name("gpu-node-1", "GPU-aaaa"), "-o", "json"
    )
    assert orjson.loads(by_name.stdout)["spec"]["device"] == "GPU-aaaa"
    # A device-plugin card: where its hold by holder pods stands.
    plugin = gpuhealth("quarantine", "show", "--kubeconfig", kubeconfig, "gpu-node-1", "GPU-aaaa")
    assert "Hold:" in plugin.stdout
    assert "Held since 2026-11-30T10:00:05Z: held by gpu-node-1-gpu-aaaa-hold-x7k2p" in plugin.stdout
    assert "Hold:" not in shown.stdout
    missing = gpuhealth("quarantine", "show", "--kubeconfig", kubeconfig, "gpu-node-9", "GPU-none")
    assert missing.returncode == 1
    assert missing.stderr.startswith("gpuhealth quarantine show: error: no DeviceQuarantine")


def test_an_unreadable_record_is_named_and_skipped(
    with_records: ServedCluster, cluster: tuple[ServedCluster, KubeClient]
) -> None:
    _, client = cluster
    name = record_name("gpu-node-1", "GPU-aaaa")
    current: dict[str, Any] = client.get(QUARANTINES, name)
    current["status"]["phase"] = "Pending"
    client.update(
        QUARANTINES,
        {**current, "status": {"phase": "Pending", "history": [{"time": "t", "phase": "Gone"}]}},
        subresource="status",
    )
    listed = gpuhealth("quarantine", "list", "--kubeconfig", str(with_records.kubeconfig))
    assert listed.returncode == 0
    assert f"warning: {name}: unreadable record (status.history[0].phase" in listed.stderr
    assert "GPU-aaaa" not in listed.stdout and "GPU-bbbb" in listed.stdout


def test_errors_say_what_is_wrong(cluster: tuple[ServedCluster, KubeClient], tmp_path: Path) -> None:
    served, _ = cluster
    no_crd = gpuhealth("quarantine", "list", "--kubeconfig", str(served.kubeconfig))
    assert no_crd.returncode == 1
    assert "install the CRD (kubectl apply -f deploy/crds/)" in no_crd.stderr
    bad = gpuhealth("quarantine", "list", "--kubeconfig", str(tmp_path / "nope"))
    assert bad.returncode == 2 and "cannot load the cluster configuration" in bad.stderr
    usage = gpuhealth("quarantine", "list", "--phase", "Broken")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr


def test_breaker_status_and_an_audited_reset(
    with_records: ServedCluster, cluster: tuple[ServedCluster, KubeClient]
) -> None:
    _, client = cluster
    kubeconfig = str(with_records.kubeconfig)
    # No breaker ConfigMap in the namespace (no gpuhealth there): an error, not "closed".
    nothing = gpuhealth("breaker", "status", "--kubeconfig", kubeconfig)
    assert nothing.returncode == 1 and not nothing.stdout
    assert (
        "no breaker found in namespace gpuhealth-system" in nothing.stderr and "--namespace" in nothing.stderr
    )
    assert (
        "nothing to reset"
        in gpuhealth(
            "breaker", "reset", "--kubeconfig", kubeconfig, "--actor", "alice", "--reason", "drill"
        ).stdout
    )

    client.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuhealth-system"}}
    )
    # As installed (deploy/base/breaker-configmap.yaml): empty, a breaker that never tripped.
    client.create(
        Resource("", "v1", "configmaps", namespaced=True),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpuhealth-breaker"}},
        namespace="gpuhealth-system",
    )
    closed = gpuhealth("breaker", "status", "--kubeconfig", kubeconfig)
    assert closed.returncode == 0 and closed.stdout.startswith("closed")
    store = BreakerStore(client, "gpuhealth-system")
    store.write(
        BreakerState(
            tripped=True, trigger="rate", tripped_at=1_800_000_000.0, detail="961 quarantines within 600 s"
        ),
        AuditEntry(time="2027-01-15T08:00:00Z", action="trip", actor="responder", reason="961 quarantines"),
    )
    status = gpuhealth("breaker", "status", "--kubeconfig", kubeconfig)
    assert status.stdout.startswith("TRIPPED (rate) since 2027-01-15T08:00:00")
    assert "releases go on" in status.stdout and "trip" in status.stdout

    empty = gpuhealth("breaker", "reset", "--kubeconfig", kubeconfig, "--actor", " ", "--reason", "x")
    assert empty.returncode == 2 and "who asked and why are kept (audited)" in empty.stderr
    reset = gpuhealth(
        "breaker",
        "reset",
        "--kubeconfig",
        kubeconfig,
        "--actor",
        "alice",
        "--reason",
        "storm over",
        "--backlog",
        "discard",
    )
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout == "Breaker reset by alice: the responder dismisses 1 deferred device(s).\n"
    after = store.read()
    assert not after.state.tripped and after.state.discarded_before is not None
    assert [(e.action, e.actor, e.backlog) for e in after.history] == [
        ("trip", "responder", ""),
        ("reset", "alice", "discard"),
    ]
    # The command writes no record's status (the operator role may not): the responder
    # dismisses what was deferred before the reset (tests/responder/test_release_guard.py).
    deferred = from_object(client.get(QUARANTINES, record_name("gpu-node-2", "GPU-bbbb")))
    assert deferred.status.phase == Phase.DEFERRED
    docs = yaml.safe_load(gpuhealth("breaker", "status", "--kubeconfig", kubeconfig, "-o", "yaml").stdout)
    assert docs["tripped"] is False and len(docs["history"]) == 2


def test_a_persons_release_is_a_request_refused_with_the_reason_while_a_failure_stands(
    with_records: ServedCluster, cluster: tuple[ServedCluster, KubeClient]
) -> None:
    _, client = cluster
    kubeconfig = str(with_records.kubeconfig)
    target = ["gpu-node-1", "GPU-aaaa"]
    who = ["--actor", "alice", "--reason", "card reseated"]
    before = client.get(QUARANTINES, record_name(*target))
    firing = gpuhealth("quarantine", "release", "--kubeconfig", kubeconfig, *target, *who)
    assert firing.returncode == 1 and "refused: GPUDeviceUnhealthy still firing" in firing.stderr
    gone = gpuhealth("quarantine", "release", "--kubeconfig", kubeconfig, *target, *who, "--force")
    assert gone.returncode == 2 and "--force" in gone.stderr  # no way around the checks
    assert client.get(QUARANTINES, record_name(*target)) == before  # nothing written

    # The alert resolved (as the responder records it): the request is written, spec only.
    obj = client.get(QUARANTINES, record_name(*target))
    sources = [{**a, "resolvedAt": "2026-11-30T11:00:00Z"} for a in obj["spec"]["sourceAlerts"]]
    obj = client.update(QUARANTINES, {**obj, "spec": {**obj["spec"], "sourceAlerts": sources}})
    asked = gpuhealth("quarantine", "release", "--kubeconfig", kubeconfig, *target, *who)
    assert asked.returncode == 0, asked.stderr
    assert "release requested" in asked.stdout and "condition ReleaseRequest" in asked.stdout
    stored = client.get(QUARANTINES, record_name(*target))
    record = from_object(stored)
    assert record.spec.release_request is not None
    assert (record.spec.release_request.actor, record.spec.release_request.reason) == (
        "person/alice",
        "card reseated",
    )
    assert record.status == from_object(obj).status  # the status is the responder's alone
    assert (
        "person/alice: release requested: card reseated"
        in stored["metadata"]["annotations"]["gpuhealth.io/last-change"]
    )
    shown = gpuhealth("quarantine", "show", "--kubeconfig", kubeconfig, *target)
    assert "Release request:" in shown.stdout and "not answered yet" in shown.stdout

    # A failed check (as the responder records it): refused, with the reason, nothing written.
    client.update(
        QUARANTINES,
        {
            **stored,
            "status": {
                **stored["status"],
                "failures": 1,
                "lastCheck": {"check": "canary", "attempt": 1, "verdict": "Failed"},
            },
        },
        subresource="status",
    )
    refused = gpuhealth("quarantine", "release", "--kubeconfig", kubeconfig, *target, *who)
    assert refused.returncode == 1 and "refused: 1 failure(s) since its last release" in refused.stderr
    assert "its last canary failed" in refused.stderr

    extended = gpuhealth("quarantine", "extend", "--kubeconfig", kubeconfig, *target, "--by", "2d", *who)
    assert extended.returncode == 0 and "2d later" in extended.stdout
    assert from_object(client.get(QUARANTINES, record_name(*target))).spec.expires_at.startswith("2099-01-03")
    bad = gpuhealth("quarantine", "extend", "--kubeconfig", kubeconfig, *target, "--by", "0s", *who)
    assert bad.returncode == 2
