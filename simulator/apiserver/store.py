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

Why not kmock (evaluated): its Kubernetes emulator keeps objects as plain dicts with a fixed
resourceVersion placeholder, no optimistic concurrency (no 409 Conflict), no selectors and no
watch replay; gpuhealth's leases and observers depend on exactly those, so the store is ours.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import copy
import random
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from gpuhealth.clock import Clock
from simulator.apiserver import disruption, graceful, kinds, propagation
from simulator.apiserver.defaults import apply_defaults
from simulator.apiserver.errors import (
    ApiError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from simulator.apiserver.patch import apply_patch
from simulator.apiserver.resources import CRD_KEY, Registry, ResourceInfo, info_from_crd
from simulator.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    extract_fields,
    parse_field_selector,
    parse_label_selector,
    selector_from_label_selector_object,
)
from simulator.apiserver.validation import Validator, WriteOptions, decoding_error
from simulator.apiserver.values import invalid_value, quantity_problems, validate_object, validate_update
from simulator.apiserver.versions import KubernetesVersion
from simulator.apiserver.watch_cache import LogEvent, WatchCache, WatchCacheSettings, state_at, too_large

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"

DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_SERVER_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # the apiserver's alphabet for generateName suffixes


class Entry:
    """One stored object version: its bytes and the index fields selectors need. Immutable by use."""

    __slots__ = ("data", "fields", "labels", "name", "namespace", "rv")

    def __init__(
        self,
        namespace: str,
        name: str,
        rv: int,
        labels: dict[str, str] | None,
        fields: dict[str, str] | None,
        data: bytes,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self.rv = rv
        self.labels = labels
        self.fields = fields
        self.data = data

    def load(self) -> dict[str, Any]:
        obj: dict[str, Any] = orjson.loads(self.data)
        return obj


def format_timestamp(seconds: float) -> str:
    """RFC 3339 with second precision, as metav1.Time serializes."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = dict(obj.get("metadata") or {})
    meta.pop("resourceVersion", None)
    return {**obj, "metadata": meta}


class Watch:
    """A live watch: an async iterator of (event type, object) pairs.

    Replayed events (synthetic ADDED for a fresh watch, or retained events newer than the
    requested resourceVersion) come first, then live ones from a bounded queue. `close()` stops it;
    a watcher whose queue overflows is ended after what it already holds.
    """

    def __init__(
        self,
        store: Store,
        info: ResourceInfo,
        namespace: str | None,
        label_selector: LabelSelector,
        field_selector: FieldSelector,
        min_rv: int,
        maxsize: int,
    ) -> None:
        self._store = store
        self.info = info
        self._namespace = namespace
        self._labels = label_selector
        self._fields = field_selector
        self._min_rv = min_rv
        self._backlog: deque[tuple[str, Entry]] = deque()
        self._queue: asyncio.Queue[tuple[str, Entry] | None] = asyncio.Queue(maxsize=maxsize)
        self._stopped = False
        self._ended = False
        self.overflowed = False

    def _accepts(self, entry: Entry | None) -> bool:
        if entry is None:
            return False
        if self._namespace is not None and entry.namespace != self._namespace:
            return False
        if not self._labels.empty and not self._labels.matches(entry.labels or {}):
            return False
        return self._fields.empty or _fields_match(self._fields, entry)

    def _translate(self, etype: str, new: Entry, old: Entry | None) -> tuple[str, Entry] | None:
        # With selectors, an object moving into or out of the selection is seen as ADDED or DELETED.
        if etype == ADDED:
            return (ADDED, new) if self._accepts(new) else None
        if etype == DELETED:
            return (DELETED, new) if self._accepts(new) else None
        now, before = self._accepts(new), self._accepts(old)
        if now and before:
            return MODIFIED, new
        if now:
            return ADDED, new
        if before:
            return DELETED, new
        return None

    def _offer(self, event: LogEvent) -> None:
        if self._stopped or self._ended:
            return
        rv, _, etype, new, old = event
        if rv <= self._min_rv:
            return
        item = self._translate(etype, new, old)
        if item is None:
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            self.overflowed = True
            self._ended = True
            self._store._unregister(self)

    def close(self) -> None:
        """Stop the watch now; pending events are dropped."""
        if self._stopped:
            return
        self._stopped = True
        self._backlog.clear()
        self._store._unregister(self)
        # On a full queue the consumer is not waiting; it sees _stopped on its next get.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    def _end(self) -> None:
        """End after the events already queued (the resource went away)."""
        self._ended = True
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)

    @property
    def closed(self) -> bool:
        return self._stopped

    @property
    def backlog_rv(self) -> int:
        """The resourceVersion the replayed events bring a client up to; live events are newer."""
        return self._min_rv

    @property
    def in_backlog(self) -> bool:
        """Whether replayed events (synthetic ADDED or retained history) are still to come."""
        return bool(self._backlog)

    def pending(self) -> bool:
        """Whether an event is ready without waiting."""
        return bool(self._backlog) or not self._queue.empty()

    async def next_entry(self) -> tuple[str, Entry] | None:
        """The next (type, entry); None when the watch ended (wrap in `asyncio.timeout` to bound the wait)."""
        if self._stopped:
            return None
        if self._backlog:
            return self._backlog.popleft()
        if self._ended and self._queue.empty():
            return None
        item = await self._queue.get()
        if item is None or self._stopped:
            return None
        return item

    def __aiter__(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        while True:
            item = await self.next_entry()
            if item is None:
                return
            yield item[0], item[1].load()


def _field_value(entry: Entry, field: str) -> str:
    if field == "metadata.name":
        return entry.name
    if field == "metadata.namespace":
        return entry.namespace
    return (entry.fields or {}).get(field, "")


def _fields_match(selector: FieldSelector, entry: Entry) -> bool:
    for req in selector.requirements:
        value = _field_value(entry, req.field)
        if (value == req.value) != (req.op == "="):
            return False
    return True


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
        self.eviction_listeners: list[Callable[[dict[str, Any]], None]] = []
        """Called with the pod (as it was) after each eviction the subresource served (not dry
        runs): the demo journals evictions from here, a deletion alone cannot say it was one."""
        """Set by the simulated kubelets: whether one of them runs a pod (its DELETE is then graceful)."""
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
            if not fsel.empty and not _fields_match(fsel, entry):
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

    def _index(
        self, info: ResourceInfo, obj: dict[str, Any]
    ) -> tuple[dict[str, str] | None, dict[str, str] | None]:
        labels = (obj.get("metadata") or {}).get("labels") or None
        if labels is not None:
            labels = {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else None
        fields = extract_fields(obj, info.field_paths) if info.field_paths else None
        if info.key == "nodes" and fields is not None and "spec.unschedulable" not in fields:
            fields["spec.unschedulable"] = "false"
        return labels, fields or None

    def _commit(self, info: ResourceInfo, obj: dict[str, Any], etype: str, old: Entry | None) -> Entry:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        meta = obj["metadata"]
        labels, fields = self._index(info, obj)
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

    def _admit(
        self,
        info: ResourceInfo,
        new: dict[str, Any],
        old: dict[str, Any] | None,
        options: WriteOptions,
        subresource: str | None = None,
    ) -> None:
        """An API client's write as the apiserver takes it: decode checks, defaults, then validation.

        Unknown and duplicate fields follow `options.field_validation`; every field error of the
        schema and of the kind's value checks comes back as one 422 Invalid.
        """
        name = str((new.get("metadata") or {}).get("name", ""))
        problems = quantity_problems(new)
        if problems:
            raise decoding_error(info.kind, info.version, problems)
        if subresource is None:
            apply_defaults(info.key, new, create=old is None)
        causes = self.validator.schema_causes(info, new, options)
        if old is None:
            causes += validate_object(info.key, new)
        else:
            old_defaulted = copy.deepcopy(old)
            apply_defaults(info.key, old_defaulted, create=False)
            causes += validate_update(info.key, new, old_defaulted, subresource)
        if causes:
            raise invalid(info.kind, info.group, name, causes)

    def _dry_result(self, info: ResourceInfo, obj: dict[str, Any], rv: int | None) -> dict[str, Any]:
        """What a dry-run write answers: the object as it would be stored, at `rv` (None: no version yet)."""
        meta = obj.setdefault("metadata", {})
        if rv is None:
            meta.pop("resourceVersion", None)
        else:
            meta["resourceVersion"] = str(rv)
        ordered = {"apiVersion": info.api_version(), "kind": info.kind}
        ordered.update((k, v) for k, v in obj.items() if k not in ("apiVersion", "kind"))
        result: dict[str, Any] = orjson.loads(orjson.dumps(ordered))
        return result

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
        if not isinstance(obj, dict):
            raise bad_request("the body of the request must be a JSON object")
        if not isinstance(obj.get("metadata", {}), dict | None):
            raise bad_request("metadata must be an object")
        new: dict[str, Any] = copy.deepcopy(obj)
        meta: dict[str, Any] = new.get("metadata") or {}  # `"metadata": null` is no metadata
        new["metadata"] = meta
        if new.get("kind") not in (None, info.kind):
            raise bad_request(f"the kind {new.get('kind')!r} of the object does not match {info.kind!r}")
        if info.namespaced:
            body_ns = meta.get("namespace")
            ns = namespace or body_ns
            if namespace and body_ns and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            if not ns:
                raise bad_request(f"a namespace is required to create {info.key}")
            meta["namespace"] = ns
            if validate and ("", ns) not in self._table(self.registry.get("namespaces")):
                raise not_found("namespaces", "", ns)
        else:
            meta.pop("namespace", None)
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
            name = self._generate_name(info, meta.get("namespace", ""), prefix, rng)
            meta["name"] = name
        if not isinstance(name, str):
            raise invalid(
                info.kind, info.group, str(name), [("metadata.name", "Invalid value: must be a string")]
            )
        for key in (
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
            "resourceVersion",
        ):
            meta.pop(key, None)
        meta["uid"] = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = format_timestamp(self.clock.now())
        if info.generation:
            meta["generation"] = 1
        else:
            meta.pop("generation", None)
        new["apiVersion"] = info.api_version()
        new["kind"] = info.kind
        if validate:
            self._reset_status_on_create(info, new)
        if info.key == "namespaces":
            if new.get("spec") is None:
                new["spec"] = {}
            if isinstance(new["spec"], dict):
                new["spec"].setdefault("finalizers", [propagation.NAMESPACE_FINALIZER])
            if new.get("status") is None:
                new["status"] = {}
            if isinstance(new["status"], dict):  # anything else fails validation below
                new["status"].setdefault("phase", "Active")
        crd_info = None
        if info.key == CRD_KEY:
            crd_info = info_from_crd(new)
            self.validator.check_custom_schemas(crd_info, new)
            new["status"] = _crd_status(new)
        kinds.prepare_create(self, info, new)
        if validate:
            self._admit(info, new, None, options or WriteOptions())
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
            return self._dry_result(info, new, None)
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

    def _reset_status_on_create(self, info: ResourceInfo, obj: dict[str, Any]) -> None:
        if info.key == "pods":
            obj["status"] = {"phase": "Pending"}
        elif info.has_status and info.key not in ("nodes", "namespaces", CRD_KEY):
            obj.pop("status", None)

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
        rv = meta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != str(old_entry.rv):
            raise conflict(info.plural, info.group, name)
        new = self._merge_write(info, old, copy.deepcopy(obj), subresource)
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
            new = copy.deepcopy(new) if result is not None else new
            meta = new.setdefault("metadata", {})
            for key in ("name", "namespace", "uid", "creationTimestamp"):
                if key in old["metadata"]:
                    meta[key] = old["metadata"][key]
            meta.pop("resourceVersion", None)
            new["apiVersion"], new["kind"] = info.api_version(), info.kind
        else:
            new = self._merge_write(info, old, new, subresource)
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
        if not isinstance(patched, dict) or not isinstance(patched.get("metadata", {}), dict):
            raise invalid(info.kind, info.group, name, [("", "the patched object is not a JSON object")])
        pmeta = patched.setdefault("metadata", {})
        rv = pmeta.get("resourceVersion")
        if rv not in (None, "") and str(rv) != str(old_entry.rv):
            raise conflict(info.plural, info.group, name)
        for key in ("name", "namespace"):
            if pmeta.get(key) != old["metadata"].get(key):
                raise invalid(
                    info.kind,
                    info.group,
                    name,
                    [(f"metadata.{key}", invalid_value(pmeta.get(key), "field is immutable"))],
                )
        new = self._merge_write(info, old, patched, subresource)
        return self._finish_write(info, old_entry, old, new, validate, options, subresource)

    def _merge_write(
        self, info: ResourceInfo, old: dict[str, Any], incoming: dict[str, Any], subresource: str | None
    ) -> dict[str, Any]:
        """The object to store when `incoming` is written to the main resource or a subresource."""
        if subresource == "status":
            if not info.has_status:
                raise not_found(f"{info.plural}/status", info.group, str(old["metadata"]["name"]))
            new = copy.deepcopy(old)
            if incoming.get("status") is None:
                new.pop("status", None)
            else:
                new["status"] = incoming["status"]
            new["metadata"].pop("resourceVersion", None)
            return new
        if subresource is not None:
            raise ApiError(
                405, "MethodNotAllowed", f"subresource {subresource!r} of {info.key} cannot be written"
            )
        meta = incoming.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        for key in _SERVER_META:
            if key in old["metadata"]:
                meta[key] = old["metadata"][key]
            else:
                meta.pop(key, None)
        meta["name"] = old["metadata"]["name"]
        if info.namespaced:
            meta["namespace"] = old["metadata"]["namespace"]
        meta.pop("resourceVersion", None)
        meta.pop("managedFields", None)
        if info.has_status:
            if "status" in old:
                incoming["status"] = old["status"]
            else:
                incoming.pop("status", None)
        incoming["apiVersion"], incoming["kind"] = info.api_version(), info.kind
        return incoming

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
        old_meta = old["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                raise invalid(
                    info.kind,
                    info.group,
                    old_meta["name"],
                    [
                        (
                            "metadata.finalizers",
                            "Forbidden: no new finalizers can be added if the object is being deleted",
                        )
                    ],
                )
        if validate:
            # Before generation and the no-op check: a PUT that only omits defaulted fields changes nothing.
            self._admit(info, new, old, options or WriteOptions(), subresource)
        if info.generation:
            generation = int(old_meta.get("generation") or 1)
            meta["generation"] = generation + 1 if _spec_part(new) != _spec_part(old) else generation
        if _without_rv(new) == _without_rv(old):
            return old  # a no-op write: no new resourceVersion, no event, like the real API (dry run too)
        if info.key == CRD_KEY:
            crd_info = info_from_crd(new)
            self.validator.check_custom_schemas(crd_info, new)
            new["status"] = {**(new.get("status") or {}), **_crd_status(new)}
        else:
            crd_info = None
        if options is not None and options.dry_run:
            return self._dry_result(info, new, old_entry.rv)
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
        A pod that a simulated kubelet runs (`pod_runs`) is deleted gracefully (`graceful`).
        `dry_run` answers the same and changes nothing.
        """
        info = self.registry.get(resource)
        old_entry = self._entry(info, name, namespace)
        obj = old_entry.load()
        if info.key == "pods" and self.pod_runs is not None:
            action, obj = graceful.delete_pod(obj, grace_period_seconds, self.clock.now(), self.pod_runs)
            if action == "unchanged":
                return obj
            if action == "terminating":
                if dry_run:
                    return obj
                return self._commit(info, obj, MODIFIED, old_entry).load()
        meta = obj["metadata"]
        if self.finalizing_controllers and not meta.get("deletionTimestamp"):
            if info.key == "namespaces" and (obj.get("spec") or {}).get("finalizers"):
                # The namespace controller empties it, then removes the finalizer and the namespace.
                meta["deletionTimestamp"] = format_timestamp(self.clock.now())
                obj["status"] = {**(obj.get("status") or {}), "phase": "Terminating"}
                meta.pop("resourceVersion", None)
                return self._commit(info, obj, MODIFIED, old_entry).load()
            finalizer = propagation.deletion_finalizer(info.key, policy)
            if finalizer is not None and finalizer not in (meta.get("finalizers") or ()):
                meta["finalizers"] = [*(meta.get("finalizers") or ()), finalizer]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return obj
            meta["deletionTimestamp"] = format_timestamp(self.clock.now())
            meta["deletionGracePeriodSeconds"] = 0
            if dry_run:
                return obj
            meta.pop("resourceVersion", None)
            return self._commit(info, obj, MODIFIED, old_entry).load()
        if dry_run:
            return obj
        return self._remove(info, obj, old_entry).load()

    def _remove(self, info: ResourceInfo, obj: dict[str, Any], old_entry: Entry) -> Entry:
        entry = self._commit(info, obj, DELETED, old_entry)
        if info.key == CRD_KEY:
            self._drop_crd(obj)
        return entry

    def _drop_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        key = f"{names.get('plural')}.{spec.get('group')}"
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
            watch = Watch(self, info, ns, lsel, fsel, self._rv, self._watch_queue_size)
            entries, _ = self.list_entries(resource, ns, label_selector=lsel, field_selector=fsel)
            watch._backlog.extend((ADDED, e) for e in entries)
        else:
            try:
                start = int(str(resource_version))
            except ValueError as exc:
                raise bad_request(f"invalid resourceVersion {resource_version!r}") from exc
            replay = self.events_since(info.key, start)
            watch = Watch(self, info, ns, lsel, fsel, max(start, self._rv), self._watch_queue_size)
            for event in replay:
                item = watch._translate(event[2], event[3], event[4])
                if item is not None:
                    watch._backlog.append(item)
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
        `dry_run` (or `deleteOptions.dryRun: ["All"]` in the body) decides and answers, writing nothing.
        """
        pods = self.registry.get("pods")
        pod = self._entry(pods, name, namespace).load()
        if body is not None and not isinstance(body, dict):
            raise bad_request("the eviction body must be a JSON object")
        options = (body or {}).get("deleteOptions") or {}
        if not isinstance(options, dict):
            raise bad_request("deleteOptions must be an object")
        flags = options.get("dryRun") or []
        if not isinstance(flags, list) or any(f != "All" for f in flags):
            raise invalid(
                "Eviction", "policy", name, [("deleteOptions.dryRun", f"Unsupported value: {flags!r}")]
            )
        dry_run = dry_run or bool(flags)
        labels = (pod["metadata"].get("labels")) or {}
        pdb_info = self.registry.get("poddisruptionbudgets.policy")
        matching: list[tuple[Entry, dict[str, Any]]] = []
        for entry in self._table(pdb_info).values():
            if entry.namespace != namespace:
                continue
            pdb = entry.load()
            selector = (pdb.get("spec") or {}).get("selector")
            if selector is None:
                continue  # policy/v1: a null selector selects no pods
            if selector_from_label_selector_object(selector).matches(labels):
                matching.append((entry, pdb))
        if len(matching) > 1:
            raise ApiError(
                500,
                "InternalError",
                "This pod has more than one PodDisruptionBudget, "
                "which the eviction subresource does not support.",
            )
        if matching and not disruption.ignores_budgets(pod):
            entry, pdb = matching[0]
            pdb["status"] = self._record_budget(pdb_info, entry, pdb, dry_run=dry_run)
            verdict = disruption.eviction_verdict(pdb, pod)
            if not verdict.allowed:
                if verdict.code == 429:
                    raise ApiError(
                        429,
                        "TooManyRequests",
                        verdict.message,
                        details={"causes": [{"reason": "DisruptionBudget", "message": verdict.cause}]},
                    )
                raise ApiError(verdict.code, "Forbidden", verdict.message)
            if verdict.record and not dry_run:
                stamp = format_timestamp(self.clock.now())
                counted = disruption.record_eviction(pdb["status"], name, stamp)

                def spend(obj: dict[str, Any]) -> None:
                    obj["status"] = counted

                self.mutate(pdb_info.key, entry.name, entry.namespace, spend, subresource="status")
        grace = options.get("gracePeriodSeconds")
        if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int)):
            raise bad_request(f"deleteOptions.gracePeriodSeconds must be an integer, got {grace!r}")
        if not dry_run:
            self.delete("pods", name, namespace, grace_period_seconds=grace)
            for listener in list(self.eviction_listeners):
                listener(pod)
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _budget_pods(self, namespace: str, selector: dict[str, Any]) -> builtins.list[dict[str, Any]]:
        sel = selector_from_label_selector_object(selector)
        return [
            p.load()
            for p in self._table(self.registry.get("pods")).values()
            if p.namespace == namespace and sel.matches(p.labels or {})
        ]

    def _get_or_none(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.get(resource, name, namespace)
        except ApiError:
            return None

    def _record_budget(
        self, info: ResourceInfo, entry: Entry, pdb: dict[str, Any], *, dry_run: bool = False
    ) -> dict[str, Any]:
        """Recompute the PDB's status from the pods and their controllers; write it when it changed."""
        selector = (pdb.get("spec") or {}).get("selector")
        pods = self._budget_pods(entry.namespace, selector) if selector is not None else []
        status = disruption.compute_status(pdb, pods, self._get_or_none, self.clock.now(), format_timestamp)
        if status != (pdb.get("status") or {}) and not dry_run:

            def apply(obj: dict[str, Any]) -> None:
                obj["status"] = status

            self.mutate(info.key, entry.name, entry.namespace, apply, subresource="status")
        return status


def _crd_status(crd: dict[str, Any]) -> dict[str, Any]:
    names = (crd.get("spec") or {}).get("names") or {}
    stored = [
        v["name"]
        for v in (crd.get("spec") or {}).get("versions") or ()
        if isinstance(v, dict) and v.get("storage")
    ]
    return {
        "conditions": [
            {
                "type": "NamesAccepted",
                "status": "True",
                "reason": "NoConflicts",
                "message": "no conflicts found",
            },
            {
                "type": "Established",
                "status": "True",
                "reason": "InitialNamesAccepted",
                "message": "the initial names have been accepted",
            },
        ],
        "acceptedNames": dict(names),
        "storedVersions": stored,
    }


__all__ = ["ADDED", "DELETED", "MODIFIED", "Entry", "Store", "Watch", "format_timestamp"]
