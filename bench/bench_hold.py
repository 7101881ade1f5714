"""What a hold costs: healthy GPU-seconds held during a fill, and how long a fill takes.

A device-plugin card is held by occupancy (`docs/quarantine.md`, "The hold"): the responder
makes a holder for every free GPU of the node, the kubelet tells which device each got, and the
holders off the card are deleted. While that happens the node's healthy free GPUs are held too.
This runs the responder's own `DeviceHold` against the simulated cluster (its simulated kubelets
start pods and choose devices as a real device manager does), on 8-GPU nodes with 0, 4 and 6
GPUs in use and a free card quarantined, and measures per fill:

- the fill's duration, from the first pass to the card held (passes every 0.1 s of wall time,
  as the reconciler's recheck while a hold fills is a few seconds: this is the kubelet's part);
- the healthy GPU-seconds held: for every holder that got another card, from its creation to its
  deletion;
- the holders made.

All in simulated seconds (the cluster runs `SPEED` times faster than the wall clock). Baseline,
measured in the same run on the same cluster: one pod with `spec.nodeName` and one GPU, from its
creation until the kubelet reports it Running. A fill cannot be shorter than one such start: the
ratio says what the fill's other steps (listing, a second pass to delete) cost on top. Target: a
fill within 3 pod starts, and no more healthy GPU-seconds held than (free GPUs - 1) x 3 pod starts.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from gpuhealth.clock import SystemClock
from gpuhealth.kube.client import KubeClient
from gpuhealth.kube.config import api_client
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import NAMESPACE, POD, Resource
from gpuhealth.kube.transport import KubeTransport
from gpuhealth.testing.loopback import wait_until
from responder.enforce.hold import DeviceHold, device_ids
from responder.enforce.hold_plan import HOLDER_LABEL, HoldState
from responder.records import QUARANTINES, Quarantine, QuarantineSpec, from_object, to_object
from simulator.fleet.objects import gpu_uuid
from simulator.testing import running_cluster

NS = "gpuhealth-system"
CRD_FILE = Path(__file__).resolve().parents[1] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
SPEED = 10.0
GPUS = 8
BUSY = (0, 4, 6)
REPEATS = 3


def _scenario(busy: int) -> dict[str, Any]:
    workloads = (
        [{"name": "serve", "namespace": "inference", "replicas": busy, "gpusPerPod": 1}] if busy else []
    )
    return {
        "name": "hold-bench",
        "fleet": [{"name": "dp", "count": 1, "gpusPerNode": GPUS, "path": "device-plugin"}],
        "workloads": workloads,
    }


def _record(client: KubeClient, node: str, index: int) -> Quarantine:
    """A stored record of the card (the holders are owned by it: the garbage collector deletes
    pods whose owner does not exist)."""
    uuid = gpu_uuid(node, index)
    spec = QuarantineSpec(
        node=node, device=uuid, path="device-plugin", reason="bench", actor="person/bench",
        expires_at="2099-01-01T00:00:00Z", uuid=uuid,
    )  # fmt: skip
    obj = to_object(Quarantine(name=f"bench-{index}", spec=spec))
    obj.pop("status", None)
    return from_object(client.create(QUARANTINES, obj))


def _pod_start(client: KubeClient, node: str) -> float:
    """Simulated seconds from creating a one-GPU pod on `node` to the kubelet reporting it Running."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "baseline", "namespace": NS},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
            ],
        },
    }  # fmt: skip
    started = time.monotonic()
    client.create(POD, pod, namespace=NS)
    while (client.get(POD, "baseline", namespace=NS).get("status") or {}).get("phase") != "Running":
        time.sleep(0.01)
    took = (time.monotonic() - started) * SPEED
    client.delete(POD, "baseline", namespace=NS)
    return took


def _fill(client: KubeClient, hold: DeviceHold, record: Quarantine) -> tuple[float, float, int]:
    """(fill seconds, healthy GPU-seconds held, holders made), all simulated."""
    card = record.spec.uuid
    clock = SystemClock()
    started = time.monotonic()
    made: dict[str, float] = {}  # holder name -> created (monotonic)
    held_healthy = 0.0
    previous: tuple[str, float] | None = None
    while True:
        before = {
            p["metadata"]["name"]: p
            for p in client.list(POD, namespace=NS, label_selector=HOLDER_LABEL).items
        }
        at = time.monotonic()
        decided = hold.sync(record, True, clock.now(), previous)
        assert decided is not None
        for name in decided.delete:
            pod = before.get(name)
            if pod is not None and card not in device_ids(pod):
                held_healthy += at - made[name]
        # The holders this pass made: held from now (their creation) until they are deleted.
        for pod in client.list(POD, namespace=NS, label_selector=HOLDER_LABEL).items:
            made.setdefault(pod["metadata"]["name"], at)
        if decided.state is HoldState.HELD:
            break
        previous = (str(decided.state), clock.now())
        if time.monotonic() - started > 60:
            raise RuntimeError(f"no hold within 60 s: {decided.state} {decided.message}")
        time.sleep(0.1)
    fill = (time.monotonic() - started) * SPEED
    count = len(made)
    hold.sync(record, False, clock.now(), None)  # let it go for the next repeat
    while client.list(POD, namespace=NS, label_selector=HOLDER_LABEL).items:
        time.sleep(0.05)
    return fill, held_healthy * SPEED, count


def _run(busy: int) -> None:
    with running_cluster(_scenario(busy), speed=SPEED) as cluster:
        client = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        try:
            client.create(NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
            client.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
            wait_until("the CRD served", lambda: client.list(QUARANTINES) is not None, timeout=20)
            node = "dp-0"
            hold = DeviceHold(client, NS)
            baseline = statistics.median(_pod_start(client, node) for _ in range(REPEATS))
            fills, healthy, made = [], [], []
            # The last GPU: first fit put the scenario's pods on the first ones.
            record = _record(client, node, GPUS - 1)
            for _ in range(REPEATS):
                fill, held, count = _fill(client, hold, record)
                fills.append(fill)
                healthy.append(held)
                made.append(count)
        finally:
            with_cleanup(client)
            client.close()
    free = GPUS - busy
    fill, held = statistics.median(fills), statistics.median(healthy)
    fill_ok = fill <= 3 * baseline
    held_ok = held <= (free - 1) * 3 * baseline + 1e-9
    bound = (free - 1) * 3 * baseline
    print(
        f"hold, {busy} of {GPUS} GPUs in use ({free} free): fill {fill:.2f} s (median of {REPEATS}) vs "
        f"one pod start {baseline:.2f} s: {fill / baseline:.1f}x (target <= 3x: {_met(fill_ok)}); "
        f"healthy GPU-seconds held {held:.2f} ({held / max(1, free - 1):.2f} per other free GPU; "
        f"target <= {bound:.2f}: {_met(held_ok)}); holders made {statistics.median(made):g}"
    )


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def with_cleanup(client: KubeClient) -> None:
    for pod in client.list(POD, namespace=NS).items:
        with contextlib.suppress(NotFound):
            client.delete(POD, pod["metadata"]["name"], namespace=NS)


def main() -> None:
    print(
        f"bench hold: 1 node of {GPUS} device-plugin GPUs, simulated at {SPEED:g}x; a free card quarantined"
    )
    for busy in BUSY:
        _run(busy)


if __name__ == "__main__":
    main()
