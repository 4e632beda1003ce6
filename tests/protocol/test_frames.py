"""The frame codec (`fusee/protocol/frames.py`): a frame comes back as it went, however
the stream is cut, and every damaged or hostile input gets `FrameError` naming what was
wrong, before a byte past the limit is buffered, never any other exception."""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fusee.protocol import frames
from fusee.protocol.frames import (
    HANDSHAKE_BYTES_MAX,
    HEADER_BYTES,
    PAYLOAD_BYTES_MAX,
    Decoder,
    Frame,
    FrameError,
    Kind,
    encode,
)


def test_frames_come_back_whole_however_the_stream_is_cut():
    sent = [Frame(Kind.HELLO, os.urandom(40)), Frame(Kind.IDLE, b""), Frame(7, os.urandom(3000))]
    stream = b"".join(encode(f.kind, f.payload) for f in sent)
    for cut in (1, 2, 5, HEADER_BYTES, 17, 1000, len(stream)):
        decoder, got = Decoder(), []
        for i in range(0, len(stream), cut):
            got += decoder.feed(stream[i : i + cut])
        assert got == sent and not decoder.buffer


def test_the_header_is_the_documented_sixteen_bytes():
    frame = encode(Kind.CHALLENGE, b"nonce")
    assert frame[:4] == b"FSE1" and len(frame) == HEADER_BYTES + 5
    assert int.from_bytes(frame[4:6], "little") == 0xF1
    assert frame[6:8] == b"\0\0" and int.from_bytes(frame[8:12], "little") == 5
    # CRC32C of the check value "123456789" is e3069283 (the checksum is CRC32C, not CRC-32)
    assert frames._crc(b"1234", b"56789") == 0xE3069283


REFUSALS = ("magic", "flags", "checksum", "limit", "ended inside")
"""What a FrameError names: the field that was wrong."""


@pytest.mark.parametrize("index", range(HEADER_BYTES + 8))
def test_any_flipped_byte_is_refused_naming_the_field(index: int):
    frame = bytearray(encode(Kind.PROOF, bytes(range(8))))
    frame[index] ^= 0x40
    decoder = Decoder(limit=1 << 20)
    with pytest.raises(FrameError) as error:
        assert decoder.feed(bytes(frame)) == []  # a longer length waits for more bytes...
        decoder.finish()  # ...which never come
    assert any(word in str(error.value) for word in REFUSALS)


def test_an_announced_length_over_the_limit_is_refused_before_its_payload_arrives():
    decoder = Decoder(limit=frames.HANDSHAKE_BYTES_MAX)
    header = encode(Kind.HELLO, b"x" * 2000, limit=1 << 20)[:HEADER_BYTES]
    with pytest.raises(FrameError, match="over the limit of 1024"):
        decoder.feed(header)  # the header alone: nothing of the payload is waited for
    with pytest.raises(FrameError):
        decoder.feed(encode(Kind.HELLO, b"ok"))  # a broken stream stays broken
    with pytest.raises(FrameError, match="over the limit"):
        encode(Kind.HELLO, b"x" * 2000, limit=frames.HANDSHAKE_BYTES_MAX)
    with pytest.raises(FrameError, match="u16"):
        encode(0x10000, b"")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(list(Kind)), st.binary(max_size=100)), max_size=3),
    st.binary(max_size=200),
    st.integers(1, 64),
)
def test_random_bytes_get_frames_or_frame_error_and_nothing_else(
    frames_first: list[tuple[Kind, bytes]], data: bytes, cut: int
):
    """Real frames, then random bytes: whatever decodes is the stream's own bytes, frame by
    frame (encoding the frames again gives the stream's beginning), the real frames first;
    the rest waits in the buffer, or is refused naming the field that was wrong."""
    sent = [Frame(kind, payload) for kind, payload in frames_first]
    stream = b"".join(encode(f.kind, f.payload) for f in sent) + data
    decoder, got = Decoder(limit=4096), []
    try:
        for i in range(0, len(stream), cut):
            got += decoder.feed(stream[i : i + cut])
    except FrameError as error:
        assert any(word in str(error) for word in REFUSALS), error
        assert got[: len(sent)] == sent[: len(got)]  # a frame cut by the refusal is not read
    else:
        assert got[: len(sent)] == sent
        assert b"".join(encode(f.kind, f.payload, limit=4096) for f in got) + bytes(decoder.buffer) == stream
    assert all(len(frame.payload) <= 4096 for frame in got)
    assert stream.startswith(b"".join(encode(f.kind, f.payload, limit=4096) for f in got))


def test_mutated_streams_of_real_frames_get_frame_error_or_the_frames_they_still_hold():
    rng = random.Random(20261130)
    for _ in range(500):
        sent = [Frame(rng.choice(list(Kind)), rng.randbytes(rng.randrange(0, 300))) for _ in range(3)]
        stream = bytearray(b"".join(encode(f.kind, f.payload) for f in sent))
        for _ in range(rng.randrange(1, 4)):
            stream[rng.randrange(len(stream))] = rng.randrange(256)
        if rng.random() < 0.3:
            del stream[rng.randrange(len(stream)) :]
        decoder = Decoder(limit=4096)
        try:
            got = decoder.feed(bytes(stream))
            decoder.finish()
        except FrameError:
            continue
        # Whatever decodes is a prefix of what was sent: a mutation is never read as data.
        assert got == sent[: len(got)]


def test_one_frame_at_a_time_checks_each_against_the_limit_set_after_the_one_before():
    """A connection's setup takes its frames one by one (an ACCEPT and the WELCOME behind
    it arrive in one read): the WELCOME gets the full limit only if the ACCEPT raised it."""
    accept = Frame(Kind.ACCEPT, b"a" * 32)
    welcome = Frame(Kind.WELCOME, b"w" * (HANDSHAKE_BYTES_MAX + 1))
    data = encode(*accept) + encode(*welcome)
    raised = Decoder(HANDSHAKE_BYTES_MAX)
    assert raised.feed(data, 1) == [accept]
    raised.limit = PAYLOAD_BYTES_MAX
    assert raised.feed(b"", 1) == [welcome]
    assert raised.feed(b"", 1) == [] and not raised.buffer
    kept = Decoder(HANDSHAKE_BYTES_MAX)
    assert kept.feed(data, 1) == [accept]
    with pytest.raises(FrameError, match="over the limit"):
        kept.feed(b"", 1)
