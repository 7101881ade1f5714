"""What every pod-resources reader shares: one read, decoded; a failed read counted and logged.

Failure policy (as for the NVML readers): an answer that cannot be read is no verdict on any GPU.
`allocatable()` and `assignments()` return None, logged once when reads of that method start
failing and once when they recover, and counted in `failures`; the exporter keeps the evidence it
had. A subclass supplies `_fetch(method)`: the answer's message bytes (`ALLOCATABLE`:
`AllocatableResourcesResponse`, `LIST`: `ListPodResourcesResponse`), or OSError saying why not;
or a `PodResourcesFetch` does, through `FetchingReader` (a reader the launcher plugs in,
`exporter.sources`).

Synchronous: call it from a worker thread (the observer's NVML poll).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

from exporter.podresources import (
    Allocatable,
    Assignments,
    PodResourcesError,
    decode_allocatable,
    decode_assignments,
)

log = logging.getLogger(__name__)

ALLOCATABLE, LIST = "GetAllocatableResources", "List"
"""The `v1.PodResourcesLister` methods read, by their gRPC names."""

_WHAT = {
    ALLOCATABLE: "idle GPUs keep their evidence",
    LIST: "pods without a device report keep the devices last listed",
}

T = TypeVar("T")


class CountingReader:
    """`PodResourcesSource` over a subclass's `_fetch(method)`, failures counted."""

    def __init__(self, node: str, source: str) -> None:
        self._node = node
        self._source = source
        self._lock = threading.Lock()
        self._failing: set[str] = set()
        self.failures = 0
        """Reads that gave no answer (the exporter's evidence stayed as it was)."""

    def allocatable(self) -> Allocatable | None:
        return self._read(ALLOCATABLE, decode_allocatable)

    def assignments(self) -> Assignments | None:
        return self._read(LIST, decode_assignments)

    def _read(self, method: str, decode: Callable[[bytes], T]) -> T | None:
        with self._lock:
            try:
                answer = decode(self._fetch(method))
            except (OSError, PodResourcesError) as exc:
                self.failures += 1
                if method not in self._failing:
                    self._failing.add(method)
                    log.warning(
                        "pod-resources %s of node %s (%s) unreadable: %s; %s",
                        method,
                        self._node,
                        self._source,
                        exc,
                        _WHAT[method],
                    )
                return None
            if method in self._failing:
                self._failing.discard(method)
                log.info("pod-resources %s of node %s (%s) answer again", method, self._node, self._source)
            return answer

    def _fetch(self, method: str) -> bytes:
        """The answer's message bytes; OSError when there is none."""
        raise NotImplementedError


class PodResourcesFetch(Protocol):
    """One node's pod-resources answers as message bytes, by the method's gRPC name."""

    @property
    def where(self) -> str:
        """How log lines name the reader (an address)."""
        ...

    def fetch(self, method: str) -> bytes:
        """The answer's message bytes; OSError when there is none."""
        ...

    def close(self) -> None: ...


class FetchingReader(CountingReader):
    """`PodResourcesSource` over a `PodResourcesFetch`, failures counted."""

    def __init__(self, node: str, fetcher: PodResourcesFetch) -> None:
        super().__init__(node, fetcher.where)
        self._fetcher = fetcher

    def close(self) -> None:
        self._fetcher.close()

    def _fetch(self, method: str) -> bytes:
        return self._fetcher.fetch(method)
