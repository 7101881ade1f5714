"""During a real run of the whole pipeline, every panel of every dashboard shows data.

The strongest dashboard test: a panel whose query returns nothing is a defect. Everything is
real except the cluster (simulated): node-mode exporters (NVML from the simulator) per node,
the responder as a child process (`gpuhealth responder`, leading, reconciling), Prometheus
with the shipped rules (time thresholds shrunk to seconds), Alertmanager with the shipped
routing delivering to the responder's webhook, and Prometheus scraping all three jobs
(`gpuhealth-exporter` with the `node` label, `gpuhealth-responder`, `alertmanager`, the
simulated workloads' own counters as `workloads`, and kube-state-metrics watching the simulated
cluster's pods and nodes, whose readiness the Workload dashboard's layers read).

The scenario gives each panel something true to show, never a faked series:
- a fatal XID on a device-plugin GPU that holds a pod: GPUDeviceFatalXid and GPUDeviceUnhealthy
  reach the responder through the real webhook; it records and enforces a quarantine and
  takes on the pod's migration;
- a DRA GPU goes silent: effectively Unknown, with an Unknown duration, then a restriction;
- the API server ends the exporters' watches (as a restart of it would): watch restarts;
- the XID's device recovers and walks the release ladder (its waits shrunk to seconds) to
  Released: a release outcome, and an ended quarantine with its verdict (confirmed) for the
  false-quarantine and verdict panels; the counters are born at 0 for every outcome and verdict;
- a person deletes the DRA restriction's DeviceTaintRule by hand: the responder puts it back;
- the responder's leader counts the device-seconds both enforcements kept out of service, which
  the GPU-hours panels read through the recording rules.
- the simulator's workloads export their own request and error counters (Prometheus scrapes
  them as job `workloads`, the default of rules/config.yaml's `workloads`): the pod on the XID's
  device fails its requests until it moves, which the business SLO panels read through the
  recording rules, joined to devices through the pods that hold them.

Then `dashboards.check.panels_without_data` runs every panel query as Grafana would, over
the run's time range, with `node` and `device` set to the quarantined GPU.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.check import panels_without_data
from gpuhealth.testing.loopback import (
    LoopbackError,
    Prometheus,
    ScrapeJob,
    child_process,
    free_port,
    http_ok,
    log_tail,
    run_alertmanager,
    run_prometheus,
    wait_until,
)
from simulator.runner import WORKLOAD_METRICS_PATH
from simulator.traffic import JOB as WORKLOADS_JOB
from tests.dashboards.support import committed
from tests.e2e.test_pipeline_e2e import render_rules  # the shipped rules, thresholds shrunk to seconds
from tests.support import kube_state_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SPEED = 10.0
TOKEN = "dashboards-e2e-token"
CRD_FILE = Path(__file__).parents[2] / "deploy" / "crds" / "devicequarantines.gpuhealth.io.yaml"
FAILING_PODS = 'namespace_pod:workload_error_ratio:rate5m{namespace="inference"}'
SCENARIO: dict[str, Any] = {
    "name": "dashboards-e2e",
    "description": "1 device-plugin node (3 GPUs) and 1 DRA node (2), one workload on each path",
    "fleet": [
        # A third device-plugin GPU: the moved pod's replacement takes it, not the recovered one.
        {"name": "gpu-dp", "count": 1, "gpusPerNode": 3, "path": "device-plugin"},
        {"name": "gpu-dra", "count": 1, "gpusPerNode": 2, "path": "dra"},
    ],
    "workloads": [
        {"name": "serve", "namespace": "inference", "kind": "Deployment", "replicas": 2,
         "gpusPerPod": 1, "path": "device-plugin", "checkpoint": "annotation", "topology": "shardable"},
        {"name": "train", "namespace": "research", "kind": "Job", "replicas": 1,
         "gpusPerPod": 2, "path": "dra"},
    ],
    "timeline": [],
}  # fmt: skip


@contextmanager
def service(argv: list[str], log: Path, ready_url: str, level: str = "WARNING") -> Iterator[None]:
    """A gpuhealth child process, once `ready_url` answers; its log on failure."""
    with child_process([sys.executable, "-m", "gpuhealth", "--log-level", level, *argv], log) as proc:
        try:
            wait_until(
                f"{argv[0]} at {ready_url}", lambda: proc.poll() is None and http_ok(ready_url), timeout=60
            )
        except LoopbackError as exc:
            raise LoopbackError(f"{exc}\n--- {log.name} ---\n{log_tail(log)}") from exc
        yield


def responder_config(tmp_path: Path) -> Path:
    """The shipped policy with its waits shrunk to seconds, so a recovered device is released
    within the run (the release ladder walked in full: probe, canary, stability, ramp)."""
    path = tmp_path / "responder-config.yaml"
    policy = {"stability": "5s", "ramp": "5s", "probe_timeout": "1m", "canary_timeout": "1m"}
    path.write_text(yaml.safe_dump({"policy": policy}))
    return path


def series(prometheus: Prometheus, expr: str) -> list[dict[str, Any]] | None:
    return prometheus.query(expr) or None


def what_the_cluster_says(kube: Any, log: Path) -> str:
    """For a wait that timed out: the GPU nodes, their pods and the quarantines as the API
    server holds them, and the responder's log."""
    from gpuhealth.kube.resources import NODE, POD
    from responder.enforce.hold import device_ids
    from responder.records import QUARANTINES

    lines = []
    for node in kube.list(NODE).items:
        meta, status = node.get("metadata") or {}, node.get("status") or {}
        lines.append(
            f"node {meta.get('name')}: allocatable {status.get('allocatable')}, "
            f"annotations {meta.get('annotations')}"
        )
    for pod in kube.list(POD).items:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        lines.append(
            f"pod {meta.get('namespace')}/{meta.get('name')} on {(pod.get('spec') or {}).get('nodeName')}: "
            f"{status.get('phase')}, devices {device_ids(pod)}, deleting {'deletionTimestamp' in meta}"
        )
    for record in kube.list(QUARANTINES).items:
        lines.append(f"quarantine {record['metadata']['name']}: {record.get('status')}")
    return "\n".join([*lines, f"--- {log.name} ---", log_tail(log)])


@pytest.mark.timeout(360)
def test_every_panel_query_returns_data(tmp_path: Path) -> None:
    from gpuhealth.kube.client import KubeClient
    from gpuhealth.kube.config import api_client
    from gpuhealth.kube.resources import NAMESPACE, Resource
    from gpuhealth.kube.transport import KubeTransport
    from simulator.testing import running_cluster

    started = time.time()
    responder_port = free_port()
    rule_files, alertmanager_config = render_rules(
        tmp_path, TOKEN, f"http://127.0.0.1:{responder_port}/webhook"
    )
    with ExitStack() as stack:
        cluster = stack.enter_context(running_cluster(SCENARIO, speed=SPEED))
        kube = KubeClient(KubeTransport(api_client(str(cluster.kubeconfig_path))))
        stack.callback(kube.close)
        crds = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", namespaced=False)
        kube.create(crds, yaml.safe_load(CRD_FILE.read_text()))
        kube.create(
            NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuhealth-system"}}
        )
        alertmanager = stack.enter_context(run_alertmanager(tmp_path / "alertmanager", alertmanager_config))
        ksm = stack.enter_context(
            kube_state_metrics.running(cluster.kubeconfig_path, tmp_path / "kube-state-metrics.log")
        )
        exporter_ports = {"gpu-dp-0": free_port(), "gpu-dra-0": free_port()}
        jobs = [
            *(
                ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{p}"], {"node": n})
                for n, p in exporter_ports.items()
            ),
            ScrapeJob("gpuhealth-responder", [f"127.0.0.1:{responder_port}"]),
            ScrapeJob("alertmanager", [alertmanager.base_url.removeprefix("http://")]),
            ScrapeJob(kube_state_metrics.JOB, [ksm]),
            ScrapeJob(
                WORKLOADS_JOB, [cluster.url.removeprefix("http://")], metrics_path=WORKLOAD_METRICS_PATH
            ),
        ]
        prometheus = stack.enter_context(
            run_prometheus(
                tmp_path / "prometheus", jobs, rule_files=rule_files, alertmanager_url=alertmanager.base_url
            )
        )
        for node, port in exporter_ports.items():
            argv = [
                "exporter", "--kubeconfig", str(cluster.kubeconfig_path), "--node", node,
                "--nvml", f"sim:{cluster.url}", "--listen", f"127.0.0.1:{port}",
                "--directory", str(tmp_path / f"directory-{node}.sqlite"),
            ]  # fmt: skip
            stack.enter_context(
                service(argv, tmp_path / f"exporter-{node}.log", f"http://127.0.0.1:{port}/readyz")
            )
        token_file = tmp_path / "responder-token"
        argv = [
            "responder", "--kubeconfig", str(cluster.kubeconfig_path),
            "--listen", f"127.0.0.1:{responder_port}", "--token-file", str(token_file),
            "--prometheus-url", prometheus.base_url, "--identity", "replica-a",
            "--config", str(responder_config(tmp_path)),
        ]  # fmt: skip
        stack.enter_context(
            service(argv, tmp_path / "responder.log", f"http://127.0.0.1:{responder_port}/readyz", "INFO")
        )
        try:
            run_the_story(cluster, kube, prometheus, len(jobs), started)
        except LoopbackError as exc:
            raise LoopbackError(f"{exc}\n{what_the_cluster_says(kube, tmp_path / 'responder.log')}") from exc


def run_the_story(cluster: Any, kube: Any, prometheus: Prometheus, targets: int, started: float) -> None:
    """The scenario's faults and what each must show, then every panel's data."""
    from gpuhealth.kube.resources import Resource

    # A device-plugin GPU that holds a pod, and a DRA GPU.
    held = wait_until(
        "a device-plugin GPU allocated to a pod",
        lambda: series(prometheus, 'gpu_device_allocation_info{node="gpu-dp-0", namespace="inference"}'),
        timeout=60,
    )[0]["metric"]["device"]
    index = next(i for i in range(3) if cluster.call(lambda c, i=i: c.fleet.gpu("gpu-dp-0", i).uuid) == held)
    wait_until(
        "every target up",
        lambda: len(prometheus.query("up == 1")) == targets,
        timeout=60,
    )

    wait_until(
        "the held GPU's workload error ratio, 0 while it is healthy",
        lambda: prometheus.value(f'node_device:workload_error_ratio:rate5m{{device="{held}"}}') == 0,
        timeout=60,
    )
    cluster.inject({"fault": "xid", "device": {"node": "gpu-dp-0", "gpu": index}, "xid": 79})
    wait_until(
        # The pod's ratio stays in the 5m window after it moves.
        "the pod on the failed GPU failing its requests",
        lambda: (prometheus.value(f"max({FAILING_PODS})") or 0) > 0,
        timeout=60,
    )
    cluster.inject({"fault": "device-unknown", "device": {"node": "gpu-dra-0", "gpu": 1}, "duration": "10m"})
    wait_until(
        "the XID's quarantine enforced by the responder",
        lambda: series(
            prometheus, f'gpuhealth_device_quarantined{{device="{held}", phase!~"Pending|Deferred"}}'
        ),
        timeout=60,
    )
    wait_until(
        "the held GPU's pod moved off it (a migration's duration observed)",
        lambda: series(prometheus, "gpuhealth_migration_duration_seconds_count > 0"),
        timeout=60,
    )
    wait_until(
        "the moved pod's replacement running on a healthy GPU (a migration recovery observed)",
        lambda: series(prometheus, "gpuhealth_migration_recovery_seconds_count > 0"),
        timeout=90,
    )
    wait_until(
        "an Unknown duration",
        lambda: series(prometheus, "node_device:gpu_device_unknown_duration:seconds"),
    )

    # The API server ends every watch, as its restart would: the exporters resume.
    cluster.call(lambda c: [w.close() for ws in list(c.store.storage._watchers.values()) for w in list(ws)])
    wait_until("watch restarts", lambda: series(prometheus, "gpuhealth_exporter_watch_restarts_total"))

    wait_until(
        "the silent DRA GPU's restriction enforced",
        lambda: series(
            prometheus, 'gpuhealth_device_quarantined{node="gpu-dra-0", phase!~"Pending|Deferred"}'
        ),
        timeout=60,
    )
    # The fatal XID's device recovers and walks the ladder to Released: a quarantine ended,
    # with its verdict (confirmed: the device's own error record) and a release outcome.
    cluster.inject({"fault": "recover", "device": {"node": "gpu-dp-0", "gpu": index}})
    wait_until(
        "the recovered device released",
        lambda: series(prometheus, 'gpuhealth_responder_releases_total{outcome="released"} == 1'),
        timeout=120,
    )
    # People deleting the enforcement by hand no longer ends a quarantine: the responder puts
    # it back (level-triggered), and says so.
    (version, *_) = kube.served_versions("resource.k8s.io", "devicetaintrules")
    rules = Resource("resource.k8s.io", version, "devicetaintrules", namespaced=False)
    deleted = {rule["metadata"]["name"] for rule in kube.list(rules).items}
    for name in deleted:
        kube.delete(rules, name)
    wait_until(
        "the deleted DeviceTaintRule put back",
        lambda: deleted and deleted <= {rule["metadata"]["name"] for rule in kube.list(rules).items},
        timeout=60,
    )

    values = {
        "node": "gpu-dp-0",
        "device": held,
        # The Workload dashboard's rows: every GPU pod (Grafana repeats the row per pod).
        "namespace": ".+",
        "pod": ".+",
        "__rate_interval": "15s",
    }
    documents = list(committed().values())
    missing: list[str] = []

    def every_panel_has_data() -> bool:
        # The whole run, as Grafana's time picker would have it at each look.
        values["__range"] = f"{int(time.time() - started) + 1}s"
        missing[:] = panels_without_data(prometheus.base_url, documents, values, start=started)
        return not missing

    with suppress(LoopbackError):  # the assertion below lists what stayed empty
        wait_until("every panel to show data", every_panel_has_data, timeout=45, interval=2)
    assert missing == [], "\n".join(missing)
