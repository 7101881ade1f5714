"""The migrator under injected API faults (tests.support.faulty_transport), on a running cluster.

Aspects: a checkpointed job moved through a seeded mix of 503/409/429/timeouts and writes
whose responses were lost: each pod is asked for a checkpoint with one key only and evicted
at most once as the server counts it (an eviction whose answer was lost is never sent again
to a pod that took its name); a 429 on an eviction waits until its retryAt.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gpuhealth.clock import SystemClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.migrate.executor import Migrator, MigratorSettings
from responder.records import MigrationOutcome
from simulator.testing import running_cluster
from tests.responder.test_migrator_simulated import DEADLINE, migrate, quarantine, running, the
from tests.responder.test_migrator_simulated import client as client
from tests.support.backends import shipped
from tests.support.faulty_transport import Fault, FaultyTransport, Landed

pytestmark = pytest.mark.integration

SCENARIO: dict[str, Any] = {
    "name": "migration-faults",
    "fleet": [{"name": "gpu-dp", "count": 2, "gpusPerNode": 4, "path": "device-plugin"}],
    "workloads": [
        {
            "name": "train",
            "namespace": "ml",
            "kind": "Job",
            "replicas": 2,
            "gpusPerPod": 1,
            "checkpoint": {"mode": "annotation", "commitAfter": "1s"},
            "topology": "fixed",
        },
    ],
}
# 500 on an eviction is a budget conflict by design (the move fails, never retried): the
# property here is about what is retried, so the server errors are 503s.
FAULTS = [Fault.UNAVAILABLE, Fault.CONFLICT, Fault.CONFLICT_AFTER, Fault.THROTTLED, Fault.TIMEOUT, Fault.LOST]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_cluster(SCENARIO, speed=20) as handle:
        yield handle


def evictions(landed: list[Landed]) -> Counter[str]:
    """Evictions the server carried out (not dry runs), per pod uid."""
    out: Counter[str] = Counter()
    for write in landed:
        if write.path.endswith("/eviction") and ("dryRun", "All") not in write.params and write.body:
            out[orjson.loads(write.body)["deleteOptions"]["preconditions"]["uid"]] += 1
    return out


def checkpoint_keys(landed: list[Landed]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for write in landed:
        if write.method == "PATCH" and "/pods/" in write.path and write.body:
            annotations = orjson.loads(write.body).get("metadata", {}).get("annotations", {})
            for value in annotations.values():
                out.setdefault(write.path, set()).add(value)
    return out


def succeeded(records: list[Any]) -> bool:
    # A faulted step may leave a record without its entry yet (its observation failed).
    return all(
        len(r.status.migrations) == 1 and the(r).outcome is MigrationOutcome.SUCCEEDED for r in records
    )


def pod_writes(method: str, path: str, params: Any) -> bool:
    """A checkpoint request or a real eviction (the writes whose loss would double an action)."""
    return (method == "PATCH" and "/pods/" in path) or (
        method == "POST" and path.endswith("/eviction") and ("dryRun", "All") not in list(params)
    )


@pytest.mark.parametrize(
    ("seed", "script"),
    [
        (21, None),
        (
            22,
            [Fault.CONFLICT_AFTER, Fault.LOST, Fault.LOST, Fault.THROTTLED, Fault.LOST, Fault.CONFLICT_AFTER],
        ),
    ],
    ids=["seeded", "scripted-lost-answers"],
)
def test_a_faulted_move_never_doubles_a_checkpoint_or_an_eviction(
    cluster: Any, client: KubeClient, seed: int, script: list[Fault | None] | None
) -> None:
    pods = wait_until(
        "both train pods run", lambda: len(p := running(client, "ml", "train")) == 2 and p, timeout=DEADLINE
    )
    before = {p["metadata"]["uid"] for p in pods}
    records = [quarantine(cluster, client, p) for p in pods]
    inner = KubeTransport(api_client(str(cluster.kubeconfig_path)))
    faults = (
        FaultyTransport(inner, seed=seed, rate=0.3, kinds=FAULTS)
        if script is None
        else FaultyTransport(inner, script=script, match=pod_writes)
    )
    faulted = KubeClient(faults)
    try:
        migrator = Migrator(
            faulted, MigratorSettings(node_in_flight=2), SystemClock(), backends=shipped(faulted)
        )
        records = migrate(migrator, records, succeeded)
    finally:
        faulted.close()
    evicted = evictions(faults.landed)
    keys = checkpoint_keys(faults.landed)
    duplicates = sum(c - 1 for c in evicted.values()) + sum(len(v) - 1 for v in keys.values())
    print(
        f"\nmigrator seed {seed}: faults injected {dict(sorted(faults.counts().items()))}; "
        f"evictions landed {dict(evicted)}; duplicate actions {duplicates}; lost quarantines 0"
    )
    assert set(evicted) <= before and all(c == 1 for c in evicted.values()), evicted
    assert all(len(v) == 1 for v in keys.values()), keys
    assert duplicates == 0
    after = wait_until(
        "the job runs again", lambda: len(p := running(client, "ml", "train")) == 2 and p, timeout=DEADLINE
    )
    assert not before & {p["metadata"]["uid"] for p in after}
    assert faults.injected
