"""Rendering the rules from rules/config.yaml, validating the config, and the runbooks.

Aspects covered: the committed files match a fresh render (and `render --check` says so,
or shows the difference, exit 1); a config or --out that cannot be read is exit 2, distinct
from stale files, with the `gpuhealth rules render: error:` prefix; the shipped config
is the declaration of every key (its default, and the kind of a key no field declares): an
override file takes it as defaults, and a key it does not declare or a value of another kind is
refused with the file and key named; bad values are refused with an error naming the key; every
alert carries severity, action, summary, description and a runbook_url whose anchor is a
section of docs/runbooks.md, and every alert section there is a rendered alert's; the
stuck-phase alert has a row for each rung of the release ladder that ends by a timeout, read
from the ladder (a rung added there gets a row, its threshold twice its length unless the
settings give one).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuhealth import ladder
from gpuhealth.kube.lease import ElectionSettings
from gpuhealth_cli.main import main
from responder.reconcile.reconciler import ReconcilerSettings
from rules import render as render_module
from rules.render import (
    DEFAULT_CONFIG,
    OUTPUTS,
    ConfigError,
    Duration,
    Settings,
    compare_files,
    load_config,
    parse_config,
    render,
    runbook_anchor,
    scaled,
    stuck_phases,
    unknown_restriction,
    unknown_schedule,
    unknown_schedule_table,
    unknown_window,
    write_files,
)
from tests.rules.support import PROMETHEUS_DIR, RULES_DIR, RUNBOOKS


def test_committed_files_match_a_fresh_render() -> None:
    problems = compare_files(render(load_config(DEFAULT_CONFIG)), RULES_DIR)
    assert not problems, "run `gpuhealth rules render` and commit:\n" + "\n".join(problems)


def test_the_shipped_config_is_the_default_of_every_key() -> None:
    shipped = load_config(DEFAULT_CONFIG)
    assert parse_config({}) == parse_config(None) == shipped
    assert isinstance(shipped, Settings)
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert shipped.device.unknown_tolerance == Duration.parse(raw["device"]["unknown_tolerance"], "x")
    # A key overridden keeps the others of its section at the shipped values.
    mine = parse_config({"self": {"down_for": "7m"}})
    assert mine.self.down_for == Duration(420) and mine.self.no_leader_for == shipped.self.no_leader_for


def _with_keys(monkeypatch: pytest.MonkeyPatch, section: str, **keys: Any) -> None:
    """The shipped config as if it declared `keys` in `section` (an alert's new thresholds)."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw[section] = {**raw[section], **keys}
    monkeypatch.setattr(render_module, "_shipped", raw)


def test_a_key_only_the_shipped_config_declares_is_typed_by_its_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Adding an alert's threshold is a config.yaml entry alone: no field, no default in Python."""
    keys = {"restarts_within": "10m", "restarts_max": 3, "share": 0.5, "paging": True, "note": "x"}
    _with_keys(monkeypatch, "self", **keys, jobs=["a"])
    own = parse_config({}).self
    assert own["restarts_within"] == Duration(600) and own["restarts_max"] == 3 and own["share"] == 0.5
    assert own["paging"] is True and own["note"] == "x" and own["jobs"] == ("a",)
    assert own["down_for"] == own.down_for, "a declared field reads the same way"
    assert parse_config({"self": {"restarts_within": "15m"}}).self["restarts_within"] == Duration(900)
    # What a template sees: jinja2 falls back to the item when no attribute has the name.
    env = render_module._environment()
    assert env.from_string("[[ cfg.self.restarts_within ]]").render(cfg=parse_config({})) == "10m"
    # Scaling reaches such keys too.
    assert scaled(parse_config({}), 20).self["restarts_within"] == Duration(30)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"self": {"restarts_within": 10}}, "self.restarts_within: write a unit"),
        ({"self": {"restarts_within": True}}, "self.restarts_within: expected a duration"),
        ({"self": {"restarts_max": "3"}}, "self.restarts_max: expected a whole number, got '3'"),
        ({"self": {"restarts_typo": 3}}, "self: unknown key(s) restarts_typo; known: "),
    ],
)
def test_an_override_of_such_a_key_is_checked_against_the_shipped_kind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data: Any, message: str
) -> None:
    _with_keys(monkeypatch, "self", restarts_within="10m", restarts_max=3)
    mine = tmp_path / "mine.yaml"
    mine.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as excinfo:
        load_config(mine)
    assert str(excinfo.value).startswith(f"{mine}: ") and message in str(excinfo.value)


def test_a_field_the_shipped_config_leaves_out_is_a_load_error(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    del raw["device"]["unknown_for"]
    monkeypatch.setattr(render_module, "_shipped", raw)
    with pytest.raises(ConfigError, match=r"device\.unknown_for: required \(declare it in config\.yaml\)"):
        parse_config({})


def test_render_check_passes_on_fresh_output_and_reports_drift(tmp_path: Path, capsys: Any) -> None:
    assert main(["rules", "render", "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpuhealth rules render: error: ") and f"under {tmp_path} are stale" in err
    assert "missing" in err

    assert main(["rules", "render", "--out", str(tmp_path)]) == 0
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.yaml")) == sorted(OUTPUTS.values())
    assert main(["rules", "render", "--out", str(tmp_path), "--check"]) == 0

    device_rules = tmp_path / "prometheus" / "gpu-device.yaml"
    device_rules.write_text(device_rules.read_text().replace("for: 1m", "for: 2m"))
    capsys.readouterr()
    assert main(["rules", "render", "--out", str(tmp_path), "--check"]) == 1
    err = capsys.readouterr().err
    assert "prometheus/gpu-device.yaml: 4 line(s) differ" in err
    assert "-        for: 2m" in err and "+        for: 1m" in err


def test_render_reports_an_invalid_config_with_exit_code_2(tmp_path: Path, capsys: Any) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("device:\n  fatal_xids: [79, 13]\n")
    assert main(["rules", "render", "--config", str(config), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "device.fatal_xids[1]: XID 13 is an application error" in err
    assert not (tmp_path / "prometheus").exists()


def test_a_custom_config_changes_the_rules() -> None:
    settings = parse_config(
        {
            "selectors": {"exporter_job": "gpu-exp"},
            "device": {"unknown_tolerance": "10m", "fatal_xids": [79, 109]},
            "runbook_base_url": "https://runbooks.example/gpu",
        }
    )
    device = render(settings)["prometheus/gpu-device.yaml"]
    assert 'xid=~"79|109"' in device
    assert 'job="gpu-exp"' in device and 'job="gpuhealth-exporter"' not in device
    rules = {r.get("alert") or r["record"]: r for g in yaml.safe_load(device)["groups"] for r in g["rules"]}
    # The first episode's window is the configured tolerance (the most, with a factor below 1);
    # the floor keeps its default.
    tolerance = rules["node_device:gpu_device_unknown_tolerance:seconds"]["expr"]
    assert "round(600 * 0.7 ^ node_device:gpu_device_unknown_repeats:count)" in tolerance
    assert "150, 600\n" in tolerance
    repeats = rules["node_device:gpu_device_unknown_repeats:count"]["expr"]
    assert "changes(node_device:gpu_device_unknown_since:timestamp[1h])" in repeats
    assert "for" not in rules["GPUDeviceUnknownExpired"]
    assert rules["GPUDeviceUnknownExpired"]["annotations"]["runbook_url"] == (
        "https://runbooks.example/gpu#gpudeviceunknownexpired"
    )


def test_the_workload_slo_reads_the_configured_counters_and_labels() -> None:
    settings = parse_config(
        {
            "workloads": {
                "requests_metric": "http_requests_total",
                "errors_metric": "http_request_failures_total",
                "matchers": 'job="inference", code!="499"',
                "namespace_label": "kubernetes_namespace",
                "pod_label": "kubernetes_pod_name",
            }
        }
    )
    fleet = yaml.safe_load(render(settings)["prometheus/gpu-fleet.yaml"])
    (group,) = [g for g in fleet["groups"] if g["name"] == "gpuhealth-workload.records"]
    exprs = {r["record"]: r["expr"] for r in group["rules"]}
    requests = exprs["namespace_pod:workload_requests:rate5m"]
    assert 'rate(http_requests_total{job="inference", code!="499"}[5m])' in requests
    assert '"namespace", "$1", "kubernetes_namespace", "(.*)"' in requests
    assert '"pod", "$1", "kubernetes_pod_name", "(.*)"' in requests
    assert "http_request_failures_total" in exprs["namespace_pod:workload_errors:rate5m"]
    # Device health never reads the workloads' series: no device rule or alert mentions them.
    device = render(settings)["prometheus/gpu-device.yaml"]
    assert "http_request" not in device and "workload_" not in device


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"device": {"fatal_xids": [48, 31]}}, "device.fatal_xids[1]: XID 31 is an application error"),
        ({"device": {"fatal_xids": [48, 48]}}, "device.fatal_xids[1]: XID 48 is listed twice"),
        ({"device": {"fatal_xids": []}}, "device.fatal_xids: empty"),
        ({"device": {"fatal_xids": ["79"]}}, "device.fatal_xids[0]: expected a whole number"),
        ({"device": {"heartbeat_limit": "2 minutes"}}, "heartbeat_limit: '2 minutes' is not a duration"),
        ({"device": {"heartbeat_limit": 120}}, "device.heartbeat_limit: write a unit"),
        ({"device": {"unknown_for": "5m"}}, "device.unknown_for (5m) must be shorter than device.unknown_"),
        (
            {"device": {"unknown_for": "2m30s"}},
            "device.unknown_for (2m30s) must be shorter than device.unknown_tolerance_floor (2m30s)",
        ),
        (
            {"device": {"unknown_tolerance_floor": "6m"}},
            "device.unknown_tolerance_floor (6m) must not be longer than device.unknown_tolerance (5m)",
        ),
        (
            {"device": {"unknown_repeat_window": "5m"}},
            "device.unknown_repeat_window (5m) must be longer than device.unknown_tolerance (5m)",
        ),
        (
            {"device": {"unknown_tolerance_floor": "0s"}},
            "device.unknown_tolerance_floor: must be longer than 0s",
        ),
        ({"device": {"flapping_episodes": 1}}, "device.flapping_episodes: 1 is below 2"),
        ({"device": {"flapping_window": "5m"}}, "device.flapping_window (5m) must be longer"),
        (
            {"device": {"unhealthy_flapping_episodes": 1}},
            "device.unhealthy_flapping_episodes: 1 is below 2; one short Unhealthy is a transient",
        ),
        # Three episodes parted by Healthy evaluations every 1m start 4m apart at the closest.
        (
            {"device": {"unhealthy_flapping_window": "4m"}},
            "device.unhealthy_flapping_window (4m) must be longer than 4m: 3 Unhealthy episodes",
        ),
        (
            {"evaluation_interval": "10m", "device": {"unhealthy_flapping_window": "30m"}},
            "device.unhealthy_flapping_window (30m) must be longer than 40m",
        ),
        ({"device": {"heartbeat_limt": "2m"}}, "device: unknown key(s) heartbeat_limt"),
        ({"devices": {}}, "unknown key(s) devices"),
        ({"node": {"unreachable_for": "2m"}}, "node.unreachable_for (2m40s) must be shorter"),
        ({"fleet": {"unknown_storm_fraction": 1.5}}, "unknown_storm_fraction: 1.5 is not between 0 and 1"),
        ({"fleet": {"unknown_storm_for": "5m"}}, "fleet.unknown_storm_for (5m) must be shorter"),
        # A repeated Unknown's window may be the floor: the storm must come before that too.
        (
            {"fleet": {"unknown_storm_for": "2m30s"}},
            "fleet.unknown_storm_for (2m30s) must be shorter than device.unknown_tolerance_floor (2m30s)",
        ),
        ({"device": {"unknown_tolerance_factor": 0}}, "device.unknown_tolerance_factor: 0.0 must be above 0"),
        (
            {"device": {"unknown_tolerance_factor": 2, "unknown_tolerance_cap": "4m"}},
            "device.unknown_tolerance_cap (4m) must not be shorter than device.unknown_tolerance (5m)",
        ),
        (
            {"device": {"unknown_restriction_factor": 0.5}},
            "device.unknown_restriction_factor: 0.5 must be at least 1",
        ),
        (
            {"device": {"unknown_restriction_cap": "5m"}},
            "device.unknown_restriction_cap (5m) must not be shorter than device.unknown_restriction (10m)",
        ),
        ({"device": {"unknown_restriction": "0s"}}, "device.unknown_restriction: must be longer than 0s"),
        ({"selectors": {"exporter_job": 'x"} or vector(1) #'}}, "selectors.exporter_job"),
        ({"alertmanager": {"responder_url": "127.0.0.1:8080/webhook"}}, "alertmanager.responder_url"),
        ({"alertmanager": {"responder_credentials_file": "token"}}, "must be an absolute path"),
        (
            {"alertmanager": {"tenants": [{"namespace": "Team_A", "url": "http://x/y"}]}},
            "alertmanager.tenants[0].namespace: 'Team_A' is not a namespace name",
        ),
        ({"alertmanager": {"tenants": [{"namespace": "a"}]}}, "alertmanager.tenants[0].url: required"),
        ({"runbook_base_url": "https://x.example/r.md#top"}, "runbook_base_url: must not hold an anchor"),
        ({"evaluation_interval": "0s"}, "evaluation_interval: must be longer than 0s"),
        ({"selectors": {"cluster_label": "k8s-cluster"}}, "selectors.cluster_label: 'k8s-cluster' is not a"),
        ({"selectors": {"cluster_label": "__cluster"}}, "selectors.cluster_label: '__cluster' is not a"),
        ({"self": {"webhook_retry_ratio": 1}}, "self.webhook_retry_ratio: 1.0 is not in [0, 1)"),
        ({"self": {"no_leader_for": "0s"}}, "self.no_leader_for: must be longer than 0s"),
        ({"self": {"reconcile_stalled_for": "1m"}}, "self.reconcile_stalled_for (1m) must be longer than"),
        ({"self": {"probing_stuck_for": "2d"}}, "self.probing_stuck_for (48h) must be shorter"),
        (["not", "a", "mapping"], "config: expected a mapping"),
        ({"workloads": {"requests_metric": "http-requests"}}, "requests_metric: 'http-requests' is not"),
        ({"workloads": {"errors_metric": "workload_requests_total"}}, "errors_metric: the same series"),
        ({"workloads": {"pod_label": "__name__"}}, "pod_label: '__name__' is not a Prometheus"),
        ({"workloads": {"pod_label": "namespace"}}, "workloads.pod_label: the same label as"),
        ({"workloads": {"matchers": "job=inference"}}, "matchers: 'job=inference' is not a comma-sep"),
        ({"workloads": {"matchers": 'job="a"} or vector(1) #'}}, "workloads.matchers:"),
        ({"workloads": {"matchers": ""}}, "workloads.matchers: expected a non-empty string"),
        ({"dcgm": {"matchers": 'job="a"} or vector(1) #'}}, "dcgm.matchers:"),
        ({"dcgm": {"health_watches": ["MEM", "FAN"]}}, "dcgm.health_watches[1]: 'FAN' is not a health watch"),
        ({"dcgm": {"health_watches": ["MEM", "MEM"]}}, "dcgm.health_watches[1]: 'MEM' is listed twice"),
        ({"dcgm": {"health_fail_value": 0}}, "dcgm.health_fail_value: 0 must be above 0 (PASS)"),
        ({"dcgm": {"health_failed_for": "0s"}}, "dcgm.health_failed_for: must be longer than 0s"),
    ],
)
def test_bad_config_values_are_refused_with_the_key_named(data: Any, message: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_config(data)
    assert message in str(excinfo.value)


def test_the_tightest_unhealthy_flapping_window_is_one_second_above_the_episodes_span() -> None:
    """Three episodes on a 1m evaluation grid start 4m apart at the closest, and a [4m] window
    (open at its start) cannot hold the first: 4m is refused above, 4m1s renders."""
    settings = parse_config({"device": {"unhealthy_flapping_window": "4m1s"}})
    device = render(settings)["prometheus/gpu-device.yaml"]
    assert "changes(node_device:gpu_device_unhealthy_since:timestamp[4m1s]) + 1 >= 3" in device


def test_load_config_names_the_file_on_bad_yaml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("device: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"absent\.yaml: cannot read"):
        load_config(tmp_path / "absent.yaml")
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe device: {}\n")
    with pytest.raises(ConfigError, match=r"binary\.yaml: not UTF-8 text"):
        load_config(binary)


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_render_into_an_unusable_directory_is_a_usage_error_not_staleness(
    tmp_path: Path, capsys: Any, check: list[str]
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    assert main(["rules", "render", "--out", str(blocker), *check]) == 2
    assert f"gpuhealth rules render: error: cannot use {blocker}:" in capsys.readouterr().err


def test_check_with_an_unreadable_rendered_file_is_exit_2(tmp_path: Path, capsys: Any) -> None:
    assert main(["rules", "render", "--out", str(tmp_path)]) == 0
    (tmp_path / "prometheus" / "gpu-device.yaml").write_bytes(b"\xff\xfe not UTF-8\n")
    capsys.readouterr()
    assert main(["rules", "render", "--out", str(tmp_path), "--check"]) == 2
    assert "gpuhealth rules render: error: cannot use" in capsys.readouterr().err


def test_check_with_a_missing_config_is_exit_2(tmp_path: Path, capsys: Any) -> None:
    argv = ["rules", "render", "--config", str(tmp_path / "absent.yaml"), "--check"]
    assert main(argv) == 2
    assert "gpuhealth rules render: error: invalid configuration: " in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "seconds", "rendered"),
    [
        ("30s", 30, "30s"),
        ("2m", 120, "2m"),
        ("1h30m", 5400, "1h30m"),
        ("1d", 86400, "24h"),
        ("90s", 90, "1m30s"),
    ],
)
def test_durations_parse_and_render_in_prometheus_syntax(text: str, seconds: int, rendered: str) -> None:
    duration = Duration.parse(text, "k")
    assert duration.seconds == seconds
    assert str(duration) == rendered


def _alerts() -> list[dict[str, Any]]:
    alerts: list[dict[str, Any]] = []
    for path in sorted(PROMETHEUS_DIR.glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            alerts += [rule for rule in group["rules"] if "alert" in rule]
    return alerts


_ALERT_NAME = re.compile(r"GPU(Device|Node|Fleet|Health|Workload)[A-Z][A-Za-z]+")
"""An alert's name: CamelCase with the prefix of what it is about."""


def _github_anchor(heading: str) -> str:
    """The anchor GitHub derives from a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_every_alert_has_labels_annotations_and_a_runbook_section() -> None:
    headings = [
        m.group(1).strip() for m in re.finditer(r"^## (.+)$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    ]
    sections = {_github_anchor(heading) for heading in headings}
    settings = load_config(DEFAULT_CONFIG)
    alerts = _alerts()
    # Derived, not counted: every rendered rule file is read (an alert the glob missed would go
    # unchecked), and the runbook's alert sections are exactly the rendered alerts, none left over
    # from one that is gone. Rules may share a name and its section: GPUHealthQuarantinePhaseStuck
    # (one rule per phase), the XID, ECC and row-remap alerts (NVML and dcgm-exporter).
    rendered = {Path(out).name for out in OUTPUTS.values() if out.startswith("prometheus/")}
    assert {path.name for path in PROMETHEUS_DIR.glob("*.yaml")} == rendered
    assert {h for h in headings if _ALERT_NAME.fullmatch(h)} == {alert["alert"] for alert in alerts}
    for alert in alerts:
        name = alert["alert"]
        assert _ALERT_NAME.fullmatch(name), name
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        assert alert["labels"]["action"] in ("quarantine", "restrict", "none"), name
        annotations = alert["annotations"]
        assert annotations["summary"] and annotations["description"], name
        url = annotations["runbook_url"]
        assert url == f"{settings.runbook_base_url}#{runbook_anchor(name)}", name
        assert url.split("#", 1)[1] in sections, f"{name}: docs/runbooks.md has no section for #{url}"


def test_device_alerts_carry_node_and_device_and_the_issue_contract() -> None:
    contract = {
        "GPUDeviceUnhealthy": ("critical", "quarantine"),
        "GPUDeviceUnhealthyFlapping": ("critical", "quarantine"),
        "GPUDeviceUnknown": ("warning", "none"),
        "GPUDeviceUnknownExpired": ("critical", "restrict"),
        "GPUDeviceStatusStale": ("warning", "none"),
        "GPUDeviceUnknownFlapping": ("warning", "restrict"),
        "GPUDeviceFatalXid": ("critical", "quarantine"),
        "GPUDeviceEccUncorrectable": ("critical", "quarantine"),
        "GPUDeviceRowRemapFailure": ("critical", "quarantine"),
        "GPUDeviceHealthWatchFailed": ("critical", "quarantine"),
        "GPUNodeUnreachable": ("warning", "none"),
        "GPUFleetUnknownStorm": ("critical", "none"),
    }
    alerts = {a["alert"]: a for a in _alerts()}
    for name, (severity, action) in contract.items():
        labels = alerts[name]["labels"]
        assert (labels["severity"], labels["action"]) == (severity, action), name
    for name in ("GPUHealthExporterDown", "GPUHealthResponderDown", "GPUHealthWebhookFailing"):
        assert name in alerts
    for name in ("GPUHealthBreakerTripped", "GPUDeviceQuarantineStuck", "GPUDeviceMigrationFailed"):
        assert name in alerts
    responder = {
        "GPUHealthBreakerTripped": ("critical", "none"),
        "GPUHealthResponderNoLeader": ("critical", "none"),
        "GPUHealthResponderReconcileStalled": ("critical", "none"),
        # Paged to on-call, never to the responder: it is the responder's own source that is away.
        "GPUHealthResponderHealthSourceDown": ("warning", "none"),
        "GPUHealthResponderWebhookRetrying": ("warning", "none"),
        "GPUDeviceMigrationUnrecoverable": ("warning", "none"),
        "GPUHealthQuarantinePhaseStuck": ("warning", "none"),
    }
    for name, (severity, action) in responder.items():
        labels = alerts[name]["labels"]
        assert (labels["severity"], labels["action"]) == (severity, action), name
    # Per-device alerts join identity labels and so keep node and device.
    for name in [n for n in contract if n.startswith("GPUDevice")] + ["GPUDeviceQuarantineStuck"]:
        assert "on (cluster, node, device) group_left (driver, pool, device_name)" in alerts[name]["expr"], (
            name
        )


def test_application_xids_are_never_in_the_rendered_rules() -> None:
    device = (PROMETHEUS_DIR / "gpu-device.yaml").read_text()
    (regex,) = set(re.findall(r'xid=~"([^"]+)"', device))
    xids = {int(x) for x in regex.split("|")}
    assert xids.isdisjoint({13, 31, 43, 45, 68})
    assert {48, 62, 64, 74, 79, 95, 119, 120} <= xids
    # dcgm-exporter's alert reads the same list, from its count's label and its gauge's value.
    dcgm = (PROMETHEUS_DIR / "gpu-dcgm.yaml").read_text()
    assert set(re.findall(r'xid=~"([^"]+)"', dcgm)) == {regex}
    assert {int(x) for x in re.findall(r"node_device:dcgm_last_xid:max == (\d+)", dcgm)} == xids


def test_dcgm_series_join_on_either_host_label_and_either_uuid_label() -> None:
    text = (PROMETHEUS_DIR / "gpu-dcgm.yaml").read_text()
    records = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "record" in r]
    assert records
    for rule in records:
        for source in ("Hostname", "hostname", "uuid", "UUID"):
            assert f'"{source}", "(.+)"' in rule["expr"], (rule["record"], source)
    # The newer spelling is applied last, so it wins where a target carries both.
    assert text.index('"Hostname", "(.+)"') < text.index('"hostname", "(.+)"')


def test_write_files_creates_the_output_tree(tmp_path: Path) -> None:
    written = write_files({"prometheus/a.yaml": "x: 1\n"}, tmp_path / "out")
    assert written == [tmp_path / "out" / "prometheus" / "a.yaml"]
    assert written[0].read_text() == "x: 1\n"


def test_scaled_settings_divide_every_duration_and_keep_the_rest() -> None:
    shipped = parse_config({})
    fast = scaled(shipped, 20)
    assert fast.evaluation_interval == Duration(3)
    assert fast.device.unknown_tolerance == Duration(15)
    assert fast.node.lease_age_limit == Duration(2)
    assert fast.alertmanager.responder_group_wait == Duration(0), "0s stays 0s"
    assert fast.device.fatal_xids == shipped.device.fatal_xids
    assert fast.fleet.unknown_storm_fraction == shipped.fleet.unknown_storm_fraction
    assert scaled(shipped, 1) == shipped


def test_scaling_that_breaks_an_ordering_is_refused() -> None:
    with pytest.raises(ConfigError, match="heartbeat_limit"):
        scaled(parse_config({}), 60)
    with pytest.raises(ConfigError, match="speed"):
        scaled(parse_config({}), 0)


def test_stuck_phase_thresholds_leave_the_responders_own_timeouts_room() -> None:
    """A phase is stuck only beyond what its step may take with the responder's defaults: the
    probe and canary timeouts, a pass at least every max_recheck_seconds, a Lease takeover."""
    own = load_config(DEFAULT_CONFIG).self
    responder = ReconcilerSettings()
    policy = responder.policy
    assert own.probing_stuck_for.seconds >= 1.5 * policy.probe_timeout_seconds
    assert own.canary_stuck_for.seconds >= 1.5 * policy.canary_timeout_seconds
    assert own.resetting_stuck_for.seconds >= 1.5 * policy.reset_timeout_seconds
    assert own.deferred_stuck_for.seconds >= 10 * responder.max_recheck_seconds
    assert own.reconcile_stalled_for.seconds >= 5 * responder.max_recheck_seconds
    assert own.no_leader_for.seconds >= 4 * ElectionSettings().lease_duration_seconds
    # 30m of rate-limited waiting is a queue far beyond the bucket's burst.
    assert own.pending_stuck_for.seconds * responder.bucket.per_hour / 3600 > responder.bucket.burst


def test_the_unknown_window_changes_by_its_factor_per_repeat_between_floor_and_cap() -> None:
    dev = parse_config(
        {
            "device": {"unknown_tolerance": "8m", "unknown_tolerance_floor": "1m30s"},
            "fleet": {"unknown_storm_for": "1m"},
        }
    ).device
    # 480 x 0.7 ^ n, rounded: 480, 336, 235.2, 164.64, 115.248 -> the floor.
    assert [unknown_window(dev, n) for n in range(6)] == [480.0, 336.0, 235.0, 165.0, 115.0, 90.0]
    assert unknown_window(dev, 10_000) == 90.0
    with pytest.raises(ValueError, match="repeats: -1 is negative"):
        unknown_window(dev, -1)
    # A factor above 1 lengthens the window, up to the cap.
    growing = parse_config({"device": {"unknown_tolerance_factor": 2, "unknown_tolerance_cap": "15m"}}).device
    assert [unknown_window(growing, n) for n in range(4)] == [300.0, 600.0, 900.0, 900.0]
    assert unknown_window(growing, 100_000) == 900.0


def test_the_restriction_lengthens_by_its_factor_per_repeat_up_to_its_cap() -> None:
    dev = parse_config({}).device
    assert [unknown_restriction(dev, n) for n in range(6)] == [600.0, 1200.0, 2400.0, 4800.0, 7200.0, 7200.0]
    assert unknown_restriction(dev, 100_000) == 7200.0


def test_the_docs_print_the_shipped_schedule() -> None:
    """docs/runbooks.md's schedule table is the one the shipped settings give (regenerate it with
    `rules.render.unknown_schedule_table`)."""
    dev = load_config(DEFAULT_CONFIG).device
    table = unknown_schedule_table(dev)
    assert table in RUNBOOKS.read_text(), "docs/runbooks.md's schedule table is stale:\n" + table
    rows = [(r.repeats, str(r.window), str(r.restriction)) for r in unknown_schedule(dev, 4)]
    assert rows == [(0, "5m", "10m"), (1, "3m30s", "20m"), (2, "2m30s", "40m"), (3, "2m30s", "1h20m")]


def _stuck_alert_phases(settings: Any) -> list[str]:
    rules = yaml.safe_load(render(settings)["prometheus/gpuhealth-self.yaml"])
    return [
        rule["labels"]["phase"]
        for group in rules["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "GPUHealthQuarantinePhaseStuck"
    ]


def test_the_stuck_phase_alert_lists_the_ladders_timed_out_rungs() -> None:
    settings = load_config(DEFAULT_CONFIG)
    # The shipped ladder's rungs in order, then the optional reset.
    shipped = [r.phase for r in ladder.LADDER.timed_out()]
    assert shipped[:2] == ["Probing", "Canary"]
    assert _stuck_alert_phases(settings) == [*shipped, "Resetting", "Pending", "Deferred"]
    after = {s.phase: s.after for s in stuck_phases(settings.self)}
    assert after["Probing"] == settings.self.probing_stuck_for
    assert after["Canary"] == settings.self.canary_stuck_for
    assert after["Resetting"] == settings.self.resetting_stuck_for


def test_a_rung_added_to_the_ladder_gets_a_row_at_twice_its_length(monkeypatch: pytest.MonkeyPatch) -> None:
    burn_in = ladder.Rung("BurnIn", "burn-in", ladder.Kind.CHECK, 900.0, "burn_in_seconds", "policy.burn_in")
    shipped = ladder.LADDER.inserted(burn_in, after="Canary")
    monkeypatch.setattr(render_module, "LADDER", shipped)
    monkeypatch.setattr(render_module, "KNOWN", ladder.with_reset(shipped))
    settings = load_config(DEFAULT_CONFIG)
    rows = _stuck_alert_phases(settings)
    assert rows[rows.index("Canary") + 1] == "BurnIn"
    assert rows[-3:] == ["Resetting", "Pending", "Deferred"]
    row = next(s for s in stuck_phases(settings.self) if s.phase == "BurnIn")
    assert row.after == Duration(1800)
    assert "The burn-in ends by its timeout (the responder's burn_in_seconds)" in row.why


# ----- many clusters (docs/multi-cluster.md) ---------------------------------------------

_GROUPING = re.compile(r"\b(by|on) \(([^)]*)\)")
_BARE_AGGREGATION = re.compile(r"\b(sum|count|max|min|avg|quantile|topk|bottomk|group|stddev)\(")


@pytest.mark.parametrize("cluster_label", ["cluster", "k8s_cluster"])
def test_every_grouping_and_join_keeps_the_cluster_label(cluster_label: str) -> None:
    files = render(parse_config({"selectors": {"cluster_label": cluster_label}}))
    checked = 0
    for path, text in files.items():
        if not path.startswith("prometheus/"):
            continue
        for group in yaml.safe_load(text)["groups"]:
            for rule in group["rules"]:
                expr = rule["expr"]
                assert not _BARE_AGGREGATION.search(expr), (rule.get("record") or rule["alert"], expr)
                for match in _GROUPING.finditer(expr):
                    labels = [label.strip() for label in match.group(2).split(",")]
                    # `or on () vector(0)` / `or on () absent(...)`: a fallback that appears only
                    # when nothing else does, in no cluster.
                    if labels == [""] and expr[match.end() :].lstrip().startswith(("vector(0)", "absent(")):
                        continue
                    assert cluster_label in labels, (rule.get("record") or rule["alert"], match.group(0))
                    checked += 1
    assert checked > 100


def test_alertmanager_groups_and_inhibits_by_the_configured_cluster_label() -> None:
    config = yaml.safe_load(render(parse_config({"selectors": {"cluster_label": "k8s_cluster"}}))[
        "alertmanager/alertmanager.yaml"
    ])  # fmt: skip
    assert config["route"]["group_by"][0] == "k8s_cluster"
    assert all("group_by" not in route for route in config["route"]["routes"]), "every route inherits it"
    for rule in config["inhibit_rules"]:
        assert "k8s_cluster" in rule["equal"], rule
