"""The release ladder as data: the rungs a quarantined device climbs on its way back to service.

Pure: no I/O. `LADDER` is the one declaration of the rungs, in order: each rung's phase, name,
kind, default length and the configuration key of its length (`LadderSettings`, beside it).
In the core because two services read it: the responder walks it (`responder.ladder` is its
view there: `responder.reconcile.policy.step` walks it with one generic step per kind of rung,
the reconciler runs each rung's executor), and the rules' stuck-phase alert lists the rungs that
end by a timeout (`rules.render`); services never import each other. Everything that shows or
judges phases reads the sequence from here: the record's phases (`responder.records.PHASES`), the
CRD's enum, the demo's progress, verdicts, summary and report, the dashboards (generated from
it, or checked against it by a test).

A rung is one of four kinds:
- check: a Job whose pod gets the device itself must succeed within `seconds`; its verdict is
  kept in the record (`status.lastCheck`), and a person may not release a device whose last
  check failed;
- window: the device reports Healthy without a break for `seconds`;
- ramp: the device carries `taint` (only work that opts in tolerates it) for `seconds`;
- reset: an installed reset controller (NVSentinel's janitor by default) is asked to reset the
  card and must report success within `seconds` (`responder.reset`); off unless configured:
  `RESET` is on a responder's ladder only through `with_reset` (`reset.enabled`).
Any failure on a rung (a failed or timed-out check, an alert firing again, the metrics not
Healthy where the rung asks for them) returns the device to Quarantined with the backoff
doubled; passing the last rung releases it.

Adding a rung is one `Rung` in `LADDER` (its default length and, when its length is
configurable, its `setting` and `key`, with the setting's field in `LadderSettings` below; a
check's `image` and `command`, the pod the generic check runner starts); the CRD's phase enum,
the rules and the dashboards are generated from it, and the tests that walk the ladder read it
(docs/ARCHITECTURE.md, "Add a rung, a backend or an alert"). A check whose pod is more than one
container brings its `CheckSpec` (`responder.checks.jobs.CheckSettings`): the probe is DCGM's
diagnostic and a judge; the canary is the workload its rung declares.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from gpuhealth import yaml_keys

QUARANTINE_TAINT = "gpuhealth.io/quarantine"
"""Taint key of an enforced quarantine (value: the reason); every check's pod tolerates it."""
CANARY_TAINT = "gpuhealth.io/canary"
"""Taint key while a released device ramps up: only claims that opt in tolerate it."""
CANARY_OPT_IN = "gpuhealth.io/canary-ok"
"""The pod label (value `"true"`) by which a device-plugin workload opts in to devices on the
ramp: the scheduler extender admits a bounded number of such pods (`docs/quarantine.md`,
"Gradual return"), the counterpart of a DRA claim request that tolerates `CANARY_TAINT`."""


class Kind(StrEnum):
    """What a rung waits for."""

    CHECK = "check"
    WINDOW = "window"
    RAMP = "ramp"
    RESET = "reset"
    """A reset of the card by a controller outside gpuhealth; walked like a check (a request per
    record and attempt, a result, a timeout), its executor is the reset hand-off, not a Job."""


class Target(StrEnum):
    """What a check's pod runs against."""

    DEVICE = "device"
    """The quarantined device itself, through the enforcement backend's device request (a claim
    on DRA that selects it by uuid and tolerates gpuhealth's taints; on device plugins a pod
    pinned to the node that the NVIDIA runtime gives that one GPU)."""


@dataclass(frozen=True, slots=True)
class Rung:
    phase: str
    """The record's `status.phase` while the device stands on this rung (CamelCase, unique)."""
    name: str
    """What people read (`probe`, `stability window`); a check's name also names its Job
    (`<record>-<name>-<attempt>`), its pods' `gpuhealth.io/check` label and `lastCheck.check`."""
    kind: Kind
    seconds: float = 0.0
    """A check's timeout, a window's or a ramp's length: in `LADDER`, the default of `setting`
    (which gives it when set: `LadderSettings.rungs`)."""
    setting: str = ""
    """The `LadderSettings` field that gives `seconds`; empty: `seconds` as declared."""
    key: str = ""
    """The configuration file's key of `setting` (`section.name`, `responder.config`)."""
    target: Target = Target.DEVICE
    """Check only: what its pod gets."""
    image: str = ""
    command: tuple[str, ...] = ()
    """Check only: what its pod runs unless the responder's settings give the check a spec of
    their own (`responder.checks.jobs.CheckSettings.spec`): one container, its exit status the
    result. Empty for the probe, whose pod the responder builds (DCGM's diagnostic and a judge)."""
    taint: str = ""
    """Ramp only: the taint key the device carries while on the rung."""
    metrics_judge: bool = True
    """The device must not report Unknown while on the rung. False for a check that judges the
    device itself (the probe: a device still reporting Unknown is what it is there to test).
    Unhealthy fails every rung whatever this says (`responder.reconcile.policy`)."""

    def __post_init__(self) -> None:
        if not self.phase or not self.phase[:1].isupper() or not self.phase.isalnum():
            raise ValueError(f"rung phase {self.phase!r} must be one CamelCase word")
        if not self.name:
            raise ValueError(f"rung {self.phase}: a name is required")
        if self.kind in (Kind.CHECK, Kind.RESET) and not self.name.replace("-", "").isalnum():
            raise ValueError(f"check {self.name!r}: letters, digits and '-' only (it names a Job)")
        if self.kind == Kind.RAMP and not self.taint:
            raise ValueError(f"ramp rung {self.phase}: a taint is required")
        if self.kind != Kind.RAMP and self.taint:
            raise ValueError(f"rung {self.phase}: only a ramp carries a taint")
        if self.kind != Kind.CHECK and (self.image or self.command):
            raise ValueError(f"rung {self.phase}: only a check carries an image and a command")
        if bool(self.image.strip()) != bool(self.command):
            raise ValueError(f"check {self.name}: an image and a command, or neither")


@dataclass(frozen=True, slots=True)
class Ladder:
    """The rungs in the order a device climbs them."""

    rungs: tuple[Rung, ...]
    _by_phase: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not self.rungs:
            raise ValueError("a release ladder needs at least one rung")
        phases = [r.phase for r in self.rungs]
        if len(set(phases)) != len(phases):
            raise ValueError(f"rung phases repeat: {phases}")
        checks = [r.name for r in self.rungs if r.kind in (Kind.CHECK, Kind.RESET)]
        if len(set(checks)) != len(checks):
            raise ValueError(f"check names repeat: {checks}")
        object.__setattr__(self, "_by_phase", {p: i for i, p in enumerate(phases)})
        object.__setattr__(self, "_hash", hash(self.rungs))

    def __hash__(self) -> int:
        # Settings are made per decision (tests, benches) and look their timed ladder up by it.
        return self._hash

    @property
    def phases(self) -> tuple[str, ...]:
        return tuple(r.phase for r in self.rungs)

    @property
    def first(self) -> Rung:
        return self.rungs[0]

    def rung(self, phase: str) -> Rung | None:
        """The rung whose phase this is; None for a phase off the ladder."""
        index = self._by_phase.get(phase)
        return None if index is None else self.rungs[index]

    def after(self, rung: Rung) -> Rung | None:
        """The next rung; None after the last (the device is released)."""
        index = self._by_phase[rung.phase] + 1
        return self.rungs[index] if index < len(self.rungs) else None

    def checks(self) -> tuple[Rung, ...]:
        return tuple(r for r in self.rungs if r.kind == Kind.CHECK)

    def resets(self) -> tuple[Rung, ...]:
        return tuple(r for r in self.rungs if r.kind == Kind.RESET)

    def timed_out(self) -> tuple[Rung, ...]:
        """The rungs that end by their timeout whatever their executor does (checks, resets): a
        record far longer on one is one the reconciler is not advancing (the rules' stuck alert)."""
        return tuple(r for r in self.rungs if r.kind in (Kind.CHECK, Kind.RESET))

    def describe(self) -> str:
        """`probe, canary, stability window and ramp`: the rungs as people read them."""
        names = [r.name for r in self.rungs]
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    def inserted(self, rung: Rung, *, after: str) -> Ladder:
        """This ladder with `rung` placed after the rung of phase `after`."""
        index = self._by_phase[after] + 1
        return Ladder((*self.rungs[:index], rung, *self.rungs[index:]))

    def timed(self, seconds: Sequence[float]) -> Ladder:
        """This ladder with the rungs' lengths `seconds` (in order), each checked finite and > 0."""
        rungs = tuple(replace(r, seconds=float(s)) for r, s in zip(self.rungs, seconds, strict=True))
        for r in rungs:
            if not 0 < r.seconds < math.inf:
                where = r.setting or f"rung {r.phase}'s seconds"
                raise ValueError(f"{where} must be finite and greater than zero, not {r.seconds!r}")
        return Ladder(rungs)


PROBING, CANARY, STABILIZING, RAMP = "Probing", "Canary", "Stabilizing", "Ramp"
"""The shipped rungs' phases, for code and tests that name one of them (named, not unpacked from
the ladder, so a rung added between them leaves every name meaning the same rung)."""

LADDER = Ladder(
    (
        Rung(
            PROBING,
            "probe",
            Kind.CHECK,
            600.0,
            "probe_timeout_seconds",
            "policy.probe_timeout",
            metrics_judge=False,
        ),
        Rung(
            CANARY,
            "canary",
            Kind.CHECK,
            1200.0,
            "canary_timeout_seconds",
            "policy.canary_timeout",
            image="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
            command=("/cuda-samples/vectorAdd",),
        ),
        Rung(STABILIZING, "stability window", Kind.WINDOW, 1800.0, "stability_seconds", "policy.stability"),
        Rung(RAMP, "ramp", Kind.RAMP, 3600.0, "ramp_seconds", "policy.ramp", taint=CANARY_TAINT),
    )
)
"""The release ladder: probe, canary, stability window, ramp. The canary is a workload, not a
second diagnostic: the CUDA sample that copies two vectors into device memory, adds them in a
kernel, copies the sum back and checks it, exiting non-zero on any CUDA error or wrong element. It
fails as a tenant's job would (context creation, allocation, launch, copies) where a diagnostic
that passed may not look, needs no DCGM or NVML, and runs in seconds; it is the sample NVIDIA's
GPU operator runs to show that a workload can use a GPU."""

RESET = Rung(
    "Resetting", "reset", Kind.RESET, 900.0, "reset_timeout_seconds", "reset.timeout", metrics_judge=False
)
"""The reset hand-off: before the probe, an installed reset controller resets the card
(`responder.reset`). Not a judge of Unknown: a card being reset may stop reporting for a while
(Unhealthy still fails it, as every rung)."""


def with_reset(ladder: Ladder) -> Ladder:
    """`ladder` with `RESET` before its first check (the probe): the probe then tests the card as
    the reset left it. Unchanged when it already has the rung."""
    if ladder.rung(RESET.phase) is not None:
        return ladder
    first_check = next((i for i, r in enumerate(ladder.rungs) if r.kind == Kind.CHECK), 0)
    return Ladder((*ladder.rungs[:first_check], RESET, *ladder.rungs[first_check:]))


def without_reset(ladder: Ladder) -> Ladder:
    """`ladder` with no reset rung (a dry run asks no controller to reset a card)."""
    return Ladder(tuple(r for r in ladder.rungs if r.kind != Kind.RESET))


KNOWN = with_reset(LADDER)
"""Every rung a shipped responder may walk, the optional reset included, in order: what a record
may say (`responder.records.PHASES`, the CRD's enum) and what the dashboards list. A responder
walks `LADDER`, or `with_reset(LADDER)` where the reset hand-off is configured."""


def _reset_ladder(value: Any) -> Ladder:
    """`reset.enabled`: the shipped ladder, with the reset rung before the probe when true."""
    return with_reset(LADDER) if yaml_keys.flag(value) else LADDER


def _length(phase: str) -> Any:
    """The field of the rung of `phase`'s length: its declared default and its key."""
    rung = KNOWN.rung(phase)
    assert rung is not None and rung.setting and rung.key, phase
    return field(default=rung.seconds, metadata=yaml_keys.key(rung.key, yaml_keys.duration))


@dataclass(frozen=True, slots=True)
class LadderSettings:
    """The ladder a responder walks and its rungs' lengths: one field per rung `setting`, its
    default and its key taken from the rung (`_length`)."""

    ladder: Ladder = field(default=LADDER, metadata=yaml_keys.key("reset.enabled", _reset_ladder))
    """The release ladder's rungs in order; each rung's `setting` names the field below that
    gives its length (the `rungs` it is walked as)."""
    probe_timeout_seconds: float = _length(PROBING)
    """A probe Job still running after this long counts as failed."""
    canary_timeout_seconds: float = _length(CANARY)
    """A canary Job still running after this long counts as failed (it waits for the device)."""
    stability_seconds: float = _length(STABILIZING)
    """Healthy without a break for this long before the device ramps back (30 minutes)."""
    ramp_seconds: float = _length(RAMP)
    """How long the device carries the canary taint (opted-in work only) before full release."""
    reset_timeout_seconds: float = _length(RESET.phase)
    """The reset rung (where the ladder has it, `with_reset`): a reset the controller has not
    reported done after this long counts as failed. NVSentinel's janitor stops the node's GPU
    services, runs a reset Job and starts them again: minutes, not seconds."""
    rungs: Ladder = field(init=False, repr=False, compare=False, hash=False)
    """`ladder` with every rung's seconds taken from its setting (what the policy walks)."""

    def __post_init__(self) -> None:
        values = []
        for rung in self.ladder.rungs:
            value = getattr(self, rung.setting, None) if rung.setting else rung.seconds
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"rung setting {rung.setting!r} is not a duration field of the policy settings"
                )
            values.append(float(value))
        object.__setattr__(self, "rungs", _timed(self.ladder, tuple(values)))


@functools.lru_cache(maxsize=256)
def _timed(ladder: Ladder, seconds: tuple[float, ...]) -> Ladder:
    """`ladder` with these rung lengths (settings are made per decision in tests and benches:
    one build per distinct ladder and lengths)."""
    return ladder.timed(seconds)
