"""Live progress of a demo run that a person can follow, read from the journal as it grows.

On a terminal: a compact status block (devices by state, firing alerts, quarantines by phase,
migrations, breaker, processes, scenario time) redrawn in place with `rich`, and the
narration lines scrolling above it. Elsewhere (a pipe, a CI log): one plain line per journal
entry, stamped with its scenario time, and no redrawing.

`Board` (the status) and `narrate` (one line per entry) are pure; `Progress` is the thin
executor the pipeline calls. It keeps its own cursor into `journal.entries`, so the pipeline
only appends to the journal and calls `refresh` whenever it likes: the block is redrawn at
most `min_interval` wall seconds apart, so a busy run never waits on the terminal.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TextIO

from rich.console import Console
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from demo.journal import Entry, Journal, Kind
from demo.summary import RESPONDER, describe
from responder.records import PHASES, Phase

HEALTH_STATES = ("Healthy", "Unhealthy", "Unknown")
PHASE_ORDER = tuple(p for p in PHASES if p != Phase.ABANDONED)
"""How quarantines by phase are listed: the record's phases in walking order (`responder.records.
PHASES`); Abandoned, and any phase a responder of another ladder wrote, follow by name."""
KIND_WIDTH = max(len(k.value) for k in Kind)


def worth_a_line(entry: Entry) -> bool:
    """Every entry but deliveries to people (pages, tickets, tenants): their alert has its line."""
    return not (entry.kind is Kind.DELIVERY and entry.what != RESPONDER)


def narrate(journal: Journal, entry: Entry) -> str:
    """One line for an entry: its scenario time, its kind and what it says."""
    return f"t+{entry.at:7.1f}s  {entry.kind.value:<{KIND_WIDTH}}  {describe(journal, entry)}"


@dataclass
class Board:
    """The run's state as the entries applied so far tell it. Pure."""

    journal: Journal
    health: dict[str, str] = field(default_factory=dict)
    """Device uuid -> its last reported health (devices never reported count as Healthy)."""
    firing: dict[tuple[str, str, str], Entry] = field(default_factory=dict)
    """(alertname, node, device) -> the entry that started it firing."""
    phases: dict[str, str] = field(default_factory=dict)
    """Record (or device, when the record is unnamed) -> its latest phase."""
    migrations: Counter[str] = field(default_factory=Counter)
    evictions: int = 0
    breaker: str = "closed"
    killed: list[str] = field(default_factory=list)
    faults: int = 0
    latest: float = 0.0
    """The latest entry time applied."""

    def apply(self, entry: Entry) -> None:
        self.latest = max(self.latest, entry.at)
        key = (entry.what, entry.node, entry.device)
        match entry.kind:
            case Kind.FAULT:
                self.faults += 1
            case Kind.HEALTH if entry.device:
                self.health[entry.device] = entry.what
            case Kind.ALERT_FIRING:
                self.firing[key] = entry
            case Kind.ALERT_RESOLVED:
                self.firing.pop(key, None)
            case Kind.PHASE:
                self.phases[entry.detail.get("record") or entry.device] = entry.what
            case Kind.MIGRATION:
                self.migrations[entry.what] += 1
            case Kind.EVICTION:
                self.evictions += 1
            case Kind.BREAKER:
                self.breaker = "tripped" if entry.what == "tripped" else "closed"
            case Kind.PROCESS if entry.what == "killed":
                self.killed.append(entry.detail.get("name", "?"))
            case Kind.PROCESS if entry.what == "started":
                name = entry.detail.get("name", "?")
                if name in self.killed:
                    self.killed.remove(name)

    def lines(self, now: float, until: float | None = None) -> list[str]:
        """The status block: a handful of lines, whatever the size of the fleet."""
        j = self.journal
        total = f" of {until:.0f}s" if until else ""
        states = Counter(self.health.get(uuid, "Healthy") for uuid in j.devices)
        states.update(state for uuid, state in self.health.items() if uuid not in j.devices)
        devices = "  ".join(
            f"{s} {states[s]}" for s in (*HEALTH_STATES, *sorted(set(states) - set(HEALTH_STATES)))
        )
        firing = sorted(self.firing.values(), key=lambda e: e.at)
        alerts = ", ".join(
            f"{e.what} {j.label(e.device) if e.device else e.node or 'fleet'}" for e in firing[:3]
        )
        if len(firing) > 3:
            alerts += f" (+{len(firing) - 3} more)"
        phases = Counter(self.phases.values())
        ordered = [p for p in PHASE_ORDER if phases[p]] + sorted(set(phases) - set(PHASE_ORDER))
        migrations = "  ".join(f"{o} {n}" for o, n in sorted(self.migrations.items())) or "none"
        return [
            f"{j.scenario}  t+{now:.0f}s{total} at {j.speed:g}x  faults {self.faults}",
            f"devices     {devices}",
            f"alerts      {len(firing)} firing" + (f": {alerts}" if alerts else ""),
            "quarantines " + ("  ".join(f"{p} {phases[p]}" for p in ordered) or "none"),
            f"migrations  {migrations}  evictions {self.evictions}",
            f"breaker     {self.breaker}" + (f"   down: {', '.join(self.killed)}" if self.killed else ""),
        ]


class Progress:
    """Narrates `journal` to `out` as it grows: `with Progress(out, journal) as p: ... p.refresh(t)`.

    live: redraw a status block in place (rich); None: when `out` is a terminal.
    until: the scenario second the run will end at, shown beside the time when known.
    """

    def __init__(
        self,
        out: TextIO,
        journal: Journal,
        *,
        live: bool | None = None,
        until: float | None = None,
        min_interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_interval < 0:
            raise ValueError(f"min_interval {min_interval} must not be negative")
        self.out = out
        self.journal = journal
        self.live = out.isatty() if live is None else live
        self.until = until
        self.min_interval = min_interval
        self.clock = clock
        self.board = Board(journal)
        self.cursor = 0
        self.now = 0.0
        self._pending: list[str] = []
        self._drawn_at = -float("inf")
        self._live: Live | None = None

    def __enter__(self) -> Progress:
        if self.live:
            console = Console(file=self.out, force_terminal=True)
            self._live = Live(self._block(), console=console, auto_refresh=False, transient=False)
            self._live.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.refresh(self.now, force=True)
        if self._live is not None:
            self._live.stop()
            self._live = None

    def refresh(self, now_scenario_seconds: float, *, force: bool = False) -> None:
        """Take the entries added since the last call; redraw if `min_interval` has passed."""
        self.now = max(self.now, now_scenario_seconds)
        new = self._take()
        lines = [narrate(self.journal, e) for e in new if worth_a_line(e)]
        if self._live is None:
            if lines:
                self.out.write("".join(f"{line}\n" for line in lines))
                self.out.flush()
            return
        self._pending.extend(lines)
        wall = self.clock()
        if not force and wall - self._drawn_at < self.min_interval:
            return
        self._drawn_at = wall
        # Lines printed above a Live display redraw it: with the block already up to date.
        self._live.update(self._block(), refresh=True)
        if self._pending:
            self._live.console.print(Text("\n".join(self._pending)), highlight=False, soft_wrap=True)
            self._pending.clear()

    def _take(self) -> Iterable[Entry]:
        # The pipeline appends from its own loop; a list slice is a consistent copy of what
        # was there, and the cursor only moves over what was taken.
        new = self.journal.entries[self.cursor :]
        self.cursor += len(new)
        for entry in new:
            self.board.apply(entry)
        return new

    def _block(self) -> Panel:
        block = Text("\n".join(self.board.lines(self.now, self.until)), no_wrap=True, overflow="ellipsis")
        return Panel(block, title="gpuhealth demo", expand=False)
