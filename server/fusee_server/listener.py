"""The server's side of a connection: the token exchange as the responder, then OPEN,
then every frame handed to the server (`fusee_server.server.Server`).

The server answers the worker's HELLO only with a CHALLENGE, and sends nothing else
until the worker's proof verifies; a connection that does not finish TLS and the
exchange within ten seconds is closed. The OPEN a worker sends behind its PROOF is read
only once the proof verified, and the ACCEPT, the WELCOME and the calls that waited for
its grants leave in one write (FramedConnection's setup reads). Failed exchanges are logged at most once every
ten seconds (a scanner must not fill the log).

The token the proof verifies under fixes the connection's scope (`access.py`): a client
or read token may not OPEN as a worker or a pinger, and every frame it sends afterwards
is checked against its scope before the server sees it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import ssl
from pathlib import Path
from typing import Any, Protocol

import msgspec

from fusee._log import RateLimit, rate_limited
from fusee.protocol import handshake
from fusee.protocol.connection import FramedConnection
from fusee.protocol.frames import FrameError, Kind
from fusee.protocol.messages import ROLE_CLIENT, ROLE_PINGER, ROLE_WORKER, VERSION, Answer, Call, Open, decode
from fusee_server import access
from fusee_server.access import Grant, Scope, Tokens

logger = logging.getLogger("fusee.server")

REFUSAL_LOG_EVERY_S = 10.0
# One line every ten seconds at most, saying how many were refused meanwhile: a scanner's
# connections must not fill the log.
_refusals = rate_limited(logger, RateLimit(REFUSAL_LOG_EVERY_S, "refused"))


def log_refusal(peer: str, reason: str) -> None:
    _refusals.warning("refused a connection from %s: %s", peer, reason)


def server_tls(cert: str, key: str, ca: str | None) -> tuple[ssl.SSLContext, bytes]:
    """The listener's TLS context (TLS 1.3 only; with `ca`, client certificates signed by
    it are required) and the binding the token exchange uses: the SHA-256 of the
    certificate it presents (Python's ssl has no TLS exporter)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.options |= ssl.OP_NO_TICKET  # no session resumption
    context.load_cert_chain(cert, key)
    if ca is not None:
        context.load_verify_locations(ca)
        context.verify_mode = ssl.CERT_REQUIRED
    pem = Path(cert).read_text()
    begin = pem.index("-----BEGIN CERTIFICATE-----")
    end = pem.index("-----END CERTIFICATE-----", begin) + len("-----END CERTIFICATE-----")
    der = ssl.PEM_cert_to_DER_cert(pem[begin:end])
    return context, handshake.tls_binding(der)


class Receiver(Protocol):
    """What a connection hands its frames to (`fusee_server.server.Server`)."""

    frame_limit: int

    def opened(self, conn: ServerConnection) -> str | None:
        """The connection is OPEN: None, or why it is refused."""
        ...

    def received(self, conn: ServerConnection, message: Any) -> None: ...

    def lost(self, conn: ServerConnection) -> None: ...


class State(enum.Enum):
    """Where a connection is in its setup; frames go to the server only when READY."""

    HELLO = enum.auto()  # the server has tokens: waiting for the peer's HELLO
    PROOF = enum.auto()  # CHALLENGE sent: waiting for the PROOF of a token
    OPEN = enum.auto()  # accepted (or no token needed): waiting for OPEN
    READY = enum.auto()  # opened: every frame goes to the server, checked against its scope


class ServerConnection(FramedConnection):
    """One worker or client, as the server sees it."""

    def __init__(self, server: Receiver, tokens: Tokens, binding: bytes) -> None:
        super().__init__()
        self.server = server
        self.tokens = tokens
        self.grant = Grant(Scope.WORKER)  # until a proof says otherwise: a server without tokens
        self.binding = binding
        self.state = State.HELLO if tokens.worker is not None else State.OPEN
        self.hello_body = b""
        self.transcript = b""
        self.role = ""
        self.max_shards: int | None = None
        self.invocation: str | None = None
        self.liveness = False
        self.session = b""  # a worker's, given in its WELCOME; a pinger's, the one it names
        self.pinger: ServerConnection | None = None  # a worker's second connection, for pings
        self.held: set[int] = set()
        self.draining: set[int] = set()  # an invoked worker's shards it wants nothing more for
        self.calls: set[int] = set()  # calls relayed to this worker, not yet answered
        # Shards it released -> the log's last record of theirs then: an answer it sends
        # after a release waits for that record to be durable (relay.py, Relay.answered).
        self.released: dict[int, int] = {}
        self.deadline: asyncio.TimerHandle | None = None
        self.write_stuck: tuple[int, float] | None = None  # (buffered bytes, since)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.deadline = asyncio.get_running_loop().call_later(handshake.DEADLINE_S, self._too_slow)

    def setting_up(self) -> bool:
        return self.state is not State.READY

    def _too_slow(self) -> None:
        if self.state is not State.READY:
            log_refusal(self.peer, f"no OPEN within {handshake.DEADLINE_S:g} s")
            self.close()

    def fail(self, reason: str) -> None:
        if self.state is not State.READY:
            log_refusal(self.peer, reason)  # a scanner's bytes must not fill the log
            self.close()
        else:
            super().fail(reason)

    def refuse(self, reason: str) -> None:
        log_refusal(self.peer, reason)
        self.send_frame(Kind.REFUSED, reason.encode())
        self.close()

    def frame_received(self, kind: int, body: bytes) -> None:
        if self.state is State.READY:
            try:
                message = decode(kind, body)
            except FrameError as error:
                if kind == Kind.CALL and self._refuse_call(body, error):
                    return  # a malformed call costs its caller an error, not its connection
                raise
            if self.grant.scope is not Scope.WORKER:
                try:
                    message = access.admitted(self.grant, message)
                except access.Refused as refused:
                    if isinstance(message, Call):  # a call outside its scope: answered
                        self.send(Answer(message.rid, code="Rejected", message=str(refused)))
                    else:
                        self.fail(str(refused))
                    return
            self.server.received(self, message)
        elif self.state is State.HELLO:
            if kind != Kind.HELLO:
                self.refuse("this server requires a token: add token-file=PATH to the address")
                return
            try:
                handshake.read_hello(body)
            except handshake.HandshakeError as error:
                self.refuse(f"bad hello: {error}")
                return
            self.hello_body = body
            challenge = handshake.challenge(handshake.nonce())
            self.transcript = handshake.transcript(body, challenge, self.binding)
            self.send_frame(Kind.CHALLENGE, challenge)
            self.state = State.PROOF
        elif self.state is State.PROOF:
            matched = None
            if kind == Kind.PROOF:
                matched = self.tokens.match(
                    lambda token: handshake.verifies(handshake.proof(token, self.transcript), body)
                )
            if matched is None:
                self.refuse(
                    "the token does not match this server's: check the file named by token-file= "
                    "against the server's --token-file (or --client-token-file, --read-token-file, "
                    "a token of --namespaces-file)"
                )
                return
            self.grant, token = matched
            self.send_frame(Kind.ACCEPT, handshake.accept(token, self.transcript))
            self.state = State.OPEN
        elif self.state is State.OPEN:
            if kind == Kind.HELLO:
                self.refuse(
                    "this server has no token: remove token-file= from the address, or start the "
                    "server with --token-file"
                )
                return
            if kind != Kind.OPEN:
                self.refuse(f"frame kind {kind} before OPEN")
                return
            self._open(decode(kind, body))

    def _open(self, opening: Open) -> None:
        if opening.version != VERSION:
            self.refuse(f"protocol version {opening.version}: this server speaks version {VERSION}")
            return
        if opening.role not in (ROLE_WORKER, ROLE_CLIENT, ROLE_PINGER):
            self.refuse(f"role {opening.role!r}: expected {ROLE_WORKER!r} or {ROLE_CLIENT!r}")
            return
        # An invocation ID makes any OPEN an invoked worker's (Server.opened): it counts too.
        if self.grant.scope is not Scope.WORKER and (
            opening.role != ROLE_CLIENT or opening.invocation is not None
        ):
            option = "--namespaces-file" if self.grant.namespace else f"--{self.grant.scope.value}-token-file"
            self.refuse(
                f"this token may not hold shards: it is the server's {option} token, "
                "for clients; a worker proves the --token-file token"
            )
            return
        if opening.max_shards is not None and opening.max_shards < 1:
            self.refuse(f"max-shards={opening.max_shards}: need at least 1")
            return
        self.role = opening.role
        self.max_shards = opening.max_shards
        self.invocation = opening.invocation
        self.liveness = opening.liveness
        self.session = opening.session
        self.decoder.limit = self.server.frame_limit
        self.state = State.READY
        if self.deadline is not None:
            self.deadline.cancel()
        refusal = self.server.opened(self)
        if refusal is not None:
            self.refuse(refusal)

    def _refuse_call(self, body: bytes, error: FrameError) -> bool:
        """Answer a CALL whose fields do not decode (a shard that is not a number, say) with
        an error, when its request number can be read: True if so."""
        try:
            fields = msgspec.msgpack.decode(body)
        except msgspec.DecodeError:
            return False
        if not isinstance(fields, list) or not fields or type(fields[0]) is not int:
            return False
        self.send(Answer(fields[0], code="Rejected", message=f"a malformed call: {error}"))
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.deadline is not None:
            self.deadline.cancel()
        if self.state is State.READY:
            self.server.lost(self)

    def __repr__(self) -> str:
        return f"{self.role or 'connection'} {self.peer}"
