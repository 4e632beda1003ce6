"""The server's side of a connection: the token exchange as the responder, then OPEN,
then every frame handed to the server (`fusee_server.server.Server`).

The server answers the worker's HELLO only with a CHALLENGE, and sends nothing else
until the worker's proof verifies; a connection that does not finish TLS and the
exchange within ten seconds is closed. Failed exchanges are logged at most once every
ten seconds (a scanner must not fill the log).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from pathlib import Path
from typing import TYPE_CHECKING

from fusee.protocol import handshake
from fusee.protocol.connection import FramedConnection
from fusee.protocol.frames import Kind
from fusee.protocol.messages import ROLE_CLIENT, ROLE_PINGER, ROLE_WORKER, VERSION, Open, decode

if TYPE_CHECKING:
    from fusee_server.server import Server

logger = logging.getLogger("fusee.server")

REFUSAL_LOG_EVERY_S = 10.0
_last_refusal_log = [0.0]


def log_refusal(peer: str, reason: str) -> None:
    now = time.monotonic()
    if now - _last_refusal_log[0] >= REFUSAL_LOG_EVERY_S:
        _last_refusal_log[0] = now
        logger.warning("refused a connection from %s: %s", peer, reason)


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


class ServerConnection(FramedConnection):
    """One worker or client, as the server sees it."""

    def __init__(self, server: Server, token: bytes | None, binding: bytes) -> None:
        super().__init__()
        self.server = server
        self.token = token
        self.binding = binding
        self.state = "hello" if token is not None else "open"
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
        self.deadline: asyncio.TimerHandle | None = None
        self.write_stuck: tuple[int, float] | None = None  # (buffered bytes, since)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.deadline = asyncio.get_running_loop().call_later(handshake.DEADLINE_S, self._too_slow)

    def _too_slow(self) -> None:
        if self.state != "ready":
            log_refusal(self.peer, f"no OPEN within {handshake.DEADLINE_S:g} s")
            self.close()

    def fail(self, reason: str) -> None:
        if self.state != "ready":
            log_refusal(self.peer, reason)  # a scanner's bytes must not fill the log
            self.close()
        else:
            super().fail(reason)

    def refuse(self, reason: str) -> None:
        log_refusal(self.peer, reason)
        self.send_frame(Kind.REFUSED, reason.encode())
        self.close()

    def frame_received(self, kind: int, body: bytes) -> None:
        if self.state == "ready":
            self.server.received(self, decode(kind, body))
        elif self.state == "hello":
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
            self.state = "proof"
        elif self.state == "proof":
            assert self.token is not None
            try:
                if kind != Kind.PROOF:
                    raise handshake.HandshakeError(f"frame kind {kind} instead of the proof")
                handshake.verify(handshake.proof(self.token, self.transcript), body)
            except handshake.HandshakeError:
                self.refuse(
                    "the token does not match this server's: check the file named by token-file= "
                    "against the server's --token-file"
                )
                return
            self.send_frame(Kind.ACCEPT, handshake.accept(self.token, self.transcript))
            self.state = "open"
        elif self.state == "open":
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
        if opening.max_shards is not None and opening.max_shards < 1:
            self.refuse(f"max-shards={opening.max_shards}: need at least 1")
            return
        self.role = opening.role
        self.max_shards = opening.max_shards
        self.invocation = opening.invocation
        self.liveness = opening.liveness
        self.session = opening.session
        self.decoder.limit = self.server.frame_limit
        self.state = "ready"
        if self.deadline is not None:
            self.deadline.cancel()
        refusal = self.server.opened(self)
        if refusal is not None:
            self.refuse(refusal)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.deadline is not None:
            self.deadline.cancel()
        if self.state == "ready":
            self.server.lost(self)

    def __repr__(self) -> str:
        return f"{self.role or 'connection'} {self.peer}"
