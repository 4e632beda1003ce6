"""Frames: how every message between workers, clients and `fusee server` is cut into
bytes. Pure functions over bytes (and a decoder that only buffers), apart from any
socket, so both sides and the fuzz tests use the very same code.

A frame is a 16-byte header, then its payload (docs/FORMAT.md, *The wire*):

    0   magic    4 bytes  b"FSE1"
    4   kind     u16 LE   what the payload is (`Kind`)
    6   flags    u16 LE   0 (reserved: a frame with any flag set is refused)
    8   length   u32 LE   payload bytes
    12  crc      u32 LE   CRC32C of bytes 0..12 and the payload

The checksum covers the header too, so a flipped length or kind is caught, not read as
another frame. Every length is checked against the decoder's limit before a byte of the
payload is buffered: a peer cannot make the other side hold more than one frame's worth.
A bad frame raises `FrameError` naming what was wrong; the connection that sent it is
closed (a stream cannot resynchronise after a bad header), and no other one is touched.
"""

from __future__ import annotations

import enum
import struct
from typing import NamedTuple

import google_crc32c

MAGIC = b"FSE1"
HEADER = struct.Struct("<4sHHII")
HEADER_BYTES = HEADER.size  # 16
HANDSHAKE_BYTES_MAX = 1024  # the token exchange's frames (docs/FORMAT.md, *The token exchange*)
PAYLOAD_BYTES_MAX = (64 << 20) + (64 << 10)  # a section of records up to the log's limit, and room


class Kind(enum.IntEnum):
    """Frame kinds: the messages of docs/FORMAT.md (*Messages*), and the token exchange's
    (*The token exchange*)."""

    OPEN = 1  # a worker's or client's first frame: its role, how many shards it wants
    WELCOME = 2  # the server's answer: shard count, the leases granted at once, liveness
    LEASE = 3  # a standby is granted a shard
    PING = 4  # a worker is alive: every second, from a thread of its own (pinger.py)
    REQUEST = 5  # a round trip about a held shard: open, records, runs, checkpoint, release
    REPLY = 6
    APPEND = 7  # a shard's records, pipelined; answered by DURABLE once a write covers them
    DURABLE = 8
    PUT_RUN = 9  # a run-store frame at an offset the worker computed
    RUN_PUT = 10
    RELAY = 11  # a message or acknowledgment between shards held by different workers
    CALL = 12  # a client's call, relayed to the holder of its shard
    ANSWER = 13
    DRAIN = 28  # route nothing more for these shards (invoked workers)
    IDLE = 29  # per shard and epoch: work left, next due time... (invoked workers)
    PERMIT_ASK = 30  # a worker's step waits for a limit's permit (docs/limits.md)
    PERMIT_GRANT = 31  # the server grants permits, by the worker's ticket
    PERMIT_RETURN = 32  # a worker returns permits, or withdraws tickets still waiting
    PERMIT_RENEW = 33  # a worker renews the leases of the permits it holds (every second)
    HELLO = 0xF0
    CHALLENGE = 0xF1
    PROOF = 0xF2
    ACCEPT = 0xF3
    REFUSED = 0xF4


class Frame(NamedTuple):
    kind: int
    payload: bytes


class FrameError(ValueError):
    """A frame that breaks the format; the message names the field."""


def _crc(header12: bytes, payload: bytes | memoryview) -> int:
    return int(google_crc32c.extend(google_crc32c.value(header12), payload))


def encode(kind: int, payload: bytes, limit: int = PAYLOAD_BYTES_MAX) -> bytes:
    """One frame. Refuses (FrameError) what the receiving side would refuse."""
    if not 0 <= kind <= 0xFFFF:
        raise FrameError(f"frame kind {kind} is not a u16")
    if len(payload) > limit:
        raise FrameError(f"frame payload of {len(payload)} bytes is over the limit of {limit}")
    head = HEADER.pack(MAGIC, kind, 0, len(payload), 0)[:12]
    return head + _crc(head, payload).to_bytes(4, "little") + payload


class Decoder:
    """Cuts a byte stream into frames. Feed it what the socket gave; it returns the whole
    frames received so far and keeps the rest. After a `FrameError` it refuses to go on
    (the stream has lost its place)."""

    def __init__(self, limit: int = PAYLOAD_BYTES_MAX) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.broken: FrameError | None = None

    def feed(self, data: bytes, most: int | None = None) -> list[Frame]:
        """The whole frames received so far, or the first `most` of them (the rest stay
        buffered: a connection's setup takes one at a time, since a frame may raise the
        limit the next one is checked against)."""
        if self.broken is not None:
            raise self.broken
        # With nothing held over (the usual case: a read ends on a frame's end), frames
        # are cut from `data` itself: one copy of each payload, none of the read.
        buffer: bytes | bytearray
        if self.buffer:
            self.buffer += data
            buffer = self.buffer
        else:
            buffer = data
        frames: list[Frame] = []
        start = 0
        try:
            while len(buffer) - start >= HEADER_BYTES and (most is None or len(frames) < most):
                magic, kind, flags, length, crc = HEADER.unpack_from(buffer, start)
                if magic != MAGIC:
                    raise FrameError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r}): not a fusee peer")
                if flags:
                    raise FrameError(f"frame flags {flags:#06x} are reserved and must be 0")
                if length > self.limit:
                    raise FrameError(f"frame of {length} bytes is over the limit of {self.limit}")
                end = start + HEADER_BYTES + length
                if len(buffer) < end:
                    break
                payload = bytes(buffer[start + HEADER_BYTES : end])
                if _crc(bytes(buffer[start : start + 12]), payload) != crc:
                    raise FrameError(f"frame checksum mismatch (kind {kind}, {length} bytes)")
                frames.append(Frame(kind, payload))
                start = end
        except FrameError as error:
            self.broken = error
            self.buffer = bytearray()
            raise
        if buffer is self.buffer:
            del self.buffer[:start]
        elif start < len(buffer):
            self.buffer = bytearray(buffer[start:])
        return frames

    def finish(self) -> None:
        """The stream ended: a frame left half-received is an error (a peer that died
        mid-frame, or a length that was damaged and waits for bytes that never come)."""
        if self.broken is None and self.buffer:
            self.broken = FrameError(f"the stream ended inside a frame ({len(self.buffer)} bytes of it)")
            self.buffer = bytearray()
            raise self.broken
