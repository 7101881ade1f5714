"""The shipped enforcement: the backends a responder quarantines devices with.

`Enforcer` is the one declaration of them, in the order they claim a device
(`responder.enforce.backends`): DRA devices by a DeviceTaintRule (`responder.enforce.taint_rules`), then
device-plugin devices by the node annotation the scheduler extender reads
(`responder.enforce.node_annotation`). A new backend is its module and one entry here.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.clock import Clock
from gpuhealth.kube.resources import Resource
from responder.enforce.backends import Backends
from responder.enforce.hold_devices import PodDevices
from responder.enforce.node_annotation import KUBELET, RAMP_PODS, RUNTIME_CLASS, NodeAnnotation
from responder.enforce.taint_rules import DEVICE_CLASS, TaintRules


class Enforcer(Backends):
    def __init__(
        self,
        client: Any,
        taint_rules: Resource | None,
        *,
        device_class: str = DEVICE_CLASS,
        runtime_class: str = RUNTIME_CLASS,
        ramp_pods: int = RAMP_PODS,
        check_route: str = KUBELET,
        devices: PodDevices | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`taint_rules`: the DeviceTaintRule resource the cluster serves (`taint_rules.discover`;
        None: none, and a DRA device cannot be quarantined). `device_class` and `runtime_class`:
        how a check's pod gets the device on each path (`responder.checks.jobs.CheckSettings`).
        `ramp_pods`: opted-in pods the extender admits per device-plugin device on the ramp (on
        DRA the device's own allocation bounds it: one claim at a time). `check_route`: how a
        device-plugin check's pod gets the card (`responder.enforce.node_annotation.CHECK_ROUTES`).
        `devices`: which device each pod got where the kubelet does not say (the hold's, shared:
        `responder.enforce.hold_devices`), asked at `clock`'s time; None: the kubelet's word only."""
        super().__init__(
            client,
            (
                TaintRules(client, taint_rules, device_class=device_class),
                NodeAnnotation(
                    client,
                    runtime_class=runtime_class,
                    ramp_pods=ramp_pods,
                    route=check_route,
                    devices=devices,
                    clock=clock,
                ),
            ),
        )
