"""The migration Lease of each job a move takes and releases: one lock per job, so two records whose
devices the same job holds never move it at once.

The Lease (`gpuhealth-migration-<hash of the owner>` in the job's namespace, held by the record's
name, owned by the record) is judged as the elector judges its own (`gpuhealth.kube.lease`): expired
once its duration has passed on our monotonic clock since we first saw its current content; never by
comparing its timestamps with our clock. Which holder may take it, and for how long, is the plan's
(`responder.migrate.plan`); this reads, writes and deletes it.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import replace
from typing import Any

from gpuhealth.clock import Clock
from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import AlreadyExists, Conflict, NotFound
from gpuhealth.kube.lease import LeaseRecord, Observed, observe
from gpuhealth.kube.meta import metadata, rfc3339
from gpuhealth.kube.resources import LEASE
from responder.migrate.plan import ReleaseLease, TakeLease
from responder.records import API_VERSION, KIND, Migration, Quarantine

log = logging.getLogger(__name__)

LEASE_PREFIX = "gpuhealth-migration-"


def lease_name(owner: str) -> str:
    """The migration Lease of a job (`<kind>/<name>`), in the job's namespace."""
    return LEASE_PREFIX + hashlib.sha256(owner.encode()).hexdigest()[:16]


class JobLeases:
    """The jobs' migration Leases, with what each held when first seen on our monotonic clock."""

    def __init__(self, client: Api, clock: Clock) -> None:
        self._client = client
        self._clock = clock
        self._seen: dict[tuple[str, str], Observed] = {}
        """What each job's Lease held when first seen, on our monotonic clock (expiry, as the elector)."""

    def read(self, namespace: str, owner: str) -> tuple[dict[str, Any] | None, str | None]:
        """The job's Lease object (None: none exists) and its holder now (None: free or expired)."""
        key = (namespace, lease_name(owner))
        try:
            lease = self._client.get(LEASE, key[1], namespace=namespace)
        except NotFound:
            self._seen.pop(key, None)
            return None, None
        seen = observe(self._seen.get(key), LeaseRecord.from_lease(lease), self._clock.monotonic())
        self._seen[key] = seen
        holder = seen.record.holder_identity
        if not holder or seen.expired(self._clock.monotonic()):
            return lease, None
        return lease, holder

    def take(
        self,
        effect: TakeLease,
        entry: Migration,
        record: Quarantine,
        lease: dict[str, Any] | None,
        now: float,
    ) -> Migration:
        duration = max(1, math.ceil(effect.seconds))
        old = LeaseRecord.from_lease(lease) if lease is not None else None
        transitions = 0 if old is None else old.lease_transitions + (old.holder_identity != effect.holder)
        spec = LeaseRecord(effect.holder, duration, now, now, transitions).to_spec()
        meta: dict[str, Any] = {
            "name": lease_name(effect.owner),
            "namespace": effect.namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpuhealth"},
            "annotations": {
                "gpuhealth.io/migration-of": effect.owner,
                "gpuhealth.io/owner-uid": effect.owner_uid,
            },
        }
        if record.uid:
            # Owned by the record: deleting it takes the lock with it (no ghost locks).
            meta["ownerReferences"] = [
                {"apiVersion": API_VERSION, "kind": KIND, "name": record.name, "uid": record.uid}
            ]
        try:
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": meta,
                    "spec": spec,
                }
                self._client.create(LEASE, body, namespace=effect.namespace)
            else:
                meta["resourceVersion"] = metadata(lease).get("resourceVersion")
                self._client.update(LEASE, {**lease, "metadata": {**metadata(lease), **meta}, "spec": spec})
        except (AlreadyExists, Conflict):
            return replace(entry, detail="another flow wrote the migration lease first; reading again")
        started = entry.started_at or rfc3339(now)
        return replace(entry, started_at=started, detail="migration lease taken")

    def release(
        self, effect: ReleaseLease, entry: Migration, identity: str, lease: dict[str, Any] | None
    ) -> Migration:
        if lease is None or LeaseRecord.from_lease(lease).holder_identity != identity:
            return entry
        meta = metadata(lease)
        try:
            # Deleted rather than cleared: a finished move leaves nothing behind in the tenant's namespace.
            self._client.delete(
                LEASE,
                lease_name(effect.owner),
                namespace=effect.namespace,
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            )
        except NotFound:
            pass
        except Conflict:
            log.info("migration lease of %s changed before its release; it expires on its own", effect.owner)
        self._seen.pop((effect.namespace, lease_name(effect.owner)), None)
        return entry
