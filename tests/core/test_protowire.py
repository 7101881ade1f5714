"""The hand-written protobuf wire format: what it writes it reads back, and malformed bytes are refused."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuhealth.protowire import (
    I32,
    I64,
    LEN,
    VARINT,
    WireError,
    encode_field,
    encode_varint,
    fields,
    read_varint,
)

values = st.one_of(
    st.integers(min_value=0, max_value=(1 << 64) - 1), st.binary(max_size=40), st.text(max_size=20)
)
messages = st.lists(st.tuples(st.integers(min_value=1, max_value=(1 << 29) - 1), values), max_size=12)


@given(messages)
def test_fields_read_back_what_was_written_in_order(written: list[tuple[int, int | bytes | str]]) -> None:
    data = b"".join(encode_field(n, v) for n, v in written)
    read = fields(data)
    expected = [
        (n, VARINT, v) if isinstance(v, int) else (n, LEN, v.encode() if isinstance(v, str) else v)
        for n, v in written
    ]
    assert read == expected


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_a_negative_int_is_its_64_bit_twos_complement(value: int) -> None:
    raw = encode_varint(value)
    assert len(raw) <= 10
    assert read_varint(raw, 0) == (value & ((1 << 64) - 1), len(raw))


def test_fixed_values_read_as_little_endian_ints() -> None:
    data = (
        bytes([1 << 3 | I64]) + (7).to_bytes(8, "little") + bytes([2 << 3 | I32]) + (9).to_bytes(4, "little")
    )
    assert fields(data) == [(1, I64, 7), (2, I32, 9)]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\x08", "runs past the end"),
        (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
        (b"\x00", "field number 0"),
        (b"\x0a\x05ab", "5 bytes announced, 2 left"),
        (b"\x09\x01\x02", "fixed value runs past the end"),
        (b"\x0b", "wire type 3"),
    ],
)
def test_malformed_bytes_are_refused_with_the_reason(data: bytes, why: str) -> None:
    with pytest.raises(WireError, match=why):
        fields(data)


@given(st.binary(max_size=64))
def test_any_bytes_are_read_or_refused_never_crash(data: bytes) -> None:
    try:
        read = fields(data)
    except WireError:
        return
    assert all(n >= 1 and w in (VARINT, I64, LEN, I32) for n, w, _ in read)
    assert sum(len(v) for _, w, v in read if w == LEN and isinstance(v, bytes)) <= len(data)
