"""What `gpuhealth backtest` reports: gpuhealth's replayed actions and a node-cordon policy's
cost on the same alerts, as one document (`-o json|yaml`) or tables for people (`-o table`).

Pure: built from the replay's account (`responder.replay.outcomes.Replay`), the alert history
and who held which device; nothing here reads Prometheus or the clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from backtest.cordon import Cordon
from backtest.pods import Holders
from gpuhealth.kube.meta import rfc3339_seconds
from gpuhealth.tables import human_duration, write_table
from responder.replay.alerting import AlertEpisode
from responder.replay.history import Firing
from responder.replay.outcomes import Replay

Broken = Mapping[tuple[str, str], list[tuple[float, float]]]


@dataclass(frozen=True, slots=True)
class Backtest:
    start: float
    end: float
    step: float
    gpus: int
    """GPUs the exporter reported in the window (what the breaker counts against)."""
    history: Sequence[Firing]
    delivered: Sequence[AlertEpisode]
    replay: Replay
    broken: Broken
    holders: Holders
    cordons: Sequence[Cordon]


def document(bt: Backtest) -> dict[str, Any]:
    """The whole report as plain data (what `-o json` prints)."""
    replay = bt.replay
    withheld = replay.withheld_healthy_seconds(bt.broken) / 3600.0
    cordon_withheld = sum(c.healthy_gpu_seconds for c in bt.cordons) / 3600.0
    return {
        "window": {
            "from": rfc3339_seconds(bt.start),
            "to": rfc3339_seconds(bt.end),
            "stepSeconds": bt.step,
            "gpus": bt.gpus,
        },
        "alerts": {
            "firings": dict(sorted(Counter(f.name for f in bt.history).items())),
            "delivered": dict(sorted(Counter(e.name for e in bt.delivered).items())),
        },
        "gpuhealth": {
            "holds": [
                {
                    "node": h.node,
                    "device": h.device,
                    "action": h.action,
                    "reason": h.reason,
                    "start": rfc3339_seconds(h.start),
                    "end": rfc3339_seconds(h.end),
                    "seconds": h.end - h.start,
                    "heldAtEnd": (h.node, h.device) in replay.held_at_end and h.end >= replay.end,
                }
                for h in replay.holds
            ],
            "moves": [
                {
                    "at": rfc3339_seconds(m.at),
                    "node": m.node,
                    "device": m.device,
                    "reason": m.reason,
                    "pods": bt.holders.on_device(m.node, m.device, m.at),
                }
                for m in replay.moves
            ],
            "breakerTrips": replay.breaker_trips,
            "healthyGpuHoursWithheld": round(withheld, 3),
            "healthyGpuHoursWithheldByAction": {
                action: round(replay.withheld_healthy_seconds(bt.broken, action) / 3600.0, 3)
                for action in sorted({h.action for h in replay.holds})
            },
            "recordsEnd": dict(sorted(replay.phases().items())),
            "actions": dict(sorted(replay.actions.items())),
        },
        "nodeCordon": {
            "cordons": [
                {
                    "node": c.node,
                    "start": rfc3339_seconds(c.start),
                    "end": rfc3339_seconds(c.end),
                    "seconds": c.end - c.start,
                    "gpus": c.gpus,
                    "pods": list(c.pods),
                }
                for c in bt.cordons
            ],
            "healthyGpuHoursWithheld": round(cordon_withheld, 3),
            "podsEvicted": sum(len(c.pods) for c in bt.cordons),
        },
    }


def write_tables(doc: Mapping[str, Any], out: TextIO) -> None:
    """The document for people: a summary, then one table per kind of action."""
    window, gh, nc = doc["window"], doc["gpuhealth"], doc["nodeCordon"]
    out.write(
        f"Window {window['from']} to {window['to']} (step {window['stepSeconds']:g} s), "
        f"{window['gpus']:,} GPUs reported\n"
    )
    fired = ", ".join(f"{k} {v}" for k, v in doc["alerts"]["firings"].items()) or "none"
    out.write(f"Alerts fired: {fired}\n")
    delivered = ", ".join(f"{k} {v}" for k, v in doc["alerts"]["delivered"].items()) or "none"
    out.write(f"Delivered to the responder (after inhibition): {delivered}\n\n")
    rows = [
        ("holds / cordons", str(len(gh["holds"])), str(len(nc["cordons"]))),
        (
            "pods moved / evicted",
            str(sum(len(m["pods"]) for m in gh["moves"])) + f" ({len(gh['moves'])} moves)",
            str(nc["podsEvicted"]),
        ),
        (
            "healthy GPU-hours withheld",
            f"{gh['healthyGpuHoursWithheld']:,.2f}",
            f"{nc['healthyGpuHoursWithheld']:,.2f}",
        ),
        ("breaker trips", str(gh["breakerTrips"]), "-"),
    ]
    write_table(("", "GPUHEALTH", "NODE-CORDON"), rows, out)
    if gh["holds"]:
        out.write("\ngpuhealth's holds:\n")
        write_table(
            ("NODE", "DEVICE", "ACTION", "START", "LENGTH", "REASON"),
            [
                (
                    h["node"],
                    h["device"],
                    h["action"],
                    h["start"],
                    human_duration(h["seconds"]) + (" (held at end)" if h["heldAtEnd"] else ""),
                    h["reason"],
                )
                for h in gh["holds"]
            ],
            out,
        )
    if gh["moves"]:
        out.write("\nPods gpuhealth would have moved:\n")
        write_table(
            ("AT", "NODE", "DEVICE", "PODS", "REASON"),
            [(m["at"], m["node"], m["device"], ",".join(m["pods"]) or "-", m["reason"]) for m in gh["moves"]],
            out,
        )
    if nc["cordons"]:
        out.write("\nNode-cordon on the same alerts:\n")
        write_table(
            ("NODE", "START", "LENGTH", "GPUS", "PODS EVICTED"),
            [
                (
                    c["node"],
                    c["start"],
                    human_duration(c["seconds"]),
                    str(c["gpus"]),
                    ",".join(c["pods"]) or "-",
                )
                for c in nc["cordons"]
            ],
            out,
        )
