"""`list(where=...)` through a server: each worker answers from its own shards' index
(loaded and parked runs alike), the server merges the parts, and `limit` keeps the first
by ID (docs/engine.md, *Search attributes*). Two worker processes, one client."""

from __future__ import annotations

import asyncio

import pytest

import fusee
import fusee.sync
from tests.support.procs import retry
from tests.support.waiting import eventually


async def test_a_filtered_listing_spans_every_worker(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    start_worker(server.address())
    client = await retry(lambda: fusee.Client.connect(server.address()))
    try:
        for i in range(40):
            await retry(lambda i=i: client.start("tagged", f"t-{i:02d}", {"tenant": i % 4, "amount": i}))

        async def listed() -> list[str] | None:
            ids = sorted([row.id async for row in client.list(where={"tenant": 1, "amount": {"gte": 20}})])
            return ids if len(ids) == 5 else None

        ids = await eventually(listed, timeout=30, every=0.1)
        assert ids == [f"t-{i:02d}" for i in range(21, 40, 4)]
        await asyncio.sleep(0.5)  # the workers park them (park_after 200 ms): from the index now
        assert (
            sorted([row.id async for row in client.list(where={"tenant": 1, "amount": {"gte": 20}})]) == ids
        )
        first = [row.id async for row in client.list(where={"tenant": {"lt": 2}}, limit=3)]
        assert first == ["t-00", "t-01", "t-04"]
        with pytest.raises(fusee.RejectedError, match="unknown operator"):
            [row async for row in client.list(where={"tenant": {"like": 1}})]
    finally:
        await client.close()

    def blocking() -> list[str]:
        with fusee.sync.Client.connect(server.address()) as sync_client:
            return sorted(row.id for row in sync_client.list(where={"tenant": 3}, limit=2))

    assert await asyncio.to_thread(blocking) == ["t-03", "t-07"]
