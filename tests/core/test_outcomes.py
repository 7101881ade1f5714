"""The decision vocabulary (gpuhealth.outcomes).

Aspects: exceptions classified into outcomes (temporary with its delay, permanent, and a
bug treated as temporary so nothing is lost); a batch answers with its worst outcome; the
HTTP mapping Alertmanager relies on (2xx stop, 4xx never retried, 503 retried, never 429).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.errors import Forbidden, TooManyRequests
from gpuhealth.outcomes import (
    DEFAULT_RETRY_SECONDS,
    Done,
    Outcome,
    PermanentError,
    Rejected,
    Retry,
    Skipped,
    TemporaryError,
    Unchanged,
    combine,
    http_status,
    is_success,
    outcome_of,
    retry_after_header,
)

outcomes = st.one_of(
    st.builds(Done, st.text(max_size=5)),
    st.builds(Unchanged, st.text(max_size=5)),
    st.builds(Skipped, st.text(max_size=5)),
    st.builds(Retry, st.text(max_size=5), st.floats(min_value=0, max_value=3600)),
    st.builds(Rejected, st.text(max_size=5)),
)


def test_exceptions_become_outcomes() -> None:
    assert outcome_of(TemporaryError("API down", delay=3)) == Retry("API down", 3)
    assert outcome_of(PermanentError("alerts[0].labels: missing")) == Rejected("alerts[0].labels: missing")
    bug = outcome_of(KeyError("x"))
    assert isinstance(bug, Retry) and "KeyError" in bug.reason


def test_api_errors_keep_the_work_and_believe_retry_after() -> None:
    throttled = outcome_of(TooManyRequests("slow down", retry_after=7))
    assert throttled == Retry("TooManyRequests: 429 TooManyRequests: slow down", 7.0)
    forbidden = outcome_of(Forbidden("rbac"))
    assert isinstance(forbidden, Retry) and forbidden.delay_seconds == DEFAULT_RETRY_SECONDS


def test_http_mapping_is_what_alertmanager_needs() -> None:
    assert http_status(Done()) == 200
    assert http_status(Unchanged()) == 200  # a duplicate: the sender must stop
    assert http_status(Skipped("node opted out")) == 200
    assert http_status(Rejected("bad body")) == 400  # never retried, cannot be mended by retrying
    assert http_status(Retry("API down")) == 503  # retried; 429 would be dropped
    assert retry_after_header(Retry("x", 2.2)) == {"Retry-After": "3"}
    assert retry_after_header(Done()) == {}


@given(st.lists(outcomes, max_size=6))
def test_a_batch_answers_with_its_worst_outcome(batch: list[Outcome]) -> None:
    result = combine(batch)
    if any(isinstance(o, Retry) for o in batch):
        assert http_status(result) == 503
    elif any(isinstance(o, Rejected) for o in batch):
        assert http_status(result) == 400
    else:
        assert http_status(result) == 200 and is_success(result)
    assert result in batch or (not batch and result == Unchanged())


@pytest.mark.parametrize("delay", [-1.0, math.nan, math.inf])
def test_delays_are_finite_and_not_negative(delay: float) -> None:
    with pytest.raises(ValueError):
        Retry("x", delay)
    with pytest.raises(ValueError):
        TemporaryError("x", delay=delay)
