"""The demo's node-mode exporters read NVML often enough, in simulated time, at any speed.

Aspects covered: the poll keeps every reading well inside the rules' heartbeat limit (in
simulated seconds) whatever the speed, and never polls slower than the exporter's default at
real time.
"""

from __future__ import annotations

import pytest

from demo.pipeline import nvml_poll_seconds
from exporter.settings import NvmlSettings
from rules.render import DEFAULT_CONFIG, load_config


@pytest.mark.parametrize("speed", [1.0, 2.0, 10.0, 20.0, 30.0, 60.0])
def test_readings_stay_well_inside_the_heartbeat_limit(speed: float) -> None:
    heartbeat = load_config(DEFAULT_CONFIG).device.heartbeat_limit.seconds  # simulated seconds
    simulated_gap = nvml_poll_seconds(speed) * speed
    # A reading at most every tenth of the limit: scrape and evaluation lag add to the age too.
    assert simulated_gap <= heartbeat / 10
    assert nvml_poll_seconds(speed) <= NvmlSettings.poll_seconds
