"""Debounce, batching and runs at once through a client and a real server with one
worker (docs/coordinators.md)."""

from __future__ import annotations

import asyncio

import pytest

import fusee


async def test_debounce_and_batch_through_a_client(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        runs = [await client.debounce("gather", "doc-1", [i], window="500ms", event_id=f"d{i}") for i in range(3)]
        again = await client.debounce("gather", "doc-1", [99], window="500ms", event_id="d1")
        assert len({r.id for r in runs + [again]}) == 1
        await runs[0].started()
        assert await runs[0].result() == [2]  # the latest input; the repeated ID added nothing

        batched = [await client.batch("gather", "t-7", i, max_events=3, max_wait="1s") for i in range(4)]
        assert batched[0].id == batched[2].id != batched[3].id
        assert await batched[0].result() == [0, 1, 2]
        await batched[3].started()
        assert await batched[3].result() == [3]


async def test_runs_at_once_through_a_client(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        runs = [await client.start("one_at_a_time", f"r{i}", 0.3) for i in range(4)]
        queued = {r.id async for r in client.list(type="fusee.queued") if r.status == "running"}
        assert {"fusee.queued/r2", "fusee.queued/r3"} <= queued
        await runs[2].cancel("not needed")
        with pytest.raises(fusee.CancelledError):
            await runs[2].result()
        ends = await asyncio.gather(runs[3].result(), runs[1].result(), runs[0].result())
        assert ends[2] + 0.3 <= ends[1] + 0.05 and ends[1] + 0.3 <= ends[0] + 0.05  # one at a time, in order
