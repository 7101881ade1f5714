"""The object store of the simulated cluster: the one owner of every API object and of the
cluster-wide resourceVersion.

Both halves of the simulator write here: the HTTP layer (`app.py`) on behalf of API clients, and
the simulated kubelets in-process (`mutate`, `create(..., validate=False)`). All calls run on one
asyncio event loop thread; the store is not thread-safe.

Two jobs, one module each: `storage.py` keeps what was written (the tables, the resourceVersion,
commits and their events, reads, the watch caches and watchers; its layout and watch semantics
are described there), and this module carries out writes and deletes, as the real apiserver's
registry does over its storage. What a write means lives beside it, one concern per module:
`admission.py` (the object a create or update makes, defaults and validation), `crds.py` (what a
CRD serves and its status), `propagation.decide_delete` (what a DELETE does: grace periods,
finalizers, a namespace's Terminating phase), `eviction.py` (the PodDisruptionBudget-aware
eviction subresource), `kinds.py` (what a few built-in kinds get on create), `watch.py` (one
watcher's events) and `stored.py` (an entry and its index).

Why not kmock (evaluated): its Kubernetes emulator keeps objects as plain dicts with a fixed
resourceVersion placeholder, no optimistic concurrency (no 409 Conflict), no selectors and no
watch replay; gpuhealth's leases and observers depend on exactly those, so the store is ours.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

from gpuhealth.clock import Clock
from simulator.apiserver import admission, crds, eviction, kinds, propagation
from simulator.apiserver.defaults import apply_defaults
from simulator.apiserver.errors import ApiError, already_exists, bad_request, invalid, not_found
from simulator.apiserver.patch import apply_patch
from simulator.apiserver.resources import CRD_KEY, Registry, ResourceInfo
from simulator.apiserver.storage import Storage
from simulator.apiserver.stored import Entry, format_timestamp
from simulator.apiserver.validation import Validator, WriteOptions
from simulator.apiserver.values import allocated_resources_status_causes
from simulator.apiserver.versions import KubernetesVersion
from simulator.apiserver.watch import ADDED, DELETED, MODIFIED, Watch
from simulator.apiserver.watch_cache import WatchCacheSettings

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's alphabet for generateName suffixes


class Store:
    """The API's objects as writes make them: create, update, patch, mutate, delete and evict, each
    admitted and carried out on the `Storage`, which serves reads and watches as they are."""

    def __init__(
        self,
        clock: Clock,
        *,
        watch_window: int | None = None,
        watch_cache: WatchCacheSettings | None = None,
        watch_queue_size: int = 100_000,
        seed: int | None = None,
        kubernetes_version: KubernetesVersion | None = None,
    ) -> None:
        """`watch_cache` sizes each resource's event window; `watch_window` (tests) only its capacity.
        `kubernetes_version` decides what is served (default: 1.37 with its default feature gates)."""
        self.clock = clock
        self.kubernetes_version = kubernetes_version or KubernetesVersion()
        self.registry = Registry(self.kubernetes_version.builtin_resources())
        self.validator = Validator()
        self._rng = random.Random(seed)
        settings = watch_cache or WatchCacheSettings()
        if watch_window is not None:
            settings = WatchCacheSettings(max(1, watch_window), settings.max_age_seconds)
        self.watch_cache_settings = settings
        self.storage = Storage(clock, self.registry, settings, watch_queue_size)
        # Reads and watches are the storage's, served unchanged.
        self.get = self.storage.get
        self.get_entry = self.storage.get_entry
        self.list_entries = self.storage.list_entries
        self.list = self.storage.list
        self.events_since = self.storage.events_since
        self.watch = self.storage.watch
        self.watcher_count = self.storage.watcher_count
        self.pod_runs: Callable[[dict[str, Any]], bool] | None = None
        """Set by the simulated kubelets: whether one of them runs a pod (its DELETE is then graceful)."""
        self.eviction_listeners: list[Callable[[dict[str, Any]], None]] = []
        """Called with the pod (as it was) after each eviction the subresource served (not dry
        runs): the demo journals evictions from here, a deletion alone cannot say it was one."""
        self.finalizing_controllers = False
        """Set while the garbage collector and the namespace controller run (`simulator/fleet`):
        deletes then add the finalizers they remove (orphan, foregroundDeletion, a namespace's
        Terminating phase); a bare store deletes at once (`propagation`)."""
        for ns in DEFAULT_NAMESPACES:
            self.create("namespaces", {"metadata": {"name": ns}}, validate=False)
        kinds.bootstrap(self)
        self.storage.start_watch_caches()

    @property
    def resource_version(self) -> int:
        return self.storage.resource_version

    @property
    def rng(self) -> random.Random:
        """The store's seeded random source (uids, generated names, service IPs): runs repeat."""
        return self._rng

    # ---- writing -----------------------------------------------------------------------------

    def create(
        self,
        resource: str,
        obj: dict[str, Any],
        *,
        namespace: str | None = None,
        validate: bool = True,
        options: WriteOptions | None = None,
    ) -> dict[str, Any]:
        """Create an object; the server sets uid, creationTimestamp, generation and resourceVersion.

        `validate=True` treats the write as an API client's: defaults, schema and value
        validation (422), the namespace must exist (404), and status is reset as the real create
        strategies do (pods start Pending; jobs, PDBs, claims and custom resources start without
        status). `validate=False` is for the simulator's own writes and stores what it is given.
        `options` carries dryRun (answered as created, nothing stored) and fieldValidation.
        """
        dry_run = options is not None and options.dry_run
        rng = random.Random() if dry_run else self._rng  # a dry run leaves seeded uids alone
        info = self.registry.get(resource)
        new = admission.creating(info, obj, namespace)
        meta = new["metadata"]
        if (
            validate
            and info.namespaced
            and ("", meta["namespace"]) not in self.storage.table(self.registry.get("namespaces"))
        ):
            raise not_found("namespaces", "", meta["namespace"])
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix or not isinstance(prefix, str):
                raise invalid(
                    info.kind,
                    info.group,
                    "",
                    [("metadata.name", "Required value: name or generateName is required")],
                )
            name = meta["name"] = self._generate_name(info, meta.get("namespace", ""), prefix, rng)
        admission.stamp_created(info, new, rng, format_timestamp(self.clock.now()))
        if validate:
            admission.reset_status_on_create(info, new)
        crd_info = crds.established(self.validator, new) if info.key == CRD_KEY else None
        kinds.prepare_create(self, info, new)
        if validate:
            admission.admit(self.validator, info, new, None, options or WriteOptions())
        elif info.key == "namespaces":
            apply_defaults(info.key, new)  # a handful of objects; kubectl shows their finalizer and label
        table = self.storage.table(info)
        if (meta.get("namespace", "") if info.namespaced else "", name) in table:
            raise already_exists(info.plural, info.group, name)
        if info.namespaced:
            ns_entry = self.storage.table(self.registry.get("namespaces")).get(("", meta["namespace"]))
            if ns_entry is not None and b'"phase":"Terminating"' in ns_entry.data:
                raise propagation.namespace_terminating(info.plural, info.group, name, meta["namespace"])
        if dry_run:
            return admission.dry_result(info, new, None)
        if crd_info is not None:
            self.registry.add(crd_info)
        entry = self.storage.commit(info, new, ADDED, None)
        kinds.after_create(self, info, new)
        return entry.load()

    def _generate_name(self, info: ResourceInfo, namespace: str, prefix: str, rng: random.Random) -> str:
        table = self.storage.table(info)
        for _ in range(100):
            name = prefix[:58] + "".join(rng.choice(_GENERATE_ALPHABET) for _ in range(5))
            if (namespace, name) not in table:
                return name
        raise ApiError(500, "InternalError", f"could not generate a unique name from {prefix!r}")

    def update(
        self,
        resource: str,
        obj: dict[str, Any],
        *,
        subresource: str | None = None,
        validate: bool = True,
        options: WriteOptions | None = None,
    ) -> dict[str, Any]:
        """PUT: replace an object (or only its status with subresource="status").

        A set metadata.resourceVersion is a precondition (409 Conflict when stale); an unset one
        means an unconditional update. The main resource ignores .status changes for resources
        with a status subresource, and the status subresource ignores everything but .status.
        """
        info = self.registry.get(resource)
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise bad_request("the body of the request must be a JSON object with metadata")
        meta = obj["metadata"]
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise invalid(info.kind, info.group, "", [("metadata.name", "Required value: name is required")])
        old_entry = self.storage.entry(info, name, meta.get("namespace"))
        old = old_entry.load()
        admission.check_precondition(info, old, meta, old_entry.rv)
        new = admission.merge_write(info, old, copy.deepcopy(obj), subresource)
        return self._finish_write(info, old_entry, old, new, validate, options, subresource)

    def mutate(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        fn: Callable[[dict[str, Any]], dict[str, Any] | None],
        *,
        subresource: str | None = None,
        validate: bool = False,
    ) -> dict[str, Any]:
        """Read-modify-write without a conflict check (the simulated kubelet's writes).

        `fn` gets a private copy and returns the new object, or changes it in place and returns None.
        Without a subresource every part of the object may change (status included); with
        subresource="status" only .status is taken. A change-free result writes nothing.
        """
        info = self.registry.get(resource)
        old_entry = self.storage.entry(info, name, namespace)
        old = old_entry.load()
        work = old_entry.load()
        result = fn(work)
        new = work if result is None else result
        if not isinstance(new, dict):
            raise TypeError("mutate function must return a dict or None")
        if subresource is None:
            new = admission.keep_identity(info, old, copy.deepcopy(new) if result is not None else new)
        else:
            new = admission.merge_write(info, old, new, subresource)
            if not validate and info.key == "pods" and subresource == "status":
                # The kubelet's own status writes are checked by the real API server too; this
                # is the check a simulated kubelet could fail (which devices a container names).
                causes = allocated_resources_status_causes(new)
                if causes:
                    raise invalid(info.kind, info.group, name, causes)
        return self._finish_write(info, old_entry, old, new, validate)

    def patch(
        self,
        resource: str,
        name: str,
        namespace: str | None,
        patch: Any,
        patch_type: str,
        *,
        subresource: str | None = None,
        validate: bool = True,
        options: WriteOptions | None = None,
    ) -> dict[str, Any]:
        """PATCH (merge, JSON or strategic-merge); a resourceVersion in the result is a precondition."""
        info = self.registry.get(resource)
        old_entry = self.storage.entry(info, name, namespace)
        old = old_entry.load()
        patched = apply_patch(old, patch, patch_type, strategic_allowed=not info.custom)
        admission.check_patched(info, old, patched, old_entry.rv)
        new = admission.merge_write(info, old, patched, subresource)
        return self._finish_write(info, old_entry, old, new, validate, options, subresource)

    def _finish_write(
        self,
        info: ResourceInfo,
        old_entry: Entry,
        old: dict[str, Any],
        new: dict[str, Any],
        validate: bool,
        options: WriteOptions | None = None,
        subresource: str | None = None,
    ) -> dict[str, Any]:
        meta = new.setdefault("metadata", {})
        admission.refuse_new_finalizers(info, old, new)
        if validate:
            # Before generation and the no-op check: a PUT that only omits defaulted fields changes nothing.
            admission.admit(self.validator, info, new, old, options or WriteOptions(), subresource)
        if info.generation:
            meta["generation"] = admission.next_generation(old, new)
        if admission.is_no_op(old, new):
            return old  # a no-op write: no new resourceVersion, no event, like the real API (dry run too)
        crd_info = crds.established(self.validator, new, keep_status=True) if info.key == CRD_KEY else None
        if options is not None and options.dry_run:
            return admission.dry_result(info, new, old_entry.rv)
        # A pod in its grace period (deletionGracePeriodSeconds > 0) waits for its kubelet; a
        # namespace waits for the namespace controller to empty it (its spec.finalizers).
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and not meta.get("deletionGracePeriodSeconds")
            and not (info.key == "namespaces" and (new.get("spec") or {}).get("finalizers"))
        ):
            return self._remove(info, new, old_entry).load()
        if crd_info is not None:
            self.registry.add(crd_info)
        return self.storage.commit(info, new, MODIFIED, old_entry).load()

    def delete(
        self,
        resource: str,
        name: str,
        namespace: str | None = None,
        *,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
        policy: str | None = None,
    ) -> dict[str, Any]:
        """Delete an object; with finalizers it only gets a deletionTimestamp until they are emptied.

        Returns the object as last stored. Deleting a namespace does not cascade to its objects.
        A pod that a simulated kubelet runs (`pod_runs`) is deleted gracefully; what a delete
        does is `propagation.decide_delete`. `dry_run` answers the same and changes nothing.
        """
        info = self.registry.get(resource)
        old_entry = self.storage.entry(info, name, namespace)
        action, obj = propagation.decide_delete(
            info.key,
            old_entry.load(),
            now=self.clock.now(),
            grace_period_seconds=grace_period_seconds,
            policy=policy,
            pod_runs=self.pod_runs,
            finalizing_controllers=self.finalizing_controllers,
        )
        if action == "unchanged" or dry_run:
            return obj
        if action == "terminating":
            return self.storage.commit(info, obj, MODIFIED, old_entry).load()
        return self._remove(info, obj, old_entry).load()

    def _remove(self, info: ResourceInfo, obj: dict[str, Any], old_entry: Entry) -> Entry:
        entry = self.storage.commit(info, obj, DELETED, old_entry)
        if info.key == CRD_KEY:
            self._drop_crd(obj)
        return entry

    def _drop_crd(self, crd: dict[str, Any]) -> None:
        key = crds.served_key(crd)
        try:
            info = self.registry.get(key)
        except ApiError:
            return
        # The real API deletes every custom resource before the CRD goes; so do we, with events.
        for entry in list(self.storage.table(info).values()):
            self.storage.commit(info, entry.load(), DELETED, entry)
        self.storage.drop(key)
        self.registry.remove(key)

    # ---- eviction ----------------------------------------------------------------------------

    def evict(
        self, name: str, namespace: str, body: dict[str, Any] | None = None, *, dry_run: bool = False
    ) -> dict[str, Any]:
        """The pods/eviction subresource: delete the pod unless its PodDisruptionBudget forbids it.

        The budget's status is recomputed first (as the disruption controller would write it),
        the verdict is taken from it, and an eviction counted against the budget is recorded in
        `disruptedPods`, so a second eviction before the replacement is Ready is refused (429).
        `dry_run` (or `deleteOptions.dryRun: ["All"]` in the body) decides and answers, writing
        nothing (`eviction.py`).
        """
        return eviction.evict(self, name, namespace, body, dry_run=dry_run)


__all__ = ["ADDED", "DELETED", "MODIFIED", "Entry", "Store", "Watch", "format_timestamp"]
