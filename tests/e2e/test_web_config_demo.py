"""The closed loop with TLS and basic auth on (`gpuhealth demo --web-config`): every exporter and
responder serves `--web.config.file`, Prometheus scrapes both jobs over HTTPS with a password
(the shipped plain-scrape fields), the webhook reaches the responders over HTTPS with their
certificate checked, and the scenario still meets every expectation it states, with no safety
violation. The same scenario without TLS runs in test_scenarios.py: tested both ways."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml

from demo.pipeline import DemoSettings, run_demo
from demo.staging import staging
from rules.render import DEFAULT_CONFIG, load_config, scaled
from simulator.scenario import resolve

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SCENARIO = "gpu-reset-handoff"
"""Short (2 GPUs), and it walks the whole loop: alert, quarantine, reset, probe, canary, release."""


@pytest.mark.timeout(240)
def test_the_loop_closes_with_tls_and_basic_auth_on(tmp_path: Path) -> None:
    scenario = resolve(SCENARIO)
    speed = staging(scenario.demo).speed or DemoSettings.speed
    out = io.StringIO()
    outcome = run_demo(
        scenario,
        scaled(load_config(DEFAULT_CONFIG), speed),
        DemoSettings(speed=speed, web_config=True),
        tmp_path,
        out,
    )
    assert outcome.verdict.violations == (), out.getvalue()[-3000:]
    assert outcome.expectation_failures == [], out.getvalue()[-3000:]
    config = yaml.safe_load((tmp_path / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    for name in ("gpuhealth-exporter", "gpuhealth-responder"):
        assert jobs[name]["scheme"] == "https"
        assert jobs[name]["basic_auth"]["password_file"] == str(tmp_path / "web" / "password")
    for log in [*tmp_path.glob("exporter-*.log"), *tmp_path.glob("responder-*.log")]:
        assert "Traceback" not in log.read_text(), log
