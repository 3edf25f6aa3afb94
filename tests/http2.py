"""Raw HTTP/2 framing (RFC 9113) and HPACK literals (RFC 7541) for the tests that play a client
gRPC's own would never be: one that sends oversized or half-sent messages and headers."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# frame types
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9,
)  # fmt: skip
# frame flags
END_STREAM, END_HEADERS, ACK = 0x1, 0x4, 0x1


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """HPACK's integer with an N-bit prefix."""
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([first | value])
    out = [first | top]
    value -= top
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """An HPACK literal header without indexing, strings not Huffman-coded."""
    return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value
