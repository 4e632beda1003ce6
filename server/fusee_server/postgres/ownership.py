"""Which server owns the shards: a lease per shard in `fusee_shards`, under an epoch that
grows by one with every new owner (docs/postgresql.md, *Owning the shards*).

Time is the database's: a lease runs until `expires`, set from the database's `now()` at
each renewal, and a claim takes a shard only when the database's `now()` is past it, so
the servers' clocks never meet. Each server also keeps a deadline of its own on its
monotonic clock, from the moment it *sent* the renewal: the database set `expires` later
than that, so the server believes it owns the shards only while the database agrees. A
server that did not renew by its deadline (paused, partitioned, the database away) steps
down: it closes every connection and claims again as a standby would. Even a server that
missed its deadline cannot write: every write is fenced by the epoch (schema.py).

A server claims every shard or none: it claims only when no other server holds a live
lease on any shard, and takes them all in one transaction under the rows' locks, so two
standbys racing for a dead server's shards do not split them (one owner; the other
keeps waiting).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from typing import Any

from fusee_server.postgres.database import connection_errors, driver

logger = logging.getLogger("fusee.server")

LEASE_S = 5.0  # a dead owner's shards are claimed this long after its last renewal
RENEW_S = 1.0  # renewals, and a standby's claims, this often
MARGIN_S = 0.5  # the owner's own deadline ends this much before the lease (clock rates differ)
CLAIM_LOCK_MS = 500  # a claim waits this long for the shards' rows, at most


class Ownership:
    """This server's claim on the store's shards."""

    def __init__(self, pool: Any, shards: int, address: str) -> None:
        self.pool = pool
        self.shards = shards
        self.address = address  # where workers reach this server, for a standby's message
        self.id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self.epochs: dict[int, int] = {}  # shard -> the epoch this server owns it under
        self.deadline = 0.0  # monotonic: owned until then (if renewed, later)
        self.lease_s = LEASE_S
        self.renew_s = RENEW_S

    def owned(self) -> bool:
        return bool(self.epochs) and time.monotonic() < self.deadline

    async def claim(self) -> bool:
        """Take every shard if no other server holds a live lease on one; True if taken."""
        sent = time.monotonic()
        async with self.pool.acquire() as conn, conn.transaction():
            # Not waiting behind the owner's row locks (its commit under way): a live
            # owner's lease is read as held, and the next look is a second away.
            await conn.execute(f"SET LOCAL lock_timeout = {CLAIM_LOCK_MS}")
            try:
                rows = await conn.fetch(
                    "SELECT shard, owner, expires > now() AS live FROM fusee_shards ORDER BY shard FOR UPDATE"
                )
            except driver().LockNotAvailableError:
                return False
            if any(row["live"] and row["owner"] != self.id for row in rows):
                return False
            claimed = await conn.fetch(
                "UPDATE fusee_shards SET epoch = epoch + 1, owner = $1, "
                "expires = now() + $2 * interval '1 millisecond' RETURNING shard, epoch",
                self.id,
                int(self.lease_s * 1000),
            )
            await conn.execute(
                "INSERT INTO fusee_servers (id, address, started, seen) VALUES ($1, $2, now(), now()) "
                "ON CONFLICT (id) DO UPDATE SET address = excluded.address, seen = now()",
                self.id,
                self.address,
            )
        self.epochs = {row["shard"]: row["epoch"] for row in claimed}
        self.deadline = sent + self.lease_s - MARGIN_S
        return True

    async def renew(self) -> bool:
        """Extend every lease this server owns; False if one was taken (or lapsed) meanwhile."""
        sent = time.monotonic()
        shards = sorted(self.epochs)
        async with self.pool.acquire() as conn:
            renewed = await conn.fetchval(
                "WITH r AS (UPDATE fusee_shards AS s SET expires = now() + $1 * interval '1 millisecond' "
                "FROM unnest($2::integer[], $3::bigint[]) AS v(shard, epoch) "
                "WHERE s.shard = v.shard AND s.epoch = v.epoch AND s.owner = $4 AND s.expires > now() "
                "RETURNING 1) SELECT count(*) FROM r",
                int(self.lease_s * 1000),
                shards,
                [self.epochs[i] for i in shards],
                self.id,
            )
        if renewed != len(shards):
            return False
        self.deadline = sent + self.lease_s - MARGIN_S
        return True

    async def holder(self) -> str:
        """Who owns the shards now, in words (a standby's log line)."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT s.owner, v.address FROM fusee_shards AS s LEFT JOIN fusee_servers AS v "
                "ON v.id = s.owner WHERE s.expires > now() ORDER BY s.shard LIMIT 1"
            )
        if row is None:
            return "no server"
        return f"{row['owner']} at {row['address']}" if row["address"] else str(row["owner"])

    async def release(self) -> None:
        """A clean stop: the leases end now, so a standby claims them at its next look
        rather than a lease later. Fenced by the epochs: a lease taken over is left alone."""
        shards = sorted(self.epochs)
        epochs = [self.epochs[i] for i in shards]
        self.epochs = {}
        try:
            async with self.pool.acquire() as conn:
                await conn.execute(
                    "UPDATE fusee_shards AS s SET owner = NULL, expires = NULL "
                    "FROM unnest($1::integer[], $2::bigint[]) AS v(shard, epoch) "
                    "WHERE s.shard = v.shard AND s.epoch = v.epoch AND s.owner = $3",
                    shards,
                    epochs,
                    self.id,
                )
                await conn.execute("DELETE FROM fusee_servers WHERE id = $1", self.id)
        except connection_errors() as error:
            logger.warning("could not end the leases at the stop (they lapse on their own): %s", error)


async def wait_to_own(ownership: Ownership, stopping: asyncio.Event) -> bool:
    """Claim the shards, as a standby until they are free: True once owned, False if
    `stopping` was set first. Says once that it waits, and who holds them."""
    said = False
    while not stopping.is_set():
        try:
            if await ownership.claim():
                return True
            if not said:
                said = True
                holder = await ownership.holder()
                # A plain line, as the owner's "ready" is: standing by is a normal state.
                print(
                    f"fusee server: standby at {ownership.address}: the shards are held by {holder}; "
                    "claiming them when its lease lapses (workers and clients reach it once it owns them)",
                    file=sys.stderr,
                    flush=True,
                )
        except connection_errors() as error:
            logger.warning("standby: the database is not answering (%s); trying again", error)
        try:
            await asyncio.wait_for(stopping.wait(), ownership.renew_s)
        except TimeoutError:
            pass
    return False
