"""Node escalation against the simulated apiserver (responder.enforce.node_taint,
responder.reconcile.escalator).

Aspects: escalating writes our NoSchedule taint (never a cordon, never NoExecute), the label that
lists escalated nodes and the annotation with the justification and its evidence, keeping the
node's other taints, labels and annotations, and writes nothing when called again; lifting takes
exactly those away. A pass escalates a node whose three cards failed together (counted by
justification), escalates nothing while the breaker is tripped or for one failing card or for a
node opted out, finds the escalated node by its label and lifts it once its cards walk their
own ladders, even when no record of the node is active any more; both told as Events on the
Node. A dry run decides and counts an escalation once and writes nothing. A reconciler whose
list of escalated nodes fails still decides its records (with the fake cluster of
tests/responder/test_reconciler.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.events import EVENT
from gpuhealth.kube.resources import NODE
from gpuhealth.kube.transport import KubeTransport
from responder.enforce.node_taint import LABEL, NodeTaint
from responder.enforce.observed import Observed
from responder.reconcile.breaker import BreakerSettings, BreakerState, Counts
from responder.reconcile.escalation import (
    ANNOTATION,
    CARDS_FAILING,
    TAINT_KEY,
    Escalation,
    EscalationSettings,
)
from responder.reconcile.escalator import Escalator
from responder.reconcile.limits import Bucket, BucketSettings
from responder.reconcile.reconciler import node_opted_out
from responder.records import Phase, Quarantine
from tests.responder.test_escalation import NOW, card
from tests.responder.test_reconciler import Harness
from tests.simulator.conftest import ServedCluster

pytestmark = pytest.mark.integration

FOREIGN_TAINT = {"key": "ops/maintenance", "value": "soon", "effect": "PreferNoSchedule"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[KubeClient]:
    served = ServedCluster(tmp_path / "kubeconfig")
    kube = KubeClient(KubeTransport(api_client(str(served.kubeconfig))))
    for name in ("gpu-0", "gpu-1"):
        kube.create(
            NODE,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"team": "ml"}, "annotations": {"team": "ml"}},
                "spec": {"taints": [FOREIGN_TAINT]},
                "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
            },
        )
    try:
        yield kube
    finally:
        kube.close()
        served.stop()


def ours(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for t in node["spec"].get("taints") or () if t["key"] == TAINT_KEY]


def test_escalating_taints_labels_and_annotates_and_lifting_takes_only_that(client: KubeClient) -> None:
    taints = NodeTaint(client)
    escalation = Escalation("gpu-0", CARDS_FAILING, ("GPU-0 Unhealthy since t",), NOW)
    taints.escalate(escalation, NOW + 5)
    node = client.get(NODE, "gpu-0")
    assert ours(node) == [{"key": TAINT_KEY, "value": CARDS_FAILING, "effect": "NoSchedule"}]
    assert FOREIGN_TAINT in node["spec"]["taints"]
    assert not node["spec"].get("unschedulable")
    assert node["metadata"]["labels"] == {"team": "ml", LABEL: CARDS_FAILING}
    body = json.loads(node["metadata"]["annotations"][ANNOTATION])
    assert body["justification"] == CARDS_FAILING and body["evidence"] == ["GPU-0 Unhealthy since t"]
    version = node["metadata"]["resourceVersion"]
    taints.escalate(escalation, NOW + 60)  # standing: nothing written, its first `at` kept
    assert client.get(NODE, "gpu-0")["metadata"]["resourceVersion"] == version
    assert [n["metadata"]["name"] for n in taints.escalated()] == ["gpu-0"]
    taints.lift("gpu-0")
    node = client.get(NODE, "gpu-0")
    assert ours(node) == [] and node["spec"]["taints"] == [FOREIGN_TAINT]
    assert node["metadata"]["labels"] == {"team": "ml"}
    assert node["metadata"]["annotations"] == {"team": "ml"}
    taints.lift("gpu-0")  # idempotent
    assert taints.escalated() == []


def escalator(client: KubeClient, registry: CollectorRegistry) -> Escalator:
    breaker = BreakerSettings(rate_floor=20, capacity_floor=20)
    return Escalator(NodeTaint(client), EscalationSettings(), breaker, registry, opted_out=node_opted_out)


def one_pass(
    client: KubeClient, e: Escalator, records: list[Quarantine], *, tripped: bool = False, at: float = NOW
) -> Bucket:
    bucket = Bucket.full(BucketSettings(burst=20, per_hour=120), at)
    return e.pass_over(
        records,
        e.standing(500),
        Observed(client),
        state=BreakerState(tripped=tripped),
        counts=Counts(eligible=16, started_in_window=len(records), quarantined=len(records)),
        bucket=bucket,
        now=at,
        fence=threading.Event(),
    )


def test_a_pass_escalates_three_cards_failing_together_and_lifts_when_they_walk(client: KubeClient) -> None:
    registry = CollectorRegistry()
    e = escalator(client, registry)
    failing = [card(f"GPU-{i}", NOW - 30 + i) for i in range(3)] + [card("GPU-9", NOW, node="gpu-1")]
    bucket = one_pass(client, e, failing)
    assert ours(client.get(NODE, "gpu-0"))
    assert not ours(client.get(NODE, "gpu-1"))  # one card: never
    assert bucket.tokens == pytest.approx(20 - 5)  # the node's 8 GPUs beyond its 3 failing cards
    assert (
        registry.get_sample_value("gpuhealth_node_escalations_total", {"justification": CARDS_FAILING}) == 1
    )
    assert (
        registry.get_sample_value(
            "gpuhealth_nodes_escalated", {"node": "gpu-0", "justification": CARDS_FAILING}
        )
        == 1
    )
    one_pass(client, e, failing, at=NOW + 10)  # standing: counted once
    assert (
        registry.get_sample_value("gpuhealth_node_escalations_total", {"justification": CARDS_FAILING}) == 1
    )

    released = [card(f"GPU-{i}", NOW - 30 + i, phase="Released") for i in range(3)]
    one_pass(client, e, released, at=NOW + 600)  # no active record: found by its label
    assert not ours(client.get(NODE, "gpu-0"))
    told = [
        (x["involvedObject"]["name"], x["reason"], x["type"])
        for x in client.list(EVENT, namespace="default").items
    ]
    assert sorted(told) == [
        ("gpu-0", "NodeEscalated", "Warning"),
        ("gpu-0", "NodeEscalationLifted", "Normal"),
    ]
    assert (
        registry.get_sample_value(
            "gpuhealth_nodes_escalated", {"node": "gpu-0", "justification": CARDS_FAILING}
        )
        is None
    )


def test_a_tripped_breaker_or_an_opted_out_node_escalates_nothing(client: KubeClient) -> None:
    e = escalator(client, CollectorRegistry())
    failing = [card(f"GPU-{i}", NOW) for i in range(3)]
    one_pass(client, e, failing, tripped=True)
    assert not ours(client.get(NODE, "gpu-0"))
    node = client.get(NODE, "gpu-0")
    node["metadata"]["labels"]["gpuhealth.io/remediation"] = "disabled"
    client.update(NODE, node)
    one_pass(client, e, failing)
    assert not ours(client.get(NODE, "gpu-0"))


def test_a_dry_run_decides_and_counts_once_and_writes_nothing(client: KubeClient) -> None:
    registry = CollectorRegistry()
    e = Escalator(
        NodeTaint(client),
        EscalationSettings(),
        BreakerSettings(rate_floor=20, capacity_floor=20),
        registry,
        opted_out=node_opted_out,
        dry_run=True,
    )
    failing = [card(f"GPU-{i}", NOW) for i in range(3)]
    one_pass(client, e, failing)
    one_pass(client, e, failing, at=NOW + 10)
    assert not ours(client.get(NODE, "gpu-0"))
    assert (
        registry.get_sample_value("gpuhealth_node_escalations_total", {"justification": CARDS_FAILING}) == 1
    )
    labels = {"node": "gpu-0", "justification": CARDS_FAILING}
    assert registry.get_sample_value("gpuhealth_nodes_escalated", labels) == 1


def test_escalated_nodes_that_cannot_be_listed_never_hold_the_records_back() -> None:
    h = Harness()
    # The fake cluster lists records only: a list of the nodes fails, as an outage or a missing grant would.
    h.kwargs["escalator"] = escalator(h.client, CollectorRegistry())  # type: ignore[arg-type]
    h.reconciler = h.new_reconciler()
    names = [h.add(f"GPU-{i}") for i in range(3)]
    report = h.reconciler.reconcile_once()
    assert report.skipped == ""
    assert {h.phase(n) for n in names} == {Phase.QUARANTINED}
