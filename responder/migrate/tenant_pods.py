"""What a move writes on the tenant's pods before their eviction, and what it tells the tenant:
the `gpuhealth.io/serving` condition set False (new requests stop), the checkpoint request
annotation, and a warning Event per pod, reason and move.

Each write is idempotent: a pass decided twice changes nothing more (a pod gone or changed since
it was listed is left to the next plan; an Event already written stands).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from typing import Any

from gpuhealth.clock import Clock
from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import AlreadyExists, ApiError, Conflict, NotFound
from gpuhealth.kube.events import EVENT, core_event
from gpuhealth.kube.meta import metadata, rfc3339, rfc3339_seconds
from gpuhealth.kube.resources import POD
from responder.migrate.plan import REQUESTED, SERVING, RequestCheckpoint, StopRequests, TellTenant
from responder.records import Migration

log = logging.getLogger(__name__)

COMPONENT = "gpuhealth-responder"


class TenantPods:
    """The requests a move makes of the tenant's pods, and the Events it writes on them."""

    def __init__(self, client: Api, clock: Clock) -> None:
        self._client = client
        self._clock = clock

    def request_checkpoint(self, effect: RequestCheckpoint, entry: Migration, now: float) -> Migration:
        patch = {"metadata": {"annotations": {REQUESTED: effect.key}}}
        try:
            self._client.patch(POD, effect.pod, patch, namespace=effect.namespace)
        except NotFound:
            return entry  # gone meanwhile: the next plan sees it
        return replace(entry, requested_at=entry.requested_at or rfc3339(now))

    def stop_requests(
        self, effect: StopRequests, entry: Migration, pod: dict[str, Any] | None, now: float
    ) -> tuple[Migration, bool]:
        """The pod's `gpuhealth.io/serving` condition set False through pods/status: a merge
        patch of its conditions, conditional on the resourceVersion listed (the kubelet writes
        the same list; a 409 is decided again next pass)."""
        if pod is None:
            return entry, False
        meta = metadata(pod)
        conditions = [
            c
            for c in (pod.get("status") or {}).get("conditions") or ()
            if isinstance(c, dict) and c.get("type") != SERVING
        ]
        conditions.append(
            {
                "type": SERVING,
                "status": "False",
                "reason": "GPUQuarantined",
                "message": f"the GPU this pod uses is quarantined: new requests stop before its "
                f"checkpoint ({effect.key})",
                "lastTransitionTime": rfc3339_seconds(self._clock.now()),
            }
        )
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"conditions": conditions},
        }
        try:
            self._client.patch(POD, effect.pod, patch, namespace=effect.namespace, subresource="status")
        except (NotFound, Conflict):
            return entry, False  # gone, or changed since listed: the next plan sees it
        return replace(entry, requested_at=entry.requested_at or rfc3339(now)), True

    def tell(self, namespace: str, pod: str, uid: str, key: str, effect: TellTenant, identity: str) -> None:
        # One Event per pod, reason and move: a step decided twice writes it once (409 AlreadyExists).
        digest = hashlib.sha256(f"{key}\x00{effect.reason}".encode()).hexdigest()[:12]
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": namespace, "name": pod}
        if uid:
            involved["uid"] = uid
        event = core_event(
            involved=involved,
            namespace=namespace,
            reason=effect.reason,
            message=effect.message,
            warning=True,
            now=self._clock.now(),
            component=COMPONENT,
            name=f"{pod}.gpuhealth-{digest}",
            instance=identity,
        )
        try:
            self._client.create(EVENT, event, namespace=namespace)
        except AlreadyExists:
            pass
        except ApiError as error:
            # The record keeps the outcome and its evidence; the Event is the tenant's courtesy copy.
            log.warning("event %s on %s/%s not written: %s", effect.reason, namespace, pod, error)
