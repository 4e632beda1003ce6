"""A listing (a client's `list`, which spans shards) racing its holder's clean exit: the
worker lets its shards go (an invoked worker's idle end, a drain, a close) while a listing
routed to it is unanswered. A listing is harmless to ask again, so the server routes each
shard's part on to the shard's next holder rather than failing it (docs/server.md, *Calls
at a handback*). Found by bench/invoke_cost.py's parked-runs listing ("the worker went
away before answering", about 3 runs in 4). A real server and a standby worker process;
the holder is an engine in this process, its read of a parked run's frame (which a
listing makes) held back by a fault point, so the race is the same every time."""

from __future__ import annotations

import asyncio
from typing import Any

import fusee
from fusee.testing.faults import held_read
from tests.server_mode.flows import WORKFLOWS
from tests.support.engine_kit import parked_ref
from tests.support.waiting import eventually


async def _ids(client: fusee.Client) -> list[str]:
    while True:
        try:
            return sorted([row.id async for row in client.list(type="sleeper")])
        except fusee.NoHolderError:
            # A shard between holders (no invoker here to bring one): said at once, and
            # retriable. What must not come is a ConnectionError or missing rows.
            await asyncio.sleep(0.01)


async def test_listings_at_a_holders_clean_exit_are_answered_with_every_shards_rows(
    start_server: Any, start_worker: Any
) -> None:
    server = start_server(shards=2)
    engine = await fusee.Engine.open(
        durability="server", address=server.address(), workflows=WORKFLOWS, park_after="50ms"
    )
    client = await fusee.Client.connect(server.address())
    closing: asyncio.Future[Any] | None = None
    try:
        ids = [f"asleep-{i}" for i in range(6)]
        for wid in ids:
            await engine.start("sleeper", wid, 3600.0)
        assert {engine.shard_of(wid).index for wid in ids} == {0, 1}
        await eventually(lambda: not any(wid in engine.shard_of(wid).runs for wid in ids))  # parked
        start_worker(server.address())  # the standby: the shards' next holder
        held_shard = engine.shard_of(ids[0])
        with held_read(held_shard.store, parked_ref(engine, ids[0])) as held:
            # Accepted by the holder, which is reading its parked runs when it starts to
            # let its shards go: answered before the shard goes.
            accepted = asyncio.ensure_future(_ids(client))
            await asyncio.wait_for(held.reached.wait(), 10)
            closing = asyncio.ensure_future(engine.close(10.0))
            await asyncio.sleep(0.1)
            # Sent while the holder lets its shards go: routed on to the standby.
            late = asyncio.ensure_future(_ids(client))
            await asyncio.sleep(0.2)
            held.release()
            assert await asyncio.wait_for(accepted, 30) == sorted(ids)
            assert await asyncio.wait_for(late, 30) == sorted(ids)
        await closing
    finally:
        await client.close()
        if closing is None:
            await engine.close()
