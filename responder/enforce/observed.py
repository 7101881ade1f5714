"""What one reconcile pass reads of the cluster for enforcement: read once, shared by its records.

An adapter over the API, scoped to one pass and dropped at its end (never a cache across passes:
the reconciler's docstring says why a fresh read per pass beats one kept by a watch). It holds
the devices the ResourceSlices publish, every object of the resources the backends read by name
(`Backend.listed`: the DeviceTaintRules, one paged list), and the nodes the pass's records stand
on: one paged list of the nodes when they are many (`ReconcilerSettings.list_nodes_from`), else
each read on first use. A pass over 10,000 records therefore makes a handful of lists instead of a
GET per record (`bench/results.md`, "responder_pass").

The pass's own writes are applied over it (`wrote`), so a record decided after another wrote the
same object (two devices of one node, a hand-over) sees that write. An executor whose conditional
write loses on a stale object reads it afresh (`reread`) before its next attempt, so an object
older than the pass costs one 409, never a lost change.

Outside a pass (`Observed(client)`, nothing listed) every object is read when first asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuhealth.kube.api import Api
from gpuhealth.kube.errors import NotFound
from gpuhealth.kube.resources import Resource
from gpuhealth.kube.slices import SliceDevice


class Observed:
    def __init__(
        self,
        client: Api,
        *,
        slices: Sequence[SliceDevice] = (),
        listed: Mapping[Resource, Mapping[str, dict[str, Any]]] | None = None,
        known: Mapping[Resource, Mapping[str, dict[str, Any] | None]] | None = None,
    ) -> None:
        """`listed`: every object of a resource, by name (a name absent is an object absent).
        `known`: some objects of a resource by name (None: absent); others are read when asked."""
        self._client = client
        self.slices = list(slices)
        """Every device the cluster's ResourceSlices publish."""
        self._complete = frozenset((listed or {}).keys())
        self._objects: dict[Resource, dict[str, dict[str, Any] | None]] = {
            resource: dict(objects) for resource, objects in {**(known or {}), **(listed or {})}.items()
        }
        self.reads = 0
        """Objects read one by one (GET) so far: what the lists did not answer."""

    def get(self, resource: Resource, name: str) -> dict[str, Any] | None:
        """The object as this pass saw it (its own writes applied); None: it does not exist."""
        objects = self._objects.setdefault(resource, {})
        if name in objects:
            return objects[name]
        if resource in self._complete:
            return None
        return self.reread(resource, name)

    def reread(self, resource: Resource, name: str) -> dict[str, Any] | None:
        """The object read from the API now (after a write lost to a newer one), kept for the pass."""
        self.reads += 1
        try:
            found: dict[str, Any] | None = self._client.get(resource, name)
        except NotFound:
            found = None
        self._objects.setdefault(resource, {})[name] = found
        return found

    def wrote(self, resource: Resource, name: str, obj: dict[str, Any] | None) -> None:
        """The pass's own write: `obj` as the API answered it (None: deleted)."""
        self._objects.setdefault(resource, {})[name] = obj
