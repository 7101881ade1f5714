"""The services as the manifests deploy them, on the simulated cluster; and RBAC held to the calls they make.

Aspects:
- The exporter DaemonSet's and the responder Deployment's container args, taken from the built
  enforcing overlay, run as `python -m gpuhealth ARGS` (the image's entry point) with only what
  a pod would get swapped in: `--kubeconfig` for the in-cluster service account, the downward-API
  variables, loopback ports, a local directory for each volume mount (every path argument must
  lie under one of the container's mounts), the simulator's NVML for the driver's, and a local
  Prometheus address. Both become ready (/readyz); of the two responder replicas exactly one
  leads; the webhook refuses a wrong token and accepts the one from the token file.
- RBAC: every service presents its service account's name as its token, and the simulated
  apiserver's audit log records (user, verb, group, resource, subresource, namespace) for each
  request. While those processes run, and while the responder's components (webhook recorder,
  reconciler, enforcement, probe and canary Jobs, migration, Events, the breaker's ConfigMap) walk
  a DRA device and a device-plugin device from alert to release, every call must be granted by
  the manifests' RBAC for that account, and every grant must have been needed by some call.
- The DeviceQuarantine records those flows wrote validate against the CRD's schema with unknown
  fields forbidden (the apiserver would prune a field the CRD does not declare).
"""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.transport import KubeTransport
from responder.reconcile.breaker import BreakerState
from responder.reconcile.breaker_store import AuditEntry, BreakerStore
from responder.records import QUARANTINES, Phase
from responder.webhook.recorder import Recorder
from simulator.apiserver.kubeconfig import write_kubeconfig
from simulator.testing import running_cluster
from tests.deploy.manifests import (
    CRD_FILE,
    NAMESPACE,
    build,
    crd_schema,
    schema_errors,
)
from tests.deploy.rbac import Call, grants, unauthorized, unused, user
from tests.support.flows import NS, SCENARIO, World, prepare
from tests.support.services import REPLICAS, exporter_run, leaders, responder_runs, running

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXPORTER = user(NAMESPACE, "gpuhealth-exporter")
RESPONDER = user(NAMESPACE, "gpuhealth-responder")
TOKEN = "webhook-token-for-the-test"
READY_TIMEOUT = 90.0

# The flows' fleet, with the device-plugin group's work a Deployment (its pods belong to a
# ReplicaSet, whose owner the migrator looks up) and the DRA group's a Job.
DEPLOY_SCENARIO: dict[str, Any] = copy.deepcopy(SCENARIO)
DEPLOY_SCENARIO["name"] = "deploy"
DEPLOY_SCENARIO["workloads"][1]["kind"] = "Deployment"


@dataclass
class Deployed:
    """What the processes started from the manifests showed."""

    ready: dict[str, bool] = field(default_factory=dict)
    leaders: list[str] = field(default_factory=list)
    webhook_answers: dict[str, int] = field(default_factory=dict)


def _kubeconfig(tmp: Path, url: str, account: str) -> Path:
    """What a pod's service account token stands for: here the token is the account's user name."""
    path = tmp / f"kubeconfig-{account.rsplit(':', 1)[-1]}"
    write_kubeconfig(path, url, token=account)
    return path


def _post(url: str, body: bytes, token: str) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with running_cluster(DEPLOY_SCENARIO, speed=20) as handle:
        prepare(handle.kubeconfig_path)
        yield handle


@pytest.fixture(scope="module")
def deployed(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    """Run the exporter and two responder replicas from the manifests until ready, then stop them
    (so they do not act on the flows' records)."""
    tmp = tmp_path_factory.mktemp("deployed")
    objects = build("enforcing")
    (tmp / "directory").mkdir()
    runs = responder_runs(objects, tmp, token=TOKEN, kubeconfig=_kubeconfig(tmp, cluster.url, RESPONDER))
    runs["exporter"] = exporter_run(
        objects,
        tmp,
        directory=tmp / "directory",
        node="dra-0",
        nvml=f"sim:{cluster.url}",
        kubeconfig=_kubeconfig(tmp, cluster.url, EXPORTER),
    )
    result = Deployed()
    with running(runs, tmp, timeout=READY_TIMEOUT) as ready:
        result.ready = ready
        result.leaders = leaders(runs, timeout=READY_TIMEOUT)
        replicas = list(REPLICAS)
        # A resolved alert for a device with no record: recorded as skipped, nothing written.
        alert = {
            "version": "4",
            "status": "resolved",
            "receiver": "gpuhealth-responder",
            "groupKey": "{}:{}",
            "alerts": [
                {
                    "status": "resolved",
                    "labels": {
                        "alertname": "GPUDeviceUnhealthy",
                        "node": "dra-0",
                        "device": "gpu-x",
                        "action": "quarantine",
                    },
                    "annotations": {},
                    "startsAt": "2026-01-01T00:00:00Z",
                    "endsAt": "2026-01-01T00:05:00Z",
                    "fingerprint": "0123456789abcdef",
                }
            ],
        }
        body = json.dumps(alert).encode()
        url = f"http://127.0.0.1:{runs[replicas[0]][1]}/webhook"
        result.webhook_answers = {
            "wrong token": _post(url, body, "not-the-token"),
            "token file": _post(url, body, TOKEN),
        }
    return result


def test_the_services_run_with_the_manifests_arguments(deployed: Deployed) -> None:
    assert deployed.ready == {"exporter": True, "gpuhealth-responder-a": True, "gpuhealth-responder-b": True}
    assert len(deployed.leaders) == 1
    assert deployed.webhook_answers == {"wrong token": 401, "token file": 200}


ONLY_ON_A_LOST_RACE = {(RESPONDER, "resource.k8s.io", "devicetaintrules", "get")}
"""Grants for a path these flows do not reach: a pass reads the rules with one list, and reads
one by name only when its write lost to another writer's (`responder.enforce.observed.reread`,
tested in tests/responder/test_reconciler_reads.py)."""


def test_rbac_grants_exactly_the_calls_the_services_make(cluster: Any, deployed: Deployed) -> None:
    tmp = cluster.kubeconfig_path.parent
    responder_kc = _kubeconfig(tmp, cluster.url, RESPONDER)
    webhook_client = KubeClient(KubeTransport(api_client(str(responder_kc))))
    try:
        for dra in (True, False):
            world = World(cluster.kubeconfig_path)
            world.kubeconfig = responder_kc  # the replicas act as the responder's account
            try:
                flow, _ = world.flow(dra=dra)
                flow.recorder = Recorder(webhook_client, world.clock)
                leader = world.replica()
                flow.fire()
                record = flow.drive(lambda _, leader=leader: leader)
                assert record.status.phase is Phase.RELEASED
            finally:
                world.close()
        # The breaker's ConfigMap as the leader writes it when the breaker trips, then when a
        # later pass records it closed again (create, then update).
        store = BreakerStore(webhook_client, NS)
        store.write(
            BreakerState(tripped=True, trigger="rate", tripped_at=1.0), AuditEntry("t", "trip", "r", "x")
        )
        store.write(BreakerState(), AuditEntry("t", "reset", "r", "x", "reevaluate"))
        records = webhook_client.list(QUARANTINES).items
    finally:
        webhook_client.close()

    with urllib.request.urlopen(f"{cluster.url}/simulator/v1/audit", timeout=10) as response:
        events = json.load(response)["events"]
    objects = build("enforcing")
    problems = []
    for account in (EXPORTER, RESPONDER):
        calls = {Call.from_audit(e) for e in events if e["user"] == account}
        assert calls, f"no call recorded for {account}"
        held = grants(objects, account)
        problems += [f"{account}: not granted: {c}" for c in unauthorized(calls, held)]
        problems += [
            f"{account}: granted but never needed: {g}"
            for g in unused(calls, held)
            if (account, g.group, g.resource, g.verb) not in ONLY_ON_A_LOST_RACE
        ]
    assert not problems, "\n".join(problems)

    # The records those flows wrote hold only fields the CRD declares.
    schema = crd_schema(yaml.safe_load(CRD_FILE.read_text()), "v1alpha1")
    assert len(records) == 2
    errors = [e for r in records for e in schema_errors(r, schema)]
    assert not errors, "\n".join(errors)
