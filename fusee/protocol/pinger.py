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

from fusee import _errors as errors
from fusee import _secrets
from fusee.protocol import handshake
from fusee.protocol.address import Address
from fusee.protocol.connection import CONNECT_TIMEOUT_S, client_tls
from fusee.protocol.frames import HANDSHAKE_BYTES_MAX, Decoder, Frame, FrameError, encode
from fusee.protocol.messages import ROLE_PINGER, VERSION, Open, Ping, Welcome, payload
from fusee.protocol.opening import ClientSetup, Outgoing, Refused, State

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
            except (OSError, FrameError, errors.FuseeError) as error:
                # (OSError here is the builtin family of socket failures; the session's end
                # comes as fusee's own ConnectionError, a FuseeError.)
                if isinstance(error, errors.ConnectionError) and "session" in str(error):
                    return  # the worker's connection is gone: nothing left to keep alive
                logger.debug("pinger: %s", error)
                self.stopped.wait(RETRY_S)
            finally:
                self.sock = None


def open_blocking(address: Address, opening: Open) -> tuple[socket.socket, Welcome]:
    """A blocking connection through the token exchange and OPEN (opening.ClientSetup, the
    same state machine as the asyncio connection's), for a thread."""
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
        token = _secrets.load(address.token_file, "token-file=") if address.token_file is not None else None
        setup = ClientSetup(token, opening)
        _drive(sock, setup, setup.start(binding))
        assert setup.welcome is not None
        sock.settimeout(None)
        return sock, setup.welcome
    except BaseException:
        sock.close()
        raise


def _drive(sock: socket.socket, setup: ClientSetup, frames: list[Outgoing]) -> None:
    """Send and read until the setup is READY."""
    decoder = Decoder(HANDSHAKE_BYTES_MAX)
    while True:
        decoder.limit = setup.frame_limit
        if frames:
            sock.sendall(b"".join(encode(kind, body) for kind, body in frames))  # PROOF and OPEN: one write
        if setup.state is State.READY:
            return
        frame = _next_frame(sock, decoder)
        try:
            frames = setup.receive(frame.kind, frame.payload)
        except Refused as refused:
            raise errors.ConnectionError(f"the server refused the pinger: {refused.reason}") from None


def _next_frame(sock: socket.socket, decoder: Decoder) -> Frame:
    """The next frame, one at a time: the setup's state after it sets the limit the next
    one is checked against (an ACCEPT and the WELCOME behind it come in one read)."""
    data = b""
    while True:
        ready = decoder.feed(data, 1)
        if ready:
            return ready[0]
        data = sock.recv(4096)
        if not data:
            raise errors.ConnectionError("the server closed the pinger's connection during setup")
