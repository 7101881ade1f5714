"""The decision vocabulary: what handling one piece of work came to, and what a caller does next.

Decisions are pure functions that return an `Outcome`; executors apply them and turn the
exceptions they meet into outcomes with `outcome_of`. Errors are classified once, where
they are raised: `TemporaryError` (retrying later can help; it carries how much later) or
`PermanentError` (the input or the request is wrong; retrying the same thing cannot help).
Anything else is a bug, and a bug is treated as temporary so that nothing is lost: the
work stays where it was and is tried again, loudly.

`http_status` is the one mapping to HTTP that a webhook answers Alertmanager with:
Alertmanager retries 5xx only and drops every 4xx (429 included), so work not yet safely
recorded must be a 503, never a 200 and never a 429; a duplicate or a policy skip is a
200 (the sender must stop retrying); malformed input is a 400 (retrying cannot mend it).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_RETRY_SECONDS = 10.0
"""Delay of a temporary failure that names none: long enough not to hammer a struggling
API server, short next to Alertmanager's own retry backoff."""


class TemporaryError(Exception):
    """Retrying later can help (an API outage, a conflict, a rate limit); `delay` in seconds."""

    def __init__(self, message: str, *, delay: float = DEFAULT_RETRY_SECONDS) -> None:
        super().__init__(message)
        if not 0 <= delay < float("inf"):  # also refuses NaN
            raise ValueError(f"delay must be a finite, non-negative number of seconds, not {delay!r}")
        self.delay = delay


class PermanentError(Exception):
    """Retrying the same thing cannot help (malformed input, a refused request)."""


@dataclass(frozen=True, slots=True)
class Done:
    """The work was carried out (or recorded durably, for a webhook)."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class Unchanged:
    """Already done before: a duplicate delivery or a replay; nothing was done twice."""

    detail: str = ""


@dataclass(frozen=True, slots=True)
class Skipped:
    """Deliberately not done: a policy said no (opt-out label, dry-run, breaker open)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Retry:
    """Not done yet; try again after `delay_seconds`. Nothing is lost."""

    reason: str
    delay_seconds: float = DEFAULT_RETRY_SECONDS

    def __post_init__(self) -> None:
        if not 0 <= self.delay_seconds < float("inf"):
            raise ValueError(f"delay_seconds must be finite and not negative, not {self.delay_seconds!r}")


@dataclass(frozen=True, slots=True)
class Rejected:
    """Refused for good: the input is wrong. The reason names what is wrong."""

    reason: str


Outcome = Done | Unchanged | Skipped | Retry | Rejected

# Worst first: combining outcomes keeps the one a sender must act on.
_SEVERITY: dict[type, int] = {Retry: 4, Rejected: 3, Done: 2, Skipped: 1, Unchanged: 0}


def outcome_of(exc: BaseException) -> Outcome:
    """The outcome an executor records for an exception it caught."""
    if isinstance(exc, TemporaryError):
        return Retry(str(exc), exc.delay)
    if isinstance(exc, PermanentError):
        return Rejected(str(exc))
    # Any other failure (an API error, a bug) keeps the work for a retry: losing it is worse
    # than trying again. A server that said how long to wait (`retry_after`, as the
    # Kubernetes errors in gpuhealth.kube.errors carry it) is believed.
    retry_after = getattr(exc, "retry_after", None)
    delay = retry_after if isinstance(retry_after, int | float) and 0 <= retry_after < float("inf") else None
    return Retry(f"{type(exc).__name__}: {exc}", DEFAULT_RETRY_SECONDS if delay is None else float(delay))


def combine(outcomes: Iterable[Outcome]) -> Outcome:
    """One outcome for a batch (a webhook delivery of several alerts): the worst of them.

    One alert that could not be recorded makes the whole delivery a retry, which is safe
    because recording is idempotent: the alerts already recorded come back as `Unchanged`.
    An empty batch is `Unchanged`.
    """
    worst: Outcome | None = None
    for outcome in outcomes:
        if worst is None or _severity(outcome) > _severity(worst):
            worst = outcome
    return Unchanged() if worst is None else worst


def _severity(outcome: Outcome) -> int:
    # By the nearest declared class: a service may name a kind of skip of its own (a subclass).
    return next(_SEVERITY[cls] for cls in type(outcome).__mro__ if cls in _SEVERITY)


def is_success(outcome: Outcome) -> bool:
    """True when the sender should stop retrying because of a success, a duplicate or a skip."""
    return isinstance(outcome, Done | Unchanged | Skipped)


def http_status(outcome: Outcome) -> int:
    """The HTTP status a webhook answers with: 200, 400 (never retried) or 503 (retried)."""
    if isinstance(outcome, Retry):
        return 503
    if isinstance(outcome, Rejected):
        return 400
    return 200


def retry_after_header(outcome: Outcome) -> dict[str, str]:
    """`Retry-After` for a 503 (whole seconds, rounded up); empty for anything else."""
    if isinstance(outcome, Retry):
        seconds = int(-(-outcome.delay_seconds // 1))
        return {"Retry-After": str(max(seconds, 0))}
    return {}
