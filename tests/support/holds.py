"""The holder pods of device-plugin cards, wired into a test's reconciler as the service wires them.

`product_hold(client)` gives the `Reconciler` keyword arguments `responder.service` passes: the
hold (`responder.enforce.hold.DeviceHold`) in the checks' namespace, and the check route that
makes it step aside for a check through the kubelet (`JobChecks.through_kubelet`).
"""

from __future__ import annotations

from typing import Any

from gpuhealth.kube.api import Api
from responder.checks.jobs import CheckSettings, JobChecks
from responder.enforce.hold import DeviceHold, HoldSettings
from responder.enforce.hold_devices import AllocationSource

NS = "gpuhealth-system"


def product_hold(
    client: Api,
    settings: CheckSettings | None = None,
    hold: HoldSettings | None = None,
    allocations: AllocationSource | None = None,
) -> dict[str, Any]:
    """`allocations`: the node exporter's series in Prometheus, as the service passes them."""
    checks = JobChecks(client, settings or CheckSettings(namespace=NS))
    hold_ = DeviceHold(client, checks.settings.namespace, hold, allocations)
    return {"hold": hold_, "hold_aside": checks.through_kubelet}
