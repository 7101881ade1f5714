"""End to end, before Kubernetes 1.36: a quarantined card held where no pod's status names its GPUs.

Aspects: a device-plugin node whose kubelet writes no `allocatedResourcesStatus`
(`resourceHealthStatus: false`); `gpuhealth exporter` in node mode on it (its own process, NVML
and the kubelet's pod-resources API read from the simulated node) publishes, from the kubelet's
`List`, which GPU each pod got; a real Prometheus scrapes it; the responder's hold, whose holder
pods carry no device report, reads their GPUs from that series and ends with the quarantined
card held (`Held` True, reason `Held`) by the one holder the kubelet gave it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.testing.loopback import ScrapeJob, child_process, free_port, run_prometheus, wait_until
from responder.enforce.hold import device_ids
from responder.enforce.hold_allocations import PrometheusAllocations
from responder.enforce.hold_plan import HoldState
from responder.records import HELD
from simulator.fleet.objects import gpu_uuid
from tests.responder.test_hold_simulated import NODE_NAME, NS, SCENARIO, SETTINGS, World, running_world

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OLD_KUBELET: dict[str, Any] = {
    **SCENARIO,
    "name": "hold-before-1-36",
    "fleet": [{**SCENARIO["fleet"][0], "resourceHealthStatus": False}],
}


def ticked(w: World) -> bool:
    """A quarter second of the reconciler's clock per pass: the hold asks Prometheus once per pass
    (`PodDevices` keeps a pass's answer by the pass's time), so passes at one instant would never
    see the holders' series arrive. A pass every 0.2 s or more: the fill's timeout (60 s of this
    clock) is a minute of wall time away, the series a few scrapes (1 s each)."""
    w.clock.advance(0.25)
    return True


def test_a_quarantined_card_is_held_through_the_node_exporters_series(tmp_path: Path) -> None:
    port = free_port()
    with running_world(OLD_KUBELET) as w:
        url = w.cluster.url
        argv = [
            sys.executable, "-m", "gpuhealth", "exporter", "--kubeconfig", str(w.cluster.kubeconfig_path),
            "--node", NODE_NAME, "--nvml", f"sim:{url}", "--pod-resources", f"sim:{url}",
            "--nvml-poll-seconds", "1", "--listen", f"127.0.0.1:{port}",
            "--directory", str(tmp_path / "devices.sqlite"),
        ]  # fmt: skip
        job = ScrapeJob("gpuhealth-exporter", [f"127.0.0.1:{port}"])
        with (
            child_process(argv, tmp_path / "exporter.log"),
            run_prometheus(tmp_path / "prometheus", [job]) as prometheus,
        ):
            source = PrometheusAllocations(prometheus.base_url)
            # Positive evidence first: the workload's two pods, which no status names, on their GPUs.
            answer = wait_until(
                "the workload's pods on their GPUs", lambda: source.devices(NODE_NAME) or None, timeout=60
            )
            assert sorted(key[0] for key in answer) == ["inference", "inference"]
            assert all(len(gpus) == 1 for gpus in answer.values())

            w.reconciler = w.new_reconciler(SETTINGS, allocations=source)
            card = gpu_uuid(NODE_NAME, 3)
            name = w.add(3)
            w.passes_until("the card held", lambda: ticked(w) and w.held(name) == HoldState.HELD, timeout=60)
            condition = w.record(name).status.condition(HELD)
            assert condition is not None and (condition.status, condition.reason) == ("True", "Held")
            (holder,) = w.holders()
            assert device_ids(holder) == ()  # its status names no device: the series did
            assert source.devices(NODE_NAME)[(NS, holder["metadata"]["name"])] == (card,)
