"""`gpuhealth demo` end to end: the real command, the real servers, a verdict.

Aspects covered: a scenario file runs through cluster, node-mode exporters, Prometheus and
Alertmanager; the fatal XID reaches the responder as a quarantine; every warranted action
(that quarantine, the long Unknown's restrict) is accounted for in the summary, as acted on
or as not seen; the application XID, the short Unknown and the silent kubelet reach the
responder not at all; the command exits 0 with the safety line. Bad input exits 2 with a
clear message after `gpuhealth demo: error:`; a speed that is not a finite positive number
is argparse's usage error, and `DemoSettings` refuses such values itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from demo.pipeline import DemoSettings
from gpuhealth.cli import main
from gpuhealth.fields import SettingsError

SCENARIO = Path(__file__).with_name("safety-scenario.yaml")
WARRANTED = (("quarantine", "gpu-dp-0/gpu-0"), ("restrict", "gpu-dra-0/gpu-1"))
"""What the scenario's faults warrant (tests/demo/test_safety.py checks the judge on it)."""
SPARED = ("gpu-dp-0/gpu-1", "gpu-dra-0/gpu-0", "gpu-dra-1/")
"""The application XID's GPU, the short Unknown's GPU, the silent kubelet's node."""

NARRATION = re.compile(r"^\[t\+\s*-?[\d.]+s [\d:]+\]\s+(?P<kind>\S+)\s+(?P<text>.*)$")
"""A progress line: `[t+  12.5s 10:00:00] kind text` (the column widths are not the contract)."""


def narrated(out: str) -> list[tuple[str, str]]:
    """(kind, text) of every progress line of the run."""
    return [(m["kind"], m["text"]) for m in map(NARRATION.match, out.splitlines()) if m]


def gpuhealth(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuhealth", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_runs_the_pipeline_and_every_action_is_warranted(tmp_path: Path) -> None:
    result = gpuhealth("demo", "--scenario", str(SCENARIO), "--speed", "20", "--workdir", str(tmp_path))
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-2000:]
    lines = narrated(out)
    responder = [text for kind, text in lines if kind == "webhook" and text.startswith("responder <- firing")]
    # Positive evidence first: the pipeline delivered to the responder (the fatal XID's
    # quarantine, a few seconds into a run of about 35), and the verdict covers the whole run.
    assert any("quarantine gpu-dp-0/gpu-0" in text for text in responder), out[-4000:]
    assert "responder asked to quarantine gpu-dp-0/gpu-0" in out
    assert "safety: every automated action was warranted" in out
    assert any(kind == "node" and text.startswith("gpu-dra-1:") for kind, text in lines), (
        "the silent kubelet is narrated"
    )
    # A warranted action that came too late for the run is the product's "not seen", not an
    # error; it must be accounted for either way.
    for action, where in WARRANTED:
        assert f"responder asked to {action} {where} " in out or f"not seen: {action} {where} " in out, (
            action,
            where,
            out[-4000:],
        )
    for spared in SPARED:
        assert not any(spared in text for text in responder), (spared, out[-4000:])


def test_demo_rejects_a_missing_scenario_and_a_speed_the_rules_cannot_follow(tmp_path: Path) -> None:
    missing = gpuhealth("demo", "--scenario", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2
    assert missing.stderr.startswith("gpuhealth demo: error: ") and "nope.yaml" in missing.stderr
    too_fast = gpuhealth("demo", "--speed", "100")
    assert too_fast.returncode == 2
    assert "rules at 100x" in too_fast.stderr and "heartbeat_limit" in too_fast.stderr


@pytest.mark.parametrize("speed", ["nan", "inf", "0", "-3", "fast"])
def test_demo_speed_must_be_a_finite_positive_number(speed: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--speed", speed])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "gpuhealth demo: error: argument --speed: " in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("speed", float("nan")),
        ("speed", 0.0),
        ("lead_in_seconds", -1.0),
        ("settle_seconds", float("inf")),
        ("node_exporters_max", 2.5),
        ("poll_interval_seconds", 0.0),
    ],
)
def test_demo_settings_refuse_values_the_run_cannot_use(field: str, value: float) -> None:
    with pytest.raises(SettingsError, match=f"DemoSettings.{field} must be"):
        DemoSettings(**{field: value})
