"""The few protobuf wire-format primitives the Tinker SDK's binary messages need.

The SDK sends forward_backward requests and reads forward_backward and sample results as
protobuf. Decoding them here (varints, length-delimited fields, doubles) keeps the server
free of a generated-code dependency; nothing in a message is executed or unpickled.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, FIXED64, LEN, FIXED32 = 0, 1, 2, 5


class ProtoError(ValueError):
    """A binary body that is not a well-formed protobuf message."""


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint longer than 10 bytes")


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` for each field: an int for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == VARINT:
            value, pos = _read_varint(buf, pos)
            yield number, wire, value
        elif wire == LEN:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise ProtoError(f"field {number} runs past the end of the message")
            yield number, wire, buf[pos:pos + size]
            pos += size
        elif wire in (FIXED64, FIXED32):
            width = 8 if wire == FIXED64 else 4
            if pos + width > len(buf):
                raise ProtoError(f"field {number} runs past the end of the message")
            yield number, wire, buf[pos:pos + width]
            pos += width
        else:
            raise ProtoError(f"unsupported wire type {wire} for field {number}")


def signed64(value: int) -> int:
    """A varint as the int64/int32 it encodes (two's complement for negatives)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def packed_ints(wire: int, value: int | bytes) -> list[int]:
    """A repeated integer field's values, packed (one LEN field) or not (one VARINT)."""
    if wire == VARINT:
        return [signed64(int(value))]
    out, pos, data = [], 0, bytes(value)
    while pos < len(data):
        item, pos = _read_varint(data, pos)
        out.append(signed64(item))
    return out


def as_double(wire: int, value: int | bytes) -> float:
    if wire != FIXED64:
        raise ProtoError("expected a double")
    return struct.unpack("<d", bytes(value))[0]


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def enc_varint(number: int, value: int) -> bytes:
    return _varint(number << 3 | VARINT) + _varint(int(value))


def enc_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | LEN) + _varint(len(value)) + value


def enc_string(number: int, value: str) -> bytes:
    return enc_bytes(number, value.encode())


def enc_double(number: int, value: float) -> bytes:
    return _varint(number << 3 | FIXED64) + struct.pack("<d", float(value))


def enc_packed(number: int, values: list[int]) -> bytes:
    return enc_bytes(number, b"".join(_varint(int(v)) for v in values))
