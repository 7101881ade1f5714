"""The HTML report of a demo run: one self-contained file a person opens from a file browser.

Everything is inline: CSS in the page, charts as SVG drawn here at build time (hand-built: a
few rectangles and markers per device need no plotting library, and the page stays small and
identical from run to run). No script, no font, no image is fetched, so it opens offline.
All text goes through jinja2's autoescape (page) or markupsafe (charts): scenario names,
alert names and messages come from files a user wrote.

Pure except `write_html`: `render_html` builds the page, `timeline_svg` one device's chart.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from demo.journal import Entry, Journal, Kind, Recovery, sorted_entries
from demo.summary import RELEASE_PHASES, Detection, Summary, concerns, describe, percentile
from responder.ladder import KNOWN

TEMPLATE = "report.html.j2"

HEALTH_COLOURS = {"Healthy": "#3a9d5d", "Unhealthy": "#d64545", "Unknown": "#e3a32b"}
RUNG_COLOURS = ("#4a6fd6", "#7b61c9", "#2f9c9c", "#8bbf4a", "#c9a227", "#c96f2f")
"""The release ladder's rungs take these in order (cycled past the last)."""
PHASE_COLOURS = {
    "Pending": "#b8b8b8",
    "Deferred": "#8c8c8c",
    "Quarantined": "#8b1e3f",
    **{phase: RUNG_COLOURS[i % len(RUNG_COLOURS)] for i, phase in enumerate(KNOWN.phases)},
    "Released": "#d9eed9",
    "Abandoned": "#dddddd",
}
"""One colour for every phase of `responder.records.PHASES`."""
MARKERS: dict[Kind, tuple[str, str]] = {
    # kind -> (shape, colour) of its marker on the actions lane
    Kind.FAULT: ("triangle", "#d64545"),
    Kind.DELIVERY: ("dot", "#555555"),
    Kind.ENFORCED: ("square", "#8b1e3f"),
    Kind.LIFTED: ("square", "#3a9d5d"),
    Kind.EVICTION: ("diamond", "#e07b00"),
    Kind.MIGRATION: ("diamond", "#1f6fb2"),
    Kind.CHECK: ("dot", "#4a6fd6"),
    Kind.TENANT_EVENT: ("dot", "#e07b00"),
    Kind.NODE_ACTION: ("triangle", "#000000"),
}

WIDTH = 960
LEFT = 170
"""Pixels for the lane names on the left of each chart."""
RIGHT = 20
LANE = 22
AXIS = 26


@dataclass(frozen=True, slots=True)
class _Frame:
    start: float
    end: float

    def x(self, at: float) -> float:
        span = self.end - self.start or 1.0
        clamped = min(max(at, self.start), self.end)
        return _px(LEFT + (clamped - self.start) / span * (WIDTH - LEFT - RIGHT))


AFFECTING = frozenset(
    {
        Kind.FAULT,
        Kind.ALERT_FIRING,
        Kind.PHASE,
        Kind.ENFORCED,
        Kind.MIGRATION,
        Kind.CHECK,
        Kind.TENANT_EVENT,
    }
)
"""Entry kinds that make their device an affected one (with a health report other than Healthy)."""


def affected_devices(journal: Journal) -> list[str]:
    """Devices a fault, an unhealthy report, an alert or an action touched: each gets a chart.

    Not the devices a migrated job ran on or landed on (an eviction shows on the failed device's
    chart), nor devices merely reported Healthy.
    """
    seen: dict[str, None] = {}
    for entry in journal.entries:
        if entry.device and (
            entry.kind in AFFECTING or (entry.kind is Kind.HEALTH and entry.what != "Healthy")
        ):
            seen.setdefault(entry.device, None)
    return list(seen)


def time_frame(journal: Journal) -> tuple[float, float]:
    """The time axis shared by every chart: the scenario's start (or the first entry) to its end."""
    times = [e.at for e in journal.entries]
    # Process starts of the lead-in carry no device: they would only stretch the axis.
    start = min([0.0, *(e.at for e in journal.entries if e.device)])
    end = max([journal.ended_at, *times, start + 1.0])
    return start, end


def timeline_svg(journal: Journal, device: str, start: float, end: float) -> Markup:
    """One device's chart: health bands, each alert firing, record phases, and the actions taken."""
    frame = _Frame(start, end)
    mine = sorted_entries(e for e in journal.entries if concerns(e, device))
    alerts = list(dict.fromkeys(e.what for e in mine if e.kind in (Kind.ALERT_FIRING, Kind.ALERT_RESOLVED)))
    # Alert names lose their common prefix on the lane (the bar's tooltip has the full name).
    lanes = ["health", *(f"alert {a.removeprefix('GPUDevice')}" for a in alerts), "record", "actions"]
    height = len(lanes) * LANE + AXIS + 8
    label = journal.label(device)
    parts: list[Markup] = [
        Markup(
            '<svg class="timeline" data-device="{}" width="{}" height="{}" '
            'viewBox="0 0 {} {}" role="img" aria-label="{}">'
        ).format(device, WIDTH, height, WIDTH, height, f"timeline of {label}")
    ]
    for i, name in enumerate(lanes):
        y = i * LANE
        parts.append(
            Markup('<text class="lane" x="{}" y="{}">{}</text>').format(LEFT - 6, _px(y + LANE * 0.68), name)
        )
        parts.append(
            Markup('<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>').format(LEFT, WIDTH - RIGHT, y, y)
        )
    health = [(e.at, e.what) for e in mine if e.kind is Kind.HEALTH]
    parts += _bands(frame, [(start, "Healthy"), *health], end, 0, HEALTH_COLOURS, "health")
    for i, name in enumerate(alerts, start=1):
        parts += _alert_bars(frame, [e for e in mine if e.what == name], end, i * LANE)
    phases = [(e.at, e.what) for e in mine if e.kind is Kind.PHASE]
    record_row = (len(alerts) + 1) * LANE
    parts += _bands(frame, phases, end, record_row, PHASE_COLOURS, "record")
    actions_row = record_row + LANE
    for entry in mine:
        marker = MARKERS.get(entry.kind)
        if marker is None or (entry.kind is Kind.DELIVERY and entry.what != "responder"):
            continue
        parts.append(_marker(frame.x(entry.at), _px(actions_row + LANE / 2), *marker, _tip(journal, entry)))
    parts += _axis(frame, len(lanes) * LANE)
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


def _tip(journal: Journal, entry: Entry) -> str:
    return f"{_t(entry.at)} {entry.kind.value}: {describe(journal, entry, where=False)}"


def _t(at: float) -> str:
    """A scenario time as the report writes it: t+30.0s, t-5.0s (the lead-in)."""
    return f"t{at:+.1f}s"


def _px(value: float) -> float:
    return round(value, 1)


def _bands(
    frame: _Frame,
    changes: Sequence[tuple[float, str]],
    end: float,
    y: float,
    colours: dict[str, str],
    lane: str,
) -> list[Markup]:
    """Consecutive bands: each state from its change to the next change (or the end)."""
    out = []
    for i, (at, state) in enumerate(changes):
        until = changes[i + 1][0] if i + 1 < len(changes) else end
        x0, x1 = frame.x(at), frame.x(until)
        out.append(
            Markup(
                '<rect class="{}" x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>'
            ).format(
                lane,
                x0,
                y + 3,
                _px(max(x1 - x0, 1.0)),
                LANE - 6,
                colours.get(state, "#cccccc"),
                f"{state} from {_t(at)} to {_t(until)}",
            )
        )
    return out


def _alert_bars(frame: _Frame, entries: Iterable[Entry], end: float, y: float) -> list[Markup]:
    out = []
    since: Entry | None = None
    for entry in [*entries, None]:
        if entry is not None and entry.kind is Kind.ALERT_FIRING:
            since = since or entry
            continue
        if since is None:
            continue
        until = end if entry is None else entry.at
        x0, x1 = frame.x(since.at), frame.x(until)
        action = since.detail.get("action", "")
        colour = "#d64545" if action in ("quarantine", "restrict") else "#e3a32b"
        out.append(
            Markup(
                '<rect class="alert" x="{}" y="{}" width="{}" height="{}" fill="{}"><title>{}</title></rect>'
            ).format(
                x0,
                y + 5,
                _px(max(x1 - x0, 1.0)),
                LANE - 10,
                colour,
                f"{since.what} firing from {_t(since.at)} to {_t(until)} (action {action or 'none'})",
            )
        )
        since = None
    return out


def _marker(x: float, y: float, shape: str, colour: str, tip: str) -> Markup:
    r = 5
    if shape == "triangle":
        points = f"{x:.1f},{y - r:.1f} {x - r:.1f},{y + r:.1f} {x + r:.1f},{y + r:.1f}"
        body = Markup('<polygon points="{}" fill="{}">').format(points, colour)
        close = Markup("</polygon>")
    elif shape == "diamond":
        points = f"{x:.1f},{y - r:.1f} {x + r:.1f},{y:.1f} {x:.1f},{y + r:.1f} {x - r:.1f},{y:.1f}"
        body = Markup('<polygon points="{}" fill="{}">').format(points, colour)
        close = Markup("</polygon>")
    elif shape == "square":
        body = Markup('<rect x="{}" y="{}" width="{}" height="{}" fill="{}">').format(
            _px(x - r + 1), _px(y - r + 1), 2 * r - 2, 2 * r - 2, colour
        )
        close = Markup("</rect>")
    else:
        body = Markup('<circle cx="{}" cy="{}" r="{}" fill="{}">').format(x, y, r - 1, colour)
        close = Markup("</circle>")
    return body + Markup("<title>{}</title>").format(tip) + close


def _axis(frame: _Frame, y: float) -> list[Markup]:
    out = [Markup('<line class="axis" x1="{}" x2="{}" y1="{}" y2="{}"/>').format(LEFT, WIDTH - RIGHT, y, y)]
    step = _tick_step(frame.end - frame.start)
    first = math.ceil(frame.start / step) * step
    tick = first
    while tick <= frame.end + 1e-9:
        x = frame.x(tick)
        out.append(Markup('<line class="tick" x1="{}" x2="{}" y1="{}" y2="{}"/>').format(x, x, y, y + 4))
        out.append(Markup('<text class="tick" x="{}" y="{}">{}</text>').format(x, y + 16, f"{tick:g}s"))
        tick += step
    return out


def _tick_step(span: float) -> float:
    """A round step giving about eight ticks over `span` seconds."""
    raw = max(span, 1.0) / 8
    magnitude = 10 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)


def latency_figures(detections: Sequence[Detection]) -> list[dict[str, Any]]:
    """Per (fault kind, alert): count, median, p99 and max of the total and of its excess over the floor."""
    groups: dict[tuple[str, str], list[Detection]] = {}
    for d in detections:
        if d.total is not None:
            groups.setdefault((d.fault, d.alert), []).append(d)
    rows = []
    for (fault, alert), ds in sorted(groups.items()):
        totals = [d.total for d in ds if d.total is not None]
        over = [d.over_floor for d in ds if d.over_floor is not None]
        rows.append(
            {
                "fault": fault,
                "alert": alert,
                "count": len(ds),
                "floor": ds[0].floor,
                "median": percentile(totals, 0.5),
                "p99": percentile(totals, 0.99),
                "max": max(totals),
                "over_median": percentile(over, 0.5),
                "over_p99": percentile(over, 0.99),
            }
        )
    return rows


RECOVERY = "gpuhealth_migration_recovery_seconds"
"""The responder's histogram of a move's first eviction to its job running again on healthy devices."""


def recovery_queries(window_seconds: float) -> dict[str, str]:
    """The PromQL that reads recovery times over the run's last `window_seconds` (wall), by path.

    increase() over the run, summed over the replicas: each counts what it saw while leading,
    from 0 after a restart."""
    window = f"[{max(1, math.ceil(window_seconds))}s]"
    return {
        "moves": f"sum by (path) (increase({RECOVERY}_count{window}))",
        "sum": f"sum by (path) (increase({RECOVERY}_sum{window}))",
        **{
            name: f"histogram_quantile({q}, sum by (path, le) (increase({RECOVERY}_bucket{window})))"
            for name, q in (("p50", 0.5), ("p99", 0.99))
        },
    }


def recoveries(answers: dict[str, dict[str, float]], speed: float) -> list[Recovery]:
    """Recovery times by path from the answers to `recovery_queries` ({name: {path: value}}).

    A path with no move in the run (fewer than half a move after increase()'s extrapolation) is
    left out; no series at all is no rows. Times become scenario seconds (wall times `speed`)."""
    rows = []
    for path, moves in sorted(answers.get("moves", {}).items()):
        count = round(moves)
        if count < 1:
            continue
        total = answers.get("sum", {}).get(path, math.nan)

        def scaled(value: float | None) -> float | None:
            return None if value is None or not math.isfinite(value) else value * speed

        rows.append(
            Recovery(
                path=path,
                moves=count,
                mean_seconds=(total / moves) * speed if math.isfinite(total) else math.nan,
                p50_seconds=scaled(answers.get("p50", {}).get(path)),
                p99_seconds=scaled(answers.get("p99", {}).get(path)),
            )
        )
    return rows


def render_html(journal: Journal, summary: Summary, verdict: object) -> str:
    """The report page. `verdict`: `demo.safety.Verdict` (only `violations` is required)."""
    start, end = time_frame(journal)
    charts = [
        {"label": journal.label(device), "device": device, "svg": timeline_svg(journal, device, start, end)}
        for device in affected_devices(journal)
    ]
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    violations = tuple(str(v) for v in getattr(verdict, "violations", ()))
    return environment.get_template(TEMPLATE).render(
        journal=journal,
        summary=summary,
        violations=violations,
        acted=tuple(getattr(verdict, "acted", ()) or ()),
        missed=tuple(getattr(verdict, "missed", ()) or ()),
        figures=latency_figures(summary.detections),
        charts=charts,
        release_phases=RELEASE_PHASES,
        health_colours=HEALTH_COLOURS,
        phase_colours=PHASE_COLOURS,
        fmt=_fmt,
    )


def write_html(path: Path, journal: Journal, summary: Summary, verdict: object) -> None:
    """Write the report to `path` (its folder must exist); an OSError says why it could not."""
    path.write_text(render_html(journal, summary, verdict), encoding="utf-8")


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:+.1f}" if signed else f"{value:.1f}"
