"""What an unrecoverable move keeps for people: the evidence ConfigMap's data, pure.

`docs/workloads.md` promises, for a pod whose move ended unrecoverable: the pod's status, the
device's directory entry and its last NVML readings. The responder reads no exporter's SQLite
directory; the directory's current entry per device (health, status age, statusVersion,
observed time) and the NVML readings (temperature, power, XID, ECC, remapped rows) are the
exporter's per-device series in Prometheus, read by a `DeviceReadings` adapter
(`responder.migrate.readings`). A failed read is written down as such: it never holds a move back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import orjson

from gpuhealth.kube.meta import rfc3339
from responder.records import Quarantine

EVIDENCE_MAX_BYTES = 256 * 1024
"""The most one evidence ConfigMap's data holds (a ConfigMap may hold 1 MiB): bounded, so a pod
with a huge status cannot make the write fail."""
SERIES_MAX = 200
"""Series of one device kept (per-device families are a few dozen; a runaway label is not)."""


class DeviceReadings(Protocol):
    def series(self, node: str, device: str) -> list[dict[str, Any]]:
        """The device's current series (`{"metric": {...labels}, "value": float}`), blocking;
        raises on any failure to read them."""
        ...


def evidence_data(
    *,
    record: Quarantine,
    pod_name: str,
    pod: Mapping[str, Any] | None,
    key: str,
    episode: int,
    reason: str,
    readings: Mapping[str, Any],
    now: float,
) -> dict[str, str]:
    """The ConfigMap's `data`: `reason`, `device.json` (the record's device and why it is
    quarantined), `pod.json` (the pod's whole status as the responder listed it), `readings.json`
    (the device's series, or the error that kept them out). Within EVIDENCE_MAX_BYTES."""
    spec = record.spec
    device = {
        "record": record.name,
        "node": spec.node,
        "device": spec.device,
        "path": spec.path,
        "uuid": spec.uuid,
        "driver": spec.driver,
        "pool": spec.pool,
        "deviceName": spec.device_name,
        "quarantineReason": spec.reason,
        "actor": spec.actor,
        "episode": episode,
        "migrationKey": key,
        "sourceAlerts": [
            {"alertname": a.alertname, "startsAt": a.starts_at, "resolvedAt": a.resolved_at}
            for a in spec.source_alerts
        ],
        "keptAt": rfc3339(now),
    }
    meta = (pod or {}).get("metadata") or {}
    pod_doc: dict[str, Any] = (
        {"gone": True, "name": pod_name}
        if pod is None
        else {
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "nodeName": (pod.get("spec") or {}).get("nodeName"),
            "annotations": {
                k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith("gpuhealth.io/")
            },
            "status": pod.get("status") or {},
        }
    )
    series = list(readings.get("series") or ())
    readings_doc = {**readings, "series": series[:SERIES_MAX]} if "series" in readings else dict(readings)
    data = {
        "reason": reason,
        "device.json": _json(device),
        "readings.json": _json(readings_doc),
        "pod.json": _json(pod_doc),
    }
    over = sum(len(v.encode()) for v in data.values()) - EVIDENCE_MAX_BYTES
    if over > 0:
        # The pod's status is the part that can grow without bound: kept as a cut excerpt,
        # flagged, rather than dropping the device's readings.
        text = data["pod.json"]
        data["pod.json"] = _json({"truncated": True, "excerpt": text[: max(0, len(text) - over - 64)]})
    return data


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
