"""The lease table: which connection holds each shard, under which epoch, and who waits.

Each shard has its own epoch, drawn from a counter that starts at the server's start time
in microseconds, so epochs only grow, across restarts too. On a PostgreSQL store the
counter counts up from the store's epoch of the shard (shifted by EPOCH_SHIFT), which
grows with every server that owns it: a worker's epochs then grow across servers as well,
whatever their clocks say. A worker gets every free shard
up to its `max-shards` when it connects and waits as a standby for the others; a shard
let go of (its holder released it, closed, or went silent) goes to the first standby with
room. Every write names its shard's epoch and is refused unless the connection holds that
lease (`Leases.held`); a refused write closes the connection (a worker that writes under
a lease it lost is out of step, and all its leases go with it): docs/server.md, *Leases
and liveness*.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from fusee.protocol import messages as m

if TYPE_CHECKING:
    from fusee_server.listener import ServerConnection

logger = logging.getLogger("fusee.server")

PING_S = 1.0
SILENCE_S = 5.0  # a holder silent this long (or not reading our writes) loses its leases
EPOCH_SHIFT = 32  # a store's epoch of a shard, in the high bits of its workers' epochs


def _level(conn: ServerConnection) -> int:
    """A lease event's log level: INFO for a long-lived worker's (a failover is an
    operator's news), DEBUG for an invoked worker's. Those come with every invocation, on
    its critical path: a line to standard error costs ~0.2 ms before the WELCOME leaves,
    about the rest of the grant twenty times over (the invoker's trace,
    FUSEE_INVOKE_TRACE, and /metrics say what invocations do)."""
    return logging.DEBUG if conn.invocation is not None else logging.INFO


class Lease:
    """One shard's lease: who holds it and under which epoch."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.holder: ServerConnection | None = None
        self.epoch = 0
        self.refused: str | None = None  # a refused run-store write: no more writes this lease


class LeaseEvents(Protocol):
    """What the rest of the server hears of the table's changes."""

    def granted(self, index: int) -> None:
        """After a grant went out: what waited for a holder goes to it."""

    def unheld(self, index: int, holder: ServerConnection) -> None:
        """`holder` let go of `index` and no standby took it."""

    def lost(self, conn: ServerConnection) -> None:
        """`conn` is gone (closed, or its leases revoked): everything of it is let go."""


class Leases:
    """The table, the connections it hands leases to, and their liveness."""

    def __init__(self, shards: int, events: LeaseEvents, base: Callable[[int], int] | None = None) -> None:
        self.table = [Lease(index) for index in range(shards)]
        self.shards = shards
        self.events = events
        self.workers: list[ServerConnection] = []  # in the order they connected: standbys in line
        self.connections: set[ServerConnection] = set()
        self.sessions: dict[bytes, ServerConnection] = {}  # workers by session: their pingers find them
        self.epochs = itertools.count(1 if base is not None else time.time_ns() // 1000)
        self.base = base  # a shard's lowest epoch (a PostgreSQL store's), else 0
        self.silence_s = SILENCE_S
        self.ping_s = PING_S

    def holder(self, index: int) -> ServerConnection | None:
        return self.table[index].holder

    def has_room(self, conn: ServerConnection) -> bool:
        return not conn.closed and (conn.max_shards is None or len(conn.held) < conn.max_shards)

    def grant(self, lease: Lease, conn: ServerConnection) -> int:
        lease.epoch = next(self.epochs) + (self.base(lease.index) if self.base is not None else 0)
        lease.holder = conn
        lease.refused = None
        conn.held.add(lease.index)
        logger.log(_level(conn), "shard %d: leased to %s (epoch %d)", lease.index, conn, lease.epoch)
        return lease.epoch

    def free(self, lease: Lease, why: str, skip: ServerConnection | None = None) -> None:
        """`lease`'s holder let go of it: hand it to the first standby with room."""
        holder = lease.holder
        if holder is not None:
            holder.held.discard(lease.index)
        lease.holder = None
        level = _level(holder) if holder is not None else logging.INFO
        logger.log(level, "shard %d: %s (epoch %d)", lease.index, why, lease.epoch)
        for conn in self.workers:
            if conn is not skip and self.has_room(conn):
                epoch = self.grant(lease, conn)
                conn.send(m.Lease(lease.index, epoch))
                self.events.granted(lease.index)
                return
        if holder is not None:
            self.events.unheld(lease.index, holder)

    def held(self, conn: ServerConnection, shard: int, epoch: int) -> Lease | None:
        """The lease, if `conn` holds `shard` under `epoch`; else the connection is closed
        (a deposed or confused worker never writes again)."""
        if 0 <= shard < self.shards:
            lease = self.table[shard]
            if lease.holder is conn and lease.epoch == epoch:
                if lease.refused is None:
                    return lease
                conn.fail(f"shard {shard}: a write after a refused one ({lease.refused})")
                return None
        conn.fail(f"shard {shard}: epoch {epoch} is not a lease this connection holds")
        return None

    def revoke(self, conn: ServerConnection, why: str) -> None:
        """Take every lease `conn` holds (it went silent): close it, as if it had left."""
        logger.warning("%s: revoking its leases on shards %s: %s", conn, sorted(conn.held), why)
        conn.close()
        if conn in self.connections:
            self.events.lost(conn)

    def check_liveness(self) -> None:
        """A holder that sent nothing for `silence_s`, or has not taken what we wrote for
        as long, loses its leases. Pings wait in the socket while the loop is busy, so
        this runs only after the loop read what arrived (the server's watch)."""
        now = time.monotonic()
        # Every holder, invoked ones too: an invoked worker frozen mid-budget (a
        # SIGSTOPped function) must lose its leases on the same silence as any other,
        # not only when its invocation's budget and grace run out.
        for conn in [c for c in self.connections if c.held]:
            if not conn.liveness or conn.transport is None:
                continue
            last_read = conn.last_read
            if conn.pinger is not None and not conn.pinger.closed:
                last_read = max(last_read, conn.pinger.last_read)
            if now - last_read > self.silence_s:
                self.revoke(conn, f"no byte from it for {self.silence_s:g} s")
                continue
            buffered = conn.transport.get_write_buffer_size()
            if buffered == 0 or conn.write_stuck is None or buffered < conn.write_stuck[0]:
                conn.write_stuck = (buffered, now) if buffered else None
            elif now - conn.write_stuck[1] > self.silence_s:
                self.revoke(conn, f"it has read nothing we wrote for {self.silence_s:g} s")
