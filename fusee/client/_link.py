"""A client's connection to its server, kept up across the server's restarts.

A server that restarts (or a connection that breaks) costs a client one retried call at
most: the calls in flight at that moment fail with a retriable `ConnectionError` (each
may or may not have taken effect, so it is retried under the same workflow, update or
signal ID); meanwhile the link connects again, with backoff and jitter (fusee/_backoff.py),
and calls made while it does wait for it (up to RECONNECT_WAIT_S) instead of failing. A
closed link stops trying.

Given a list of servers (`a:7600,b:7600`, docs/postgresql.md), the link also pings the
one it reached every `ping_ms` its WELCOME gives, and drops it once it answered nothing
for SILENCE_S: a server that froze (SIGSTOP, a paused VM) keeps its socket open, and its
standby owns the shards meanwhile, so waiting on that socket would wait until it exits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fusee import _errors as errors
from fusee._backoff import Backoff
from fusee._errors import ClosedError, FuseeError
from fusee.protocol import messages as m
from fusee.protocol.address import Address
from fusee.protocol.connection import ClientConnection, connect, passed_over

logger = logging.getLogger("fusee.client")

RECONNECT_FIRST_S = 0.05
RECONNECT_MAX_S = 1.0  # a restarted server is found again within about a second
RECONNECT_WAIT_S = 10.0  # how long a call waits for the link to be up again
FIRST_WAIT_S = 10.0  # of a list, a first connection waits this long for a server (a failover)
SILENCE_S = 4.0  # of a list of servers, one silent this long is dropped (a worker's limit too)


class Link:
    """Calls out and answers back over one connection at a time. `lost` is why the link
    is down while it is (None while connected)."""

    def __init__(self, address: Address) -> None:
        self.address = address
        self.conn: ClientConnection | None = None
        self.shards = 0
        self.rids = 0
        self.pending: dict[int, asyncio.Future[m.Answer]] = {}
        self.lost: errors.ConnectionError | None = None
        self.closed = False
        self.up = asyncio.Event()  # set while connected, and once closed (waiters wake)
        self.reconnecting: asyncio.Task[None] | None = None
        self.attempting = False  # a connection is being set up (close waits for it)
        self.last_attempt: FuseeError | None = None
        self.watch: asyncio.TimerHandle | None = None  # the pings of a list's server
        self.silence: str | None = None  # why the watch dropped the connection

    def _opening(self) -> m.Open:
        return m.Open(m.VERSION, m.ROLE_CLIENT, liveness=False)

    async def open(self) -> None:
        """The first connection: its failure is the caller's (a wrong address or token
        is said at once, not retried; of a list, servers none of which answers are tried
        for FIRST_WAIT_S, as while a standby takes over)."""
        conn, welcome = await connect(self.address, self._opening(), self, FIRST_WAIT_S)
        self._connected(conn, welcome)

    def _connected(self, conn: ClientConnection, welcome: m.Welcome) -> None:
        self.conn = conn
        self.shards = welcome.shards
        self.lost = None
        self.up.set()
        if self.address.others and welcome.ping_ms:
            self._watch(conn, welcome.ping_ms / 1000)

    def _watch(self, conn: ClientConnection, every_s: float) -> None:
        """A PING to the server `conn` reached (it answers each), or, after SILENCE_S of
        nothing from it, the connection aborted: its `on_lost` says why, and the link
        connects again through the list."""
        self.watch = None
        if conn is not self.conn or conn.closed or self.closed:
            return
        silent = time.monotonic() - conn.last_read
        if silent > SILENCE_S:
            self.silence = f"the server at {conn.where} answered nothing for {silent:.1f} s"
            if conn.address is not None:
                passed_over(self.address, conn.address)
            if conn.transport is not None:
                conn.transport.abort()  # (close() would wait to flush to a peer not reading)
            return
        if time.monotonic() - conn.last_sent >= every_s * 0.9:
            conn.send(m.Ping())
        self.watch = asyncio.get_running_loop().call_later(every_s, self._watch, conn, every_s)

    # -- the connection's handler --------------------------------------------------------

    def on_message(self, message: Any) -> None:
        if type(message) is m.Answer:
            future = self.pending.pop(message.rid, None)
            if future is not None and not future.done():
                future.set_result(message)

    def on_lost(self, error: errors.ConnectionError) -> None:
        # `conn` stays the last connection (closed now): `up` says whether it may be used.
        if self.silence is not None:
            error, self.silence = errors.ConnectionError(self.silence), None
        if not self.closed:
            self.up.clear()
            self.lost = error
            if self.reconnecting is None:
                logger.info("%s; connecting again", error.message)
                self.reconnecting = asyncio.ensure_future(self._reconnect())
        pending = list(self.pending.values())
        self.pending.clear()
        for future in pending:
            if not future.done():
                future.set_exception(self._in_flight(error))

    def _in_flight(self, error: errors.ConnectionError) -> FuseeError:
        if self.closed:
            return ClosedError("the client was closed before the call was answered")
        return errors.ConnectionError(
            f"{error.message}; the call may or may not have taken effect: retry it with the same "
            "workflow, update or signal ID (the client connects again by itself)"
        )

    async def _reconnect(self) -> None:
        backoff = Backoff(RECONNECT_FIRST_S, RECONNECT_MAX_S)
        try:
            while not self.closed:
                await asyncio.sleep(backoff.next())
                if self.closed:
                    return
                self.attempting = True
                try:
                    conn, welcome = await connect(self.address, self._opening(), self)
                except Exception as error:  # noqa: BLE001 - any failed attempt is tried again
                    self.last_attempt = (
                        error if isinstance(error, FuseeError) else errors.ConnectionError(repr(error))
                    )
                    continue
                finally:
                    self.attempting = False
                if self.closed:  # closed while this connection was being set up
                    await conn.aclose()
                    return
                self._connected(conn, welcome)
                logger.info("connected again to the server at %s", conn.where)
                return
        finally:
            self.reconnecting = None

    # -- calls ---------------------------------------------------------------------------

    async def _connection(self) -> ClientConnection:
        if not self.up.is_set():
            try:
                async with asyncio.timeout(RECONNECT_WAIT_S):
                    await self.up.wait()
            except TimeoutError:  # the builtin, asyncio.timeout's
                last = f" (last attempt: {self.last_attempt.message})" if self.last_attempt else ""
                lost = self.lost.message if self.lost is not None else "the connection was lost"
                raise errors.ConnectionError(
                    f"{lost}; not connected again within {RECONNECT_WAIT_S:g} s{last}; retry"
                ) from None
        if self.closed:
            raise ClosedError("the client is closed; connect a new one")
        assert self.conn is not None  # set before `up` is
        return self.conn

    async def request(self, method: str, shard: int, args: bytes) -> m.Answer:
        """The answer to a call of `method` for `shard` with `args` (a MessagePack map)."""
        if self.closed:
            raise ClosedError("the client is closed; connect a new one")
        conn = await self._connection()
        self.rids += 1
        rid = self.rids
        future: asyncio.Future[m.Answer] = asyncio.get_running_loop().create_future()
        conn.send(m.Call(rid, method, shard, args))  # FrameError (over the limit): nothing pending
        self.pending[rid] = future
        try:
            return await future
        finally:
            self.pending.pop(rid, None)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.up.set()  # calls waiting for a connection raise ClosedError
        if self.watch is not None:
            self.watch.cancel()
        reconnecting = self.reconnecting
        if reconnecting is not None:
            if self.attempting:
                # Not cancelled mid-setup (the half-made connection would be left open):
                # it sees `closed` once its attempt ends, and closes what it made.
                await asyncio.wait([reconnecting])
            else:
                reconnecting.cancel()
                await asyncio.gather(reconnecting, return_exceptions=True)
        if self.conn is not None:
            await self.conn.aclose()
