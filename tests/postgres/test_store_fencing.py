"""A deposed server writes nothing, on every write path of the PostgreSQL store: its
store is opened and owns the shards, another server takes them over (their leases lapsed),
and then each kind of write of the first is refused by the database in the same statement
(records, run-store frames, due times, checkpoints, the limits' definitions, renewals and
the release at a stop), with every row as the new owner left it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from fusee_server.postgres import database
from fusee_server.postgres.ownership import Ownership
from fusee_server.postgres.store import Batch, Deposed, PgStore

from fusee._errors import IoError
from tests.support.postgres import owned_store


class Deposition:
    def __init__(self, pool: Any, old: PgStore, new: Ownership) -> None:
        self.pool = pool
        self.old = old
        self.new = new

    async def rows(self) -> list[Any]:
        """Everything the store holds, to compare before and after a refused write."""
        async with self.pool.acquire() as conn:
            return [
                await conn.fetch("SELECT * FROM fusee_shards ORDER BY shard"),
                await conn.fetch("SELECT * FROM fusee_records ORDER BY shard, position"),
                await conn.fetch("SELECT * FROM fusee_runs ORDER BY shard, run_offset"),
                await conn.fetch("SELECT * FROM fusee_checkpoints ORDER BY shard, seq"),
                await conn.fetch("SELECT * FROM fusee_meta ORDER BY key"),
            ]


@pytest.fixture
async def deposed(pg_url: str) -> AsyncIterator[Deposition]:
    # A write that lands, under the epoch the old server owns the shards by.
    pool, old = await owned_store(pg_url, 2, "old:7600")
    shards = old.shard_count
    # Its leases lapse (the database's clock says so) and another server claims them.
    await pool.execute("UPDATE fusee_shards SET expires = now() - interval '1 second'")
    new = Ownership(pool, shards, "new:7600")
    assert await new.claim()
    yield Deposition(pool, old, new)
    if old.renewer is not None:
        old.renewer.cancel()
    if old.commit_conn is not None:
        await old.commit_conn.close()
    await pool.close()


async def test_records_of_a_deposed_server_are_refused(deposed: Deposition):
    before = await deposed.rows()
    batch = Batch()
    batch.records[0], batch.first[0] = [b"c"], 3
    with pytest.raises(Deposed):
        await deposed.old._commit(batch)
    assert await deposed.rows() == before


async def test_run_store_frames_of_a_deposed_server_are_refused(deposed: Deposition):
    before = await deposed.rows()
    batch = Batch()
    batch.frames.append((1, 0, b"frame"))
    batch.runs_len[1] = 13
    with pytest.raises(Deposed):
        await deposed.old._commit(batch)
    assert await deposed.rows() == before


async def test_due_times_of_a_deposed_server_are_refused(deposed: Deposition):
    before = await deposed.rows()
    batch = Batch()
    batch.dues[1] = 123
    with pytest.raises(Deposed):
        await deposed.old._commit(batch)
    assert await deposed.rows() == before


async def test_a_checkpoint_of_a_deposed_server_is_refused_and_it_steps_down(deposed: Deposition):
    before = await deposed.rows()
    with pytest.raises(IoError):
        await deposed.old._checkpoint(0, 2, b"index")
    assert deposed.old.deposed
    assert await deposed.rows() == before


async def test_a_limit_defined_on_a_deposed_server_is_refused(deposed: Deposition):
    before = await deposed.rows()
    with pytest.raises(IoError, match="another server owns the shards"):
        await deposed.old.definitions.save(b'[{"name": "api", "concurrent": 1, "per_second": null}]')
    assert deposed.old.deposed
    assert await deposed.rows() == before


async def test_a_deposed_server_can_neither_renew_nor_end_the_new_owners_leases(deposed: Deposition):
    before = await deposed.rows()
    assert not await deposed.old.ownership.renew()
    await deposed.old.ownership.release()
    assert await deposed.rows() == before
    assert await deposed.new.renew()


async def test_the_functions_refuse_a_stale_epoch_in_the_same_statement(deposed: Deposition):
    before = await deposed.rows()
    stale = deposed.old.ownership.epochs[0]
    async with deposed.pool.acquire() as conn:
        with pytest.raises(Exception) as raised:
            await conn.execute(
                "SELECT fusee_commit_v1($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                [0], [stale], [9], [0], [-2], [0], [3], [b"x"], [], [], [],
            )  # fmt: skip
        assert database.fenced(raised.value)
        with pytest.raises(Exception) as raised:
            await conn.execute("SELECT fusee_checkpoint_v1(0, $1, 2, 0, 'x')", stale)
        assert database.fenced(raised.value)
    assert await deposed.rows() == before


async def test_a_store_of_a_newer_schema_or_another_shard_count_is_refused(pg_url: str):
    pool = await database.pool(pg_url)
    try:
        assert await database.prepare(pool, pg_url, 3) == 3
        assert await database.prepare(pool, pg_url, None) == 3
        with pytest.raises(Exception, match="has 3 shards, not the 5 asked for"):
            await database.prepare(pool, pg_url, 5)
        await pool.execute("UPDATE fusee_meta SET value = '99' WHERE key = 'schema_version'")
        with pytest.raises(Exception, match="schema is version 99, written by a newer fusee server"):
            await database.prepare(pool, pg_url, None)
    finally:
        await pool.close()


async def test_a_store_past_its_own_deadline_takes_no_connection(pg_url: str):
    """Resumed after a freeze, a server's listener can run before its renewal notices
    the lease is gone: its store says it serves nobody (Server.opened refuses with it)."""
    pool, store = await owned_store(pg_url, 1)
    try:
        assert store.serving() is None
        store.ownership.deadline = 0.0  # its own deadline passed while it was frozen
        assert "no longer owns the shards" in (store.serving() or "")
    finally:
        if store.renewer is not None:
            store.renewer.cancel()
        if store.commit_conn is not None:
            await store.commit_conn.close()
        await pool.close()
