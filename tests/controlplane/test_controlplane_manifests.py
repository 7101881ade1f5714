"""Our CRD and every overlay under deploy/, judged by a real apiserver (1.37; the CRD on 1.36 too).

Aspects: the DeviceQuarantine CRD is accepted and established; a record as the responder
writes it (`responder.records.to_object`) applies with strict field validation (an unknown
field would be an error, not silently pruned) and its status subresource takes the status the
reconciler writes (as the responder's ServiceAccount: the admission policy refuses anyone else);
every overlay applies with `kubectl apply --server-side --validate=strict`
(the Prometheus Operator kinds against CRDs made from the deploy tests' schemas) with no
warning but the PodSecurity ones the namespace is labelled for (one per exporter DaemonSet:
the exporter is not `restricted`), and applying it again changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml

from gpuhealth.kube.resources import Resource
from responder.records import QUARANTINES, Phase, Quarantine, QuarantineStatus, to_object
from simulator.controlplane import ControlPlane
from tests.deploy.manifests import NAMESPACE, OVERLAYS, build
from tests.support.controlplane import admin, apply, as_service_account, dra_quarantine, kubectl

pytestmark = [pytest.mark.integration, pytest.mark.controlplane, pytest.mark.slow]

CRD = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)


def _record() -> Quarantine:
    quarantine = dra_quarantine("node-a", "gpu.nvidia.com", "gpu-3")
    enforced = f"DeviceTaintRule/{quarantine.name}"
    return replace(quarantine, status=QuarantineStatus(phase=Phase.QUARANTINED, enforced=enforced))


@pytest.mark.parametrize("fixture", ["installed", "installed_136"])
def test_the_crd_is_established_and_takes_the_records_the_responder_writes(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    plane: ControlPlane = request.getfixturevalue(fixture)
    client = admin(plane)
    try:
        crd = client.get(CRD, "devicequarantines.gpuhealth.io")
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True" and conditions["NamesAccepted"] == "True"
        record = to_object(_record())
        status = record.pop("status")
        done = apply(plane, [record])
        assert done.returncode == 0, done.stderr
        assert "unknown field" not in done.stderr
        stored = client.get(QUARANTINES, record["metadata"]["name"])
        assert stored["spec"] == record["spec"]  # nothing pruned
        responder = as_service_account(plane, client, NAMESPACE, "gpuhealth-responder")
        try:
            updated = responder.update(QUARANTINES, {**stored, "status": status}, subresource="status")
        finally:
            responder.close()
        assert updated["status"] == status
    finally:
        client.close()


def _versions(plane: ControlPlane, objects: list[dict[str, Any]]) -> dict[str, str]:
    """`kind/namespace/name` -> the object's generation as stored (its spec's version; status
    writes of the controllers do not count), or its resourceVersion for kinds without one."""
    done = kubectl(plane, "get", "-f", "-", "-o", "json", stdin=yaml.safe_dump_all(objects))
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout).get("items") or []
    out = {}
    for obj in items:
        meta = obj["metadata"]
        key = f"{obj['kind']}/{meta.get('namespace', '')}/{meta['name']}"
        out[key] = str(meta.get("generation") or meta["resourceVersion"])
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_applies_server_side_with_strict_validation(
    installed: ControlPlane, overlay: str
) -> None:
    objects = build(overlay)
    done = apply(installed, objects)
    assert done.returncode == 0, done.stderr
    # The warnings by design, one per exporter DaemonSet (device-plugin nodes and the others):
    # the namespace enforces `privileged` (the exporter needs its host paths and root) and warns
    # at `restricted`, which the exporter's pods are not. No other object warns.
    warnings = [line for line in done.stderr.splitlines() if line.startswith("Warning:")]
    daemonsets = {o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"}
    assert daemonsets == {"gpuhealth-exporter", "gpuhealth-exporter-device-plugin"}
    assert len(warnings) == len(daemonsets), done.stderr
    for warning in warnings:
        assert warning.startswith('Warning: would violate PodSecurity "restricted:latest"'), warning
        assert 'container "exporter"' in warning, warning
    stored = _versions(installed, objects)
    assert len(stored) == len(objects)  # every object is there
    again = apply(installed, objects)
    assert again.returncode == 0, again.stderr
    assert _versions(installed, objects) == stored  # applying again changes nothing
