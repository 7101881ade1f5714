"""The protobuf wire format, read and written by hand: varints, fields, length-delimited values.

Two small schemas are spoken without generated modules: the kubelet's pod-resources answer
(`exporter.podresources`, and the simulated kubelets that serve it) and the Kubernetes
protobuf objects the simulated API server accepts (`simulator.apiserver.protobuf`). Both read a
message as its (field number, wire type, value) triples and leave the schema to the caller.

Wire types (protobuf's encoding guide): 0 varint, 1 fixed 64-bit, 2 length-delimited, 5 fixed
32-bit; 3 and 4 (groups) are deprecated and refused. Fixed values are returned as unsigned
little-endian integers. Pure: bytes in, plain data out.
"""

from __future__ import annotations

VARINT, I64, LEN, I32 = 0, 1, 2, 5

Field = tuple[int, int, int | bytes]
"""(field number, wire type, value): a varint or fixed value as an int, a length-delimited one as bytes."""


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint at `pos`; at most 10 bytes (64 bits)."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("a varint runs past the end of the message")
        if shift >= 64:
            raise WireError("a varint longer than 10 bytes")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def fields(data: bytes) -> list[Field]:
    """The fields of one message, in the order they appear (repeated ones as often as they do)."""
    out: list[Field] = []
    pos = 0
    while pos < len(data):
        key, pos = read_varint(data, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError("field number 0")
        value: int | bytes
        if wire == VARINT:
            value, pos = read_varint(data, pos)
        elif wire == LEN:
            size, pos = read_varint(data, pos)
            if pos + size > len(data):
                raise WireError(f"field {number}: {size} bytes announced, {len(data) - pos} left")
            value, pos = data[pos : pos + size], pos + size
        elif wire in (I64, I32):
            size = 8 if wire == I64 else 4
            if pos + size > len(data):
                raise WireError(f"field {number}: a fixed value runs past the end")
            value, pos = int.from_bytes(data[pos : pos + size], "little"), pos + size
        else:
            raise WireError(f"field {number}: wire type {wire} (groups or unknown) is not supported")
        out.append((number, wire, value))
    return out


def encode_varint(value: int) -> bytes:
    """`value` as a varint; a negative int as its 64-bit two's complement (int32/int64 fields)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def encode_field(number: int, value: int | bytes | str) -> bytes:
    """One field: an int as a varint, str and bytes length-delimited (a nested message too)."""
    if isinstance(value, int):
        return encode_varint(number << 3 | VARINT) + encode_varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return encode_varint(number << 3 | LEN) + encode_varint(len(raw)) + raw
