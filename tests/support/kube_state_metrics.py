"""kube-state-metrics as the tests run it: the series gpuhealth reads, and its command line.

kube-state-metrics 2.20 (tools/upstream: built from `k8s.io/kube-state-metrics/v2`) is the
cluster's, not a gpuhealth service: the workload-layer rules (rules/prometheus/gpu-workload.yaml)
read its pod series for allocation success and container readiness. `SERIES` names exactly those,
with the labels kube-state-metrics 2.20 writes on each (its docs/metrics/workload/pod-metrics.md);
the tests run it with only pods and nodes watched and only these series allowed, which keeps it
light and makes a rule that reads anything else fail its declared-series check.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gpuhealth.testing.loopback import child_process, free_port, http_ok, require_binary, wait_until

JOB = "kube-state-metrics"
"""Its scrape job (rules/config.yaml `layers.kube_state_metrics_matchers`)."""

_POD = frozenset({"namespace", "pod", "uid"})
SERIES: Mapping[str, frozenset[str]] = {
    "kube_pod_status_phase": _POD | {"phase"},
    "kube_pod_status_ready": _POD | {"condition"},
    "kube_pod_status_scheduled": _POD | {"condition"},
    "kube_pod_status_unschedulable": _POD,
    "kube_pod_status_reason": _POD | {"reason"},
    "kube_pod_container_status_ready": _POD | {"container"},
    "kube_pod_container_status_waiting_reason": _POD | {"container", "reason"},
    "kube_pod_container_resource_requests": _POD | {"container", "node", "resource", "unit"},
    "kube_pod_resourceclaim_info": _POD | {"claim_name", "resourceclaim_name", "resourceclaim_template_name"},
}
"""Series name -> the labels kube-state-metrics writes on it (the scrape adds job and instance)."""


def command(binary: Path, kubeconfig: Path, port: int, telemetry_port: int) -> list[str]:
    """kube-state-metrics watching pods and nodes of the cluster `kubeconfig` names, serving `SERIES`
    on 127.0.0.1:`port`."""
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--resources=pods,nodes",
        f"--metric-allowlist={','.join(sorted(SERIES))}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--telemetry-host=127.0.0.1",
        f"--telemetry-port={telemetry_port}",
    ]


@contextmanager
def running(kubeconfig: Path, log: Path) -> Iterator[str]:
    """kube-state-metrics watching the cluster `kubeconfig` names, once it serves: its
    `host:port` (a scrape target of job `JOB`)."""
    port = free_port()
    argv = command(Path(require_binary("kube-state-metrics")), kubeconfig, port, free_port())
    with child_process(argv, log):
        wait_until(
            "kube-state-metrics to serve", lambda: http_ok(f"http://127.0.0.1:{port}/metrics"), timeout=30
        )
        yield f"127.0.0.1:{port}"
