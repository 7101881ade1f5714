"""The Kubernetes error vocabulary (gpuhealth.kube.errors).

Aspects: each status maps to its class, 409 AlreadyExists to its own Conflict subclass, 5xx
to Unavailable; the Status body's reason, message and details are kept; a body that is not
a Status still gives the class and its text; Retry-After (header or details) in seconds;
ERROR events of a watch (a Status without HTTP status); temporary vs permanent.
"""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NotFound,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    error_from_response,
    error_from_status,
    parse_retry_after,
)


def status_body(code: int, reason: str, message: str, **details: object) -> bytes:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    body.update(reason=reason, message=message)
    if details:
        body["details"] = details
    return orjson.dumps(body)


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [
        (400, "BadRequest", BadRequest),
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "NotFound", NotFound),
        (409, "Conflict", Conflict),
        (409, "AlreadyExists", AlreadyExists),
        (410, "Expired", Gone),
        (422, "Invalid", Invalid),
        (429, "TooManyRequests", TooManyRequests),
        (500, "InternalError", Unavailable),
        (503, "ServiceUnavailable", Unavailable),
        (504, "Timeout", Unavailable),
        (405, "MethodNotAllowed", ApiError),
        (415, "UnsupportedMediaType", ApiError),
    ],
)
def test_each_status_maps_to_its_class(status: int, reason: str, cls: type[ApiError]) -> None:
    error = error_from_response(status, status_body(status, reason, "what happened"))
    assert type(error) is cls
    assert (error.status, error.reason, error.message) == (status, reason, "what happened")
    assert str(error) == f"{status} {reason}: what happened"


def test_already_exists_is_a_conflict_but_a_conflict_is_not_already_exists() -> None:
    assert isinstance(error_from_response(409, status_body(409, "AlreadyExists", "taken")), Conflict)
    assert not isinstance(error_from_response(409, status_body(409, "Conflict", "stale")), AlreadyExists)


def test_status_details_are_kept() -> None:
    causes = [{"reason": "FieldValueInvalid", "field": "spec.containers", "message": "Required value"}]
    error = error_from_response(422, status_body(422, "Invalid", "Pod p is invalid", name="p", causes=causes))
    assert isinstance(error, Invalid)
    assert error.details == {"name": "p", "causes": causes}


@pytest.mark.parametrize("body", [b"", b"upstream connect error", b"[1,2]", b'{"kind":"Pod"}'])
def test_a_body_that_is_not_a_status_still_gives_the_class_and_its_text(body: bytes) -> None:
    error = error_from_response(404, body)
    assert isinstance(error, NotFound)
    assert error.reason == "NotFound"  # the status's own phrase, as the apiserver spells reasons
    assert error.message == body.decode().strip()[:300]


def test_retry_after_comes_from_the_header_or_the_status_details() -> None:
    header = error_from_response(429, status_body(429, "TooManyRequests", "slow down"), {"Retry-After": "7"})
    assert isinstance(header, TooManyRequests) and header.retry_after == 7.0
    in_body = error_from_response(500, status_body(500, "InternalError", "later", retryAfterSeconds=2))
    assert isinstance(in_body, Unavailable) and in_body.retry_after == 2.0
    neither = error_from_response(429, status_body(429, "TooManyRequests", "slow down"))
    assert neither.retry_after is None


@given(st.integers(min_value=0, max_value=10**9))
def test_retry_after_delay_seconds_parse(seconds: int) -> None:
    assert parse_retry_after(f" {seconds} ") == float(seconds)


@given(st.text())
def test_retry_after_never_raises(value: str) -> None:
    parsed = parse_retry_after(value)
    assert parsed is None or parsed >= 0


def test_retry_after_http_dates_and_negative_values_are_not_read() -> None:
    assert parse_retry_after("Wed, 21 Oct 2026 07:28:00 GMT") is None
    assert parse_retry_after("-3") is None
    assert parse_retry_after("1.5") is None
    assert parse_retry_after(None) is None


def test_an_error_event_maps_by_its_code_and_without_one_is_a_server_error() -> None:
    expired = error_from_status({"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"})
    assert isinstance(expired, Gone) and expired.message == "too old"
    for malformed in ({"kind": "Status", "message": "?"}, {"code": "410"}, {"code": True}, "junk", None):
        error = error_from_status(malformed)
        assert isinstance(error, Unavailable) and error.status == 500


def test_errors_raised_by_hand_carry_their_class_status() -> None:
    assert Gone().status == 410 and str(Gone()) == "410 Gone"
    assert NotFound("pods x").status == 404
    no_response = Unavailable("connection refused")
    assert no_response.status is None and str(no_response) == "NoResponse: connection refused"


def test_temporary_errors_are_throttling_and_server_trouble_only() -> None:
    classes = (
        BadRequest,
        Forbidden,
        Unauthorized,
        Conflict,
        Gone,
        Invalid,
        NotFound,
        TooManyRequests,
        Unavailable,
    )
    assert [cls for cls in classes if cls.temporary] == [TooManyRequests, Unavailable]
