"""A server, one worker, one client: the basic path end to end."""

from __future__ import annotations

import asyncio

import pytest

import fusee
import fusee.sync
from tests.server_mode.flows import WORKFLOWS
from tests.support.procs import listed, retry


async def test_a_worker_runs_what_a_client_starts(start_server, start_worker):
    server = start_server()
    worker = start_worker(server.address())
    assert worker.initial == [0, 1, 2, 3]
    client = await fusee.Client.connect(server.address())
    try:
        runs = [await client.start("steps", f"smoke-{i}", 3) for i in range(8)]
        results = [await run.result() for run in runs]
        assert all(len(r) == 3 for r in results)
        rows = [row async for row in client.list(type="steps")]
        assert sorted(r.id for r in rows) == sorted(f"smoke-{i}" for i in range(8))
        assert [r.shard for r in rows] == sorted(r.shard for r in rows)
    finally:
        await client.close()
    assert worker.stop() == 0
    assert server.stop() == 0


async def test_a_worker_over_the_unix_socket_and_a_blocking_client(start_server, start_worker, tmp_path):
    sock = tmp_path / "fusee.sock"
    start_server("--unix", str(sock))
    worker = start_worker(f"unix:{sock}")
    assert worker.initial == [0, 1, 2, 3]

    def blocking() -> list[object]:
        with fusee.sync.Client.connect(f"unix:{sock}") as client:
            run = client.start("waiter", "w-1", 2)
            run.signal("go", 7)
            run.signal("go", 8)
            rows = client.list(type="waiter")
            return [run.result(), [r.id for r in rows]]

    result, listed = await asyncio.to_thread(blocking)
    assert result == [7, 8]
    assert listed == ["w-1"]


async def test_fusee_url_opens_an_engine_in_server_mode(start_server, monkeypatch):
    server = start_server(shards=2)
    monkeypatch.setenv("FUSEE_URL", server.address(max_shards=1))
    engine = await fusee.Engine.open(workflows=WORKFLOWS)
    try:
        assert engine.storage.durability is fusee.Durability.SERVER
        assert len(engine.shards) == 1
        server.wait_for(r"shard \d: leased to worker")
    finally:
        await engine.close()
    server.wait_for(r"released by worker")


async def test_a_call_for_a_shard_without_holder_fails_at_once_saying_so(start_server):
    server = start_server()
    async with await fusee.Client.connect(server.address()) as client:
        with pytest.raises(fusee.NoHolderError, match="no worker holds shard"):
            await client.start("steps", "nobody-home", 1)
        with pytest.raises(fusee.NoHolderError):
            await anext(client.list())


async def test_records_larger_than_one_frame_holds_together_reach_the_log_and_recover(
    start_server, start_worker
):
    server = start_server(shards=1)
    worker = start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        run = await client.start("big", "big-1", 5)
        assert await run.result() == [5 << 20] * 3
        worker.kill()
        standby = start_worker(server.address())  # recovers the shard: 15 MiB of records, in pages
        assert standby.initial == [0]
        assert await retry(lambda: client.run("big-1").result()) == [5 << 20] * 3


async def test_a_shard_whose_checkpoint_is_large_is_read_off_the_loop_and_recovers(
    start_server, start_worker
):
    """A checkpoint over 64 KiB (2,000 runs waiting for a signal) is read by the server's
    reader thread for the next holder's open, a small one on its loop: both recover every
    run, and the runs go on."""
    server = start_server(shards=1)
    worker = start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        gate = asyncio.Semaphore(64)

        async def start(i: int) -> None:
            async with gate:
                await client.start("waiter", f"w-{i}", 1)

        await asyncio.gather(*(start(i) for i in range(2000)))
        assert worker.stop() == 0  # parks the runs, then a checkpoint of the whole index
        sizes = [path.stat().st_size for path in server.dir.rglob("checkpoint-*")]
        assert max(sizes) > 64 << 10, sizes  # over INLINE_READ_BYTES: read off the loop
        for _ in range(2):  # the large checkpoint, then (after the next close) the same again
            worker = start_worker(server.address())
            assert len(await retry(lambda: listed(client, "waiter", "running"))) == 2000
            assert worker.stop() == 0
        worker = start_worker(server.address())
        await retry(lambda: client.run("w-7").signal("go", 7))
        assert await retry(lambda: client.run("w-7").result()) == [7]
        assert len(await retry(lambda: listed(client, "waiter", "running"))) == 1999
