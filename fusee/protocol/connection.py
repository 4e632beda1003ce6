"""Framed connections over asyncio: the part of the wire both sides share, and the
connecting side (workers and clients). The listening side is the server's
(fusee_server/listener.py).

A connection cuts what it reads into frames and decodes each into its message; a frame
or message that breaks the protocol closes that connection with its reason logged, and
touches nothing else. The first frame sent during a turn of the event loop leaves at
once; the rest of that turn's frames leave together in one socket write, so the records
of several shards, their run-store frames and a relayed message share a system call.

The connecting side runs the token exchange (docs/FORMAT.md, "The token exchange") before
its first protocol frame, through the state machine it shares with the pinger
(opening.py): it sends OPEN with its proof, and takes the server's WELCOME only once the
server's proof verified.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from fusee import _errors as errors
from fusee import _secrets
from fusee.protocol import handshake
from fusee.protocol.address import Address
from fusee.protocol.frames import HANDSHAKE_BYTES_MAX, Decoder, FrameError, encode
from fusee.protocol.messages import Open, Welcome, decode, payload
from fusee.protocol.opening import ClientSetup, Outgoing, Refused, State

logger = logging.getLogger("fusee.wire")

CONNECT_TIMEOUT_S = handshake.DEADLINE_S
# Of a list of servers, one that has not finished the handshake this long is passed over:
# a frozen server's kernel still accepts the TCP connection, and its standby owns the
# shards meanwhile (a handshake on a live server takes milliseconds).
LIST_CONNECT_TIMEOUT_S = 2.0


READ_BYTES = 256 << 10  # what one read takes at most (a record page arrives in a few)


class FramedConnection(asyncio.BufferedProtocol):
    """Frames in, messages out; at most two socket writes per loop turn.

    Reads land in a buffer of the connection's own, reused: a plain Protocol has asyncio
    allocate 256 KiB per read, which malloc serves with an mmap and a munmap, two system
    calls per message on the step path."""

    def __init__(self) -> None:
        self.inbuffer = memoryview(bytearray(READ_BYTES))
        self.transport: asyncio.Transport | None = None
        self.decoder = Decoder(HANDSHAKE_BYTES_MAX)  # raised to the full limit once authenticated
        self.out: list[bytes] = []
        self.scheduled = False
        self.closed = False
        self.last_read = time.monotonic()
        self.last_sent = time.monotonic()
        self.peer = "?"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop: not a subclass
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer or "unix")

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.inbuffer

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self.inbuffer[:nbytes]))

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        if self.closed:
            return
        try:
            if self.setting_up():
                self._setup_received(data)
                return
            for kind, body in self.decoder.feed(data):
                self.frame_received(kind, body)
                if self.closed:
                    return
        except FrameError as error:
            self.fail(f"protocol error: {error}")

    def setting_up(self) -> bool:
        """Whether the connection's setup (the token exchange and OPEN) is still going on."""
        return False

    def _setup_received(self, data: bytes) -> None:
        """A read during the setup. Its frames are taken one at a time: each may raise the
        frame limit (a proof verified) or end the setup, and the frame behind it in the
        same read is checked against the limit that then holds. What they make this side
        send leaves in one write at the end (PROOF and OPEN; ACCEPT, WELCOME and the calls
        waiting for its grants): one segment, one wake-up of the peer."""
        corked, self.scheduled = self.scheduled, True  # (send_frame gathers while set)
        try:
            frames = self.decoder.feed(data, 1)
            while frames and not self.closed:
                self.frame_received(*frames[0])
                if not self.setting_up():
                    for kind, body in self.decoder.feed(b""):
                        if self.closed:
                            return
                        self.frame_received(kind, body)
                    return
                frames = self.decoder.feed(b"", 1)
        finally:
            if not corked:  # (else the write scheduled before this read sends it all)
                self._write()

    def eof_received(self) -> bool | None:
        try:
            self.decoder.finish()
        except FrameError as error:
            logger.info("%s: %s", self.peer, error)
        return None

    def frame_received(self, kind: int, body: bytes) -> None:
        raise NotImplementedError

    def send(self, message: Any) -> None:
        kind, body = payload(message)
        self.send_frame(kind, body)

    def send_frame(self, kind: int, body: bytes) -> None:
        if self.closed:
            return
        frame = encode(kind, body)
        if self.scheduled:
            self.out.append(frame)
            return
        # The first frame of a turn leaves at once (a step is usually waiting on it: a
        # write deferred to the next turn costs a pass through the selector, ~8 µs); the
        # frames that follow it in the same turn gather and leave together at the next.
        self.scheduled = True
        asyncio.get_running_loop().call_soon(self._write)
        if self.transport is not None:
            self.transport.write(frame)
            self.last_sent = time.monotonic()

    def _write(self) -> None:
        self.scheduled = False
        if self.out and not self.closed and self.transport is not None:
            data = self.out[0] if len(self.out) == 1 else b"".join(self.out)
            self.out.clear()
            self.transport.write(data)
            self.last_sent = time.monotonic()

    def fail(self, reason: str) -> None:
        """Close this connection for a reason worth a log line."""
        logger.warning("%s: closing: %s", self.peer, reason)
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        self._write()
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Handler(Protocol):
    def on_message(self, message: Any) -> None: ...
    def on_lost(self, error: errors.ConnectionError) -> None: ...


class ClientConnection(FramedConnection):
    """The connecting side: the setup (token exchange and OPEN, opening.ClientSetup), then
    messages to its handler."""

    def __init__(self, token: bytes | None, opening: Open, handler: Handler, where: str) -> None:
        super().__init__()
        self.token = token
        self.setup = ClientSetup(token, opening)
        self.handler = handler
        self.where = where
        self.address: Address | None = None  # the one it reached (of a list: the server that took it)
        self.ready: asyncio.Future[Welcome] = asyncio.get_running_loop().create_future()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.given_up = False  # connect() failed with it: its close is nobody's news
        self.made_at = 0.0  # time.monotonic() when TCP (and TLS) were up: the invoke trace's

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.made_at = time.monotonic()
        # Called once TLS is up (asyncio's SSL protocol calls it after its handshake), so
        # the server's certificate, which the proofs are bound to, is known here.
        tls = transport.get_extra_info("ssl_object") if self.token is not None else None
        binding = handshake.tls_binding(tls.getpeercert(binary_form=True)) if tls is not None else b""
        self._send_setup(self.setup.start(binding))

    def setting_up(self) -> bool:
        return self.setup.state is not State.READY

    def _send_setup(self, frames: list[Outgoing]) -> None:
        # Raised once the server proved the token: its WELCOME and what follows it may be
        # large, and arrive in the same read as the ACCEPT.
        self.decoder.limit = self.setup.frame_limit
        for kind, body in frames:
            self.send_frame(kind, body)

    def frame_received(self, kind: int, body: bytes) -> None:
        if self.setup.state is State.READY:
            self.handler.on_message(decode(kind, body))
            return
        try:
            self._send_setup(self.setup.receive(kind, body))
        except Refused as refused:
            self._refused(f"the server at {self.where} refused the connection: {refused.reason}")
            return
        except (FrameError, handshake.HandshakeError) as error:
            self._refused(f"the server at {self.where} broke the handshake: {error}")
            return
        if self.setup.welcome is not None and not self.ready.done():
            self.ready.set_result(self.setup.welcome)

    async def aclose(self, timeout: float = 1.0) -> None:
        """Close and wait until the transport is gone (a TLS close takes a round trip);
        abort it if that takes longer than `timeout`."""
        self.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), timeout)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()

    def give_up(self) -> None:
        """Close a connection whose setup failed: its handler never hears of it (the failure
        was connect()'s to raise), and nobody waits for its WELCOME any more."""
        self.given_up = True
        self.ready.cancel()  # (done already if refused: then a no-op)
        self.close()

    def _refused(self, message: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(errors.ConnectionError(message))
        self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)
        if self.given_up:
            return
        if not self.ready.done():
            why = f": {exc}" if exc is not None else ""
            if self.transport is not None and self.transport.get_extra_info("ssl_object") is not None:
                # TLS 1.3 checks the client's certificate after the client's side of the
                # handshake is done: a refused one shows up here, as a closed connection.
                hint = (
                    " (a server started with --tls-ca refuses client certificates its CA did not "
                    "sign: check cert= and key= in the address)"
                )
            elif self.token is None:
                hint = " (if the server wants a token, add token-file=PATH; if it uses TLS, add ca=PATH)"
            else:
                hint = " (if the server uses TLS, add ca=PATH)"
            self.ready.set_exception(
                errors.ConnectionError(
                    f"the server at {self.where} closed the connection during setup{why}{hint}"
                )
            )
            return
        self.handler.on_lost(
            errors.ConnectionError(
                f"the connection to the server at {self.where} was lost" + (f": {exc}" if exc else "")
            )
        )


def client_tls(address: Address) -> ssl.SSLContext | None:
    if address.ca is None:
        return None
    try:
        context = ssl.create_default_context(cafile=address.ca)
        if address.cert is not None:
            _secrets.check_private(address.key or address.cert, "key=")
            context.load_cert_chain(address.cert, address.key)
    except (OSError, ssl.SSLError) as error:
        raise errors.ConnectionError(f"TLS settings (ca=, cert=, key=): {error}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    return context


_first: dict[tuple[tuple[str | None, int | None], ...], int] = {}  # a list's server that accepted last


async def connect(
    address: Address, opening: Open, handler: Handler, wait_s: float = 0.0
) -> tuple[ClientConnection, Welcome]:
    """Connect, authenticate and OPEN; ConnectionError saying what to change otherwise.

    With a list of servers, the first that takes the connection, starting from the one
    that took the last (the shards' owner; a standby's port refuses connections). Only a
    server that cannot be reached (or does not finish the handshake within
    LIST_CONNECT_TIMEOUT_S) sends the connection on to the next: one that refuses it (a
    token, a version) would refuse it the same on every server. With `wait_s` (a first
    connection), a list none of whose servers answered is tried again for that long: a
    standby claims the shards within a lease of its owner's end."""
    hosts = address.hosts()
    if len(hosts) == 1:
        return await _connect_one(address, opening, handler)
    key = _key(address)
    deadline = time.monotonic() + wait_s
    pause = 0.1
    while True:
        start = _first.get(key, 0)
        failures: list[str] = []
        for k in range(len(hosts)):
            i = (start + k) % len(hosts)
            try:
                found = await _connect_one(hosts[i], opening, handler, LIST_CONNECT_TIMEOUT_S)
            except _Unreachable as error:
                failures.append(str(error))
                continue
            _first[key] = i
            return found
        if time.monotonic() + pause > deadline:
            waited = f" (tried for {wait_s:g} s)" if wait_s else ""
            raise errors.ConnectionError(f"no server of the list answered{waited}: {'; '.join(failures)}")
        await asyncio.sleep(pause)
        pause = min(pause * 2, 1.0)


def _key(address: Address) -> tuple[tuple[str | None, int | None], ...]:
    return tuple((a.host, a.port) for a in address.hosts())


def passed_over(address: Address, reached: Address) -> None:
    """`reached`, of the list `address`, went silent (frozen, cut off): the next
    connection starts with the server after it, not with it."""
    key, at = _key(address), (reached.host, reached.port)
    if len(key) > 1 and at in key:
        _first[key] = (key.index(at) + 1) % len(key)


class _Unreachable(errors.ConnectionError):
    """Nothing took the connection there (refused, unreachable, timed out)."""


async def _connect_one(
    address: Address, opening: Open, handler: Handler, timeout_s: float = CONNECT_TIMEOUT_S
) -> tuple[ClientConnection, Welcome]:
    token = _secrets.load(address.token_file, "token-file=") if address.token_file is not None else None
    where = address.unix if address.unix is not None else f"{address.host}:{address.port}"
    context = client_tls(address)

    made: list[ClientConnection] = []

    def factory() -> ClientConnection:
        made.append(ClientConnection(token, opening, handler, where))
        return made[-1]

    host, port = address.host or "", address.port or 0
    try:
        conn, welcome = await _connect(address, factory, context, host, port, where, timeout_s)
        conn.address = address
        return conn, welcome
    except BaseException:
        # Timed out, refused or cancelled (a worker's reconnect stopped by its close) after
        # the socket was made: it is closed here, or it would stay open with nobody reading.
        for conn in made:
            conn.give_up()
        raise


async def _connect(
    address: Address,
    factory: Callable[[], ClientConnection],
    context: ssl.SSLContext | None,
    host: str,
    port: int,
    where: str,
    timeout_s: float,
) -> tuple[ClientConnection, Welcome]:
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            if address.unix is not None:
                _, conn = await loop.create_unix_connection(factory, address.unix)
            elif context is not None:
                _, conn = await loop.create_connection(
                    factory,
                    host,
                    port,
                    ssl=context,
                    server_hostname=address.name or address.host,
                    ssl_handshake_timeout=timeout_s,
                )
            else:
                _, conn = await loop.create_connection(factory, host, port)
            welcome = await conn.ready
    except ssl.SSLError as error:
        raise errors.ConnectionError(
            f"TLS with the server at {where} failed: {error.reason or error}; check ca=, cert=, key= and "
            "name= in the address (the server takes TLS 1.3 only and, when started with --tls-ca, "
            "a client certificate signed by that CA)"
        ) from None
    except TimeoutError:  # the builtin, asyncio.timeout's
        raise _Unreachable(
            f"the server at {where} did not complete the connection within {timeout_s:g} s"
        ) from None
    # The builtin ConnectionError among them; fusee's (from `conn.ready`) is no OSError.
    except OSError as error:
        raise _Unreachable(f"cannot connect to the server at {where}: {error.strerror or error}") from None
    return conn, welcome
