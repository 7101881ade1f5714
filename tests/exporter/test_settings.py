"""The exporter's settings tree (exporter.settings) checks itself when built.

Aspects: defaults build; each class refuses a value the exporter cannot run with, naming
the class and field (a zero NVML poll period would spin its loop, a zero flush interval the
processor; a shard in node mode); sim:URL NVML needs node mode; the server settings are the core's with the
exporter's port.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from exporter.settings import (
    DEFAULT_PORT,
    DirectorySettings,
    ExporterServerSettings,
    ExporterSettings,
    NvmlSettings,
    ObserverSettings,
)
from exporter.sharding import Shard
from gpuhealth.fields import SettingsError
from gpuhealth.http import ServerSettings
from gpuhealth.kube.backoff import BackoffSettings


def test_defaults_build_and_the_server_is_the_core_s_on_the_exporter_port() -> None:
    settings = ExporterSettings()
    assert isinstance(settings.server, ServerSettings)
    assert (settings.server.host, settings.server.port, DEFAULT_PORT) == ("0.0.0.0", 9842, 9842)


@pytest.mark.parametrize(
    ("cls", "kwargs", "field"),
    [
        (NvmlSettings, {"poll_seconds": 0}, "poll_seconds"),
        (NvmlSettings, {"poll_seconds": math.nan}, "poll_seconds"),
        (NvmlSettings, {"source": "cuda"}, "source"),
        (NvmlSettings, {"source": "sim:"}, "source"),
        (ObserverSettings, {"flush_interval_seconds": 0.0}, "flush_interval_seconds"),
        (ObserverSettings, {"watch_timeout_seconds": 0}, "watch_timeout_seconds"),
        (ObserverSettings, {"watch_timeout_seconds": 1.5}, "watch_timeout_seconds"),
        (ObserverSettings, {"list_page_size": 0}, "list_page_size"),
        (ObserverSettings, {"connect_timeout_seconds": math.inf}, "connect_timeout_seconds"),
        (ObserverSettings, {"node_name": ""}, "node_name"),
        (ObserverSettings, {"slice_health_drivers": ("",)}, "slice_health_drivers"),
        (ObserverSettings, {"node_name": "n", "shard": Shard(1, 2)}, "shard"),  # node mode is one node
        (ObserverSettings, {"slice_health_drivers": (" gpu.nvidia.com",)}, "slice_health_drivers"),
        (BackoffSettings, {"initial_seconds": 0}, "initial_seconds"),
        (BackoffSettings, {"max_seconds": 0.1}, "max_seconds"),  # below the initial delay
        (BackoffSettings, {"factor": 0.5}, "factor"),
        (BackoffSettings, {"jitter": 1.5}, "jitter"),
        (DirectorySettings, {"change_flush_seconds": -1.0}, "change_flush_seconds"),
        (DirectorySettings, {"heartbeat_flush_seconds": math.nan}, "heartbeat_flush_seconds"),
        (DirectorySettings, {"path": ""}, "path"),
        (ExporterServerSettings, {"offload_min_devices": -1}, "offload_min_devices"),
        (ExporterServerSettings, {"port": 70000}, "port"),
    ],
)
def test_values_the_exporter_cannot_run_with_are_refused(
    cls: type, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(SettingsError, match=rf"{cls.__name__}\.{field}"):
        cls(**kwargs)


def test_simulated_nvml_needs_node_mode() -> None:
    with pytest.raises(SettingsError, match="node_name"):
        ExporterSettings(nvml=NvmlSettings(source="sim:http://127.0.0.1:1"))
    ExporterSettings(
        observer=ObserverSettings(node_name="n"), nvml=NvmlSettings(source="sim:http://127.0.0.1:1")
    )
