"""Which backend enforces a record, as the API says: the reconciler's identification step (an executor).

Every pass resolves each record's device through the backends (`responder.enforce.backends`,
`Backends.identify`). The first pass that a backend claims the device on gives the record its
path (the webhook records none: nothing guesses); while none does, the record's `Identified`
condition says so and nothing is enforced. When a later pass finds another identity (a slice
now publishes a device its node served through the device plugin), the enforcement is handed
over: the new backend's in place before the old one's is lifted, so the device is never free.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import replace
from typing import Protocol

from gpuhealth.kube.meta import rfc3339
from responder.enforce.observed import Observed
from responder.reconcile.policy import ACTOR, Enforce, PolicySettings, holding
from responder.records import IDENTIFIED, Condition, Quarantine

log = logging.getLogger(__name__)


class Enforcement(Protocol):
    """The backends (`responder.enforce.backends.Backends`), as the reconciler uses them."""

    def observe(
        self, nodes: Collection[str] = (), *, list_nodes: bool = False, page_size: int = 500
    ) -> Observed:
        """What the pass reads once for all its records (`responder.enforce.observed`)."""
        ...

    def identify(
        self,
        record: Quarantine,
        seen: Observed,
        partitions: tuple[str, ...] = (),
        profiles: tuple[tuple[str, str], ...] = (),
    ) -> Quarantine:
        """`record` naming its device as the API says it is now (unchanged when nothing says);
        `partitions`: a MIG card's partitions as the health source saw them this pass, `profiles`
        their MIG profiles."""
        ...

    def enforced_as(self, record: Quarantine) -> str: ...

    def holds_card(self, record: Quarantine) -> bool:
        """Whether the record's card is taken by holder pods (device plugins)."""
        ...

    def present(
        self, record: Quarantine, wanted: Enforce | None = None, seen: Observed | None = None
    ) -> bool: ...

    def enforce(self, record: Quarantine, effect: Enforce, seen: Observed | None = None) -> None: ...

    def unenforce(self, record: Quarantine, seen: Observed | None = None) -> None: ...


class Identification:
    def __init__(self, enforcer: Enforcement, policy: PolicySettings) -> None:
        self._enforcer = enforcer
        self._policy = policy

    def resolve(
        self,
        record: Quarantine,
        seen: Observed,
        partitions: tuple[str, ...],
        profiles: tuple[tuple[str, str], ...],
        now: float,
    ) -> Quarantine:
        """`record` naming its device as the backends say it is now (`seen`: the pass's reads;
        `partitions` and `profiles`: a MIG card's as the health source saw them), with the
        enforcement handed over when the identity changed; with no path and its `Identified`
        condition False while no backend claims the device (`record` itself when that is
        already so)."""
        current = self._enforcer.identify(record, seen, partitions, profiles)
        if not current.spec.path:
            return unidentified(record, now)
        if current.spec == record.spec:
            return record
        return self._hand_over(record, current, seen, now)

    def _hand_over(self, before: Quarantine, after: Quarantine, seen: Observed, now: float) -> Quarantine:
        """`after` (the record naming its device's identity as resolved now) with the enforcement
        moved to its backend: the new one is put in place before the old one is lifted, so the
        device is never free in between. Idempotent: a failure here is this record's retry,
        and the next pass resolves and moves again from what is stored."""
        if not before.status.enforced:
            # Nothing in place yet (the first identification among them): the policy enforces
            # through the new backend.
            if not before.spec.path:
                log.info("%s: %s is a %s device", before.name, before.spec.device, after.spec.path)
            others = tuple(c for c in after.status.conditions if c.type != IDENTIFIED)
            return replace(after, status=replace(after.status, conditions=others))
        self._enforcer.enforce(after, holding(after, self._policy), seen)
        self._enforcer.unenforce(before, seen)
        now_as = self._enforcer.enforced_as(after)
        message = (
            f"the device is a {after.spec.path} device now: enforcement moved from "
            f"{before.status.enforced} to {now_as}"
        )
        log.warning("%s: %s", before.name, message)
        moved = after.with_phase(
            after.status.phase,
            time=rfc3339(now),
            actor=ACTOR,
            message=message,
            reason=after.status.phase_reason,
        )
        return replace(moved, status=replace(moved.status, enforced=now_as))


def unidentified(record: Quarantine, now: float) -> Quarantine:
    """`record` with its `Identified` condition False (no backend claims its device), its
    transition time kept while it stays so; `record` itself when nothing changes."""
    message = (
        f"no backend claims {record.spec.device} on {record.spec.node} yet: no ResourceSlice "
        "publishes it and the node advertises no device plugin GPU resource; nothing is enforced"
    )
    before = record.status.condition(IDENTIFIED)
    if before is not None and before.message == message:
        return record
    since = before.last_transition_time if before is not None else rfc3339(now)
    condition = Condition(IDENTIFIED, "False", "NoBackendClaims", message, since)
    others = tuple(c for c in record.status.conditions if c.type != IDENTIFIED)
    return replace(record, status=replace(record.status, conditions=(*others, condition)))
