"""A worker's pings, from a thread of its own, on a connection of their own.

The server revokes a holder's leases after five seconds without a byte from it. Pings
must not depend on the worker's event loop: a long garbage collection or a blocking call
in workflow code would otherwise cost it every shard. An asyncio transport cannot be
written from another thread, and a TLS session cannot be shared between threads, so the
pings get their own connection: blocking, with the same address, token and TLS settings,
naming the worker's session (given in its WELCOME). The server counts a byte on either
connection as the worker being alive, and closes the pinger with the worker.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time

from fusee import _secrets
from fusee._errors import ConnectionError, FuseeError
from fusee.protocol import handshake
from fusee.protocol.address import Address
from fusee.protocol.connection import CONNECT_TIMEOUT_S, client_tls
from fusee.protocol.frames import (
    HANDSHAKE_BYTES_MAX,
    PAYLOAD_BYTES_MAX,
    Decoder,
    Frame,
    FrameError,
    Kind,
    encode,
)
from fusee.protocol.messages import ROLE_PINGER, VERSION, Open, Ping, Welcome, decode, payload

logger = logging.getLogger("fusee.wire")

RETRY_S = 0.5


class Pinger:
    def __init__(self, address: Address, session: bytes, interval_s: float, stall_s: float = 0.0) -> None:
        self.address = address
        self.session = session
        self.interval_s = interval_s
        self.stall_s = stall_s  # a gap between beats longer than this: the process was stopped
        self.last_beat = 0.0  # time.monotonic() of the last ping that left (0: none yet)
        self.stalled = False
        self.stopped = threading.Event()
        self.sock: socket.socket | None = None
        self.thread = threading.Thread(target=self._run, name="fusee-ping", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread out of a send
            except OSError:
                pass

    def _run(self) -> None:
        ping = encode(*payload(Ping()))
        while not self.stopped.is_set():
            try:
                self.sock, _ = open_blocking(self.address, Open(VERSION, ROLE_PINGER, session=self.session))
                with self.sock:
                    while not self.stopped.is_set():
                        now = time.monotonic()
                        if self.stall_s and self.last_beat and now - self.last_beat > self.stall_s:
                            # Woken after a stop (SIGSTOP, a frozen VM): the server has
                            # revoked the leases meanwhile. Pinging now would make the
                            # worker look alive to itself; it must learn it was not.
                            self.stalled = True
                            return
                        self.sock.sendall(ping)
                        self.last_beat = time.monotonic()
                        self.stopped.wait(self.interval_s)
            except (OSError, FrameError, FuseeError) as error:
                if isinstance(error, ConnectionError) and "session" in str(error):
                    return  # the worker's connection is gone: nothing left to keep alive
                logger.debug("pinger: %s", error)
                self.stopped.wait(RETRY_S)
            finally:
                self.sock = None


def open_blocking(address: Address, opening: Open) -> tuple[socket.socket, Welcome]:
    """A blocking connection through the token exchange and OPEN, for a thread."""
    if address.unix is not None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect(address.unix)
    else:
        sock = socket.create_connection((address.host or "", address.port or 0), CONNECT_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        binding = b""
        context = client_tls(address)
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname=address.name or address.host)
            assert isinstance(sock, ssl.SSLSocket)
            binding = handshake.tls_binding(sock.getpeercert(binary_form=True) or b"")
        frames = _Frames(sock)
        if address.token_file is not None:
            token = _secrets.load(address.token_file, "token-file=")
            hello = handshake.hello(handshake.nonce())
            sock.sendall(encode(Kind.HELLO, hello))
            challenge = frames.expect(Kind.CHALLENGE)
            t = handshake.transcript(hello, challenge, binding)
            sock.sendall(encode(Kind.PROOF, handshake.proof(token, t)))
            handshake.verify(handshake.accept(token, t), frames.expect(Kind.ACCEPT))
        sock.sendall(encode(*payload(opening)))
        frames.decoder.limit = PAYLOAD_BYTES_MAX
        welcome: Welcome = decode(Kind.WELCOME, frames.expect(Kind.WELCOME))
        sock.settimeout(None)
        return sock, welcome
    except BaseException:
        sock.close()
        raise


class _Frames:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = Decoder(max(HANDSHAKE_BYTES_MAX, 4096))
        self.ready: list[Frame] = []

    def expect(self, kind: int) -> bytes:
        while not self.ready:
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError("the server closed the pinger's connection during setup")
            self.ready.extend(self.decoder.feed(data))
        frame = self.ready.pop(0)
        if frame.kind == Kind.REFUSED:
            raise ConnectionError(
                f"the server refused the pinger: {frame.payload.decode('utf-8', 'replace')}"
            )
        if frame.kind != kind:
            raise ConnectionError(f"the server sent frame kind {frame.kind} where {kind} was due")
        return frame.payload
