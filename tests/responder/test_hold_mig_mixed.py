"""Holding a MIG card on a node of MIG strategy `mixed`, on the simulated cluster.

Under strategy mixed the device plugin advertises a card's partitions as
`nvidia.com/mig-<profile>`, never as `nvidia.com/gpu`: holders asking for `nvidia.com/gpu`
could never be given them. Aspects: the holders of a free card ask for its profile's resource
and the kubelet gives them the card's partitions (the fill's holders on the other card gone),
the node annotation says each partition held; the card's check asks the kubelet for as many
units of that resource as the card has partitions; a card whose profiles the record does not
know is still held (the fill asks for every MIG resource the node advertises and keeps what
landed on the card), while its check takes the runtime's route.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.kube.resources import NODE, POD, STATUS
from responder.enforce.hold import device_ids, holds
from responder.enforce.hold_plan import HoldState
from responder.enforce.node_annotation import NodeAnnotation
from responder.reconcile.policy import Health
from responder.records import QUARANTINES, to_object
from responder.webhook.intake import IntakeSettings, Write, decide
from simulator.fleet.mig import partition_uuid
from simulator.fleet.objects import gpu_uuid
from simulator.model import MigLayout
from tests.responder.test_hold_simulated import NS, World, running_world
from tests.responder.test_intake import alert

pytestmark = pytest.mark.integration

NODE_NAME = "mx-0"
PROFILE = "3g.40gb"
RESOURCE = f"nvidia.com/mig-{PROFILE}"
SCENARIO: dict[str, Any] = {
    "name": "hold-mig-mixed",
    "fleet": [
        {
            "name": "mx",
            "count": 1,
            "gpusPerNode": 2,
            "path": "device-plugin",
            "mig": {"strategy": "mixed", "profile": PROFILE, "partitions": 2},
        }
    ],
    # One pod of one partition: first fit puts it on card 0; card 1 is free.
    "workloads": [
        {"name": "serve", "namespace": "inference", "replicas": 1, "gpusPerPod": 1, "nodeGroup": "mx"}
    ],
}


@pytest.fixture
def world() -> Iterator[World]:
    with running_world(SCENARIO) as w:
        yield w


def partitions(card: int) -> tuple[str, ...]:
    uuid = gpu_uuid(NODE_NAME, card)
    return tuple(partition_uuid(uuid, p) for p in range(MigLayout("mixed", PROFILE, 2).partitions))


def quarantine(w: World, card: int, *, profiles: bool) -> str:
    """A record of the card, through the webhook's intake, with its partitions (and their
    profiles) as the health source reads them from NVML."""
    uuid = gpu_uuid(NODE_NAME, card)
    decision = decide(
        None, alert(node=NODE_NAME, device=uuid, uuid=uuid), now=w.clock.now(), settings=IntakeSettings()
    )
    assert isinstance(decision, Write)
    parts = partitions(card)
    spec = replace(
        decision.record.spec,
        partitions=tuple(sorted(parts)),
        profiles=tuple(sorted((p, PROFILE) for p in parts)) if profiles else (),
    )
    obj = to_object(replace(decision.record, spec=spec))
    status = obj.pop("status")
    created = w.client.create(QUARANTINES, obj)
    w.client.update(QUARANTINES, {**created, "status": status}, subresource=STATUS)
    w.health.set(NODE_NAME, uuid, Health.UNHEALTHY)
    return decision.record.name


@pytest.mark.parametrize("profiles", [True, False], ids=["profiles-known", "profiles-unknown"])
def test_a_free_mig_card_on_a_mixed_node_is_held_by_holders_of_its_profile(
    world: World, profiles: bool
) -> None:
    w = world
    name = quarantine(w, 1, profiles=profiles)
    card = set(partitions(1))
    w.passes_until("the card held", lambda: w.held(name) == HoldState.HELD, timeout=60)
    holders = w.holders()
    assert {d for p in holders for d in device_ids(p)} == card
    for pod in holders:
        assert pod["spec"]["containers"][0]["resources"]["requests"][RESOURCE] == "1"
        assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["requests"]
    assert holds(w.client.get(NODE, NODE_NAME)) == dict.fromkeys(card, "held")
    # The check: the kubelet's route with every profile known, as many units as partitions.
    backend = NodeAnnotation(w.client, route="kubelet")
    record = w.record(name)
    assert backend.through_kubelet(record) is profiles
    request = backend.device_request(record, "probe", NS).container
    if profiles:
        assert request["resources"]["requests"] == {RESOURCE: "2"}
    else:
        assert {e["name"]: e["value"] for e in request["env"]}["NVIDIA_VISIBLE_DEVICES"] == ",".join(
            sorted(card)
        )


def test_a_mig_card_on_a_mixed_node_is_held_once_its_pod_left(world: World) -> None:
    w = world
    name = quarantine(w, 0, profiles=True)
    w.passes_until("the hold waiting for the pod", lambda: w.held(name) == HoldState.CARD_BUSY, timeout=60)
    on_card = [
        p for p in w.client.list(POD, namespace="inference").items if set(device_ids(p)) & set(partitions(0))
    ]
    assert len(on_card) == 1
    w.client.delete(POD, on_card[0]["metadata"]["name"], namespace="inference")
    w.passes_until("the card held", lambda: w.held(name) == HoldState.HELD, timeout=60)
    assert {d for p in w.holders() for d in device_ids(p)} == set(partitions(0))
