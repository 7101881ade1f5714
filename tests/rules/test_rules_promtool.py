"""The rendered rules under Prometheus' and Alertmanager's own checkers.

Aspects covered: the promtool unit tests in rules/tests/ pass; `promtool check rules` and
`amtool check-config` are clean; every alert has promtool tests on both sides (a case where
it is expected silent and one where it is expected firing).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.rules.support import ALERTMANAGER_CONFIG, PROMETHEUS_DIR, PROMTOOL_TESTS_DIR, run_tool


def rule_files() -> list[Path]:
    files = sorted(PROMETHEUS_DIR.glob("*.yaml"))
    assert files, f"no rule files under {PROMETHEUS_DIR}"
    return files


def promtool_test_files() -> list[Path]:
    files = sorted(PROMTOOL_TESTS_DIR.glob("*.yaml"))
    assert files, f"no promtool tests under {PROMTOOL_TESTS_DIR}"
    return files


def alert_names() -> list[str]:
    names: list[str] = []
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [rule["alert"] for rule in group["rules"] if "alert" in rule]
    return names


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = run_tool([promtool, "test", "rules", *map(str, promtool_test_files())], timeout=120)
    assert result.returncode == 0, f"promtool test rules failed:\n{result.stdout}\n{result.stderr}"


def test_promtool_check_rules_is_clean(promtool: str) -> None:
    result = run_tool([promtool, "check", "rules", *map(str, rule_files())])
    assert result.returncode == 0, f"promtool check rules failed:\n{result.stdout}\n{result.stderr}"
    # promtool reports lint findings (e.g. duplicate rules) without failing, on stderr.
    output = result.stdout + result.stderr
    assert "WARNING" not in output and "FAILED" not in output and "lint error" not in output, output


def test_amtool_check_config_is_clean(amtool: str) -> None:
    result = run_tool([amtool, "check-config", str(ALERTMANAGER_CONFIG)])
    assert result.returncode == 0, f"amtool check-config failed:\n{result.stdout}\n{result.stderr}"
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize("alertname", alert_names())
def test_every_alert_is_tested_silent_and_firing(alertname: str) -> None:
    silent = firing = 0
    for path in promtool_test_files():
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check["alertname"] != alertname:
                    continue
                if check.get("exp_alerts"):
                    firing += 1
                else:
                    silent += 1
    assert firing, f"{alertname}: no promtool case expects it to fire"
    assert silent, f"{alertname}: no promtool case expects it to stay silent"
