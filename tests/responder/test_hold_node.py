"""Holds of cards that share a node, through `DeviceHold` over an API in memory.

Aspects: a pod staying on a card its plugin calls Unhealthy keeps a Healthy GPU from any fill
(its request still counts against allocatable), so a fill that got none of the card leaves it
pending, its holders kept, and holds it once that pod has left, never marking it `excluded@N`
meanwhile; a hold stepping aside for a check says `aside` from its first pass, so another card's
fill on the node waits instead of taking the card the check is to get.
"""

from __future__ import annotations

from typing import Any

from responder.enforce.hold import DeviceHold, holds
from responder.enforce.hold_plan import HOLDER_LABEL, HoldState
from responder.enforce.node_annotation import DEVICE_PLUGIN
from responder.records import Quarantine, QuarantineSpec
from tests.responder.test_hold_devices import NS, MemoryApi


def record(uuid: str) -> Quarantine:
    spec = QuarantineSpec(
        node="n1",
        device=uuid,
        path=DEVICE_PLUGIN,
        reason="XID 79",
        actor="alert/GPUDeviceFatalXid",
        expires_at="2099-01-01T00:00:00Z",
        uuid=uuid,
    )
    return Quarantine(name=f"n1-{uuid.lower()}", spec=spec, uid=f"uid-{uuid}")


def tenant(api: MemoryApi, name: str, device: str, health: str = "Healthy") -> None:
    """A workload pod running on `device`, as its kubelet reports it."""
    gpu = {"nvidia.com/gpu": "1"}
    container = {"name": "c", "resources": {"limits": gpu, "requests": gpu}}
    api.pods[name] = {
        "metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}", "labels": {}},
        "spec": {"nodeName": "n1", "containers": [container]},
        "status": {"phase": "Running", "containerStatuses": [reported(device, health)]},
    }


def reported(device: str, health: str = "Healthy") -> dict[str, Any]:
    resources = [{"resourceID": device, "health": health}]
    return {"name": "c", "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": resources}]}


def start(api: MemoryApi, *devices: str) -> None:
    """The kubelet starts the pending holders, in name order, on `devices`."""
    pending = sorted(n for n, p in api.pods.items() if p["status"].get("phase") == "Pending")
    assert len(pending) == len(devices), pending
    for name, device in zip(pending, devices, strict=True):
        api.pods[name]["status"] = {"phase": "Running", "containerStatuses": [reported(device)]}


def holders_of(api: MemoryApi, r: Quarantine) -> list[str]:
    return sorted(n for n, p in api.pods.items() if p["metadata"]["labels"].get(HOLDER_LABEL) == r.name)


def test_a_pod_on_an_unhealthy_card_leaves_the_card_pending_until_a_fill_can_reach_it() -> None:
    """release-request at 20x: GPU-3 recovered while a pod still ran on GPU-0, which its plugin
    calls Unhealthy (allocatable 3 of 4). The fill was admitted two holders for the three Healthy
    free GPUs and got GPU-1 and GPU-2; `excluded@3` followed, and once GPU-0's pod was moved the
    kubelet handed GPU-3 to its replacement, the extender passing it."""
    api = MemoryApi(gpus=4)
    api.node["status"]["allocatable"]["nvidia.com/gpu"] = "3"
    tenant(api, "serve", "GPU-0", health="Unhealthy")
    hold, card = DeviceHold(api, NS), record("GPU-3")  # type: ignore[arg-type]
    first = hold.sync(card, True, 0.0)
    assert first is not None and first.state is HoldState.FILLING and first.create == 2
    start(api, "GPU-1", "GPU-2")
    short = hold.sync(card, True, 1.0)
    assert short is not None and short.state is HoldState.FILLING, short.message
    assert len(holders_of(api, card)) == 2, "the holders stay: no GPU of the node is given back"
    assert holds(api.node) == {"GPU-3": "pending"}, "the extender keeps new GPU pods off the node"
    # GPU-0's pod is moved: its unit frees, and the next fill can only be given the card.
    del api.pods["serve"]
    more = hold.sync(card, True, 2.0)
    assert more is not None and more.state is HoldState.FILLING and more.create == 1
    start(api, "GPU-3")
    held = hold.sync(card, True, 3.0)
    assert held is not None and held.state is HoldState.HELD, held.message
    assert len(holders_of(api, card)) == 1 and holds(api.node) == {"GPU-3": "held"}


def test_another_card_s_fill_waits_while_a_hold_steps_aside_for_its_check() -> None:
    """release-request at 10x: GPU-3's hold deleted its holder for the probe (its last step
    before `SteppedAside`, still marked `pending`), and GPU-0's refill in the same reconcile pass
    saw a free GPU and no `aside` mark: its holder was given GPU-3 and the probe got no GPU."""
    api = MemoryApi(gpus=4)
    api.node["status"]["allocatable"]["nvidia.com/gpu"] = "3"  # GPU-0: its plugin excludes it
    tenant(api, "serve", "GPU-1")
    hold, checked, other = DeviceHold(api, NS), record("GPU-3"), record("GPU-0")  # type: ignore[arg-type]
    hold.sync(checked, True, 0.0)
    start(api, "GPU-3", "GPU-2")
    assert (held := hold.sync(checked, True, 1.0)) is not None and held.state is HoldState.HELD
    # The probe is due: GPU-2 held first, then the card's holder goes.
    aside = hold.sync(checked, True, 2.0, aside=True)
    assert aside is not None and aside.state is HoldState.FILLING and aside.create == 1
    assert holds(api.node) == {"GPU-3": "aside"}
    start(api, "GPU-2")
    freeing = hold.sync(checked, True, 3.0, aside=True)
    assert freeing is not None and freeing.state is HoldState.FILLING and len(freeing.delete) == 1
    assert holds(api.node) == {"GPU-3": "aside"}, "the card is free now: no other fill may start"
    waiting = hold.sync(other, True, 3.1)
    assert waiting is not None and waiting.create == 0 and "waiting for the check of GPU-3" in waiting.message
    assert holders_of(api, other) == []
    assert holds(api.node) == {"GPU-0": "pending", "GPU-3": "aside"}


def test_a_card_excluded_beside_a_held_card_its_plugin_then_called_unhealthy_is_not_allocatable() -> None:
    """GPU-0 is held, and its plugin has since called it Unhealthy (its holder stays on it);
    GPU-3 is excluded too, and no pod names it: it is the excluded GPU nobody reports, so the
    fill that got none of it judges it excluded rather than keep the node's GPUs held."""
    api = MemoryApi(gpus=4)
    api.node["status"]["allocatable"]["nvidia.com/gpu"] = "2"
    tenant(api, "held-elsewhere", "GPU-0", health="Unhealthy")
    api.pods["held-elsewhere"]["metadata"]["labels"] = {HOLDER_LABEL: "n1-gpu-0"}
    hold, card = DeviceHold(api, NS), record("GPU-3")  # type: ignore[arg-type]
    first = hold.sync(card, True, 0.0)
    assert first is not None and first.create == 1
    start(api, "GPU-1")
    judged = hold.sync(card, True, 1.0)
    assert judged is not None and judged.state is HoldState.NOT_ALLOCATABLE, judged.message
    assert holders_of(api, card) == [] and holds(api.node) == {"GPU-3": "excluded@2"}
