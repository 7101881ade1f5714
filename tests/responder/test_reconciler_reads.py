"""What one reconcile pass reads of the API (responder.reconcile.reconciler with the shipped
backends over responder.enforce.observed), counted at a fake API.

Aspects: a pass over N DRA records makes the same lists whatever N (the records, the
ResourceSlices, the DeviceTaintRules, the nodes once they are many) and no GET of any record's
rule, nor of a node; a rule a person deleted is put back by the next pass from the list alone
(level-triggered, with the warning Event); records on a few nodes read each node once, never
per record, and list no nodes; a rule created by another replica after the pass listed (the
create answers 409) is read again and left as it is, and the pass's own writes are what later
reads of it see; a waiting record is enforced before the moves of records already enforced,
and the pass's Events come after every record; the loop's passes run while the event loop's
default executor (where webhook deliveries run) is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from gpuhealth.kube.client import ObjectList
from gpuhealth.kube.errors import AlreadyExists, NotFound
from gpuhealth.kube.resources import NODE, RESOURCE_SLICE, Resource
from responder.enforce.observed import Observed
from responder.enforce.shipped import Enforcer
from responder.reconcile.health import Health
from responder.reconcile.limits import BucketSettings
from responder.reconcile.policy import QUARANTINE_TAINT, Enforce
from responder.records import Phase, Quarantine
from tests.responder.test_reconciler import NOW, SETTINGS, FakeClient, Harness

RULES = Resource("resource.k8s.io", "v1", "devicetaintrules", namespaced=False)
GPUS = 8


class CountingClient(FakeClient):
    """The reconciler's fake API, also serving DeviceTaintRules, nodes and ResourceSlices, and
    counting every call as (verb, resource)."""

    def __init__(self) -> None:
        super().__init__()
        self.rules: dict[str, dict[str, Any]] = {}
        self.slices: list[dict[str, Any]] = []
        self.calls: Counter[tuple[str, str]] = Counter()

    def list(self, resource: Resource, **kwargs: Any) -> ObjectList:
        self.calls["list", resource.plural] += 1
        if resource == RULES:
            return ObjectList(copy.deepcopy(list(self.rules.values())), str(self._rv))
        if resource == NODE:
            return ObjectList(copy.deepcopy(list(self.nodes.values())), str(self._rv))
        if resource == RESOURCE_SLICE:
            return ObjectList(copy.deepcopy(self.slices), str(self._rv))
        return super().list(resource, **kwargs)

    def get(self, resource: Resource, name: str) -> dict[str, Any]:
        self.calls["get", resource.plural] += 1
        if resource == RULES:
            if name not in self.rules:
                raise NotFound(f"devicetaintrules {name} not found")
            return copy.deepcopy(self.rules[name])
        return super().get(resource, name)

    def create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        self.calls["create", resource.plural] += 1
        assert resource == RULES
        name = obj["metadata"]["name"]
        if name in self.rules:
            raise AlreadyExists(f"devicetaintrules {name} already exists")
        stored = copy.deepcopy(obj)
        stored["metadata"].update(uid=f"uid-rule-{name}", resourceVersion=self._next())
        self.rules[name] = stored
        return copy.deepcopy(stored)

    def update(
        self, resource: Resource, obj: dict[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        self.calls["update", resource.plural] += 1
        if resource != RULES:
            return super().update(resource, obj, subresource=subresource)
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = self._next()
        self.rules[obj["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def delete(self, resource: Resource, name: str, **kwargs: Any) -> dict[str, Any]:
        self.calls["delete", resource.plural] += 1
        assert resource == RULES
        return self.rules.pop(name)

    def add_node(self, node: str) -> None:
        """A DRA node: one ResourceSlice of GPUS devices, each with its uuid."""
        self.nodes[node] = {"metadata": {"name": node, "labels": {}}, "status": {"capacity": {}}}
        devices = [
            {"name": f"gpu-{g}", "attributes": {"uuid": {"string": f"GPU-{node}-{g}"}}} for g in range(GPUS)
        ]
        self.slices.append(
            {
                "metadata": {"name": f"{node}-slice"},
                "spec": {
                    "driver": "gpu.nvidia.com",
                    "pool": {"name": node},
                    "nodeName": node,
                    "devices": devices,
                },
            }
        )

    def by_verb(self, verb: str) -> dict[str, int]:
        return {plural: n for (v, plural), n in self.calls.items() if v == verb}


def dra_harness(records: int, *, list_nodes_from: int = 50) -> tuple[Harness, CountingClient, list[str]]:
    """`records` DRA devices failing, 8 to a node, under the shipped backends; the bucket and the
    fleet large enough that every one of them is quarantined in the first pass."""
    settings = replace(
        SETTINGS, bucket=BucketSettings(burst=10_000, per_hour=10_000.0), list_nodes_from=list_nodes_from
    )
    h = Harness(settings)
    client = CountingClient()
    h.client = client
    h.enforcer = Enforcer(client, RULES)  # type: ignore[assignment]
    h.reconciler = h.new_reconciler()
    for i in range(20 * records):
        h.health.set(f"healthy-{i // GPUS}", f"GPU-h-{i}", Health.HEALTHY, NOW - 86400)
    names = []
    for node in range((records + GPUS - 1) // GPUS):
        client.add_node(f"gpu-node-{node}")
    for i in range(records):
        node = f"gpu-node-{i // GPUS}"
        names.append(h.add(device=f"GPU-{node}-{i % GPUS}", node=node))
    return h, client, names


@pytest.mark.parametrize("records", [40, 400])
def test_a_pass_lists_the_same_few_times_whatever_the_records_and_gets_no_rule(records: int) -> None:
    h, client, names = dra_harness(records, list_nodes_from=1)
    h.reconciler.reconcile_once()
    assert {h.phase(n) for n in names} == {Phase.QUARANTINED}
    assert len(client.rules) == records
    # The admissions created their rules from the list: nothing was read rule by rule.
    assert client.by_verb("get").get("devicetaintrules", 0) == 0
    assert client.by_verb("create") == {"devicetaintrules": records}

    client.calls.clear()
    outcomes = h.reconciler.reconcile_once().outcomes
    assert set(outcomes.values()) == {"unchanged"}
    assert client.by_verb("list") == {
        "devicequarantines": 1,
        "devicetaintrules": 1,
        "resourceslices": 1,
        "nodes": 1,
    }
    assert client.by_verb("get") == {}
    assert sum(client.calls.values()) == 4


def test_a_rule_deleted_by_a_person_is_put_back_by_the_next_pass_from_the_list() -> None:
    h, client, names = dra_harness(16)
    h.reconciler.reconcile_once()
    gone = names[3]
    del client.rules[gone]
    client.calls.clear()
    h.reconciler.reconcile_once()
    assert gone in client.rules and client.rules[gone]["spec"]["taint"]["key"] == QUARANTINE_TAINT
    assert h.phase(gone) == Phase.QUARANTINED
    assert any(r == "EnforcementRestored" and warning for _, r, _, warning in h.events.notices)
    assert client.by_verb("create") == {"devicetaintrules": 1}
    assert client.by_verb("get") == {}


def test_records_on_a_few_nodes_read_each_node_once_and_list_none() -> None:
    h, client, names = dra_harness(16, list_nodes_from=50)  # 2 nodes, 8 Pending records each
    h.reconciler.reconcile_once()
    assert {h.phase(n) for n in names} == {Phase.QUARANTINED}
    assert client.by_verb("get") == {"nodes": 2}  # the opt-out label of each Pending record's node
    assert "nodes" not in client.by_verb("list")


def test_a_rule_created_after_the_list_is_read_again_and_left_as_it_is() -> None:
    _, client, names = dra_harness(1)
    enforcer = Enforcer(client, RULES)
    seen = enforcer.observe()
    record = enforcer.identify(client.record(names[0]), seen)
    assert record.spec.path == "dra" and record.uid
    quarantine = Enforce(QUARANTINE_TAINT, "Unhealthy", "NoSchedule")
    enforcer.enforce(record, quarantine)  # another replica, after this pass listed
    client.calls.clear()
    enforcer.enforce(record, quarantine, seen)
    # Its create lost (409), the rule was read again, found as wanted, and left alone.
    assert client.by_verb("create") == {"devicetaintrules": 1}
    assert client.by_verb("get") == {"devicetaintrules": 1}
    assert client.by_verb("update") == {}
    assert enforcer.present(record, quarantine, seen)
    # The pass's own writes are what it reads next: lifted, absent, with no further read.
    enforcer.unenforce(record, seen)
    assert not enforcer.present(record, None, seen)
    assert client.by_verb("get") == {"devicetaintrules": 1}
    assert isinstance(seen, Observed) and seen.reads == 1


def test_a_waiting_record_is_enforced_before_the_moves_of_enforced_ones_and_events_come_last() -> None:
    h = Harness()
    order: list[tuple[str, str]] = []

    def migrate(record: Quarantine, now: float) -> Quarantine:
        order.append(("migrate", record.name))
        return record

    emit = h.events.emit

    def recorded(record: Quarantine, *args: Any, **kwargs: Any) -> None:
        order.append(("event", record.name))
        emit(record, *args, **kwargs)

    h.events.emit = recorded  # type: ignore[method-assign]
    h.enforcer.calls = order
    h.kwargs["migrate"] = migrate
    h.reconciler = h.new_reconciler()
    first = h.add(device="GPU-first")
    h.reconciler.reconcile_once()
    assert h.phase(first) == Phase.QUARANTINED
    h.clock.advance(1)
    second = h.add(device="GPU-second")  # created after the first: once, it came after it
    order.clear()
    h.reconciler.reconcile_once()
    assert h.phase(second) == Phase.QUARANTINED
    assert order.index(("enforce", second)) < order.index(("migrate", first))
    events = [i for i, (what, _) in enumerate(order) if what == "event"]
    assert events and min(events) > max(i for i, (what, _) in enumerate(order) if what != "event")


async def test_the_loop_passes_while_the_default_executor_is_busy() -> None:
    """Webhook deliveries run in the loop's default executor: a pass never queues behind them."""
    h = Harness()
    name = h.add()
    loop = asyncio.get_running_loop()
    release = threading.Event()
    busy = [loop.run_in_executor(None, release.wait) for _ in range(64)]
    task = asyncio.create_task(h.reconciler.run())
    try:
        for _ in range(3000):  # a deadline of at least 30 s, however slow the machine
            if h.phase(name) == Phase.QUARANTINED:
                break
            await asyncio.sleep(0.01)
        assert h.phase(name) == Phase.QUARANTINED
        assert not any(f.done() for f in busy)
    finally:
        release.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.gather(*busy)
