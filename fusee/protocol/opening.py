"""The connecting side's setup of a connection, without I/O: the token exchange
(docs/FORMAT.md, "The token exchange"), then OPEN until the server's WELCOME, as a state
machine over frames (like h11: bytes and frames in, frames to send out, no sockets).

Two drivers feed it, and both therefore put the same frames on the wire in the same
order: `connection.ClientConnection` (asyncio, workers and clients) and
`pinger.open_blocking` (a blocking socket in a worker's ping thread). Each sends what
`start` and `receive` return, feeds back every frame it reads until `state` is READY, and
turns the two refusals below into its own ConnectionError.

OPEN leaves with the PROOF, in the same write, and the server answers ACCEPT and WELCOME
in one write: the setup takes two round trips after TCP's, not three (docs/FORMAT.md, *The
token exchange*). Nothing is acted on before both proofs verified: the server reads the
OPEN only once the PROOF verified, and this side verifies the ACCEPT before it takes the
WELCOME behind it, with the frame limit raised only then (a party that did not prove the
token gets no large buffer). What OPEN tells a party without the token (the role, an
invocation or pinger session it cannot use without the token) is no secret: without TLS
it crosses the wire in the clear anyway, and TLS authenticated the server before it.
"""

from __future__ import annotations

import enum

from fusee.protocol import handshake
from fusee.protocol.frames import HANDSHAKE_BYTES_MAX, PAYLOAD_BYTES_MAX, FrameError, Kind
from fusee.protocol.messages import Open, Welcome, decode, payload

Outgoing = tuple[int, bytes]  # a frame to send: its kind and payload


class State(enum.Enum):
    IDLE = "idle"  # nothing sent yet: `start` sends HELLO, or OPEN without a token
    HELLO = "hello"  # HELLO sent: the server's CHALLENGE is due
    PROOF = "proof"  # PROOF and OPEN sent (the server's challenge answered): its ACCEPT is due
    OPEN = "open"  # the server proved the token (or there is none; OPEN sent): WELCOME is due
    READY = "ready"  # WELCOME received: protocol messages flow both ways


class Refused(Exception):
    """The server sent REFUSED during the setup: `reason` is its own words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ClientSetup:
    """One connection's setup. A frame out of order raises FrameError; a proof that does not
    verify, handshake.HandshakeError; a REFUSED frame, Refused."""

    def __init__(self, token: bytes | None, opening: Open) -> None:
        self.token = token
        self.opening = opening
        self.state = State.IDLE
        self.welcome: Welcome | None = None  # the server's WELCOME, once READY
        self.hello_body = b""
        self.binding = b""
        self.transcript = b""

    @property
    def frame_limit(self) -> int:
        """The largest frame to accept now: a few hundred bytes until the server proved
        the token (a party that has not gets no large buffer), the full limit after."""
        return (
            HANDSHAKE_BYTES_MAX if self.state in (State.IDLE, State.HELLO, State.PROOF) else PAYLOAD_BYTES_MAX
        )

    def start(self, binding: bytes = b"") -> list[Outgoing]:
        """The first frames to send. `binding` ties the proofs to the TLS session
        (handshake.tls_binding of the server's certificate; empty without TLS)."""
        assert self.state is State.IDLE
        if self.token is None:
            self.state = State.OPEN
            return [payload(self.opening)]
        self.binding = binding
        self.hello_body = handshake.hello(handshake.nonce())
        self.state = State.HELLO
        return [(Kind.HELLO, self.hello_body)]

    def receive(self, kind: int, body: bytes) -> list[Outgoing]:
        """Take one frame the server sent before READY; the frames to send in answer."""
        if kind == Kind.REFUSED:
            raise Refused(body.decode("utf-8", "replace"))
        if self.state is State.HELLO and kind == Kind.CHALLENGE:
            assert self.token is not None
            handshake.read_challenge(body)
            self.transcript = handshake.transcript(self.hello_body, body, self.binding)
            self.state = State.PROOF
            # OPEN behind the PROOF: the server reads it only once the proof verified, and
            # the WELCOME it answers is taken only once its own ACCEPT verified (below).
            return [(Kind.PROOF, handshake.proof(self.token, self.transcript)), payload(self.opening)]
        if self.state is State.PROOF and kind == Kind.ACCEPT:
            assert self.token is not None
            handshake.verify(handshake.accept(self.token, self.transcript), body)
            self.state = State.OPEN
            return []
        if self.state is State.OPEN and kind == Kind.WELCOME:
            self.welcome = decode(kind, body)
            self.state = State.READY
            return []
        raise FrameError(f"frame kind {kind} during the connection's setup ({self.state.value})")
