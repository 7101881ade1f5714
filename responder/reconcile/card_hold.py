"""The reconciler's side of the hold of device-plugin cards (an executor over `responder.enforce.hold`).

Which of a record's phases hold its card (from the quarantine until the ramp or the release lets
other pods back; never in dry-run), when the hold steps aside (for a check that reaches the card
through the kubelet, and for the ramp's first opted-in work while `ramp_fill_seconds` runs), and
the record's `Held` condition after each pass. The hold itself (its holder pods, the fill) is
`responder.enforce.hold.DeviceHold`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from gpuhealth.kube.meta import parse_rfc3339, rfc3339
from responder.enforce.hold import DeviceHold
from responder.enforce.hold_plan import HoldPlan, HoldState
from responder.ladder import Kind
from responder.reconcile.policy import PolicySettings, StartCheck, Step
from responder.records import HELD, Condition, Phase, Quarantine


def with_held(record: Quarantine, decided: HoldPlan | None, now: float) -> Quarantine:
    """`record` with its `Held` condition as `decided` says (None: no condition); the transition
    time moves only when the status or the reason changes."""
    others = tuple(c for c in record.status.conditions if c.type != HELD)
    if decided is None:
        conditions = others
    else:
        before = record.status.condition(HELD)
        status = "True" if decided.state.standing else "False"
        since = (
            before.last_transition_time
            if before is not None and before.status == status and before.reason == decided.state
            else rfc3339(now)
        )
        conditions = (*others, Condition(HELD, status, str(decided.state), decided.message[:1024], since))
    if conditions == record.status.conditions:
        return record
    return replace(record, status=replace(record.status, conditions=conditions))


class CardHolding:
    """`step`: the policy's step with the card's hold made for the phase it leads to; `held`:
    one pass of a card's hold for a record as it stands."""

    def __init__(self, hold: DeviceHold, policy: PolicySettings, aside: Callable[[Quarantine], bool]) -> None:
        """`aside`: whether a record's checks get its card through the kubelet, so that the hold
        steps aside for them (`responder.checks.jobs.JobChecks.through_kubelet`)."""
        self.hold = hold
        self._policy = policy
        self._aside = aside

    def step(self, decided: Step, now: float) -> Step:
        """A check that reaches the card through the kubelet starts only once the hold has
        stepped aside (until then its Job stays absent, and the next pass asks for it again)."""
        record = decided.record
        rung = self._policy.rungs.rung(record.status.phase)
        aside = rung is not None and rung.kind == Kind.CHECK and self._aside(record)
        held, ready = self.held(record, now, aside=aside)
        effects = decided.effects
        if aside and not ready:
            effects = tuple(e for e in effects if not isinstance(e, StartCheck))
        return replace(decided, record=held, effects=effects)

    def held(self, record: Quarantine, now: float, *, aside: bool = False) -> tuple[Quarantine, bool]:
        """`record` with its `Held` condition after one pass of its card's hold, and whether the
        hold stands as asked (held; or stepped aside for a check)."""
        rung = self._policy.rungs.rung(record.status.phase)
        # The ramp's first opted-in work goes to the card itself: the node's other free GPUs are
        # held for a while at its start (`HoldSettings.ramp_fill_seconds`), as for a check.
        entered = parse_rfc3339(record.status.phase_since)
        ramp = (
            rung is not None
            and rung.kind == Kind.RAMP
            and self._aside(record)
            and entered is not None
            and now - entered < self.hold.settings.ramp_fill_seconds
        )
        wanted = not self._policy.dry_run and (
            record.status.phase == Phase.QUARANTINED or (rung is not None and rung.kind != Kind.RAMP) or ramp
        )
        before = record.status.condition(HELD)
        previous = None
        if before is not None:
            since = parse_rfc3339(before.last_transition_time)
            previous = (before.reason, since if since is not None else now)
        decided = self.hold.sync(record, wanted, now, previous, aside=aside or ramp, ramp=ramp)
        ready = decided is not None and decided.state is (HoldState.ASIDE if aside else HoldState.HELD)
        return with_held(record, decided, now), ready
