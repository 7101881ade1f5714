"""Scale of the simulated apiserver: a 10,000-node x 8-GPU fleet in memory, listed by the official client.

The fleet is built directly through `Store.create(..., validate=False)` in a child process that
then serves it on loopback, so the child's resident memory (VmRSS / VmHWM from
/proc/PID/status) is the simulated cluster alone. The parent lists all pods through the official
client, raw (`_preload_content=False`) and as models, and lists one node's pods by fieldSelector
(what a kubelet-like reader does). Baseline for the storage layout: the same pods held as Python
dicts, measured with tracemalloc on a sample.

Objects are shaped like real ones: nodes with labels, capacity, conditions and nodeInfo; node
Leases; ResourceSlices with 8 devices and their attributes; pods with one GPU each (the worst
case for the pod count: 8 pods per node, 80,000 pods) carrying owner references, conditions and
`allocatedResourcesStatus`. Real nodes also carry image lists (often several KB), left out here.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import time
import tracemalloc
from typing import Any

NODES = 10_000
GPUS_PER_NODE = 8
PODS_PER_NODE = 8  # one GPU each


def _uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-{gpu:04x}-4000-8000-{node * 8 + gpu:012x}"


def _node(i: int) -> dict[str, Any]:
    name = f"gpu-node-{i:05d}"
    conditions = [
        {
            "type": t,
            "status": "True" if t == "Ready" else "False",
            "lastHeartbeatTime": "2026-11-29T18:00:00Z",
            "lastTransitionTime": "2026-11-29T12:00:00Z",
            "reason": f"Kubelet{t}",
            "message": f"kubelet reports {t}",
        }
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")
    ]
    resources = {"cpu": "96", "memory": "1056763076Ki", "nvidia.com/gpu": "8", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "p5.48xlarge",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.count": "8",
            },
        },
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24", "providerID": f"sim://{name}"},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": f"10.0.{i // 256}.{i % 256}"}],
            "nodeInfo": {
                "machineID": f"{i:032x}",
                "systemUUID": f"{i:032x}",
                "bootID": f"{i:032x}",
                "kernelVersion": "6.8.0-1015",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://2.0.0",
                "kubeletVersion": "v1.36.0",
                "kubeProxyVersion": "v1.36.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def _lease(i: int) -> dict[str, Any]:
    name = f"gpu-node-{i:05d}"
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": "kube-node-lease",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": f"{i:032x}"}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": 40,
            "renewTime": "2026-11-29T18:00:00.000000Z",
        },
    }


def _slice(i: int) -> dict[str, Any]:
    name = f"gpu-node-{i:05d}"
    devices = [
        {
            "name": f"gpu-{g}",
            "attributes": {
                "uuid": {"string": _uuid(i, g)},
                "index": {"int": g},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "architecture": {"string": "Hopper"},
                "driverVersion": {"version": "570.124.6"},
                "type": {"string": "gpu"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for g in range(GPUS_PER_NODE)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{name}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": name,
            "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def _pod(i: int, p: int) -> dict[str, Any]:
    node = f"gpu-node-{i:05d}"
    name = f"infer-{i:05d}-{p}"
    ready = [
        {"type": t, "status": "True", "lastTransitionTime": "2026-11-29T12:00:00Z"}
        for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": f"tenant-{i % 50:02d}",
            "labels": {"app": f"model-{i % 200}", "pod-template-hash": "7d9f8b6c5d"},
            "annotations": {"gpuhealth.io/checkpoint": "annotation", "gpuhealth.io/topology": "fixed"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"model-{i % 200}-7d9f8b6c5d",
                    "uid": f"{i % 200:032x}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "nodeName": node,
            "schedulerName": "default-scheduler",
            "restartPolicy": "Always",
            "serviceAccountName": "default",
            "containers": [
                {
                    "name": "server",
                    "image": "registry.example/inference-server:2.4.1",
                    "ports": [{"containerPort": 8000, "protocol": "TCP"}],
                    "env": [{"name": "MODEL", "value": f"model-{i % 200}"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "status": {
            "phase": "Running",
            "conditions": ready,
            "hostIP": f"10.0.{i // 256}.{i % 256}",
            "podIP": f"10.{i // 256 % 256}.{i % 256}.{p + 10}",
            "startTime": "2026-11-29T12:00:00Z",
            "qosClass": "BestEffort",
            "containerStatuses": [
                {
                    "name": "server",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "registry.example/inference-server:2.4.1",
                    "imageID": "registry.example/inference-server@sha256:" + "ab" * 32,
                    "containerID": f"containerd://{i:032x}{p:032x}",
                    "state": {"running": {"startedAt": "2026-11-29T12:00:05Z"}},
                    "allocatedResourcesStatus": [
                        {
                            "name": "nvidia.com/gpu",
                            "resources": [{"resourceID": _uuid(i, p), "health": "Healthy"}],
                        }
                    ],
                }
            ],
        },
    }


def _proc_status(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM in bytes."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _serve_fleet(conn: multiprocessing.connection.Connection) -> None:
    """Child: build the fleet, serve it, report (port, build seconds, object counts), serve until killed."""
    from aiohttp import web

    from gpuhealth.clock import SystemClock
    from simulator.apiserver.app import create_app
    from simulator.apiserver.store import Store

    async def run() -> None:
        store = Store(SystemClock(), seed=1)
        rss_empty = _proc_status()["VmRSS"]
        started = time.perf_counter()
        for n in range(50):
            store.create("namespaces", {"metadata": {"name": f"tenant-{n:02d}"}}, validate=False)
        for i in range(NODES):
            store.create("nodes", _node(i), validate=False)
            store.create("leases.coordination.k8s.io", _lease(i), validate=False)
            store.create("resourceslices.resource.k8s.io", _slice(i), validate=False)
            for p in range(PODS_PER_NODE):
                store.create("pods", _pod(i, p), validate=False)
        build_s = time.perf_counter() - started
        rss_built = _proc_status()["VmRSS"]

        def renew(obj: dict[str, Any]) -> None:
            obj["spec"]["renewTime"] = "2026-11-29T18:00:10.000000Z"

        def unknown(obj: dict[str, Any]) -> None:
            resources = obj["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["resources"]
            resources[0]["health"] = "Unknown"

        # One update round (every lease renewed, every pod's device turned Unknown): the watch log
        # now retains the old version of each, as it would in a running fleet.
        started = time.perf_counter()
        for i in range(NODES):
            store.mutate("leases.coordination.k8s.io", f"gpu-node-{i:05d}", "kube-node-lease", renew)
            for p in range(PODS_PER_NODE):
                store.mutate(
                    "pods", f"infer-{i:05d}-{p}", f"tenant-{i % 50:02d}", unknown, subresource="status"
                )
        update_s = time.perf_counter() - started
        runner = web.AppRunner(create_app(store))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send((runner.addresses[0][1], build_s, update_s, rss_empty, rss_built, store.resource_version))
        await asyncio.Event().wait()

    asyncio.run(run())


def _dict_vs_bytes_per_pod(sample: int = 2000) -> tuple[float, float]:
    """Bytes per pod held as Python dicts (the naive layout) and as JSON bytes (ours)."""
    import orjson

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    dicts = [_pod(i, 0) for i in range(sample)]
    as_dicts = (tracemalloc.get_traced_memory()[0] - base) / sample
    base = tracemalloc.get_traced_memory()[0]
    blobs = [bytes(memoryview(orjson.dumps(d))) for d in dicts]  # exact size, as the store keeps them
    as_bytes = (tracemalloc.get_traced_memory()[0] - base) / sample
    tracemalloc.stop()
    del dicts, blobs
    return as_dicts, as_bytes


def main() -> None:
    from kubernetes import client

    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_fleet, args=(child,), daemon=True)
    proc.start()
    try:
        if not parent.poll(600):
            raise RuntimeError("the fleet did not come up within 10 minutes")
        port, build_s, update_s, rss_empty, rss_built, rv = parent.recv()
        built = _proc_status(proc.pid or 0)
        cfg = client.Configuration()
        cfg.host = f"http://127.0.0.1:{port}"
        with client.ApiClient(cfg) as api:
            core = client.CoreV1Api(api)
            started = time.perf_counter()
            resp: Any = core.list_pod_for_all_namespaces(_preload_content=False)  # urllib3 response
            raw = resp.data
            raw_s = time.perf_counter() - started
            started = time.perf_counter()
            models = core.list_pod_for_all_namespaces()
            model_s = time.perf_counter() - started
            count = len(models.items)
            del models
            started = time.perf_counter()
            one_node = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-node-04242")
            field_s = time.perf_counter() - started
            assert len(one_node.items) == PODS_PER_NODE
        served = _proc_status(proc.pid or 0)
        as_dicts, as_bytes = _dict_vs_bytes_per_pod()
    finally:
        proc.kill()
        proc.join()

    mib = 1024 * 1024
    rows = [
        (
            "fleet",
            f"{NODES} nodes x {GPUS_PER_NODE} GPUs, {count} pods, {NODES} leases, {NODES} ResourceSlices",
        ),
        ("writes (cluster resourceVersion)", f"{rv}"),
        ("build through Store.create(validate=False)", f"{build_s:.1f} s"),
        ("simulated cluster RSS, empty store", f"{rss_empty / mib:.0f} MiB"),
        ("simulated cluster RSS, fleet built", f"{rss_built / mib:.0f} MiB"),
        ("one update round through Store.mutate (90,000 writes)", f"{update_s:.1f} s"),
        ("RSS after it (watch log keeps the old versions)", f"{built['VmRSS'] / mib:.0f} MiB"),
        ("simulated cluster peak RSS while serving the lists", f"{served['VmHWM'] / mib:.0f} MiB"),
        ("list all pods, official client, raw", f"{raw_s:.2f} s ({len(raw) / mib:.0f} MiB of JSON)"),
        ("list all pods, official client, models", f"{model_s:.2f} s"),
        ("list one node's pods by fieldSelector", f"{field_s * 1000:.0f} ms"),
        ("pod held as Python dict (naive layout)", f"{as_dicts:.0f} B"),
        ("pod held as JSON bytes (our layout)", f"{as_bytes:.0f} B ({as_dicts / as_bytes:.1f}x smaller)"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    limit = 2 * 1024 * mib
    verdict = "within" if served["VmHWM"] <= limit else "OVER"
    print(f"peak {served['VmHWM'] / mib:.0f} MiB is {verdict} the 2 GiB budget")


if __name__ == "__main__":
    main()
