"""The four policies of the fleet benchmark, accounted over one trace and one workload mix.

gpuhealth's figures come from the replay engine (`responder.replay`: the product's decisions);
the other three are simple rules written here:
- node-cordon (NVSentinel's way): a GPU signal of any kind cordons and drains the card's node
  one rule evaluation after the fault; the node returns when the card is repaired;
- naive: every pod on a device that reports anything but Healthy is deleted at once (Unknown
  included); its replacement avoids a card the device plugin reports Unhealthy, and nothing else;
- none: nothing acts; a crashed pod restarts on the same card (its container keeps the device).

Every measure is per mix: the fixed-topology training job (one 8-GPU pod per node, one job: any
pod interrupted interrupts the job) and the inference fleet (services of 1 to 8 GPUs packed onto
each node: an interruption is one pod's). Each mix also says which pod holds each card when
(`Placement`, gpuhealth's replay's `holders`): a restricted card keeps its pod until that pod
leaves, and only then does its release attempt begin.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bench.fleet_causes import GPUS_PER_NODE, NODES, Incident, Knobs, Sight, Trace, devices_of, node_name
from responder.replay.engine import Holding
from responder.replay.outcomes import DeviceKey, Replay

CRASHLOOP_SECONDS = 300.0
"""The kubelet's CrashLoopBackOff cap: a container that keeps failing restarts every 5 minutes."""
NODE_BREAKER_SHARE, NODE_BREAKER_WINDOW = 0.5, 300.0
"""NVSentinel's breaker: it pauses when 50 % of nodes were cordoned within 5 minutes."""
SERVICE_SIZES, SERVICE_WEIGHTS = (1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1)
"""Assumption: the inference fleet's services by GPUs per pod."""

POLICIES = ("gpuhealth", "node-cordon", "naive", "none")


@dataclass(frozen=True, slots=True)
class Mix:
    name: str
    sizes: dict[str, tuple[int, ...]]
    """Per node, the GPUs of each of its pods, packed onto its cards in order."""
    job_wide: bool
    """One job spans every pod: any pod interrupted interrupts it once."""
    redeploy_days: float | None = None
    """A service pod's life on its cards (None: the pod is replaced only when the job restarts)."""
    seed: int = 0
    pods: dict[str, int] = field(init=False)
    """Pods per node."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "pods", {node: len(sizes) for node, sizes in self.sizes.items()})

    def hit(self, pods: int) -> int:
        """Interruptions counted when `pods` pods of one node are interrupted together."""
        return min(1, pods) if self.job_wide else pods

    def placement(self, trace: Trace) -> Placement:
        return Placement(self, trace)


def training() -> Mix:
    return Mix(
        "training: one fixed-topology job, 8-GPU pods",
        dict.fromkeys(map(node_name, range(NODES)), (GPUS_PER_NODE,)),
        True,
    )


def inference(seed: int, redeploy_days: float = Knobs().redeploy_days) -> Mix:
    rng = random.Random(seed)
    sizes = {}
    for n in range(NODES):
        free, pods = GPUS_PER_NODE, []
        while free:
            size = rng.choices(SERVICE_SIZES, SERVICE_WEIGHTS)[0]
            pods.append(size if size <= free else 1)
            free -= pods[-1]
        sizes[node_name(n)] = tuple(pods)
    return Mix("inference: services of 1-8 GPUs", sizes, False, redeploy_days, seed)


class Placement(Mapping[DeviceKey, Sequence[Holding]]):
    """Which pod of a mix holds each card when, over the trace: the replay's `holders`, computed
    for a card when the replay asks (it asks only for cards that get a record).

    Every card is busy (as in the accounting): a pod holds its cards from one replacement to the
    next. The training job's pods are all replaced whenever the job restarts: at every
    interruption of the trace (any pod interrupted interrupts the job) and every planned
    maintenance. A service's pod is replaced every `redeploy_days` (at its own drawn phase) and
    when its node goes down or is drained (a host failure, a planned maintenance). The replay
    keeps gpuhealth's effects on these: a quarantine's move ends the holding early, and a pod
    due while the card is excluded runs elsewhere."""

    def __init__(self, mix: Mix, trace: Trace) -> None:
        self.mix, self.start, self.end = mix, trace.timeline.start, trace.timeline.end
        self.node_down: dict[str, list[float]] = defaultdict(list)
        for incident in trace.incidents:
            if incident.cause.sight == Sight.NODE_LEASE:
                self.node_down[incident.node].append(incident.at)
        for at, node in trace.planned:
            self.node_down[node].append(at)
        self.restarts = sorted([i.at for i in trace.incidents] + [at for at, _ in trace.planned])

    def __getitem__(self, key: DeviceKey) -> Sequence[Holding]:
        node, device = key
        sizes = self.mix.sizes.get(node)
        if sizes is None:
            raise KeyError(key)
        cards = devices_of(int(node.split("-")[1]))
        if device not in cards:
            raise KeyError(key)
        index, card, pod = cards.index(device), 0, 0
        while card + sizes[pod] <= index:
            card += sizes[pod]
            pod += 1
        name = f"{node}/pod-{pod}"
        if self.mix.redeploy_days is None:
            edges = list(self.restarts)
        else:
            period = self.mix.redeploy_days * 86400.0
            phase = random.Random(f"{self.mix.seed}/{name}").uniform(0.0, period)
            rollouts = (
                self.start + phase + k * period for k in range(int((self.end - self.start) // period) + 1)
            )
            edges = sorted([*rollouts, *self.node_down.get(node, [])])
        inside = edges[bisect.bisect_right(edges, self.start) : bisect.bisect_left(edges, self.end)]
        bounds = [self.start, *inside, self.end]
        return [(a, b, f"{name}-{i}") for i, (a, b) in enumerate(itertools.pairwise(bounds)) if a < b]

    def __iter__(self) -> Iterator[DeviceKey]:
        for node in self.mix.sizes:
            for device in devices_of(int(node.split("-")[1])):
                yield (node, device)

    def __len__(self) -> int:
        return len(self.mix.sizes) * GPUS_PER_NODE


@dataclass
class Tally:
    withheld_healthy_hours: float = 0.0
    interruptions: int = 0
    failing_work_hours: float = 0.0
    unknown_evictions: int = 0
    false_quarantines: int = 0
    breaker_trips: int | None = None
    actions: int = 0
    failing_by_cause: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    crashes_by_cause: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    """Interruptions of work restarting on a failing card (crash-loops), by the card's cause."""


def account(trace: Trace, mix: Mix, gpuhealth: Replay, detection_seconds: float) -> dict[str, Tally]:
    tallies = {p: Tally() for p in POLICIES}
    shared = _shared_interruptions(trace, mix)
    for tally in tallies.values():
        tally.interruptions += shared
    broken = broken_spans(trace)
    _gpuhealth(tallies["gpuhealth"], trace, mix, gpuhealth, broken)
    _node_cordon(tallies["node-cordon"], trace, mix, broken, detection_seconds)
    _naive(tallies["naive"], trace, mix)
    _none(tallies["none"], trace, mix)
    return tallies


def _shared_interruptions(trace: Trace, mix: Mix) -> int:
    """What every policy suffers: each failure of the table, each relapse, each planned maintenance."""
    total = 0
    for incident in trace.incidents:
        node_wide = incident.cause.sight == Sight.NODE_LEASE
        total += mix.hit(mix.pods[incident.node] if node_wide else 1)
    return total + sum(mix.hit(mix.pods[node]) for _, node in trace.planned)


Broken = dict[tuple[str, str], list[tuple[float, float]]]
"""(node, device) -> the intervals its card was broken."""


def broken_spans(trace: Trace) -> Broken:
    spans: Broken = defaultdict(list)
    for i in trace.incidents:
        if i.cause.card:
            spans[(i.node, i.device)].append((i.at, min(i.until, trace.timeline.end)))
    return spans


def _cards(trace: Trace) -> list[Incident]:
    """The broken cards, each from when it could run work: a card that breaks while its host is
    down (an inhibited alert, a drained node) runs nothing until the host is back."""
    down: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for i in trace.incidents:
        if i.cause.sight == Sight.NODE_LEASE:
            down[i.node].append((i.at, i.until))
    cards = []
    for incident in trace.incidents:
        if not incident.cause.card:
            continue
        resumed = max(
            (b for a, b in down.get(incident.node, ()) if a <= incident.at < b), default=incident.at
        )
        if resumed < min(incident.until, trace.timeline.end):
            cards.append(replace(incident, at=resumed))
    return cards


def _crashes(seconds: float) -> int:
    return int(max(0.0, seconds) // CRASHLOOP_SECONDS)


def _on_failing(tally: Tally, incident: Incident, seconds: float, mix: Mix) -> None:
    """Work ran `seconds` on the failing card of `incident`; a crashing one restarted meanwhile."""
    tally.failing_work_hours += seconds / 3600.0
    tally.failing_by_cause[incident.cause.name] += seconds / 3600.0
    if incident.cause.sight != Sight.NOTHING:  # silent corruption crashes nothing
        tally.interruptions += _crashes(seconds) * mix.hit(1)
        tally.crashes_by_cause[incident.cause.name] += _crashes(seconds) * mix.hit(1)


def _gpuhealth(tally: Tally, trace: Trace, mix: Mix, replay: Replay, broken: Broken) -> None:
    holds = defaultdict(list)
    for hold in replay.holds:
        holds[(hold.node, hold.device)].append(hold)
    for incident in _cards(trace):
        key = (incident.node, incident.device)
        own = holds.get(key, [])
        end = min(incident.until, trace.timeline.end)
        pods = replay.occupied.get(key)
        if pods is not None:
            # The replay placed the mix's pods: work runs on the failing card while a pod holds
            # it (a restricted card keeps its pod; a quarantine's move ends the pod's holding;
            # no new pod lands while the card is excluded).
            seconds = sum(max(0.0, min(b, end) - max(a, incident.at)) for a, b in pods)
            _on_failing(tally, incident, seconds, mix)
            continue
        if any(h.start <= incident.at < h.end for h in own):
            continue  # held already: no work on the card
        caught = [h.start for h in own if incident.at <= h.start < end]
        seconds = (
            min(caught[0] + trace.timeline.move_seconds, end) - incident.at if caught else end - incident.at
        )
        _on_failing(tally, incident, seconds, mix)
    false_moves = [
        m for m in replay.moves if not any(a <= m.at < b for a, b in broken.get((m.node, m.device), ()))
    ]
    tally.interruptions += mix.hit(1) * len(false_moves)
    tally.unknown_evictions = sum(1 for m in replay.moves if m.reason == "Unknown")
    tally.withheld_healthy_hours = replay.withheld_healthy_seconds(broken) / 3600.0
    tally.false_quarantines = len(replay.false_holds(broken))
    tally.breaker_trips = replay.breaker_trips
    tally.actions = sum(replay.actions.values())


def _node_cordon(tally: Tally, trace: Trace, mix: Mix, broken: Broken, detection: float) -> None:
    cordons: dict[str, list[tuple[float, float]]] = defaultdict(list)
    starts = []
    end_of_trace = trace.timeline.end
    for incident in _cards(trace):
        end = min(incident.until, end_of_trace)
        spans = cordons[incident.node]
        if spans and spans[-1][0] <= incident.at < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))  # drained already: no work on the card
            continue
        if incident.cause.sight == Sight.NOTHING:
            _on_failing(tally, incident, end - incident.at, mix)
            continue
        at = min(incident.at + detection, end)
        _on_failing(tally, incident, at - incident.at, mix)
        spans.append((at, end))
        starts.append(at)
        pods = mix.pods[incident.node]
        tally.interruptions += 0 if mix.job_wide else pods - 1  # the job crashed with the card already
        tally.actions += 2 + pods
        tally.false_quarantines += sum(
            1
            for device in devices_of(int(incident.node.split("-")[1]))
            if not any(a <= at < b for a, b in broken.get((incident.node, device), ()))
        )
    for node, spans in cordons.items():
        for device in devices_of(int(node.split("-")[1])):
            own = broken.get((node, device), [])
            for a, b in spans:
                tally.withheld_healthy_hours += (b - a - _overlap(a, b, own)) / 3600.0
    starts.sort()
    trips, first = 0, 0
    for i, at in enumerate(starts):
        while starts[first] < at - NODE_BREAKER_WINDOW:
            first += 1
        if i - first + 1 >= NODE_BREAKER_SHARE * NODES:
            trips += 1
            break
    tally.breaker_trips = trips


def _overlap(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans)


def _naive(tally: Tally, trace: Trace, mix: Mix) -> None:
    for incident in _cards(trace):
        end = min(incident.until, trace.timeline.end)
        if incident.cause.sight == Sight.FATAL_XID:
            tally.actions += 1  # the crashed pod deleted; its replacement avoids the Unhealthy card
        else:
            _on_failing(tally, incident, end - incident.at, mix)
    for spell in trace.timeline.spells:
        pods = mix.pods[spell.node]
        tally.interruptions += mix.hit(pods)
        tally.unknown_evictions += pods
        tally.actions += pods


def _none(tally: Tally, trace: Trace, mix: Mix) -> None:
    for incident in _cards(trace):
        _on_failing(tally, incident, min(incident.until, trace.timeline.end) - incident.at, mix)
