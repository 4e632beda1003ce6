"""Fuzzing the wire: random and damaged frames through the codec (only FrameError may come
out), then through a real `fusee server` (it closes each bad connection, keeps serving,
and prints no traceback).

The seed is printed; set FUSEE_FUZZ_SEED to replay a run, FUSEE_FUZZ_CONNECTIONS to
change the size of the storms.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import google_crc32c
import msgspec
import pytest

import fusee
from fusee.protocol import handshake
from fusee.protocol import messages as m
from fusee.protocol.frames import (
    HANDSHAKE_BYTES_MAX,
    HEADER,
    HEADER_BYTES,
    MAGIC,
    Decoder,
    FrameError,
    Kind,
    encode,
)
from tests.support.procs import Server

SEED = int(os.environ.get("FUSEE_FUZZ_SEED") or secrets.randbits(32))
CONNECTIONS = int(os.environ.get("FUSEE_FUZZ_CONNECTIONS") or 300)
PARALLEL = 32
WAIT_S = 5.0


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    print(f"FUSEE_FUZZ_SEED={SEED}")
    return random.Random(f"{SEED}/{request.node.name}")


def seeded(what: str) -> str:
    return f"{what} (replay with FUSEE_FUZZ_SEED={SEED})"


# One valid message of every kind (the test fails when a kind is added without one).
SAMPLES: list[Any] = [
    m.Open(m.VERSION, m.ROLE_CLIENT),
    m.Open(m.VERSION, m.ROLE_WORKER, max_shards=2, invocation="inv-1", liveness=False),
    m.Welcome(4, [(0, 7), (1, 8)], 1000, 5000),
    m.Lease(1, 9),
    m.Ping(),
    m.Request(3, "records", 0, 5, after=2, max_bytes=4096, offsets=[0, 17], data=b"cp"),
    m.Reply(3, None, 12, 40, (10, b"checkpoint"), [b"a", b"bc"]),
    m.Append(0, 5, 1, [b"record-1", b"record-2"]),
    m.Durable([(0, 5, 2), (1, 6, 9)]),
    m.PutRun(0, 5, 0, b"run-frame"),
    m.RunPut(0, 5, 0, "refused"),
    m.Relay(2, False, b"message"),
    m.Call(7, "list", -1, m.encode_value({"type": None, "status": None})),
    m.Answer(7, m.encode_value([{"id": "a", "shard": 0}])),
    m.Drain([0, 3]),
    m.Idle(0, 5, 1234, True, False, 3, 1.5),
]
HANDSHAKE_BODIES = [
    (Kind.HELLO, handshake.hello(bytes(32))),
    (Kind.CHALLENGE, handshake.challenge(bytes(range(32)))),
    (Kind.PROOF, bytes(32)),
    (Kind.ACCEPT, bytes(32)),
    (Kind.REFUSED, b"a reason"),
]
VALID_FRAMES = [encode(*m.payload(sample)) for sample in SAMPLES] + [encode(*kb) for kb in HANDSHAKE_BODIES]


def test_the_samples_cover_every_kind():
    assert {type(sample) for sample in SAMPLES} == set(m.TYPES.values())


# -- damage -----------------------------------------------------------------------------


def flip_bits(rng: random.Random, data: bytes, count: int = 1) -> bytes:
    damaged = bytearray(data)
    for _ in range(count):
        bit = rng.randrange(len(damaged) * 8)
        damaged[bit // 8] ^= 1 << (bit % 8)
    return bytes(damaged)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 4 else 6)
    if choice == 0:
        return rng.choice([None, True, False])
    if choice == 1:
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), 2**64 - 1, rng.randrange(-(2**40), 2**40)])
    if choice == 2:
        return rng.random() * rng.choice([1, -1e300, 1e300])
    if choice == 3:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(12)))
    if choice == 4:
        return rng.randbytes(rng.randrange(40))
    if choice == 5:
        return rng.choice(["client", "worker", "records", "list", ""])
    if choice in (6, 7):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(8))]
    return {str(random_value(rng, depth + 1)): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def garbage_payload(rng: random.Random) -> bytes:
    """Bytes that may or may not be MessagePack, of the right shape or not."""
    choice = rng.randrange(4)
    if choice == 0:
        return rng.randbytes(rng.randrange(64))
    if choice == 1:
        return m.encode_value(random_value(rng))
    if choice == 2:  # a valid message's fields, shuffled, cut or extended
        fields = list(msgspec.msgpack.decode(m.payload(rng.choice(SAMPLES))[1]))
        rng.shuffle(fields)
        del fields[rng.randrange(len(fields) + 1) :]
        fields += [random_value(rng) for _ in range(rng.randrange(3))]
        return m.encode_value(fields)
    return flip_bits(rng, m.payload(rng.choice(SAMPLES))[1], rng.randrange(1, 4))


def damaged_frame(rng: random.Random) -> bytes:
    """A frame broken in one of the ways a stream can be."""
    frame = rng.choice(VALID_FRAMES)
    kind, payload = int.from_bytes(frame[4:6], "little"), frame[HEADER_BYTES:]
    choice = rng.randrange(10)
    if choice == 0:
        return flip_bits(rng, frame, rng.randrange(1, 6))
    if choice == 1:
        return frame[: rng.randrange(len(frame))]
    if choice == 2:
        return frame + rng.randbytes(rng.randrange(1, 40))
    if choice == 3:  # a wrong length, checksum as it was
        length = rng.choice([0, len(payload) + 1, len(payload) - 1, rng.randrange(2**32)]) % 2**32
        return frame[:8] + length.to_bytes(4, "little") + frame[12:]
    if choice == 4:  # a wrong length with a checksum that covers it
        cut = rng.randrange(len(payload) + 1)
        return encode(kind, payload[:cut])
    if choice == 5:
        return encode(rng.randrange(2**16), payload)
    if choice == 6:
        return encode(rng.choice(list(m.TYPES)), garbage_payload(rng))
    if choice == 7:  # a header with flags set, checksum valid
        head = HEADER.pack(MAGIC, kind, rng.randrange(1, 2**16), len(payload), 0)[:12]
        crc = google_crc32c.extend(google_crc32c.value(head), payload)
        return head + int(crc).to_bytes(4, "little") + payload
    if choice == 8:
        return rng.randbytes(rng.randrange(1, 64))
    return MAGIC + rng.randbytes(rng.randrange(60))


# -- the codec --------------------------------------------------------------------------


def decode_stream(data: bytes, rng: random.Random, limit: int | None = None) -> list[Any]:
    """Feed `data` in random pieces; decode every frame. Returns the messages; raises only
    what the codec raises."""
    decoder = Decoder() if limit is None else Decoder(limit)
    messages = []
    at = 0
    while at < len(data):
        step = rng.choice([1, 3, 16, 17, 64, len(data)])
        for kind, payload in decoder.feed(data[at : at + step]):
            messages.append(m.decode(kind, payload) if kind in m.TYPES else (kind, payload))
        at += step
    decoder.finish()
    return messages


def only_frame_errors(what: Callable[[], object], case: object) -> bool:
    """True when `what` raised FrameError, False when it returned; anything else fails."""
    try:
        what()
    except FrameError:
        return True
    except Exception as error:  # noqa: BLE001 - what the test is about
        pytest.fail(seeded(f"{type(error).__name__}: {error} for {case!r}"))
    return False


def test_valid_frames_decode_in_any_pieces(rng):
    for _ in range(300):
        chosen = rng.sample(range(len(SAMPLES)), rng.randrange(1, 6))
        data = b"".join(VALID_FRAMES[i] for i in chosen)
        assert decode_stream(data, rng) == [SAMPLES[i] for i in chosen], seeded(repr(data))


def test_one_flipped_bit_or_a_cut_is_always_a_frame_error(rng):
    for frame in VALID_FRAMES:
        for _ in range(100):
            flipped = flip_bits(rng, frame)
            assert only_frame_errors(lambda f=flipped: decode_stream(f, rng), flipped), seeded(repr(flipped))
        for cut in range(1, len(frame)):
            part = frame[:cut]
            assert only_frame_errors(lambda p=part: decode_stream(p, rng), part), seeded(repr(part))


def test_random_and_damaged_frames_raise_only_frame_errors(rng):
    outcomes: Counter[str] = Counter()
    for _ in range(20000):
        pieces = [rng.choice(VALID_FRAMES) for _ in range(rng.randrange(3))]
        pieces.insert(rng.randrange(len(pieces) + 1), damaged_frame(rng))
        data = b"".join(pieces)
        limit = rng.choice([None, HANDSHAKE_BYTES_MAX, 64])
        refused = only_frame_errors(lambda d=data, lim=limit: decode_stream(d, rng, lim), data)
        outcomes["refused" if refused else "decoded"] += 1
    assert outcomes["refused"] > 10000, outcomes  # the damage is real damage, mostly


def test_garbage_payloads_of_every_kind_raise_only_frame_errors(rng):
    for _ in range(20000):
        kind = rng.choice([*m.TYPES, *(k for k, _ in HANDSHAKE_BODIES), rng.randrange(2**16)])
        payload = garbage_payload(rng)
        only_frame_errors(lambda k=kind, p=payload: m.decode(k, p), (kind, payload))
        only_frame_errors(lambda p=payload: m.decode_value(p), payload)


def test_handshake_bodies_raise_only_handshake_errors(rng):
    for _ in range(2000):
        body = rng.choice([rng.randbytes(rng.randrange(80)), flip_bits(rng, HANDSHAKE_BODIES[0][1])])
        for read in (handshake.read_hello, handshake.read_challenge):
            try:
                read(body)
            except handshake.HandshakeError:
                pass


@pytest.mark.parametrize("nesting", [b"\x91", b"\x81\xa1k"])
def test_deeply_nested_values_are_frame_errors(nesting):
    only_frame_errors(lambda: m.decode_value(nesting * 5000 + b"\xc0"), nesting)


# -- a real server ----------------------------------------------------------------------


@dataclass
class Case:
    """One connection of a storm: what it sends, and whether the server must close it on
    its own (a broken frame, a kind its role never sends) or may wait for more (an
    incomplete frame, messages it accepts): then the test half-closes first."""

    name: str
    opening: bytes  # sent first; its answer (WELCOME) awaited when not empty
    data: bytes
    closes: bool


def closes_before_open(data: bytes) -> bool:
    """Whether a server without a token must refuse `data` as a connection's first bytes."""
    try:
        frames = Decoder(HANDSHAKE_BYTES_MAX).feed(data)
    except FrameError:
        return True
    if not frames:
        return False
    kind, payload = frames[0]
    if kind != Kind.OPEN:
        return True
    try:
        opening = m.decode(kind, payload)
    except FrameError:
        return True
    return (
        opening.version != m.VERSION
        or opening.role not in (m.ROLE_CLIENT, m.ROLE_WORKER)
        or (opening.max_shards is not None and opening.max_shards < 1)
    )


NEVER_SENT_BY_PEERS = (m.Open, m.Welcome, m.Lease, m.Reply, m.Durable, m.RunPut, m.Idle)


def closes_after_open(data: bytes, role: int) -> bool:
    """Whether the server must close the connection of a `role` that sent `data` after its
    OPEN (False: it may keep it, waiting for more)."""
    try:
        frames = Decoder().feed(data)
    except FrameError:
        return True
    for kind, payload in frames:
        try:
            message = m.decode(kind, payload)
        except FrameError:
            if kind == Kind.CALL and answerable_call(payload):
                continue  # answered Rejected on the open connection (docs/server.md)
            return True
        if isinstance(message, NEVER_SENT_BY_PEERS):
            return True
        if isinstance(message, m.Drain):
            if role != m.ROLE_WORKER:
                return True
            # A worker's DRAIN of shards it holds is answered, one of others closes: which
            # shards a worker of the storm was granted depends on the storm's timing.
            continue
    return False


def answerable_call(payload: bytes) -> bool:
    """A CALL whose fields do not decode but whose request number reads (a msgpack array
    starting with an int): the server answers it Rejected and keeps the connection."""
    try:
        fields = msgspec.msgpack.decode(payload)
    except msgspec.DecodeError:
        return False
    return isinstance(fields, list) and bool(fields) and type(fields[0]) is int


def storm_case(rng: random.Random) -> Case:
    role = rng.choice([m.ROLE_CLIENT, m.ROLE_CLIENT, m.ROLE_WORKER])
    opening = encode(*m.payload(m.Open(m.VERSION, role, max_shards=rng.choice([None, 1, 2]))))
    choice = rng.randrange(6)
    if choice == 0:
        data = rng.randbytes(rng.randrange(1, 2048))
        return Case("random bytes", b"", data, closes_before_open(data))
    if choice == 1:
        data = flip_bits(rng, opening, rng.randrange(1, 4))
        return Case("a damaged OPEN", b"", data, closes_before_open(data))
    if choice == 2:
        data = damaged_frame(rng)
        return Case("a damaged frame before OPEN", b"", data, closes_before_open(data))
    if choice == 3:
        data = rng.randbytes(rng.randrange(1, 2048))
        return Case(f"random bytes after a {role}'s OPEN", opening, data, closes_after_open(data, role))
    valid = [encode(*m.payload(rng.choice([m.Ping(), SAMPLES[12]]))) for _ in range(rng.randrange(3))]
    valid.insert(rng.randrange(len(valid) + 1), damaged_frame(rng))
    data = b"".join(valid)
    return Case(f"a damaged frame after a {role}'s OPEN", opening, data, closes_after_open(data, role))


async def read_until_closed(reader: asyncio.StreamReader) -> bytes:
    received = bytearray()
    try:
        while chunk := await reader.read(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return bytes(received)


async def welcome(reader: asyncio.StreamReader) -> None:
    decoder = Decoder()
    while True:
        chunk = await reader.read(65536)
        assert chunk, "the server closed the connection after a valid OPEN"
        if any(kind == Kind.WELCOME for kind, _ in decoder.feed(chunk)):
            return


async def run_case(host: str, port: int, case: Case) -> tuple[str, bytes]:
    """How the connection ended ("closed", "closed after our EOF"), and what it received."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        if case.opening:
            writer.write(case.opening)
            await asyncio.wait_for(welcome(reader), WAIT_S)
        try:
            writer.write(case.data)
            await writer.drain()
            if not case.closes:
                writer.write_eof()
        except (ConnectionResetError, BrokenPipeError):
            pass
        try:
            received = await asyncio.wait_for(read_until_closed(reader), WAIT_S)
        except TimeoutError:
            raise AssertionError(seeded(f"the server kept open {case}")) from None
        return ("closed" if case.closes else "closed after our EOF"), received
    finally:
        writer.close()


async def storm(server: Server, cases: list[Case]) -> list[tuple[str, bytes]]:
    host, port = server.host_port.rsplit(":", 1)
    gate = asyncio.Semaphore(PARALLEL)

    async def one(case: Case) -> tuple[str, bytes]:
        async with gate:
            return await run_case(host, int(port), case)

    return await asyncio.gather(*(one(case) for case in cases))


async def assert_serving(server: Server, **options: str) -> None:
    assert server.popen.poll() is None, server.output()
    client = await fusee.Client.connect(server.address(**options))
    try:
        with pytest.raises(fusee.NoHolderError):
            await anext(client.list())
    finally:
        await client.close()


def output_after_stop(server: Server) -> str:
    assert server.stop() == 0, server.output()
    server.close()
    return "\n".join(server.lines)


async def test_a_storm_of_bad_connections_leaves_the_server_serving(start_server, rng):
    server = start_server()
    cases = [storm_case(rng) for _ in range(CONNECTIONS)]
    results = await storm(server, cases)
    print(Counter(f"{case.name}: {how}" for case, (how, _) in zip(cases, results, strict=True)))
    assert sum(case.closes for case in cases) > CONNECTIONS // 2
    await assert_serving(server)
    output = output_after_stop(server)
    assert "Traceback" not in output, seeded(output[-5000:])


def token_case(rng: random.Random, token: bytes) -> Case:
    """A first flight against a token server: what the server must refuse."""
    hello_body = handshake.hello(handshake.nonce())
    hello = encode(Kind.HELLO, hello_body)
    choice = rng.randrange(5)
    if choice == 0:
        data = rng.randbytes(rng.randrange(1, 256))
    elif choice == 1:
        data = flip_bits(rng, hello, rng.randrange(1, 4))
    elif choice == 2:
        data = damaged_frame(rng)
    elif choice == 3:  # a proof made without the server's challenge, or damaged
        proof = handshake.proof(token, handshake.transcript(hello_body, handshake.challenge(bytes(32))))
        data = hello + rng.choice([encode(Kind.PROOF, proof), damaged_frame(rng)])
    else:
        data = encode(*m.payload(SAMPLES[rng.randrange(2)])) + hello
    try:
        frames = Decoder(HANDSHAKE_BYTES_MAX).feed(data)
        if frames and frames[0].kind == Kind.HELLO:
            handshake.read_hello(frames[0].payload)
            closes = len(frames) > 1  # the proof, which cannot verify
        else:
            closes = bool(frames)  # no frame yet: the server waits for the rest
    except (FrameError, handshake.HandshakeError):
        closes = True
    return Case("a token server's first flight", b"", data, closes)


async def test_a_token_server_refuses_every_bad_first_flight(start_server, rng, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(secrets.token_hex(32))
    token_file.chmod(0o600)
    server = start_server("--token-file", str(token_file))
    token = token_file.read_bytes().strip()
    cases = [token_case(rng, token) for _ in range(CONNECTIONS // 2)]
    results = await storm(server, cases)
    for case, (_, received) in zip(cases, results, strict=True):
        kinds = [kind for kind, _ in Decoder().feed(received)]
        assert Kind.ACCEPT not in kinds and Kind.WELCOME not in kinds, seeded(repr(case))
    await assert_serving(server, token_file=str(token_file))
    output = output_after_stop(server)
    assert "Traceback" not in output, seeded(output[-5000:])
