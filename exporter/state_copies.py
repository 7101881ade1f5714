"""Hot-path copies of a `DeviceState`, compiled from its fields (`exporter.snapshot.compiled_function`).

They cost what hand-written ones do and a new field is copied without touching them. Each names
only the fields it changes. They fill the slots of a new instance through the slots' own
descriptors instead of calling the frozen dataclass's `__init__`, whose
`object.__setattr__(self, "name", ...)` per field looks each slot up by name: 0.68 us against
1.26 us a copy (a pod replacement folds 8, a scrape after every pod confirmed folds all 80,000).
What `__init__` would add is nothing: no defaults apply (every field is given) and there is no
`__post_init__`, which the check below keeps true.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.snapshot import DEVICE_FIELDS, Allocation, DeviceState, DriverTaint, compiled_function
from exporter.state_model import DeviceMeta

if "__post_init__" in vars(DeviceState):
    raise TypeError("DeviceState has a __post_init__: the compiled copies below would skip it")

_SLOT_SETTERS = {f"_set_{f.name}": getattr(DeviceState, f.name).__set__ for f in DEVICE_FIELDS}


def compile_copy(name: str, params: str, **changes: str) -> Callable[..., Any]:
    """`name(d, params)`: `d` with `changes` (field name -> expression), every other field kept."""
    unknown = changes.keys() - {f.name for f in DEVICE_FIELDS}
    if unknown:
        raise TypeError(f"{name} changes fields DeviceState does not have: {sorted(unknown)}")
    body = [
        "copy = _new(DeviceState)",
        *(f"_set_{f.name}(copy, {changes.get(f.name, f'd.{f.name}')})" for f in DEVICE_FIELDS),
    ]
    return compiled_function(name, f"d, {params}", "copy", body, _new=object.__new__, **_SLOT_SETTERS)


observed: Callable[[DeviceState, float], DeviceState] = compile_copy("observed", "at", observed_at="at")
"""The device confirmed at `at`."""

changed: Callable[[DeviceState, str, str, float, float | None, str], DeviceState] = compile_copy(
    "changed",
    "health, message, at, unknown_since, source",
    health="health",
    message="message",
    status_version="d.status_version + 1",
    changed_at="at",
    observed_at="at",
    unknown_since="unknown_since",
    source="source",
)
"""The device with a new (health, message) from `source` observed at `at`: the next status version."""

sourced: Callable[[DeviceState, str], DeviceState] = compile_copy("sourced", "source", source="source")
"""The device with another source vouching for the same status."""

with_holders: Callable[[DeviceState, tuple[Allocation, ...], str], DeviceState] = compile_copy(
    "with_holders", "allocations, source", allocations="allocations", source="source"
)
"""The device with new holders and whoever vouches for its status now (one copy for both)."""

held: Callable[[DeviceState, tuple[Allocation, ...], DeviceMeta, tuple[DriverTaint, ...]], DeviceState] = (
    compile_copy(
        "held",
        "allocations, meta, taints",
        allocations="allocations",
        driver_taints="taints",
        **{name: f"meta.{name} or d.{name}" for name in DeviceMeta._fields},
    )
)
"""The device with new allocations and identity attributes (empty ones keep the old)."""
