"""A recorded alert history as the replay's input: Prometheus' `ALERTS` samples turned into the
deliveries the responder would have received, and into what the devices read meanwhile.

Pure. Prometheus writes one `ALERTS{alertstate="firing", ...}` sample per rule evaluation while
an alert fires, so a firing episode is a run of samples with no gap longer than the step they
were read at (`firings`). Alertmanager's part is the alerting model's (`alerting`): the
responder receives the firing `group_wait` after the first sample and the resolved
`group_interval` after the evaluation that found it gone (one step after the last sample), and
GPUNodeUnreachable inhibits its node's device alerts, as the shipped Alertmanager configuration
does. Not modelled, as there: the Unknown storm's and the critical-over-warning inhibitions.

What a device reads is taken from the same alerts (`readings`), since the history holds no
device truth of its own: a card reads Unhealthy, and fails a check, while one of its
`quarantine` alerts fires; it reads Unknown while a `restrict` alert fires; Healthy otherwise.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from responder.replay.alerting import AlertEpisode, RuleTimings, unmuted
from responder.replay.readings import UNHEALTHY, UNKNOWN, Interval, Readings
from responder.webhook.alerts import QUARANTINE, RESTRICT

NODE_ALERT = "GPUNodeUnreachable"
"""The node alert whose firing inhibits every device alert of its node (rules/alertmanager)."""
GAP_STEPS = 1.5
"""Samples further apart than this many steps belong to two episodes: one missed evaluation's
jitter is not a resolve (Prometheus evaluates on its own clock, not on the query's grid)."""
_OWN = frozenset({"alertname", "alertstate", "node", "device", "action", "__name__"})


@dataclass(frozen=True, slots=True)
class Firing:
    """One firing episode of one alert series: samples from `first` to `last`, none missing."""

    labels: tuple[tuple[str, str], ...]
    """The series' labels, sorted (`alertname`, `action`, `node`, `device`, `xid`, ...)."""
    first: float
    last: float

    def label(self, name: str) -> str:
        return dict(self.labels).get(name, "")

    @property
    def name(self) -> str:
        return self.label("alertname")


def runs(timestamps: Iterable[float], step: float) -> list[tuple[float, float]]:
    """(first, last) of each run of `timestamps` with no gap longer than `GAP_STEPS` steps."""
    if step <= 0:
        raise ValueError(f"step must be above 0 s, not {step!r}")
    out: list[tuple[float, float]] = []
    for t in sorted(set(timestamps)):
        if out and t - out[-1][1] <= GAP_STEPS * step:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def firings(series: Iterable[tuple[Mapping[str, str], Sequence[float]]], step: float) -> list[Firing]:
    """Every firing episode of `series` (labels, sample timestamps), in time order. A label set
    that comes more than once (a window read in pages) is one series: its samples are merged."""
    merged: dict[tuple[tuple[str, str], ...], list[float]] = defaultdict(list)
    for labels, timestamps in series:
        merged[tuple(sorted(labels.items()))].extend(timestamps)
    out = [Firing(key, a, b) for key, stamps in merged.items() for a, b in runs(stamps, step)]
    out.sort(key=lambda f: (f.first, f.labels))
    return out


def _span(firing: Firing, step: float) -> tuple[float, float]:
    """[fires, resolves): the evaluation after the last sample is the one that found it gone."""
    return firing.first, firing.last + step


def _muted(history: Sequence[Firing], step: float) -> dict[str, list[tuple[float, float]]]:
    """node -> the intervals its GPUNodeUnreachable fired (what inhibits its device alerts)."""
    muted: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for firing in history:
        if firing.name == NODE_ALERT and firing.label("node"):
            muted[firing.label("node")].append(_span(firing, step))
    return muted


def _delivered(history: Sequence[Firing], step: float) -> Iterable[tuple[Firing, float]]:
    """(firing, when Alertmanager first lets it through) of every device firing not wholly inhibited."""
    muted = _muted(history, step)
    for firing in _device_firings(history):
        fires, resolves = _span(firing, step)
        delivered = unmuted(fires, resolves, muted.get(firing.label("node"), ()))
        if delivered is not None:
            yield firing, delivered


def uninhibited(history: Iterable[Firing], step: float) -> list[Firing]:
    """The device firings of `history` that reached the responder at all (a node's outage
    inhibits its device alerts: none of those says a card broke)."""
    return [firing for firing, _ in _delivered(list(history), step)]


def deliveries(history: Iterable[Firing], step: float, rules: RuleTimings) -> list[AlertEpisode]:
    """The device alerts of `history` that would have reached the responder, in delivery order:
    those with an action (`quarantine`, `restrict`) and a node and device, less what their node's
    GPUNodeUnreachable inhibited."""
    out = []
    for firing, delivered in _delivered(list(history), step):
        resolves = _span(firing, step)[1]
        out.append(
            AlertEpisode(
                firing.name,
                firing.label("action"),
                firing.label("node"),
                firing.label("device"),
                delivered + rules.group_wait,
                resolves + rules.group_interval,
                labels=tuple((k, v) for k, v in firing.labels if k not in _OWN),
            )
        )
    out.sort(key=lambda e: (e.fires, e.node, e.device, e.name))
    return out


def _device_firings(history: Iterable[Firing]) -> Iterable[Firing]:
    for firing in history:
        if (
            firing.label("action") in (QUARANTINE, RESTRICT)
            and firing.label("node")
            and firing.label("device")
        ):
            yield firing


def broken(history: Iterable[Firing], step: float) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(node, device) -> the intervals a `quarantine` alert of it fired: the history's only word
    on when a card was broken (merged, in time order)."""
    spans: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for firing in _device_firings(history):
        if firing.label("action") == QUARANTINE:
            spans[(firing.label("node"), firing.label("device"))].append(_span(firing, step))
    return {key: merge(found) for key, found in spans.items()}


def merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of half-open intervals, as disjoint intervals in time order."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def readings(history: Iterable[Firing], step: float) -> Readings:
    """What each device reads while the history's alerts fire (the module's docstring says how)."""
    device: dict[tuple[str, str], list[Interval]] = defaultdict(list)
    for firing in _device_firings(history):
        what = UNHEALTHY if firing.label("action") == QUARANTINE else UNKNOWN
        device[(firing.label("node"), firing.label("device"))].append((*_span(firing, step), what))
    return Readings(device, {}, broken(history, step))
