"""The exporter command tunes Python's cyclic collector for its event path.

Aspects: `tune_collector` sets the young generation's threshold from the settings and keeps
the older generations' as they were; a threshold the collector cannot run with is refused
when the settings are built.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from exporter.cli import tune_collector
from exporter.settings import ExporterSettings
from gpuhealth.fields import SettingsError


@pytest.fixture
def restored_collector() -> Iterator[None]:
    saved = gc.get_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*saved)


@pytest.mark.usefixtures("restored_collector")
def test_the_young_threshold_comes_from_the_settings_and_the_older_ones_stay() -> None:
    gc.set_threshold(700, 11, 12)
    tune_collector(ExporterSettings(collector_young_threshold=5_000))
    assert gc.get_threshold() == (5_000, 11, 12)
    tune_collector(ExporterSettings())
    assert gc.get_threshold() == (ExporterSettings.collector_young_threshold, 11, 12)


@pytest.mark.parametrize("value", [0, -1, 2.5])
def test_a_threshold_the_collector_cannot_run_with_is_refused(value: float) -> None:
    with pytest.raises(SettingsError, match="collector_young_threshold"):
        ExporterSettings(collector_young_threshold=value)  # type: ignore[arg-type]
