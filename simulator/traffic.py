"""The simulated workloads' own service metrics: requests served and failed, per pod.

A real serving stack exports these itself (a request counter and an error counter per pod,
scraped through pod discovery with `namespace` and `pod` relabelled on); the business SLO
that `rules/config.yaml` (`workloads`) selects is computed from them, beside device health and
never from it. The simulator's workloads do the same, so the demo and the dashboards' data
test read real values: every running pod of a scenario workload serves `REQUESTS_PER_SECOND`
(simulated) requests, and each one fails while the pod runs on a failing device (lost to
NVML, reported Unhealthy by its driver, or with a failed row remap), and a workload with an
`errorRatio` fails that share of its requests on healthy devices too (its own bug: the business
SLO failing alone, `docs/layers.md`). A device that is only Unknown (a silent health stream)
fails nothing: the work on it goes on, which is why Unknown is never a reason to evict. A pod
moved to a healthy device serves without errors; a pod that is gone takes its series with it,
as a deleted pod's scrape target does.

`Traffic.exposition()` (served by `GET /simulator/v1/workloads/metrics`) advances the counters
to the fleet's time before rendering them: the interval since the previous read is counted at
the devices' state as read now, so a device's failure shows within one read (Prometheus scrapes
every second of wall time), counted from the read that first sees it. Counters start at 0 the
first time a pod is read, like a process that has just started.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuhealth.metrics import Catalog, MetricFamily
from simulator.fleet import Fleet
from simulator.fleet.health import UNHEALTHY, Gpu
from simulator.fleet.state import SimPod

REQUESTS = MetricFamily(
    "workload_requests",
    "counter",
    "Requests a simulated workload pod served (failed ones included).",
    ("namespace", "pod"),
)
ERRORS = MetricFamily(
    "workload_request_errors",
    "counter",
    "Requests a simulated workload pod failed (it ran on a failing device).",
    ("namespace", "pod"),
)
CATALOG = Catalog((REQUESTS, ERRORS))
"""What the simulated workloads expose; rules/config.yaml's `workloads` defaults name these."""

JOB = "workloads"
"""The scrape job the demo and the tests give these series (rules/config.yaml's default
`workloads.matchers` select it)."""
REQUESTS_PER_SECOND = 10.0
"""Requests each running workload pod serves per simulated second."""
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def failing(gpu: Gpu) -> bool:
    """Whether work on `gpu` fails: the hardware itself is broken, not merely unreported."""
    return gpu.lost or gpu.reported == UNHEALTHY or gpu.rows_failure or bool(gpu.failed_watches)


@dataclass(slots=True)
class _Counts:
    requests: float = 0.0
    errors: float = 0.0


class Traffic:
    """The request and error counters of every serving pod of one fleet."""

    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        self._namespaces = frozenset(w.namespace for w in fleet.scenario.workloads)
        self._counts: dict[tuple[str, str], _Counts] = {}
        self._last: float | None = None

    def serving(self) -> list[SimPod]:
        """Running pods of the scenario's workloads that hold devices (probes and canaries,
        which run in the responder's namespace, serve nothing)."""
        return [
            pod
            for pod in self._fleet.pods.values()
            if pod.namespace in self._namespaces
            and pod.slots
            and not (pod.terminated or pod.stopped or pod.waiting)
        ]

    def advance(self) -> None:
        """Count the requests since the previous call, at the devices' state now."""
        now = self._fleet.now()
        elapsed = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        present: dict[tuple[str, str], _Counts] = {}
        for pod in self.serving():
            key = (pod.namespace, pod.name)
            counts = self._counts.get(key)
            if counts is None:
                present[key] = _Counts()  # first seen: its counters start now
                continue
            served = REQUESTS_PER_SECOND * elapsed
            counts.requests += served
            node = self._fleet.nodes.get(pod.node)
            if node is not None and any(failing(node.gpus[slot.gpu]) for slot in pod.slots):
                counts.errors += served
            else:
                counts.errors += served * pod.workload.error_ratio  # its own errors (`errorRatio`)
            present[key] = counts
        self._counts = present

    def counts(self) -> dict[tuple[str, str], tuple[float, float]]:
        """(requests, errors) per (namespace, pod), as of the last `advance()`."""
        return {key: (c.requests, c.errors) for key, c in sorted(self._counts.items())}

    def exposition(self) -> str:
        """Advance, then render both counters in the Prometheus text format."""
        self.advance()
        counts = self.counts()
        lines: list[str] = []
        for family, index in ((REQUESTS, 0), (ERRORS, 1)):
            name = family.exposed_name
            lines.append(f"# HELP {name} {family.help}")
            lines.append(f"# TYPE {name} counter")
            for (namespace, pod), values in counts.items():
                lines.append(f'{name}{{namespace="{namespace}",pod="{pod}"}} {values[index]:.1f}')
        return "\n".join(lines) + "\n"
