"""The storage of the simulated API server: the tables, the cluster-wide resourceVersion, commits
and their events, reads, the watch caches and the live watchers.

What a write means (admission, defaults, finalizers, a CRD's served kind) is the `Store`'s
(`store.py`), which carries every write out through `commit` here; this module never decides
whether a write is allowed, only keeps what was written and tells the watchers.

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
"""

from __future__ import annotations

from typing import Any

import orjson

from gpuhealth.clock import Clock
from simulator.apiserver.errors import bad_request, not_found
from simulator.apiserver.resources import Registry, ResourceInfo
from simulator.apiserver.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from simulator.apiserver.stored import Entry, fields_match, index
from simulator.apiserver.watch import ADDED, DELETED, Watch
from simulator.apiserver.watch_cache import LogEvent, WatchCache, WatchCacheSettings, state_at, too_large


class Storage:
    """Every stored object by resource, with one cluster-wide resourceVersion, and its watchers."""

    def __init__(
        self, clock: Clock, registry: Registry, settings: WatchCacheSettings, watch_queue_size: int
    ) -> None:
        self.clock = clock
        self.registry = registry
        self.watch_cache_settings = settings
        self._objects: dict[str, dict[tuple[str, str], Entry]] = {}
        self._rv = 0
        self._caches: dict[str, WatchCache] = {}
        self._watchers: dict[str, set[Watch]] = {}
        self._watch_queue_size = watch_queue_size

    def start_watch_caches(self) -> None:
        """The watch caches start now, as a real apiserver's do after its bootstrap: a watch or an
        exact list from before this version is 410 Expired (a client outliving a restart relists)."""
        self._caches = {
            info.key: WatchCache(self.watch_cache_settings, self._rv) for info in self.registry.all()
        }

    # ---- reading -----------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def table(self, info: ResourceInfo) -> dict[tuple[str, str], Entry]:
        """The resource's live table, by (namespace, name); only `commit` changes it."""
        return self._objects.setdefault(info.key, {})

    def _ns(self, info: ResourceInfo, namespace: str | None) -> str:
        if not info.namespaced:
            return ""
        if not namespace:
            raise bad_request(f"a namespace is required for namespaced resource {info.key}")
        return namespace

    def entry(self, info: ResourceInfo, name: str, namespace: str | None) -> Entry:
        """The stored entry, 404 NotFound when there is none."""
        entry = self.table(info).get((self._ns(info, namespace), name))
        if entry is None:
            raise not_found(info.plural, info.group, name)
        return entry

    def get(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        info = self.registry.get(resource)
        return self.entry(info, name, namespace).load()

    def get_entry(self, resource: str, name: str, namespace: str | None = None) -> Entry:
        """The stored entry (bytes and index) without parsing it; for the HTTP layer."""
        info = self.registry.get(resource)
        return self.entry(info, name, namespace)

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
        table = self.table(info)
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

    # ---- committing --------------------------------------------------------------------------

    def commit(self, info: ResourceInfo, obj: dict[str, Any], etype: str, old: Entry | None) -> Entry:
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
        table = self.table(info)
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

    def drop(self, key: str) -> None:
        """The resource is no longer served (its CRD is gone): its table, cache and watchers go."""
        self._objects.pop(key, None)
        self._caches.pop(key, None)
        for watcher in list(self._watchers.get(key, ())):
            watcher._end()
        self._watchers.pop(key, None)

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
