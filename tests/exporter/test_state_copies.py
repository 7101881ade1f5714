"""The state's hot-path copies of a device, compiled from `DeviceState`'s fields.

Aspects covered: each copy equals `dataclasses.replace` with the changes it names, for any
device; what each copy changes is what the directory's matching UPDATE writes (a status
change only STATUS fields, a pod or slice only IDENTITY and ALLOCATIONS fields, a
confirmation only `observed_at`), so no change is lost between memory and the file; an
identity attribute a pod leaves empty keeps the device's; a copy naming a field the
dataclass lacks fails at import.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter.snapshot import (
    ALLOCATIONS,
    DEVICE_FIELDS,
    HEALTH_VALUES,
    IDENTITY,
    MOVES,
    STATUS,
    STATUS_SOURCES,
    Allocation,
    DeviceState,
    DriverTaint,
)
from exporter.state_copies import changed as _changed
from exporter.state_copies import compile_copy as _copy
from exporter.state_copies import held as _held
from exporter.state_copies import observed as _observed
from exporter.state_copies import with_holders as _with_holders
from exporter.state_model import DeviceMeta as _Meta
from tests.exporter.fixtures.strategies import allocations, devices, driver_taints, finite

_maybe = st.just("") | st.text(max_size=8)
metas = st.builds(_Meta, _maybe, _maybe, _maybe, _maybe, _maybe)
"""What a pod's entries say of a device's identity; empty: they do not say."""


def moved(before: DeviceState, after: DeviceState) -> set[str]:
    return {f.name for f in DEVICE_FIELDS if getattr(before, f.name) != getattr(after, f.name)}


def fields_moved_by(*moves: str) -> set[str]:
    return {f.name for f in DEVICE_FIELDS if f.metadata.get(MOVES) in moves}


@given(devices, finite)
def test_a_confirmation_moves_only_observed_at(device: DeviceState, at: float) -> None:
    copy = _observed(device, at)
    assert copy == dataclasses.replace(device, observed_at=at)
    assert moved(device, copy) <= {"observed_at"}


@given(devices, st.sampled_from(HEALTH_VALUES), st.text(max_size=8), finite, st.sampled_from(STATUS_SOURCES))
def test_a_status_change_moves_only_status_fields(
    device: DeviceState, health: str, message: str, at: float, source: str
) -> None:
    copy = _changed(device, health, message, at, at, source)
    assert copy == dataclasses.replace(
        device,
        health=health,
        message=message,
        status_version=device.status_version + 1,
        changed_at=at,
        observed_at=at,
        unknown_since=at,
        source=source,
    )
    # The source moves with the holders (ALLOCATIONS), and with a status a new source gives.
    assert moved(device, copy) <= fields_moved_by(STATUS) | {"source"}


@given(devices, allocations, metas, driver_taints)
def test_pods_and_slices_move_only_identity_and_allocations(
    device: DeviceState, held: tuple[Allocation, ...], meta: _Meta, taints: tuple[DriverTaint, ...]
) -> None:
    copy = _held(device, held, meta, taints)
    assert copy == dataclasses.replace(
        device,
        allocations=held,
        driver_taints=taints,
        uuid=meta.uuid or device.uuid,
        driver=meta.driver or device.driver,
        pool=meta.pool or device.pool,
        device_name=meta.device_name or device.device_name,
        resource=meta.resource or device.resource,
    )
    assert moved(device, copy) <= fields_moved_by(IDENTITY, ALLOCATIONS)
    assert _with_holders(device, held, "nvml") == dataclasses.replace(device, allocations=held, source="nvml")
    assert moved(device, _with_holders(device, held, "nvml")) <= fields_moved_by(ALLOCATIONS)


def test_a_copy_of_a_field_the_device_lacks_is_refused() -> None:
    with pytest.raises(TypeError, match=r"_bad changes fields DeviceState does not have: \['colour'\]"):
        _copy("_bad", "colour", colour="colour")
