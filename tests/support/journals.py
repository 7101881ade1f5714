"""Journals of demo runs built by hand, for the views over the journal (summary, progress, report).

`closed_loop()` is the closed-loop story as the pipeline would record it at 20x (floor 40 s,
stamps up to 10 s late): a fatal XID under a checkpointed job (quarantine, two evictions,
migration, then the device recovers and walks probe -> canary -> stabilizing -> ramp ->
released), a short Unknown (warning only), a long Unknown (restrict, no eviction, released when
health returns), an application XID (nothing), and the responder leader killed mid-run.
Times are scenario seconds; `at` of each device is its (node, gpu index).
"""

from __future__ import annotations

from demo.journal import Device, Journal, Kind
from simulator.fleet.objects import gpu_uuid

FLOOR = 40.0
XID_GPU = ("gpu-dra-0", 3)
BLIP_GPU = ("gpu-dra-1", 1)
LONG_UNKNOWN_GPU = ("gpu-dra-2", 6)
APP_XID_GPU = ("gpu-dp-0", 0)


def uuid(place: tuple[str, int]) -> str:
    return gpu_uuid(*place)


def fleet() -> dict[str, Device]:
    devices = {}
    for node, path in (
        ("gpu-dra-0", "dra"),
        ("gpu-dra-1", "dra"),
        ("gpu-dra-2", "dra"),
        ("gpu-dp-0", "device-plugin"),
    ):
        for i in range(8):
            device = Device(gpu_uuid(node, i), node, i, path)
            devices[device.uuid] = device
    return devices


def empty(scenario: str = "closed-loop") -> Journal:
    return Journal(
        scenario=scenario,
        description="the whole story in one run",
        speed=20.0,
        devices=fleet(),
        floor_seconds=FLOOR,
        resolution_seconds=10.0,
    )


def closed_loop() -> Journal:
    j = empty()
    xid, blip, long_, app = (uuid(p) for p in (XID_GPU, BLIP_GPU, LONG_UNKNOWN_GPU, APP_XID_GPU))
    record_xid = "dq-gpu-dra-0-gpu-3"
    record_long = "dq-gpu-dra-2-gpu-6"
    j.record(-160.0, Kind.PROCESS, "started", name="responder-0", role="leader")
    j.record(-160.0, Kind.PROCESS, "started", name="responder-1", role="follower")
    j.record(-150.0, Kind.PROCESS, "started", name="exporter-gpu-dra-0")
    # A fatal XID under the checkpointed 8-GPU job.
    j.record(30.0, Kind.FAULT, "xid", "gpu-dra-0", xid, xid="79")
    j.record(30.5, Kind.HEALTH, "Unhealthy", "gpu-dra-0", xid)
    j.record(40.0, Kind.FAULT, "device-unknown", "gpu-dra-1", blip, duration="90")
    j.record(50.0, Kind.FAULT, "device-unknown", "gpu-dra-2", long_, duration="420")
    j.record(60.0, Kind.FAULT, "xid", "gpu-dp-0", app, xid="13")
    j.record(
        72.0,
        Kind.ALERT_FIRING,
        "GPUDeviceFatalXid",
        "gpu-dra-0",
        xid,
        action="quarantine",
        severity="critical",
    )
    j.record(
        72.5, Kind.DELIVERY, "responder", "gpu-dra-0", xid,
        alertname="GPUDeviceFatalXid", status="firing", action="quarantine",
    )  # fmt: skip
    j.record(72.6, Kind.DELIVERY, "page", "gpu-dra-0", xid, alertname="GPUDeviceFatalXid", status="firing")
    j.record(
        73.0, Kind.PHASE, "Quarantined", "gpu-dra-0", xid, reason="FatalXid", record=record_xid, actor="alert"
    )
    j.record(
        73.4, Kind.ENFORCED, "quarantine", "gpu-dra-0", xid, rule=record_xid, taint="gpuhealth.io/quarantine"
    )
    j.record(75.0, Kind.HEALTH, "Unknown", "gpu-dra-1", blip)
    j.record(85.0, Kind.HEALTH, "Unknown", "gpu-dra-2", long_)
    # An eviction names the pod's first device and lists all of them; the job moves whole, so
    # train-1, which does not hold the failed GPU, is evicted too.
    for pod, gpus in (("train-0", (0, 1, 2, 3)), ("train-1", (4, 5, 6, 7))):
        devices = [gpu_uuid("gpu-dra-0", g) for g in gpus]
        j.record(
            90.0, Kind.EVICTION, f"research/{pod}", "gpu-dra-0", devices[0],
            job="research/train", devices=",".join(devices),
        )  # fmt: skip
    for pod, node, gpus in (("train-0", "gpu-dra-0", (0, 1, 2, 4)), ("train-1", "gpu-dra-1", (5, 6, 7, 0))):
        placed = [gpu_uuid(node, g) for g in gpus]
        j.record(
            95.0, Kind.NOTE, "placed", node, placed[0],
            pod=f"research/{pod}", job="research/train", devices=",".join(placed),
        )  # fmt: skip
    j.record(
        96.0,
        Kind.MIGRATION,
        "succeeded",
        "gpu-dra-0",
        xid,
        job="research/train",
        reason="checkpoint committed",
    )
    j.record(130.0, Kind.HEALTH, "Healthy", "gpu-dra-1", blip)
    j.record(
        135.0, Kind.ALERT_FIRING, "GPUDeviceUnknown", "gpu-dra-1", blip, action="none", severity="warning"
    )
    j.record(136.0, Kind.DELIVERY, "ticket", "gpu-dra-1", blip, alertname="GPUDeviceUnknown", status="firing")
    j.record(140.0, Kind.ALERT_RESOLVED, "GPUDeviceUnknown", "gpu-dra-1", blip)
    j.record(
        145.0, Kind.ALERT_FIRING, "GPUDeviceUnknown", "gpu-dra-2", long_, action="none", severity="warning"
    )
    j.record(150.0, Kind.PROCESS, "killed", name="responder-0", role="leader")
    j.record(180.0, Kind.PROCESS, "started", name="responder-0", role="follower")
    # The XID device recovers and walks the release path.
    j.record(240.0, Kind.FAULT, "recover", "gpu-dra-0", xid)
    j.record(241.0, Kind.HEALTH, "Healthy", "gpu-dra-0", xid)
    j.record(332.0, Kind.ALERT_RESOLVED, "GPUDeviceFatalXid", "gpu-dra-0", xid)
    j.record(
        332.5, Kind.DELIVERY, "responder", "gpu-dra-0", xid,
        alertname="GPUDeviceFatalXid", status="resolved", action="quarantine",
    )  # fmt: skip
    j.record(333.0, Kind.PHASE, "Probing", "gpu-dra-0", xid, record=record_xid, actor="alert")
    j.record(340.0, Kind.CHECK, "probe", "gpu-dra-0", xid, result="passed")
    j.record(341.0, Kind.PHASE, "Canary", "gpu-dra-0", xid, record=record_xid)
    j.record(360.0, Kind.CHECK, "canary", "gpu-dra-0", xid, result="passed")
    j.record(361.0, Kind.PHASE, "Stabilizing", "gpu-dra-0", xid, record=record_xid)
    j.record(421.0, Kind.PHASE, "Ramp", "gpu-dra-0", xid, record=record_xid)
    j.record(421.3, Kind.ENFORCED, "canary", "gpu-dra-0", xid, rule=record_xid, taint="gpuhealth.io/canary")
    j.record(451.0, Kind.PHASE, "Released", "gpu-dra-0", xid, record=record_xid, verdict="confirmed")
    j.record(451.2, Kind.LIFTED, "canary", "gpu-dra-0", xid, rule=record_xid)
    # The long Unknown: restrict after the 5-minute tolerance, nothing evicted.
    j.record(
        425.0,
        Kind.ALERT_FIRING,
        "GPUDeviceUnknownExpired",
        "gpu-dra-2",
        long_,
        action="restrict",
        severity="critical",
    )
    j.record(
        426.0, Kind.DELIVERY, "responder", "gpu-dra-2", long_,
        alertname="GPUDeviceUnknownExpired", status="firing", action="restrict",
    )  # fmt: skip
    j.record(426.5, Kind.PHASE, "Quarantined", "gpu-dra-2", long_, reason="Unknown", record=record_long)
    j.record(427.0, Kind.ENFORCED, "quarantine", "gpu-dra-2", long_, rule=record_long)
    j.record(470.0, Kind.HEALTH, "Healthy", "gpu-dra-2", long_)
    j.record(480.0, Kind.ALERT_RESOLVED, "GPUDeviceUnknownExpired", "gpu-dra-2", long_)
    j.record(480.0, Kind.ALERT_RESOLVED, "GPUDeviceUnknown", "gpu-dra-2", long_)
    j.record(482.0, Kind.PHASE, "Probing", "gpu-dra-2", long_, record=record_long)
    j.record(490.0, Kind.CHECK, "probe", "gpu-dra-2", long_, result="passed")
    j.record(491.0, Kind.PHASE, "Canary", "gpu-dra-2", long_, record=record_long)
    j.ended_at = 500.0
    return j
