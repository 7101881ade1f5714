"""What the demo's observer journals from each observation (demo.observer), with plain objects.

Aspects: a record journals its first phase and each phase change once (repeated updates in one
phase add nothing), and each migration outcome once; a gpuhealth DeviceTaintRule is ENFORCED (by
its taint's meaning), its taint turning canary is LIFTED quarantine + ENFORCED canary, its deletion
LIFTED; a rule gpuhealth does not own is ignored; the node annotation's devices are diffed into
ENFORCED/LIFTED, a device moving to the ramp annotation is LIFTED quarantine + ENFORCED canary (and
back on a failure), its release LIFTED canary; a cordon or a gpuhealth node taint is a NODE_ACTION
(other taints are not); a check Job is journalled once when it finishes, with its record's device;
only the responder's Events on pods are tenant events; a re-placed pod of an evicted job is noted
with its devices and whether it opted in to the ramp; the leader Lease and the breaker's state
changes are journalled once each; a second episode's move of the same job is journalled again,
keyed by its episode; pods on recorded devices are journalled as they start and stop running there
(the ones already running when the record appears, too), others not; a check's devices are the ones
its pod really reached (its allocation, or `NVIDIA_VISIBLE_DEVICES` on its node, by uuid or index);
a pod's start is journalled once per pod (by uid), when first seen Running, with the cards the API
gives it (a device plugin's resource IDs: the uuid, a time-sliced replica, a MIG partition; a DRA
claim's allocation, seen before or after the pod, a MIG device as its card), its holder or check
label, and only on recorded devices;
a release request and each new answer of the responder are journalled once; Prometheus' alerts are
diffed into firing and resolved; a delivery journals each alert with its device resolved from the
DRA labels."""

from __future__ import annotations

import json
from typing import Any

from demo.journal import Device, Journal, Kind
from demo.observer import (
    CLAIMS,
    CONFIG_MAPS,
    EVENTS,
    JOBS,
    LEASES,
    NODES,
    PODS,
    QUARANTINES,
    RULES,
    Observer,
)
from responder.ladder import PROBING
from responder.records import Phase as P
from responder.records import Quarantine, QuarantineSpec, QuarantineStatus, to_object
from simulator.fleet.objects import gpu_uuid

NODE = "gpu-dra-0"
UUID = gpu_uuid(NODE, 3)
OTHER = gpu_uuid(NODE, 1)


def observer() -> Observer:
    devices = {gpu_uuid(NODE, i): Device(gpu_uuid(NODE, i), NODE, i, "dra") for i in range(4)}
    return Observer(Journal("t", "", 10.0, devices))


def kinds(o: Observer) -> list[tuple[str, str]]:
    return [(e.kind.value, e.what) for e in o.journal.entries]


def record(phase: str, **status: Any) -> dict[str, Any]:
    spec = QuarantineSpec(
        node=NODE,
        device=UUID,
        path="dra",
        reason="Unhealthy",
        actor="alert/GPUDeviceUnhealthy",
        expires_at="2026-12-01T00:00:00Z",
        uuid=UUID,
        driver="gpu.nvidia.com",
        pool=NODE,
        device_name="gpu-3",
    )
    obj: dict[str, Any] = to_object(
        Quarantine("rec", spec, QuarantineStatus(phase=phase, **status), uid="u1", resource_version="1")
    )
    return obj


def rule(taint: str, owned: bool = True) -> dict[str, Any]:
    owners = [{"kind": "DeviceQuarantine", "name": "rec"}] if owned else []
    return {
        "metadata": {"name": "rec", "ownerReferences": owners},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": NODE, "device": "gpu-3"},
            "taint": {"key": taint, "value": "Unhealthy", "effect": "NoSchedule"},
        },
    }


def test_records_phases_and_migrations_are_journalled_once_each() -> None:
    from responder.records import Migration, MigrationOutcome

    o = observer()
    o.change(1, QUARANTINES, "ADDED", record(P.PENDING))
    o.change(2, QUARANTINES, "MODIFIED", record(P.QUARANTINED))
    o.change(3, QUARANTINES, "MODIFIED", record(P.QUARANTINED))
    waiting = Migration("research", "Job/train", "j1", "k")
    o.change(4, QUARANTINES, "MODIFIED", record(P.QUARANTINED, migrations=(waiting,)))
    done = Migration("research", "Job/train", "j1", "k", outcome=MigrationOutcome.SUCCEEDED, evictions=("t",))
    o.change(5, QUARANTINES, "MODIFIED", record(P.QUARANTINED, migrations=(done,)))
    o.change(6, QUARANTINES, "MODIFIED", record(PROBING, migrations=(done,)))
    assert kinds(o) == [
        ("phase", "Pending"),
        ("phase", "Quarantined"),
        ("note", "move-started"),
        ("migration", "succeeded"),
        ("phase", "Probing"),
    ]
    assert o.journal.entries[2].at == 4 and o.journal.entries[2].detail["job"] == "research/train"
    migration = o.journal.entries[3]
    assert migration.device == UUID and migration.detail["job"] == "research/train"
    assert (
        o.journal.entries[0].detail["record"] == "rec"
        and o.journal.entries[0].detail["action"] == "quarantine"
    )


def test_rules_annotations_and_node_wide_actions() -> None:
    o = observer()
    o.change(1, RULES, "ADDED", rule("gpuhealth.io/quarantine", owned=False))
    o.change(2, RULES, "ADDED", rule("gpuhealth.io/quarantine"))
    o.change(3, RULES, "MODIFIED", rule("gpuhealth.io/quarantine"))
    o.change(4, RULES, "MODIFIED", rule("gpuhealth.io/canary"))
    o.change(5, RULES, "DELETED", rule("gpuhealth.io/canary"))
    assert kinds(o) == [
        ("enforced", "quarantine"),
        ("lifted", "quarantine"),
        ("enforced", "canary"),
        ("lifted", "canary"),
    ]
    assert {e.device for e in o.journal.entries} == {UUID}
    n = observer()

    def node(devices: list[str], *, cordon: bool = False, taints: tuple[str, ...] = ()) -> dict[str, Any]:
        return {
            "metadata": {
                "name": NODE,
                "annotations": {"gpuhealth.io/quarantined-devices": json.dumps(devices)},
            },
            "spec": {"unschedulable": cordon, "taints": [{"key": t, "effect": "NoSchedule"} for t in taints]},
        }

    n.change(1, NODES, "ADDED", node([]))
    n.change(2, NODES, "MODIFIED", node([UUID]))
    n.change(3, NODES, "MODIFIED", node([UUID, OTHER], taints=("node.kubernetes.io/unreachable",)))
    n.change(4, NODES, "MODIFIED", node([OTHER], cordon=True, taints=("gpuhealth.io/quarantine",)))
    assert kinds(n) == [
        ("enforced", "quarantine"),
        ("enforced", "quarantine"),
        ("lifted", "quarantine"),
        ("node-action", "cordon"),
        ("node-action", "taint"),
    ]
    assert [e.device for e in n.journal.entries[:3]] == [UUID, OTHER, UUID]


def test_a_device_plugin_ramp_is_journalled_like_a_rule_turning_canary() -> None:
    o = observer()

    def node(quarantined: list[str], ramping: list[str]) -> dict[str, Any]:
        annotations = {"gpuhealth.io/quarantined-devices": json.dumps(quarantined)}
        if ramping:
            annotations["gpuhealth.io/ramping-devices"] = json.dumps(dict.fromkeys(ramping, 1))
        return {"metadata": {"name": NODE, "annotations": annotations}, "spec": {}}

    o.change(1, NODES, "ADDED", node([UUID], []))
    o.change(2, NODES, "MODIFIED", node([], [UUID]))  # the ramp
    o.change(3, NODES, "MODIFIED", node([UUID], []))  # failed on the ramp
    o.change(4, NODES, "MODIFIED", node([], [UUID]))
    o.change(5, NODES, "MODIFIED", node([], []))  # released
    assert [(e.at, *k) for e, k in zip(o.journal.entries, kinds(o), strict=True)] == [
        (1, "enforced", "quarantine"),
        (2, "lifted", "quarantine"),
        (2, "enforced", "canary"),
        (3, "lifted", "canary"),
        (3, "enforced", "quarantine"),
        (4, "lifted", "quarantine"),
        (4, "enforced", "canary"),
        (5, "lifted", "canary"),
    ]
    assert {e.device for e in o.journal.entries} == {UUID}


def test_checks_tenant_events_and_re_placed_pods() -> None:
    o = observer()
    o.change(1, QUARANTINES, "ADDED", record(PROBING))

    def job(status: dict[str, Any]) -> dict[str, Any]:
        return {
            "metadata": {
                "name": "rec-probe-1",
                "labels": {"gpuhealth.io/check": "probe", "gpuhealth.io/record": "rec"},
                "annotations": {"gpuhealth.io/attempt": "1"},
            },
            "status": status,
        }

    o.change(2, JOBS, "ADDED", job({}))
    o.change(3, JOBS, "MODIFIED", job({"succeeded": 1}))
    o.change(4, JOBS, "MODIFIED", job({"succeeded": 1}))
    [check] = [e for e in o.journal.entries if e.kind is Kind.CHECK]
    assert (check.what, check.device, check.detail["result"], check.detail["attempt"]) == (
        "probe",
        UUID,
        "passed",
        "1",
    )

    def pod(name: str, phase: str) -> dict[str, Any]:
        labels = {"job-name": "train"}
        return {
            "metadata": {"name": name, "namespace": "research", "labels": labels},
            "spec": {"nodeName": NODE},
            "status": {"phase": phase},
        }

    o.change(5, PODS, "ADDED", pod("train-0", "Running"), [UUID])
    o.evicted(6, "research/train-0", NODE, [UUID], "research/train")
    o.change(7, PODS, "ADDED", pod("train-1", "Pending"))
    o.change(8, PODS, "MODIFIED", pod("train-1", "Running"), [OTHER])
    o.change(9, PODS, "MODIFIED", pod("train-1", "Running"), [OTHER])
    placed = [e for e in o.journal.entries if e.what == "placed"]
    assert len(placed) == 1 and placed[0].detail["devices"] == OTHER and placed[0].at == 8
    assert placed[0].detail["optedIn"] == "false"
    opted = pod("train-2", "Running")
    opted["metadata"]["labels"]["gpuhealth.io/canary-ok"] = "true"
    o.change(10, PODS, "ADDED", opted, [UUID])
    assert [e.detail["optedIn"] for e in o.journal.entries if e.what == "placed"] == ["false", "true"]

    def event(component: str, kind: str = "Pod") -> dict[str, Any]:
        return {
            "metadata": {"name": f"e-{component}", "namespace": "research"},
            "involvedObject": {"kind": kind, "name": "train-1", "namespace": "research"},
            "reason": "WorkUnrecoverable",
            "message": "no checkpoint",
            "reportingComponent": component,
        }

    o.change(10, EVENTS, "ADDED", event("gpuhealth-responder"))
    o.change(11, EVENTS, "MODIFIED", event("gpuhealth-responder"))
    o.change(12, EVENTS, "ADDED", event("default-scheduler"))
    o.change(
        13,
        EVENTS,
        "ADDED",
        event("gpuhealth-responder", kind="DeviceQuarantine") | {"metadata": {"name": "x"}},
    )
    [tenant] = [e for e in o.journal.entries if e.kind is Kind.TENANT_EVENT]
    assert (
        tenant.what == "WorkUnrecoverable"
        and tenant.detail["pod"] == "research/train-1"
        and tenant.device == OTHER
    )


def test_leader_breaker_alerts_and_deliveries() -> None:
    o = observer()
    lease = {"metadata": {"name": "gpuhealth-responder"}, "spec": {"holderIdentity": "responder-0"}}
    o.change(1, LEASES, "ADDED", lease)
    o.change(2, LEASES, "MODIFIED", lease)
    o.change(3, LEASES, "MODIFIED", {**lease, "spec": {"holderIdentity": "responder-1"}})
    o.change(4, LEASES, "MODIFIED", {"metadata": {"name": "other"}, "spec": {"holderIdentity": "x"}})
    assert o.leader == "responder-1"

    def breaker(tripped: bool) -> dict[str, Any]:
        history = [{"actor": "alice", "action": "reset"}]
        data = {"state": json.dumps({"tripped": tripped, "trigger": "rate"}), "history": json.dumps(history)}
        return {"metadata": {"name": "gpuhealth-breaker"}, "data": data}

    o.change(5, CONFIG_MAPS, "ADDED", breaker(False))
    o.change(6, CONFIG_MAPS, "MODIFIED", breaker(True))
    o.change(7, CONFIG_MAPS, "MODIFIED", breaker(True))
    o.change(8, CONFIG_MAPS, "MODIFIED", breaker(False))
    labels = {"alertname": "GPUDeviceUnhealthy", "node": NODE, "device": "gpu.nvidia.com/gpu-dra-0/gpu-3"}
    o.alerts(9, [{"labels": labels}])
    o.alerts(10, [{"labels": labels}])
    o.alerts(11, [])
    body = {
        "alerts": [
            {"status": "firing", "labels": {**labels, "action": "quarantine"}, "fingerprint": "f"},
            "x",
        ]
    }
    o.delivery(12, "responder", body)
    o.delivery(13, "responder", None)
    assert kinds(o) == [
        ("note", "leader"),
        ("note", "leader"),
        ("breaker", "tripped"),
        ("breaker", "reset"),
        ("alert-firing", "GPUDeviceUnhealthy"),
        ("alert-resolved", "GPUDeviceUnhealthy"),
        ("delivery", "responder"),
    ]
    assert o.journal.entries[4].device == UUID and o.journal.entries[-1].device == UUID
    assert o.journal.entries[-1].detail["fingerprint"] == "f"


def test_a_second_episode_moves_the_same_job_again() -> None:
    from responder.records import Migration, MigrationOutcome

    o = observer()
    first = Migration("research", "Job/train", "j1", "k1", episode=1, outcome=MigrationOutcome.SUCCEEDED)
    o.change(1, QUARANTINES, "ADDED", record(P.QUARANTINED, episode=1, migrations=(first,)))
    o.change(2, QUARANTINES, "MODIFIED", record(PROBING, episode=1, attempt=1, migrations=(first,)))
    second = Migration("research", "Job/train", "j1", "k2", episode=2)
    o.change(
        3, QUARANTINES, "MODIFIED", record(P.QUARANTINED, episode=2, attempt=1, migrations=(first, second))
    )
    done = Migration("research", "Job/train", "j1", "k2", episode=2, outcome=MigrationOutcome.SUCCEEDED)
    o.change(
        4, QUARANTINES, "MODIFIED", record(P.QUARANTINED, episode=2, attempt=1, migrations=(first, done))
    )
    moves = [(e.at, e.what, e.detail["episode"]) for e in o.journal.entries if e.kind is Kind.MIGRATION]
    assert moves == [(1, "succeeded", "1"), (4, "succeeded", "2")]
    started = [(e.at, e.detail["episode"]) for e in o.journal.entries if e.what == "move-started"]
    assert started == [(1, "1"), (3, "2")]
    phases = [(e.what, e.detail["episode"], e.detail["attempt"]) for e in o.journal.of(Kind.PHASE)]
    assert phases == [("Quarantined", "1", "0"), ("Probing", "1", "1"), ("Quarantined", "2", "1")]


def _pod(
    name: str, phase: str, *, check: str = "", job: str = "train", env: str | None = None
) -> dict[str, Any]:
    labels = {"job-name": job, **({"gpuhealth.io/check": check} if check else {})}
    container: dict[str, Any] = {"name": "c"}
    if env is not None:
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": env}]
    return {
        "metadata": {"name": name, "namespace": "research", "labels": labels},
        "spec": {"nodeName": NODE, "containers": [container]},
        "status": {"phase": phase},
    }


def test_pods_on_recorded_devices_are_journalled_as_they_start_and_stop() -> None:
    o = observer()
    o.change(1, PODS, "ADDED", _pod("train-0", "Running"), [UUID])
    o.change(2, PODS, "ADDED", _pod("other-0", "Running", job="other"), [OTHER])
    assert not list(o.journal.of(Kind.POD))  # no record on either device yet
    o.change(3, QUARANTINES, "ADDED", record(P.QUARANTINED))
    o.change(4, PODS, "MODIFIED", _pod("train-0", "Running"), [UUID])
    o.change(5, PODS, "MODIFIED", _pod("train-0", "Succeeded"), [UUID])
    o.change(6, PODS, "ADDED", _pod("train-1", "Running"), [UUID])
    o.change(7, PODS, "DELETED", _pod("train-1", "Running"), [UUID])
    o.change(8, PODS, "MODIFIED", _pod("other-0", "Succeeded", job="other"), [OTHER])
    pods = [(e.at, e.what, e.detail["pod"], e.detail["job"]) for e in o.journal.of(Kind.POD)]
    assert pods == [
        (3, "running", "research/train-0", "research/train"),
        (5, "stopped", "research/train-0", "research/train"),
        (6, "running", "research/train-1", "research/train"),
        (7, "stopped", "research/train-1", "research/train"),
    ]


def _check_job(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "research",
            "labels": {"gpuhealth.io/check": "probe", "gpuhealth.io/record": "rec"},
            "annotations": {"gpuhealth.io/attempt": "1"},
        },
        "status": {"succeeded": 1},
    }


def test_a_check_ran_on_the_devices_its_pod_really_reached() -> None:
    o = observer()
    o.change(1, QUARANTINES, "ADDED", record(PROBING))
    # A DRA check: the device its claim's allocation gave the pod.
    o.change(2, PODS, "ADDED", _pod("claimed-x", "Pending", check="probe", job="claimed"))
    o.change(3, PODS, "MODIFIED", _pod("claimed-x", "Running", check="probe", job="claimed"), [UUID])
    o.change(4, JOBS, "MODIFIED", _check_job("claimed"))
    # A device-plugin check: no allocation, the runtime exposes the GPU the env names.
    o.change(5, PODS, "ADDED", _pod("env-x", "Running", check="probe", job="env", env=UUID))
    o.change(6, JOBS, "MODIFIED", _check_job("env"))
    # The env names a GPU by index, and another one: the check ran on another card.
    o.change(7, PODS, "ADDED", _pod("index-x", "Running", check="probe", job="index", env="1"))
    o.change(8, JOBS, "MODIFIED", _check_job("index"))
    # No pod was ever seen on a device.
    o.change(9, JOBS, "MODIFIED", _check_job("nowhere"))
    ran = {e.detail["job"]: e.detail["ranOn"] for e in o.journal.of(Kind.CHECK)}
    assert ran == {"claimed": UUID, "env": UUID, "index": OTHER, "nowhere": ""}
    running = [e.detail.get("check") for e in o.journal.of(Kind.POD) if e.what == "running"]
    assert running == ["probe", "probe"]  # only those on the recorded device


def test_a_release_request_and_each_new_answer_are_journalled_once() -> None:
    from responder.records import Condition, ReleaseRequest

    o = observer()
    request = ReleaseRequest("person/ana", "replaced the riser", "2026-12-01T00:00:00Z")

    def asked(answer: Condition | None, at: str = "2026-12-01T00:00:00Z") -> dict[str, Any]:
        obj = record(P.QUARANTINED, conditions=(answer,) if answer else ())
        obj["spec"]["releaseRequest"] = {"actor": request.actor, "reason": request.reason, "requestedAt": at}
        return obj

    refused = Condition("ReleaseRequest", "False", "FailureStands", "refused: 1 failure(s)", "t")
    honoured = Condition("ReleaseRequest", "True", "Honoured", "honoured", "t")
    o.change(1, QUARANTINES, "ADDED", record(P.QUARANTINED))
    o.change(2, QUARANTINES, "MODIFIED", asked(None))
    o.change(3, QUARANTINES, "MODIFIED", asked(refused))
    o.change(4, QUARANTINES, "MODIFIED", asked(refused))
    o.change(5, QUARANTINES, "MODIFIED", asked(honoured, "2026-12-01T01:00:00Z"))
    seen = [(e.at, e.what, e.detail.get("reason", "")) for e in o.journal.of(Kind.REQUEST)]
    assert seen == [
        (2, "requested", ""),
        (3, "refused", "FailureStands"),
        (5, "requested", ""),
        (5, "honoured", "Honoured"),
    ]
    assert all(
        e.detail["actor"] == "person/ana" and e.detail["record"] == "rec" for e in o.journal.of(Kind.REQUEST)
    )


def _started_pod(name: str, *, ids: tuple[str, ...] = (), uid: str = "u", **labels: str) -> dict[str, Any]:
    pod = _pod(name, "Running")
    pod["metadata"]["uid"] = uid
    pod["metadata"]["labels"].update(labels)
    if ids:
        resources = [{"resourceID": rid, "health": "Healthy"} for rid in ids]
        pod["status"]["containerStatuses"] = [
            {"name": "c", "allocatedResourcesStatus": [{"name": "nvidia.com/gpu", "resources": resources}]}
        ]
    return pod


def _claim(name: str, pod: str, *devices: str) -> dict[str, Any]:
    results = [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": NODE, "device": d} for d in devices]
    return {
        "metadata": {"name": name, "namespace": "research"},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": pod, "uid": "u"}],
        },
    }


def _starts(o: Observer) -> list[tuple[float, str, str, str, str, str]]:
    return [
        (
            e.at,
            e.what,
            e.detail["devices"],
            e.detail["deviceIDs"],
            e.detail.get("holder", ""),
            e.detail.get("check", ""),
        )
        for e in o.journal.of(Kind.POD_STARTED)
    ]


def test_a_device_plugin_pods_start_is_journalled_with_the_cards_its_resource_ids_name() -> None:
    mig = "MIG-0000-card-3"
    devices = {gpu_uuid(NODE, i): Device(gpu_uuid(NODE, i), NODE, i, "device-plugin") for i in range(3)}
    devices[UUID] = Device(UUID, NODE, 3, "device-plugin", (mig,))
    o = Observer(Journal("t", "", 10.0, devices))
    o.change(1, PODS, "ADDED", _started_pod("early-0", ids=(UUID,)))  # no record yet: left out
    o.change(2, QUARANTINES, "ADDED", record(P.QUARANTINED))
    o.change(3, PODS, "ADDED", _started_pod("train-0", ids=(f"{UUID}::2",)))
    o.change(4, PODS, "MODIFIED", _started_pod("train-0", ids=(f"{UUID}::2",)))  # started once
    o.change(5, PODS, "ADDED", _started_pod("mig-0", ids=(mig, OTHER)))
    o.change(6, PODS, "ADDED", _started_pod("hold-0", ids=(UUID,), **{"gpuhealth.io/holder": "rec"}))
    o.change(7, PODS, "ADDED", _started_pod("probe-0", ids=(UUID,), **{"gpuhealth.io/check": "probe"}))
    o.change(8, PODS, "ADDED", _started_pod("elsewhere-0", ids=(OTHER,)))  # no record on it
    # A pod seen Running before its status names a device: stamped when it was seen Running.
    o.change(9, PODS, "ADDED", _started_pod("late-0"))
    o.change(10, PODS, "MODIFIED", _started_pod("late-0", ids=(UUID,)))
    # The same name again (a StatefulSet's replacement): a new pod, a new start.
    o.change(11, PODS, "DELETED", _started_pod("train-0", ids=(f"{UUID}::2",)))
    o.change(12, PODS, "ADDED", _started_pod("train-0", ids=(UUID,), uid="u2"))
    assert _starts(o) == [
        (3, "research/train-0", UUID, f"{UUID}::2", "", ""),
        (5, "research/mig-0", f"{UUID},{OTHER}", f"{mig},{OTHER}", "", ""),
        (6, "research/hold-0", UUID, UUID, "rec", ""),
        (7, "research/probe-0", UUID, UUID, "", "probe"),
        (9, "research/late-0", UUID, UUID, "", ""),
        (12, "research/train-0", UUID, UUID, "", ""),
    ]


def test_a_dra_pods_start_is_journalled_with_its_claims_allocation_seen_before_or_after_it() -> None:
    o = observer()
    o.change(1, QUARANTINES, "ADDED", record(P.QUARANTINED))
    o.change(2, CLAIMS, "ADDED", _claim("before-gpus", "before-0", "gpu-3"))
    o.change(3, PODS, "ADDED", _started_pod("before-0"))
    o.change(4, PODS, "ADDED", _started_pod("after-0"))
    o.change(5, CLAIMS, "ADDED", _claim("after-gpus", "after-0", "gpu-3-mig-3g40gb-9-0"))
    o.change(6, CLAIMS, "ADDED", _claim("other-gpus", "other-0", "gpu-1"))
    o.change(7, PODS, "ADDED", _started_pod("other-0"))  # on a device with no record
    assert _starts(o) == [
        (3, "research/before-0", UUID, f"{NODE}/gpu-3", "", ""),
        (4, "research/after-0", UUID, f"{NODE}/gpu-3-mig-3g40gb-9-0", "", ""),
    ]
