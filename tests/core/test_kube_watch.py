"""The watch stream's wire format (gpuhealth.kube.watch) and the one throttling helper (backoff).

Aspects: lines reassembled across chunks and grouped per chunk, whatever the chunking;
decoding gives (type, object) or a parse error reason, never an exception; backoff delays
grow with jitter up to a cap, honour a minimum (Retry-After), reset on success, and keep
working through any number of failures; its one settings class serves the exporter and, with
the responder's defaults (`WatchBackoff`), the responder, checking its values either way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.fields import SettingsError
from gpuhealth.kube.backoff import Backoff, BackoffSettings, WatchBackoff
from gpuhealth.kube.watch import INVALID_JSON, MALFORMED_EVENT, decode_event, split_lines


@dataclass(frozen=True)
class Policy:
    """Any settings object with these fields serves (`BackoffSettings` does)."""

    initial_seconds: float = 0.5
    max_seconds: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5


def test_split_lines_reassembles_lines_across_chunks() -> None:
    chunks = [b'{"a":1}\n{"b"', b":2}\n\n", b'{"c":3}']
    assert list(split_lines(iter(chunks))) == [[b'{"a":1}'], [b'{"b":2}'], [b'{"c":3}']]


@given(
    st.lists(
        st.binary(min_size=1).map(lambda b: b.replace(b"\n", b"x")).filter(lambda b: b.strip()), max_size=8
    ),
    st.lists(st.integers(min_value=0, max_value=64), max_size=10),
)
def test_split_lines_gives_the_same_lines_whatever_the_chunking(lines: list[bytes], cuts: list[int]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    points = sorted({min(c, len(data)) for c in cuts})
    chunks = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    batches = list(split_lines(iter(chunks)))
    assert [line for batch in batches for line in batch] == lines
    assert len(batches) <= len(chunks)  # one batch per chunk at most: per chunk, not per line


def test_decode_event_gives_type_and_object_or_a_reason() -> None:
    assert decode_event(b'{"type":"ADDED","object":{"metadata":{}}}') == ("ADDED", {"metadata": {}})
    assert decode_event(b'{"type":"ADDED","object":[1]}') == ("ADDED", [1])  # the consumer judges objects
    assert decode_event(b"{not json") == INVALID_JSON
    assert decode_event(b'{"object": {}}') == MALFORMED_EVENT
    assert decode_event(b'{"type": 1}') == MALFORMED_EVENT
    assert decode_event(b"[1, 2]") == MALFORMED_EVENT


@given(st.binary())
def test_decode_event_never_raises(line: bytes) -> None:
    decoded = decode_event(line)
    assert decoded in (INVALID_JSON, MALFORMED_EVENT) or isinstance(decoded, tuple)


def test_backoff_grows_with_jitter_up_to_a_cap_and_resets() -> None:
    backoff = Backoff(Policy(initial_seconds=1, max_seconds=8, factor=2, jitter=0.5), random.Random(3))
    delays = [backoff.next_delay() for _ in range(6)]
    caps = [1, 2, 4, 8, 8, 8]
    assert all(cap / 2 <= d <= cap for d, cap in zip(delays, caps, strict=True))
    backoff.reset()
    assert backoff.next_delay() <= 1


def test_backoff_honours_a_minimum_such_as_retry_after() -> None:
    backoff = Backoff(Policy(initial_seconds=1, max_seconds=8, jitter=0.5), random.Random(3))
    assert backoff.next_delay(minimum=20.0) == 20.0


def test_backoff_survives_a_long_outage() -> None:
    # factor**failures overflowed a float after about a thousand failures at the cap.
    backoff = Backoff(Policy(initial_seconds=0.5, max_seconds=30, jitter=0.0))
    delays = [backoff.next_delay() for _ in range(5000)]
    assert delays[-1] == 30.0


def test_one_settings_class_with_the_responders_defaults_and_the_same_checks() -> None:
    assert isinstance(WatchBackoff(), BackoffSettings)
    assert (WatchBackoff().initial_seconds, WatchBackoff().jitter) == (1.0, 0.2)
    assert (BackoffSettings().initial_seconds, BackoffSettings().jitter) == (0.5, 0.5)
    with pytest.raises(SettingsError, match="max_seconds"):
        WatchBackoff(max_seconds=0.5)
