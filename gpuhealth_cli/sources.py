"""The test harness's exporter sources: `--nvml sim:URL` and `--pod-resources sim:URL`.

A simulated node's NVML and kubelet pod-resources view over the simulated cluster's HTTP
endpoint (`simulator.nvml_remote`, `simulator.podresources_remote`): the choices the demo, the
tests and the benches give the exporters they start. They are harness code, so the product only
offers the seam (`exporter.sources`); this module, the command's door to the harness, plugs them
in where the `simulator` package imports, and otherwise refuses `sim:` with the reason, as
`gpuhealth_cli.main` does for the harness's subcommands. `gpuhealth_cli.main.build_parser` calls
`register()` before the exporter's flags are built; a process that builds exporter settings
without the command (the tests, `tests/conftest.py`) calls it too.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from exporter import sources
from exporter.podresources import PodResourcesSource
from exporter.podresources_reads import FetchingReader, PodResourcesFetch
from gpuhealth.nvml import NvmlSource

SCHEME = "sim"
FORM = "sim:URL"
URL = re.compile(r"https?://\S+")
"""The simulated cluster's base URL, what follows `sim:`."""
MISSING = (
    "sim: sources need the gpuhealth test harness (simulator package), which only a source "
    "checkout holds (run `make setup` there)"
)


Readers = tuple[Callable[[str, str], NvmlSource], Callable[[str, str], PodResourcesFetch]]
"""The harness's NVML reader and pod-resources fetcher, each built from (base URL, node)."""


def _harness() -> Readers:
    from simulator.nvml_remote import RemoteNvmlSource
    from simulator.podresources_remote import RemotePodResources

    return RemoteNvmlSource, RemotePodResources


def register(load: Callable[[], Readers] | None = None) -> None:
    """Offer `sim:URL` for both sources where the harness imports (`load`, by default the
    `simulator` package's readers), else refuse it; idempotent."""
    try:
        nvml, fetcher = (load or _harness)()
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "simulator":
            raise  # the harness is there but broken: a defect to see
        sources.NVML.refuse(SCHEME, MISSING)
        sources.POD_RESOURCES.refuse(SCHEME, MISSING)
        return

    def pod_resources(url: str, node: str) -> PodResourcesSource:
        return FetchingReader(node, fetcher(url, node))

    sources.NVML.add(sources.Choice(SCHEME, FORM, nvml, URL, one_node=True))
    sources.POD_RESOURCES.add(sources.Choice(SCHEME, FORM, pod_resources, URL))
