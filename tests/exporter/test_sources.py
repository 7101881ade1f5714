"""The exporter's source choices (`exporter.sources`) and the harness's `sim:URL` plugged into them.

Aspects covered: the product offers auto, none, pynvml and none, unix:///PATH, listed in that
order; a value names a choice by its scheme and target, anything else is refused with the
choices listed; the `gpuhealth` command adds `sim:URL` where the harness imports
(`gpuhealth_cli.sources`), and where it does not, `sim:` is refused with the reason (settings,
flags, exit 2); a broken harness is raised, not hidden.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from exporter import sources
from exporter.settings import ExporterSettings, NvmlSettings, ObserverSettings
from gpuhealth.fields import SettingsError
from gpuhealth_cli import sources as harness_sources
from gpuhealth_cli.main import main


def _missing(name: str) -> harness_sources.Readers:
    raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@pytest.fixture
def product_install(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The sources as a product install (no `simulator`) has them; the harness's again after."""
    monkeypatch.setattr(harness_sources, "_harness", lambda: _missing("simulator.nvml_remote"))
    harness_sources.register()
    try:
        yield
    finally:
        monkeypatch.undo()
        harness_sources.register()


def test_the_product_s_choices_and_the_harness_s_are_listed_in_order() -> None:
    assert sources.NVML.expected() == "auto, none, pynvml or sim:URL"
    assert sources.POD_RESOURCES.expected() == "none, unix:///PATH (the kubelet's socket) or sim:URL"


@pytest.mark.parametrize(
    "value", ["auto", "none", "pynvml", "sim:http://127.0.0.1:1", "sim:https://sim.example/x"]
)
def test_nvml_values_that_name_a_choice(value: str) -> None:
    assert sources.NVML.choice(value).scheme == value.partition(":")[0]


@pytest.mark.parametrize("value", ["cuda", "none:", "pynvml:x", "sim:", "sim:ftp://x", "unix:///x", ""])
def test_nvml_values_that_name_none_are_refused_with_the_choices(value: str) -> None:
    with pytest.raises(ValueError, match=r": expected auto, none, pynvml or sim:URL$"):
        sources.NVML.choice(value)


def test_none_opens_no_reader() -> None:
    assert sources.NVML.open("none", "n") is None
    assert sources.POD_RESOURCES.open("none", "n") is None


def test_without_the_harness_sim_is_refused_with_the_reason(
    product_install: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert sources.NVML.expected() == "auto, none or pynvml"
    with pytest.raises(SettingsError, match="sim: sources need the gpuhealth test harness"):
        NvmlSettings(source="sim:http://127.0.0.1:1")
    with pytest.raises(
        SettingsError, match=r"pod_resources 'sim:x': sim: sources need the gpuhealth test harness"
    ):
        ExporterSettings(observer=ObserverSettings(node_name="n"), pod_resources="sim:x")
    with pytest.raises(ValueError, match=r"'cuda': expected auto, none or pynvml$"):
        sources.NVML.choice("cuda")
    # The command registers the sources again on every parse: still refused.
    with pytest.raises(SystemExit, match="2"):  # argparse's own exit, for a flag's value
        main(["exporter", "--node", "n", "--nvml", "sim:http://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert "gpuhealth exporter: error: argument --nvml: 'sim:http://127.0.0.1:1': sim: sources need " in err
    assert "(simulator package)" in err and "Traceback" not in err


def test_a_broken_harness_is_raised_not_hidden(product_install: None) -> None:
    with pytest.raises(ModuleNotFoundError, match="jsonpatch"):
        harness_sources.register(lambda: _missing("jsonpatch"))
