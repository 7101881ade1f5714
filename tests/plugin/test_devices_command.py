"""`kubectl gpuhealth devices` in-process, over a stand-in client (`kubectl_gpuhealth.devices`).

Aspects: with `--node`, only the exporter pod on that node is asked (all of them when none runs
there, since a cluster-mode exporter may know the node); an exporter that answers something
other than a device view or fails is a warning naming its pod and the command exits 1 with what
the others gave; none answering is a failure; a cluster without the DeviceQuarantine CRD is a
warning and the table goes without a QUARANTINE column, and the document without `quarantine`.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from exporter.devices_view import devices_document
from exporter.snapshot import Allocation, DeviceState, Snapshot
from gpuhealth.cliargs import CommandFailed
from gpuhealth.clock import ManualClock
from gpuhealth.kube.errors import NotFound, Unavailable
from gpuhealth.kube.resources import Resource
from kubectl_gpuhealth.cli import build_parser
from kubectl_gpuhealth.devices import run_devices

T0 = 1_800_000_000.0


def view(node: str | None, *devices: DeviceState) -> dict[str, Any]:
    return devices_document(Snapshot(devices={(d.node, d.device): d for d in devices}, node_name=node), T0)


def gpu(node: str, key: str, health: str = "Healthy") -> DeviceState:
    return DeviceState(node, key, health, "", 1, T0, T0, T0, allocations=(Allocation("ns", "p", "c", "r"),))


def exporter_pod(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "gpuhealth-system"}, "spec": {"nodeName": node}}


@dataclass
class FakeClient:
    """The calls `devices` makes: list pods and records, GET through the pod proxy."""

    answers: dict[str, Any]
    """By exporter pod name: a document, or an exception to raise."""
    records: list[dict[str, Any]] | None = field(default_factory=list)
    asked: list[str] = field(default_factory=list)

    def list(self, resource: Resource, **_: Any) -> Any:
        if resource.plural == "pods":
            items = [exporter_pod(name, f"n{name[-1]}") for name in self.answers]
        elif self.records is None:
            raise NotFound("the server could not find the requested resource")
        else:
            items = self.records
        return type("Listed", (), {"items": items})()

    def proxy_get(self, resource: Resource, name: str, path: str, **_: Any) -> Any:
        self.asked.append(name)
        answer = self.answers[name]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def close(self) -> None:
        pass


def run(client: FakeClient, *flags: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["devices", "-A", *flags])
    out, err = io.StringIO(), io.StringIO()
    code = run_devices(args, client=client, clock=ManualClock(start=T0), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_with_node_only_that_nodes_exporter_is_asked_else_every_one() -> None:
    client = FakeClient({"exp-1": view("n1", gpu("n1", "GPU-a")), "exp-2": view("n2", gpu("n2", "GPU-b"))})
    code, out, _ = run(client, "--node", "n2", "-o", "json")
    assert code == 0 and client.asked == ["exp-2"]
    assert [d["device"] for d in orjson.loads(out)["devices"]] == ["GPU-b"]
    client.asked.clear()
    code, out, _ = run(client, "--node", "n9", "-o", "json")
    assert code == 0 and sorted(client.asked) == ["exp-1", "exp-2"] and orjson.loads(out)["devices"] == []


def test_a_failing_exporter_is_named_and_the_others_still_print() -> None:
    client = FakeClient(
        {
            "exp-1": view("n1", gpu("n1", "GPU-a", "Unhealthy")),
            "exp-2": {"kind": "Status", "status": "Failure"},
            "exp-3": Unavailable("error trying to reach service", status=503),
        }
    )
    code, out, err = run(client)
    assert code == 1
    assert "GPU-a" in out and "Unhealthy" in out
    assert "warning: exporter pod gpuhealth-system/exp-2: not a device view (expected a DeviceList" in err
    assert "warning: exporter pod gpuhealth-system/exp-3: " in err and "error trying to reach service" in err


def test_no_exporter_answering_is_a_failure() -> None:
    with pytest.raises(CommandFailed, match=r"no exporter answered \(1 asked"):
        run(FakeClient({"exp-1": Unavailable("connection refused")}))


def test_without_the_crd_the_quarantine_state_is_left_out_with_a_warning() -> None:
    client = FakeClient({"exp-1": view("n1", gpu("n1", "GPU-a"))}, records=None)
    code, out, err = run(client)
    assert code == 0
    assert out.splitlines()[0].split() == ["NODE", "DEVICE", "HEALTH", "AGE", "PODS", "MESSAGE"]
    assert "DeviceQuarantine is not served by this cluster" in err
    code, out, _ = run(client, "-o", "yaml")
    assert "quarantine" not in out
