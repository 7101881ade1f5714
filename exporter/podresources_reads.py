"""What every pod-resources reader shares: one read, decoded; a failed read counted and logged.

Failure policy (as for the NVML readers): an answer that cannot be read is no verdict on any GPU.
`allocatable()` returns None, logged once when reads start failing and once when they recover,
and counted in `failures`; the exporter keeps the evidence it had. A subclass supplies
`_fetch()`: the `AllocatableResourcesResponse` message's bytes, or OSError saying why not.

Synchronous: call it from a worker thread (the observer's NVML poll).
"""

from __future__ import annotations

import logging
import threading

from exporter.podresources import Allocatable, PodResourcesError, decode_allocatable

log = logging.getLogger(__name__)


class CountingReader:
    """`PodResourcesSource.allocatable()` over a subclass's `_fetch()`, failures counted."""

    def __init__(self, node: str, source: str) -> None:
        self._node = node
        self._source = source
        self._lock = threading.Lock()
        self._failing = False
        self.failures = 0
        """Reads that gave no answer (the exporter's evidence stayed as it was)."""

    def allocatable(self) -> Allocatable | None:
        with self._lock:
            try:
                answer = decode_allocatable(self._fetch())
            except (OSError, PodResourcesError) as exc:
                self.failures += 1
                if not self._failing:
                    self._failing = True
                    log.warning(
                        "pod-resources of node %s (%s) unreadable: %s; idle GPUs keep their evidence",
                        self._node,
                        self._source,
                        exc,
                    )
                return None
            if self._failing:
                self._failing = False
                log.info("pod-resources of node %s (%s) answer again", self._node, self._source)
            return answer

    def _fetch(self) -> bytes:
        """The answer's message bytes; OSError when there is none."""
        raise NotImplementedError
