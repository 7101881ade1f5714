"""Generating the dashboards: the committed JSON is what the code generates, and the CLI says so.

Aspects covered: dashboards/*.json equal a fresh generation (a stale commit fails here, with
the command to run); `gpuhealth dashboards render` writes the four files and `--check` exits 0
on fresh files, 1 on a stale or missing one, 2 on an unreadable rules config; the job names
come from rules/config.yaml; the four UIDs are stable; the layout fills 24-column lines and
wraps a panel that does not fit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dashboards import render, sdk, settings
from dashboards.cli import main
from dashboards.definitions import UIDS
from tests.dashboards.support import DASHBOARDS_DIR, committed


def test_the_committed_json_is_a_fresh_generation() -> None:
    problems = render.stale(render.render(settings.load()), DASHBOARDS_DIR)
    assert problems == [], "run `gpuhealth dashboards render` and commit dashboards/*.json:\n" + "\n".join(
        problems
    )


def test_the_dashboards_keep_their_uids() -> None:
    assert {stem: doc["uid"] for stem, doc in committed().items()} == {
        "fleet": "gpuhealth-fleet",
        "device": "gpuhealth-device",
        "remediation": "gpuhealth-remediation",
        "pipeline": "gpuhealth-pipeline",
        "workload": "gpuhealth-workload",
    }
    assert {stem: doc["uid"] for stem, doc in committed().items()} == UIDS


def test_render_writes_and_check_tells_fresh_from_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "device.json",
        "fleet.json",
        "pipeline.json",
        "remediation.json",
        "workload.json",
    ]
    assert main(["--out", str(tmp_path), "--check"]) == 0
    assert "5 dashboard file(s)" in capsys.readouterr().out

    fleet = tmp_path / "fleet.json"
    fleet.write_text(fleet.read_text().replace("Devices by effective state", "Devices"))
    (tmp_path / "device.json").unlink()
    assert main(["--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "2 of 5 dashboard file(s)" in err and "gpuhealth dashboards render" in err
    assert "device.json: missing" in err
    assert '-      "title": "Devices",' in err and '+      "title": "Devices by effective state",' in err


def test_an_unreadable_rules_config_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path), "--rules-config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read the job names" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_job_names_come_from_the_rules_config(tmp_path: Path) -> None:
    config = yaml.safe_load((Path(render.__file__).parents[1] / "rules" / "config.yaml").read_text())
    config["selectors"] = {"exporter_job": "gpu-exporter", "responder_job": "gpu-responder"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    files = render.render(settings.load(path))
    pipeline = json.loads(files["pipeline.json"])
    exprs = [t["expr"] for p in pipeline["panels"] for t in p.get("targets", [])]
    assert any('job="gpu-exporter"' in e for e in exprs) and any('job="gpu-responder"' in e for e in exprs)
    assert not any("gpuhealth-exporter" in e or "gpuhealth-responder" in e for e in exprs)


def test_the_cli_is_registered_under_gpuhealth() -> None:
    from gpuhealth_cli.main import build_parser

    args = build_parser().parse_args(["dashboards", "render", "--check"])
    assert args.check and args.prog == "gpuhealth dashboards render"


def panel(title: str, width: int) -> sdk.Panel:
    return sdk.Panel("timeseries", title, "d", "short", (), width=width, height=8)


def test_the_layout_wraps_a_panel_that_does_not_fit_the_line() -> None:
    rows = (
        sdk.Row("one", (panel("a", 12), panel("b", 6), panel("c", 18))),
        sdk.Row("two", (panel("d", 24),)),
    )
    assert sdk.layout(rows) == [
        (0, 0, 24, 1),
        (0, 1, 12, 8),
        (12, 1, 6, 8),
        (0, 9, 18, 8),  # 12 + 6 + 18 > 24: a new line
        (0, 17, 24, 1),
        (0, 18, 24, 8),
    ]


def test_a_panel_with_an_unknown_unit_is_refused() -> None:
    bad = sdk.Dashboard(
        "u", "t", "d", (), (), (sdk.Row("r", (sdk.Panel("timeseries", "p", "d", "seconds", ()),)),)
    )
    with pytest.raises(ValueError, match="'seconds' is not a Grafana unit"):
        sdk.build(bad)


@pytest.mark.parametrize(
    ("field", "value"),
    [("exporter_job", ""), ("responder_job", 'a"b'), ("alertmanager_job", "a\\b")],
)
def test_settings_refuse_what_would_break_the_queries(field: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"dashboard settings: {field} must be"):
        settings.Settings(**{field: value})


def test_the_business_slo_reads_the_rules_records_and_no_free_text_selector() -> None:
    # The workloads' counters are configured once, in rules/config.yaml (`workloads`); the
    # dashboards read the recording rules built on them, so no text box can point them elsewhere.
    docs = render.render(settings.Settings())
    for stem in ("fleet", "device"):
        doc = json.loads(docs[f"{stem}.json"])
        assert all(v["type"] != "textbox" for v in doc["templating"]["list"])
        exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]
        assert any("workload_error_ratio:rate5m" in e for e in exprs), stem


def test_the_cluster_variable_reads_the_shipped_cluster_label() -> None:
    from dashboards.definitions import CLUSTER
    from rules.render import DEFAULT_CONFIG, load_config

    label = load_config(DEFAULT_CONFIG).selectors.cluster_label
    assert f'{label}="$cluster"' == CLUSTER
    for path in sorted(DASHBOARDS_DIR.glob("*.json")):
        for variable in json.loads(path.read_text())["templating"]["list"]:
            if variable["name"] == "cluster":
                assert variable["query"].endswith(f", {label})"), path.name
