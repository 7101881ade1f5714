"""Where an unrecoverable move's evidence is kept: one ConfigMap per pod of the move in the
responder's namespace, owned by the record (it goes when the record goes), and an excerpt of the
pod's status in the record's entry.

What the ConfigMap holds is `responder.migrate.evidence`'s (pure); this reads the device's series
and writes it. The full evidence is a courtesy: a failed read or write is written down or logged,
and never holds the move back.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Any

import orjson

from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import AlreadyExists, ApiError
from gpuhealth.kube.resources import CONFIG_MAP
from responder.migrate.evidence import DeviceReadings, evidence_data
from responder.migrate.plan import KeepEvidence
from responder.records import Evidence, Migration, Quarantine, owner_reference

log = logging.getLogger(__name__)


def evidence_name(record: str, key: str, pod: str) -> str:
    """The evidence ConfigMap of one pod of one move: `<record>-evidence-<hash>`, within a name's
    253 characters."""
    digest = hashlib.sha256(f"{key}\x00{pod}".encode()).hexdigest()[:10]
    return f"{record[: 253 - len(digest) - 10]}-evidence-{digest}"


class EvidenceStore:
    """The evidence of unrecoverable pods: its ConfigMaps, and the entry's record of them."""

    def __init__(self, client: Api, namespace: str, readings: DeviceReadings | None) -> None:
        """`namespace`: the responder's, where evidence ConfigMaps are kept. `readings`: the device's
        series (its directory entry and NVML readings, from Prometheus); None: the evidence says none
        were read."""
        self._client = client
        self._namespace = namespace
        self._readings = readings

    def keep(
        self,
        effect: KeepEvidence,
        entry: Migration,
        record: Quarantine,
        pod: dict[str, Any] | None,
        now: float,
    ) -> Migration:
        if any(e.pod == effect.pod for e in entry.evidence):
            return entry
        # The pod as this pass listed it (the responder may list pods, not get them one by one).
        excerpt = _excerpt(pod) if pod is not None else '{"gone":true}'
        name = evidence_name(record.name, entry.key, effect.pod)
        kept = self._write(name, effect, entry, record, pod, now)
        ref = f"{self._namespace}/{name}" if kept else ""
        return replace(entry, evidence=(*entry.evidence, Evidence(effect.pod, effect.reason, excerpt, ref)))

    def _write(
        self,
        name: str,
        effect: KeepEvidence,
        entry: Migration,
        record: Quarantine,
        pod: dict[str, Any] | None,
        now: float,
    ) -> bool:
        """The evidence ConfigMap, owned by the record (it goes when the record goes). A failed
        read of the device's series is written down in it, and holds nothing back."""
        readings: dict[str, Any]
        if self._readings is None:
            readings = {"error": "no source of device readings is configured"}
        else:
            try:
                readings = {"series": self._readings.series(record.spec.node, record.spec.device)}
            except Exception as error:  # the move goes on; the evidence says what is missing
                readings = {"error": f"{type(error).__name__}: {error}"[:512]}
        data = evidence_data(
            record=record,
            pod_name=effect.pod,
            pod=pod,
            key=entry.key,
            episode=entry.episode,
            reason=effect.reason,
            readings=readings,
            now=now,
        )
        meta: dict[str, Any] = {
            "name": name,
            "namespace": self._namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpuhealth", "gpuhealth.io/evidence": "migration"},
            "annotations": {
                "gpuhealth.io/record": record.name,
                "gpuhealth.io/pod": f"{effect.namespace}/{effect.pod}",
            },
        }
        if record.uid:
            meta["ownerReferences"] = [owner_reference(record)]
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}
        try:
            self._client.create(CONFIG_MAP, body, namespace=self._namespace)
        except AlreadyExists:
            return True  # a pass decided twice: the first write stands
        except ApiError as error:
            # The record keeps the excerpt; the full evidence is a courtesy that must not stop the move.
            log.warning("evidence %s/%s not written: %s", self._namespace, name, error)
            return False
        return True


def _excerpt(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    excerpt = {
        "phase": status.get("phase"),
        "conditions": [
            {k: c.get(k) for k in ("type", "status", "reason", "message") if c.get(k) is not None}
            for c in status.get("conditions") or []
            if isinstance(c, dict)
        ],
        "allocatedResourcesStatus": {
            str(c.get("name")): c.get("allocatedResourcesStatus")
            for c in status.get("containerStatuses") or []
            if isinstance(c, dict) and c.get("allocatedResourcesStatus")
        },
    }
    return orjson.dumps(excerpt).decode()
