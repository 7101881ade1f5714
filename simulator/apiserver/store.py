"""The object store of the simulated cluster: the one owner of every API object and of the
cluster-wide resourceVersion.

Both halves of the simulator write here: the HTTP layer (`app.py`) on behalf of API clients, and
the simulated kubelets in-process (`mutate`, `create(..., validate=False)`). All calls run on one
asyncio event loop thread; the store is not thread-safe.

Layout, chosen so a 10,000-node x 8-GPU fleet fits in well under 2 GiB: each object is kept as
its orjson bytes plus a small index (`Entry`: namespace, name, resourceVersion, labels and the
selectable fields). Reads parse the bytes afresh, so callers never alias stored state, and the
HTTP layer serves lists and watch events by joining the stored bytes without parsing them.
Stored objects always begin with `{"apiVersion":..., "kind":...}`, so serving another version of
the same group (resource.k8s.io v1beta2) only swaps that prefix.

Watches: every write appends (rv, resource, type, new entry, old entry) to that resource's watch
cache (`watch_cache.py`: a window bounded by count and age) and offers it to the live watchers of
that resource. A watch from a resourceVersion replays the retained events newer than it; one
older than the window (or than the store itself) gets 410 Expired. The same window serves lists
at an exact older resourceVersion (continued pages are a snapshot). Each watcher has a bounded
queue; a watcher that falls that far behind is ended, as the real apiserver ends slow watchers,
and its client re-lists.

What this module owns is storage: the tables, the resourceVersion, commits and their events,
reads, and carrying out writes, deletes and watches. What a write means lives beside it, one
concern per module: `admission.py` (the object a create or update makes, defaults and
validation), `crds.py` (what a CRD serves and its status), `propagation.decide_delete` (what a
DELETE does: grace periods, finalizers, a namespace's Terminating phase), `eviction.py` (the
PodDisruptionBudget-aware eviction subresource), `kinds.py` (what a few built-in kinds get on
create), `watch.py` (one watcher's events) and `stored.py` (an entry and its index).

Why not kmock (evaluated): its Kubernetes emulator keeps objects as plain dicts with a fixed
resourceVersion placeholder, no optimistic concurrency (no 409 Conflict), no selectors and no
watch replay; gpuhealth's leases and observers depend on exactly those, so the store is ours.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import orjson

from gpuhealth.clock import Clock
from simulator.apiserver import admission, crds, eviction, kinds, propagation
from simulator.apiserver.defaults import apply_defaults
from simulator.apiserver.errors import ApiError, already_exists, bad_request, invalid, not_found
from simulator.apiserver.patch import apply_patch
from simulator.apiserver.resources import CRD_KEY, Registry, ResourceInfo
from simulator.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from simulator.apiserver.stored import Entry, fields_match, format_timestamp, index
from simulator.apiserver.validation import Validator, WriteOptions
from simulator.apiserver.values import allocated_resources_status_causes
from simulator.apiserver.versions import KubernetesVersion
from simulator.apiserver.watch import ADDED, DELETED, MODIFIED, Watch
from simulator.apiserver.watch_cache import LogEvent, WatchCache, WatchCacheSettings, state_at, too_large

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's alphabet for generateName suffixes


class Store:
    """All objects of the simulated cluster, with one cluster-wide resourceVersion."""

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
        self._objects: dict[str, dict[tuple[str, str], Entry]] = {}
        self._rv = 0
        settings = watch_cache or WatchCacheSettings()
        if watch_window is not None:
            settings = WatchCacheSettings(max(1, watch_window), settings.max_age_seconds)
        self.watch_cache_settings = settings
        self._caches: dict[str, WatchCache] = {}
        self._watchers: dict[str, set[Watch]] = {}
        self._watch_queue_size = watch_queue_size
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
        # The watch caches start now, as a real apiserver's do after its bootstrap: a watch or an
        # exact list from before this version is 410 Expired (a client outliving a restart relists).
        self._caches = {info.key: WatchCache(settings, self._rv) for info in self.registry.all()}

    # ---- reading -----------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    @property
    def rng(self) -> random.Random:
        """The store's seeded random source (uids, generated names, service IPs): runs repeat."""
        return self._rng

    def _table(self, info: ResourceInfo) -> dict[tuple[str, str], Entry]:
        return self._objects.setdefault(info.key, {})

    def _ns(self, info: ResourceInfo, namespace: str | None) -> str:
        if not info.namespaced:
            return ""
        if not namespace:
            raise bad_request(f"a namespace is required for namespaced resource {info.key}")
        return namespace

    def _entry(self, info: ResourceInfo, name: str, namespace: str | None) -> Entry:
        entry = self._table(info).get((self._ns(info, namespace), name))
        if entry is None:
            raise not_found(info.plural, info.group, name)
        return entry

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        info = self.registry.get(resource)
        return self._entry(info, name, namespace).load()

    def get_entry(self, resource: str, name: str, namespace: str | None = None) -> Entry:
        """The stored entry (bytes and index) without parsing it; for the HTTP layer."""
        info = self.registry.get(resource)
        return self._entry(info, name, namespace)

    def _cache(self, key: str) -> WatchCache:
        cache = self._caches.get(key)
        if cache is None:
            # A resource's cache starts with its first event or read: nothing before it is known.
            cache = self._caches[key] = WatchCache(self.watch_cache_settings, self._rv)
        return cache

    def events_since(self, resource: str, rv: int) -> list[LogEvent]:
        """The retained events of `resource` newer than `rv`; 410 Expired when the window lost some,
        504 ResourceVersionTooLarge when `rv` is in the future."""
        if rv > self._rv:
            raise too_large(rv, self._rv)
        cache = self._cache(self.registry.get(resource).key)
        cache.expire(self.clock.monotonic())
        return cache.since(rv)

    def list_entries(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | LabelSelector | None = None,
        field_selector: str | FieldSelector | None = None,
        at: int | None = None,
    ) -> tuple[list[Entry], str]:
        """Matching entries in (namespace, name) order, and the list resourceVersion.

        `at`: the state at that exact resourceVersion, rebuilt from the watch cache (410 Expired
        once the window no longer covers it, 504 for a future one); None: the current state.
        """
        info = self.registry.get(resource)
        lsel = (
            label_selector
            if isinstance(label_selector, LabelSelector)
            else parse_label_selector(label_selector)
        )
        fsel = (
            field_selector
            if isinstance(field_selector, FieldSelector)
            else parse_field_selector(field_selector, info.selectable_fields)
        )
        out: list[Entry] = []
        ns = namespace if info.namespaced and namespace else None
        table = self._table(info)
        if at is not None and at != self._rv:
            table = state_at(table, self.events_since(info.key, at))
        for entry in table.values():
            if ns is not None and entry.namespace != ns:
                continue
            if not lsel.empty and not lsel.matches(entry.labels or {}):
                continue
            if not fsel.empty and not fields_match(fsel, entry):
                continue
            out.append(entry)
        out.sort(key=lambda e: (e.namespace, e.name))
        return out, str(self._rv if at is None else at)

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        entries, rv = self.list_entries(
            resource, namespace, label_selector=label_selector, field_selector=field_selector
        )
        return [e.load() for e in entries], rv

    # ---- writing -----------------------------------------------------------------------------

    def _commit(self, info: ResourceInfo, obj: dict[str, Any], etype: str, old: Entry | None) -> Entry:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        meta = obj["metadata"]
        labels, fields = index(info, obj)
        # apiVersion and kind first: lets the HTTP layer swap the version prefix without parsing.
        ordered = {"apiVersion": info.api_version(), "kind": info.kind}
        ordered.update((k, v) for k, v in obj.items() if k not in ("apiVersion", "kind"))
        try:
            # orjson hands back a buffer with spare capacity (8 KiB for a 2 KiB pod, measured); an
            # exact-size copy makes stored objects 4x smaller.
            data = bytes(memoryview(orjson.dumps(ordered)))
        except TypeError as exc:
            self._rv -= 1
            raise bad_request(f"object is not serializable as JSON: {exc}") from exc
        entry = Entry(
            meta.get("namespace", "") if info.namespaced else "", meta["name"], self._rv, labels, fields, data
        )
        table = self._table(info)
        key = (entry.namespace, entry.name)
        if etype == DELETED:
            table.pop(key, None)
        else:
            table[key] = entry
        self._emit((self._rv, info.key, etype, entry, old))
        return entry

    def _emit(self, event: LogEvent) -> None:
        self._cache(event[1]).append(event, self.clock.monotonic())
        for watcher in list(self._watchers.get(event[1], ())):
            watcher._offer(event)

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
            and ("", meta["namespace"]) not in self._table(self.registry.get("namespaces"))
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
        table = self._table(info)
        if (meta.get("namespace", "") if info.namespaced else "", name) in table:
            raise already_exists(info.plural, info.group, name)
        if info.namespaced:
            ns_entry = self._table(self.registry.get("namespaces")).get(("", meta["namespace"]))
            if ns_entry is not None and b'"phase":"Terminating"' in ns_entry.data:
                raise propagation.namespace_terminating(info.plural, info.group, name, meta["namespace"])
        if dry_run:
            return admission.dry_result(info, new, None)
        if crd_info is not None:
            self.registry.add(crd_info)
        entry = self._commit(info, new, ADDED, None)
        kinds.after_create(self, info, new)
        return entry.load()

    def _generate_name(self, info: ResourceInfo, namespace: str, prefix: str, rng: random.Random) -> str:
        table = self._table(info)
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
        old_entry = self._entry(info, name, meta.get("namespace"))
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
        old_entry = self._entry(info, name, namespace)
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
        old_entry = self._entry(info, name, namespace)
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
        return self._commit(info, new, MODIFIED, old_entry).load()

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
        old_entry = self._entry(info, name, namespace)
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
            return self._commit(info, obj, MODIFIED, old_entry).load()
        return self._remove(info, obj, old_entry).load()

    def _remove(self, info: ResourceInfo, obj: dict[str, Any], old_entry: Entry) -> Entry:
        entry = self._commit(info, obj, DELETED, old_entry)
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
        for entry in list(self._table(info).values()):
            self._commit(info, entry.load(), DELETED, entry)
        self._objects.pop(key, None)
        self._caches.pop(key, None)
        for watcher in list(self._watchers.get(key, ())):
            watcher._end()
        self._watchers.pop(key, None)
        self.registry.remove(key)

    # ---- watching ----------------------------------------------------------------------------

    def watch(
        self,
        resource: str,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Watch:
        """Start a watch; ApiError 410 Expired when `resource_version` is older than the watch cache's
        window, 504 ResourceVersionTooLarge when it is newer than the store.

        Unset or "0": synthetic ADDED events for the current objects, then live events.
        Otherwise: the retained events newer than it, in order, then live events.
        """
        info = self.registry.get(resource)
        lsel = parse_label_selector(label_selector)
        fsel = parse_field_selector(field_selector, info.selectable_fields)
        ns = namespace if info.namespaced and namespace else None
        if resource_version in (None, "", "0"):
            watch = Watch(self._unregister, info, ns, lsel, fsel, self._rv, self._watch_queue_size)
            entries, _ = self.list_entries(resource, ns, label_selector=lsel, field_selector=fsel)
            watch.replay([(ADDED, e) for e in entries])
        else:
            try:
                start = int(str(resource_version))
            except ValueError as exc:
                raise bad_request(f"invalid resourceVersion {resource_version!r}") from exc
            replay = self.events_since(info.key, start)
            watch = Watch(
                self._unregister, info, ns, lsel, fsel, max(start, self._rv), self._watch_queue_size
            )
            watch.replay_log(replay)
        self._watchers.setdefault(info.key, set()).add(watch)
        return watch

    def _unregister(self, watch: Watch) -> None:
        watchers = self._watchers.get(watch.info.key)
        if watchers is not None:
            watchers.discard(watch)

    def watcher_count(self) -> int:
        return sum(len(w) for w in self._watchers.values())

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
