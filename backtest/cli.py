"""`gpuhealth backtest`: what gpuhealth would have done over a window of a fleet's own history.

The executor of the backtest: it reads the clock once (`now`, for relative times), reads the
window's alerts, GPU counts and pod allocations from Prometheus (`backtest.prometheus`), and hands
them to the pure parts: the alert history becomes deliveries and device readings
(`responder.replay.history`), the replay engine plays them through the product's decisions
(`responder.replay.engine.replay_deliveries`), and `backtest.cordon` and `backtest.report`
account the result. Progress goes to stderr, the report to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from backtest.cordon import cordons
from backtest.inputs import alert_names, replay_settings, timings_of
from backtest.pods import Holders
from backtest.prometheus import PrometheusError, PrometheusReader
from backtest.report import Backtest, document, write_tables
from backtest.window import Window, WindowError, parse_time
from gpuhealth.cliargs import CommandFailed, UsageError, add_output_option, command, positive_duration_seconds
from gpuhealth.kube.meta import rfc3339_seconds
from gpuhealth.tables import write_document
from responder import config as responder_config
from responder.replay import history
from responder.replay.alerting import RuleTimings
from responder.replay.engine import ReplaySettings, replay_deliveries
from responder.replay.timeline import CheckTruth, Frame
from rules.render import DEFAULT_CONFIG, ConfigError, load_config

GPUHEALTH_METRICS = (
    '{__name__=~"gpu_device_info|gpu_device_status_version|gpu_node_kubelet_lease_age_seconds"}'
)
"""Series only gpuhealth's exporter writes: their absence means Prometheus never scraped it."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "backtest",
        help="replay a window of a fleet's alert history through gpuhealth's decisions",
        description=(
            "Read what the shipped rules fired in a window (Prometheus' ALERTS series) and which pods "
            "held which GPU, play it through gpuhealth's own decisions and report what gpuhealth "
            "would have done (holds with their reasons and lengths, pods moved, breaker trips, healthy "
            "GPU-hours withheld) beside what cordoning the node would have cost on the same alerts. "
            "Exit codes: 0 reported; 1 Prometheus unreachable, refusing, or without gpuhealth's "
            "metrics in the window; 2 bad times or an unreadable config."
        ),
    )
    parser.add_argument(
        "--prometheus-url", required=True, help="Prometheus' base URL, e.g. http://prometheus:9090"
    )
    parser.add_argument(
        "--from",
        dest="start",
        default="-7d",
        help="start: now, a time before it (--from=-7d: with `=`) or RFC 3339 (default: %(default)s)",
    )
    parser.add_argument("--to", dest="end", default="now", help="end, as --from (default: %(default)s)")
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="a responder-config.yaml (default: the responder's defaults)",
    )
    parser.add_argument(
        "--rules-config",
        type=Path,
        default=DEFAULT_CONFIG,
        help="the rules' settings the alerts were rendered from (default: the shipped rules/config.yaml)",
    )
    parser.add_argument(
        "--probe-time",
        type=positive_duration_seconds,
        default=120.0,
        help="how long a probe runs before its verdict (default: 2m)",
    )
    parser.add_argument(
        "--canary-time",
        type=positive_duration_seconds,
        default=300.0,
        help="how long a canary runs before its verdict (default: 5m)",
    )
    parser.add_argument(
        "--move-time",
        type=positive_duration_seconds,
        default=60.0,
        help="how long moving the work off a device takes (default: 1m)",
    )
    add_output_option(parser)
    command(parser, run)


def _progress(line: str) -> None:
    print(f"gpuhealth backtest: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        window_start, window_end = parse_time(args.start, now=now), parse_time(args.end, now=now)
        rules = load_config(args.rules_config)
        settings = replay_settings(args.config)
    except (WindowError, ConfigError, responder_config.ConfigError) as exc:
        raise UsageError(exc) from None
    timings = timings_of(rules)
    try:
        window = Window(window_start, window_end, timings.evaluation_interval)
    except WindowError as exc:
        raise UsageError(f"--from {args.start} and --to {args.end}: {exc}") from None
    try:
        reader = PrometheusReader(args.prometheus_url, progress=_progress)
        bt = _backtest(
            reader,
            window,
            timings,
            settings,
            sorted(alert_names(rules)),
            CheckTruth(args.probe_time, args.canary_time),
            args.move_time,
        )
    except PrometheusError as exc:
        raise CommandFailed(exc) from None
    doc = document(bt)
    if args.output in ("json", "yaml"):
        write_document(doc, args.output, sys.stdout)
    else:
        write_tables(doc, sys.stdout)
    return 0


def _backtest(
    reader: PrometheusReader,
    window: Window,
    timings: RuleTimings,
    settings: ReplaySettings,
    names: list[str],
    checks: CheckTruth,
    move_seconds: float,
) -> Backtest:
    step = window.step
    alerts_query = f'ALERTS{{alertstate="firing",alertname=~{json.dumps("|".join(names))}}}'
    fired = history.firings(reader.sample_times(alerts_query, window, what="ALERTS"), step)
    if not fired:
        if not reader.series(GPUHEALTH_METRICS, window.start, window.end, limit=1):
            raise PrometheusError(
                f"Prometheus at {reader.url} holds no gpuhealth metrics between "
                f"{rfc3339_seconds(window.start)} and {rfc3339_seconds(window.end)}: point --prometheus-url "
                "at the Prometheus that scrapes gpuhealth's exporter, within its retention"
            )
        _progress("no gpuhealth alert fired in the window: gpuhealth would have done nothing")
    devices = {
        (labels.get("node", ""), labels.get("device", ""))
        for labels in reader.series("gpu_device_info", window.start, window.end)
    }
    gpus = Counter(node for node, _ in devices)
    delivered = history.deliveries(fired, step, timings)
    # Both policies act on the alerts that reached the responder: an alert of an unreachable
    # node's device is inhibited, for gpuhealth and node-cordon alike.
    kept = history.uninhibited(fired, step)
    broken = history.broken(kept, step)
    nodes = sorted({node for node, _ in broken} | {e.node for e in delivered})
    allocations = []
    if nodes:
        pattern = json.dumps("|".join(_regex_literal(n) for n in nodes))
        allocations = reader.sample_times(
            f"gpu_device_allocation_info{{node=~{pattern}}}",
            window,
            what="gpu_device_allocation_info",
        )
    holders = Holders(allocations, step)
    alerted = {(e.node, e.device) for e in delivered}
    eligible = max(sum(gpus.values()), len(alerted))
    if not gpus and alerted:
        _progress(
            f"no gpu_device_info in the window: the fleet is taken as the {len(alerted)} alerted "
            "devices, so the breaker sees a larger share of it than it would have"
        )
    frame = Frame(
        window.start,
        window.end,
        eligible,
        checks,
        move_seconds=move_seconds,
    )
    played = replay_deliveries(frame, delivered, history.readings(kept, step), settings)
    return Backtest(
        start=window.start,
        end=window.end,
        step=step,
        gpus=eligible,
        history=fired,
        delivered=delivered,
        replay=played,
        broken=broken,
        holders=holders,
        cordons=cordons(broken, gpus, holders.on_node, end=window.end),
    )


def _regex_literal(text: str) -> str:
    """`text` matched literally by an RE2 regex."""
    return "".join(c if c.isalnum() or c in "_" else "\\" + c for c in text)
