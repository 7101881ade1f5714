"""The shipped RBAC under the real apiserver's authorization (Node,RBAC), on 1.37.

Aspects: the exporter (node and cluster mode) and two responder replicas run as processes
from the enforcing overlay's container args, each with its ServiceAccount's token from the
TokenRequest API (not the admin's credentials); all become ready and one replica leads. Then
the responder's components act as its account: the webhook's recorder writes a record, the
enforcement writes and removes a DeviceTaintRule and the device-plugin node annotation, the
breaker's store creates and updates its ConfigMap, a record Event is emitted. For each
service one call outside its roles is refused with 403. The apiserver's audit log shows
calls from both accounts, no 403 for them other than those two, and the RBAC model of the
deploy tests (tests/deploy/rbac.py) grants every call that the real authorizer let through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpuhealth.clock import ManualClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.errors import ApiError
from gpuhealth.kube.resources import CONFIG_MAP, NODE, Resource
from responder.enforce.node_annotation import DEVICE_PLUGIN, NODE_ANNOTATION
from responder.enforce.shipped import Enforcer
from responder.enforce.taint_rules import DRA, discover
from responder.reconcile.breaker import BreakerState
from responder.reconcile.breaker_store import AuditEntry, BreakerStore
from responder.reconcile.events import KubeEvents
from responder.reconcile.policy import QUARANTINE_TAINT, Enforce
from responder.records import QUARANTINES, Quarantine, from_object
from responder.webhook.recorder import Recorder
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import NAMESPACE, build
from tests.deploy.rbac import Call, grants, unauthorized, user
from tests.support.controlplane import (
    admin,
    apply,
    as_service_account,
    audit_events,
    publish_devices,
    ready_node,
    service_account_token,
)
from tests.support.flows import alert_labels, delivery
from tests.support.services import exporter_run, leaders, responder_runs, running

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

EXPORTER = user(NAMESPACE, "gpuhealth-exporter")
RESPONDER = user(NAMESPACE, "gpuhealth-responder")
NODE_NAME = "rbac-0"
DRIVER = "gpu.rbac.gpuhealth.test"
READY_TIMEOUT = 90.0
SECRET = Resource("", "v1", "secrets", namespaced=True)


@dataclass
class Exercised:
    ready: dict[str, bool] = field(default_factory=dict)
    leaders: list[str] = field(default_factory=list)
    refused: dict[str, int | None] = field(default_factory=dict)
    """Account -> the status of its call outside its roles."""


def _run_services(plane: ControlPlane, client: KubeClient, tmp: Path, result: Exercised) -> None:
    """The exporter (node and cluster mode) and two responder replicas as their accounts, until
    ready and one leads; then stopped, so they do not act on the records written next."""
    kubeconfig = {
        account: plane.kubeconfig_for_token(
            tmp / f"kubeconfig-{account.rsplit(':', 1)[1]}",
            service_account_token(client, NAMESPACE, account.rsplit(":", 1)[1]),
        )
        for account in (EXPORTER, RESPONDER)
    }
    objects = build("enforcing")
    runs = responder_runs(objects, tmp, token="webhook-token", kubeconfig=kubeconfig[RESPONDER])
    for mode, node in (("node", NODE_NAME), ("cluster", "")):
        (tmp / mode).mkdir()
        runs[f"exporter-{mode}"] = exporter_run(
            objects, tmp, directory=tmp / mode, node=node, nvml="none", kubeconfig=kubeconfig[EXPORTER]
        )
    with running(runs, tmp, timeout=READY_TIMEOUT) as ready:
        result.ready = ready
        result.leaders = leaders(runs, timeout=READY_TIMEOUT)


def _record(recorder: Recorder, account: KubeClient, node: str, device: str, *, dra: bool) -> Quarantine:
    labels = alert_labels(node, device, dra=dra, uuid=f"GPU-{node}-{device.rsplit('/', 1)[-1]}")
    outcomes = recorder.record_all([delivery("firing", node, labels, starts_at=time.time() - 60)])
    assert len(outcomes) == 1
    [obj] = [
        o
        for o in account.list(QUARANTINES).items
        if o["spec"]["node"] == node and o["spec"]["device"] == device
    ]
    return from_object(obj)


def _refused(call: Callable[[], object]) -> int | None:
    try:
        call()
    except ApiError as exc:
        return exc.status
    return 200


@pytest.fixture(scope="module")
def exercised(installed: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exercised]:
    result = Exercised()
    client = admin(installed)
    with ExitStack() as stack:
        stack.callback(client.close)
        # Exactly the enforcing overlay's RBAC (another test may have applied other overlays).
        done = apply(installed, build("enforcing"))
        assert done.returncode == 0, done.stderr
        ready_node(client, NODE_NAME)
        # Its device plugin also advertises GPUs (a node of both stacks), as a kubelet would.
        gpus = {"nvidia.com/gpu": "1"}
        client.patch(
            NODE, NODE_NAME, {"status": {"capacity": gpus, "allocatable": gpus}}, subresource="status"
        )
        publish_devices(client, NODE_NAME, DRIVER, 2)
        _run_services(installed, client, tmp_path_factory.mktemp("rbac"), result)

        exporter = as_service_account(installed, client, NAMESPACE, "gpuhealth-exporter")
        responder = as_service_account(installed, client, NAMESPACE, "gpuhealth-responder")
        stack.callback(exporter.close)
        stack.callback(responder.close)
        clock = ManualClock(time.time())
        recorder = Recorder(responder, clock)
        enforcer = Enforcer(responder, discover(responder))
        # The webhook records no path; the reconciler's first pass identifies each device through
        # the backends, with the responder's own reads (the slices, the node).
        recorded = [
            _record(recorder, responder, NODE_NAME, f"{DRIVER}/{NODE_NAME}/gpu-0", dra=True),
            _record(recorder, responder, NODE_NAME, "GPU-plugin-0", dra=False),
        ]
        assert [r.spec.path for r in recorded] == ["", ""]
        seen = enforcer.observe([NODE_NAME])
        dra, plugin = (enforcer.identify(r, seen) for r in recorded)
        assert (dra.spec.path, plugin.spec.path) == (DRA, DEVICE_PLUGIN)
        for record in (dra, plugin):
            enforcer.enforce(record, Enforce(QUARANTINE_TAINT, "xid-79", "NoSchedule"))
            assert enforcer.present(record)
        assert "GPU-plugin-0" in client.get(NODE, NODE_NAME)["metadata"]["annotations"][NODE_ANNOTATION]
        KubeEvents(responder).emit(
            dra, "Quarantined", "written by the RBAC test", warning=False, now=clock.now()
        )
        store = BreakerStore(responder, NAMESPACE)
        store.write(
            BreakerState(tripped=True, trigger="rate", tripped_at=1.0), AuditEntry("t", "trip", "r", "x")
        )
        store.write(BreakerState(), AuditEntry("t", "reset", "r", "x", "reevaluate"))
        assert client.get(CONFIG_MAP, "gpuhealth-breaker", namespace=NAMESPACE)
        for record in (dra, plugin):
            enforcer.unenforce(record)
            assert not enforcer.present(record)

        result.refused = {
            EXPORTER: _refused(lambda: exporter.list(SECRET, namespace=NAMESPACE)),
            RESPONDER: _refused(lambda: responder.delete(NODE, NODE_NAME)),
        }
        yield result


def test_each_service_runs_as_its_account_under_the_shipped_rbac(exercised: Exercised) -> None:
    assert exercised.ready == {
        "exporter-node": True,
        "exporter-cluster": True,
        "gpuhealth-responder-a": True,
        "gpuhealth-responder-b": True,
    }
    assert len(exercised.leaders) == 1


def test_a_call_outside_each_services_roles_is_refused_with_403(exercised: Exercised) -> None:
    assert exercised.refused == {EXPORTER: 403, RESPONDER: 403}


OUTSIDE = {EXPORTER: Call("list", "", "secrets", NAMESPACE), RESPONDER: Call("delete", "", "nodes", "")}


def test_the_audit_log_shows_no_403_for_our_accounts_and_the_model_grants_what_passed(
    installed: ControlPlane, exercised: Exercised
) -> None:
    objects = build("enforcing")
    for account in (EXPORTER, RESPONDER):
        events = [e for e in audit_events(installed) if e["user"]["username"] == account]
        refused, passed = [], set()
        for event in events:
            ref = event.get("objectRef")
            code = event["responseStatus"]["code"]
            call = None
            if ref is not None:
                resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
                call = Call(event["verb"], ref.get("apiGroup", ""), resource, ref.get("namespace", ""))
            # Refused by RBAC, not by an admission policy's validation (the pod-status policy's
            # test provokes refusals of the responder on purpose on the same control plane).
            decision = (event.get("annotations") or {}).get("authorization.k8s.io/decision")
            if code == 403 and decision != "allow":
                refused.append(call or event["requestURI"])
            elif ref is not None and code < 400:
                passed.add(call)
        assert refused == [OUTSIDE[account]], f"{account} was refused: {refused}"
        assert passed, f"no call recorded for {account}"
        assert unauthorized(passed, grants(objects, account)) == []
