"""A test's reconciler wired as `responder.service` wires it: one set of backends for all.

`wiring(client, backends)` gives the `Reconciler` keyword arguments the service passes beside
its health source, events and breaker store: the backends (`enforcer`), the checks over them,
the holders over them, the hold (`responder.enforce.hold.DeviceHold`) in the checks' namespace,
and the check route that makes it step aside for a check through the kubelet
(`JobChecks.through_kubelet`).
"""

from __future__ import annotations

from typing import Any

from gpuhealth.kube.api import Api
from responder.checks.jobs import CheckSettings, JobChecks
from responder.enforce.backends import Backends
from responder.enforce.hold import DeviceHold, HoldSettings
from responder.enforce.hold_devices import AllocationSource
from responder.enforce.holders import DeviceHolders

NS = "gpuhealth-system"


def wiring(
    client: Api,
    backends: Backends,
    settings: CheckSettings | None = None,
    hold: HoldSettings | None = None,
    allocations: AllocationSource | None = None,
) -> dict[str, Any]:
    """`allocations`: the node exporter's series in Prometheus, as the service passes them."""
    checks = JobChecks(client, backends, settings or CheckSettings(namespace=NS))
    hold_ = DeviceHold(client, checks.settings.namespace, hold, allocations)
    return {
        "enforcer": backends,
        "checks": checks,
        "holders": DeviceHolders(client, backends),
        "hold": hold_,
        "hold_aside": checks.through_kubelet,
    }
