"""The garbage collector: objects whose owners are gone, and deletions that wait for dependents.

It follows the resources that carry ownerReferences in the simulated cluster (pods, the
workload kinds, ResourceClaims, ConfigMaps) and keeps an index from owner uid to dependents,
built from what it sees added (parsed once per object). What it does, as the real one:

- a dependent whose owners are all gone (no object of that kind, name and uid) is deleted in
  the background; one with some owners left loses only the dangling references;
- `orphan` finalizer (propagationPolicy Orphan, and the default for ReplicationControllers and
  batch/v1 Jobs): the owner's uid leaves every dependent's ownerReferences, then the finalizer
  goes and the owner with it;
- `foregroundDeletion` finalizer (propagationPolicy Foreground): the owner stays, with its
  deletionTimestamp, while its dependents are deleted (in the foreground themselves when they
  have dependents); once no dependent with `blockOwnerDeletion: true` is left, the finalizer goes.

The store adds those finalizers on delete only while this collector runs
(`Store.finalizing_controllers`, `simulator/apiserver/propagation.py`). Not done: ownerReferences
added to an existing object later (adoption) are seen only by a resync, and cluster-scoped
dependents of namespaced owners are not refused.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from simulator.apiserver.errors import ApiError
from simulator.apiserver.propagation import FOREGROUND, ORPHAN
from simulator.fleet.informer import Informer

if TYPE_CHECKING:
    from simulator.apiserver.resources import ResourceInfo
    from simulator.apiserver.store import Entry, Store

log = logging.getLogger(__name__)

FOLLOWED = (
    "pods",
    "replicasets.apps",
    "deployments.apps",
    "statefulsets.apps",
    "replicationcontrollers",
    "jobs.batch",
    "resourceclaims.resource.k8s.io",
    "configmaps",
)
"""The resources whose objects may be owners or dependents here."""

Key = tuple[str, str, str]
"""(resource, namespace, name)."""


class GarbageCollector:
    """Deletes orphaned dependents and carries out orphan and foreground deletions."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._dependents: dict[str, set[Key]] = {}
        """Owner uid -> dependents that referenced it when seen."""
        self._check: set[Key] = set()
        """Dependents whose owners must be checked."""
        self._gone: set[str] = set()
        """Uids of deleted objects whose dependents must be checked."""
        self._finalize: set[Key] = set()
        """Objects being deleted with an orphan or foregroundDeletion finalizer."""
        self._kinds: dict[tuple[str, str], ResourceInfo] = {}
        self._owners_seen: dict[tuple[str, str, str, str], bool] = {}
        self._waiting: dict[str, Key] = {}
        """Owners in foreground deletion waiting for blocking dependents, by uid."""
        self.informers = [
            Informer(store, resource, self._event(resource), self.sync)
            for resource in FOLLOWED
            if self._registered(resource)
        ]

    def _registered(self, resource: str) -> bool:
        try:
            self._store.registry.get(resource)
        except ApiError:
            return False
        return True

    def _event(self, resource: str) -> Any:
        def on_event(etype: str, entry: Entry) -> None:
            data = entry.data
            owned = b'"ownerReferences"' in data
            if etype == "DELETED":
                obj = entry.load()
                uid = str(obj["metadata"].get("uid"))
                if uid in self._dependents:
                    self._gone.add(uid)
                for ref in obj["metadata"].get("ownerReferences") or ():
                    owner_uid = str(ref.get("uid"))
                    deps = self._dependents.get(owner_uid)
                    if deps is not None:
                        deps.discard((resource, entry.namespace, entry.name))
                        if not deps:
                            del self._dependents[owner_uid]
                    if owner_uid in self._waiting:  # an owner waiting in the foreground may now go
                        self._finalize.add(self._waiting[owner_uid])
                return
            if b'"deletionTimestamp"' in data and (b'"orphan"' in data or b'"foregroundDeletion"' in data):
                self._finalize.add((resource, entry.namespace, entry.name))
            if owned and etype == "ADDED":
                obj = entry.load()
                key = (resource, entry.namespace, entry.name)
                for ref in obj["metadata"].get("ownerReferences") or ():
                    self._dependents.setdefault(str(ref.get("uid")), set()).add(key)
                self._check.add(key)

        return on_event

    def close(self) -> None:
        for informer in self.informers:
            informer.close()

    # ---------------------------------------------------------------- decisions

    def _info(self, api_version: str, kind: str) -> ResourceInfo | None:
        group = api_version.split("/", 1)[0] if "/" in api_version else ""
        info = self._kinds.get((group, kind))
        if info is None:
            self._kinds = {(i.group, i.kind): i for i in self._store.registry.all()}
            info = self._kinds.get((group, kind))
        return info

    def _owner_exists(self, namespace: str, ref: dict[str, Any]) -> bool:
        """Whether the owner an ownerReference names exists with that uid (memoized for one sync)."""
        info = self._info(str(ref.get("apiVersion") or ""), str(ref.get("kind") or ""))
        if info is None:
            return False
        ns = namespace if info.namespaced else ""
        memo = (info.key, ns, str(ref.get("name")), str(ref.get("uid")))
        known = self._owners_seen.get(memo)
        if known is None:
            try:
                entry = self._store.get_entry(info.key, memo[2], ns or None)
            except ApiError:
                known = False
            else:
                # The uid is in the stored bytes exactly once as metadata.uid, unless it also names
                # an owner of the owner; parse only then.
                known = (
                    f'"uid":"{memo[3]}"'.encode() in entry.data
                    and entry.load()["metadata"].get("uid") == memo[3]
                )
            self._owners_seen[memo] = known
        return known

    def _get(self, key: Key) -> dict[str, Any] | None:
        resource, namespace, name = key
        try:
            return self._store.get(resource, name, namespace or None)
        except ApiError:
            return None

    def sync(self) -> None:
        self._owners_seen.clear()  # what exists may change with every write; one batch only
        while self._check or self._gone or self._finalize:
            for uid in list(self._gone):
                self._gone.discard(uid)
                for key in list(self._dependents.get(uid, ())):
                    self._check.add(key)
            while self._check:
                self._check_owners(self._check.pop())
            while self._finalize:
                self._finalize_one(self._finalize.pop())

    def _check_owners(self, key: Key) -> None:
        obj = self._get(key)
        if obj is None:
            return
        refs = obj["metadata"].get("ownerReferences") or []
        if not refs:
            return
        namespace = key[1]
        dangling = [ref for ref in refs if not self._owner_exists(namespace, ref)]
        if not dangling:
            return
        resource, _, name = key
        try:
            if len(dangling) == len(refs):
                self._store.delete(resource, name, namespace or None, policy="Background")
            else:
                gone = {str(ref.get("uid")) for ref in dangling}
                self._drop_refs(key, gone)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def _drop_refs(self, key: Key, uids: set[str]) -> None:
        resource, namespace, name = key

        def apply(obj: dict[str, Any]) -> None:
            refs = [r for r in obj["metadata"].get("ownerReferences") or () if str(r.get("uid")) not in uids]
            if refs:
                obj["metadata"]["ownerReferences"] = refs
            else:
                obj["metadata"].pop("ownerReferences", None)

        self._store.mutate(resource, name, namespace or None, apply)

    def _finalize_one(self, key: Key) -> None:
        obj = self._get(key)
        if obj is None:
            return
        meta = obj["metadata"]
        finalizers = meta.get("finalizers") or []
        if not meta.get("deletionTimestamp"):
            return
        uid = str(meta.get("uid"))
        dependents = [
            (dep, d)
            for dep in sorted(self._find_dependents(uid, key[1]))
            if (d := self._get(dep)) is not None
            and any(str(r.get("uid")) == uid for r in d["metadata"].get("ownerReferences") or ())
        ]
        if ORPHAN in finalizers:
            for dep, _ in dependents:
                try:
                    self._drop_refs(dep, {uid})
                except ApiError as exc:
                    if exc.code != 404:
                        raise
            self._dependents.pop(uid, None)
            self._remove_finalizer(key, ORPHAN)
            return
        if FOREGROUND not in finalizers:
            return
        blocking = False
        for dep, d in dependents:
            ref = next(r for r in d["metadata"].get("ownerReferences") or () if str(r.get("uid")) == uid)
            if ref.get("blockOwnerDeletion") is True:
                blocking = True
            if not d["metadata"].get("deletionTimestamp"):
                has_own = str(d["metadata"].get("uid")) in self._dependents
                try:
                    self._store.delete(
                        dep[0], dep[2], dep[1] or None, policy="Foreground" if has_own else "Background"
                    )
                except ApiError as exc:
                    if exc.code != 404:
                        raise
        # Dependents deleted at once are gone now; those with finalizers keep the owner waiting.
        still = [dep for dep, d in dependents if self._get(dep) is not None and self._blocks(dep, uid)]
        if blocking and still:
            self._waiting[uid] = key
            return
        self._waiting.pop(uid, None)
        self._remove_finalizer(key, FOREGROUND)

    def _find_dependents(self, uid: str, namespace: str) -> set[Key]:
        """The index's dependents of `uid`, and any its informers have not delivered yet.

        A deletion with a finalizer is rare; scanning the stored bytes for the uid closes the
        window in which a dependent written just before its owner's deletion is not indexed.
        """
        found = set(self._dependents.get(uid, ()))
        needle = uid.encode()
        for informer in self.informers:
            entries, _ = self._store.list_entries(informer.resource, namespace or None)
            found.update((informer.resource, e.namespace, e.name) for e in entries if needle in e.data)
        return found

    def _blocks(self, dep: Key, owner_uid: str) -> bool:
        obj = self._get(dep)
        if obj is None:
            return False
        return any(
            str(r.get("uid")) == owner_uid and r.get("blockOwnerDeletion") is True
            for r in obj["metadata"].get("ownerReferences") or ()
        )

    def _remove_finalizer(self, key: Key, finalizer: str) -> None:
        resource, namespace, name = key

        def apply(obj: dict[str, Any]) -> None:
            obj["metadata"]["finalizers"] = [
                f for f in obj["metadata"].get("finalizers") or () if f != finalizer
            ]

        try:
            self._store.mutate(resource, name, namespace or None, apply)
        except ApiError as exc:
            if exc.code != 404:
                raise
