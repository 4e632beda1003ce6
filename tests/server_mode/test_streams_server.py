"""A stream read through a server (docs/engine.md, *Streams*): a client follows a run's
stream while its worker appends, the worker is SIGKILLed twice and another takes the
shard each time; the reader gets every chunk once, in order, none it later loses. Real
processes: the server, three workers, the client."""

from __future__ import annotations

import asyncio

import fusee
from tests.support.procs import retry
from tests.support.waiting import eventually

CHUNKS = 300


async def test_a_reader_through_the_server_gets_every_chunk_once_across_worker_kills(
    start_server, start_worker
):
    server = start_server()
    workers = [start_worker(server.address()) for _ in range(3)]
    client = await retry(lambda: fusee.Client.connect(server.address()))
    try:
        await retry(lambda: client.start("streamer", "st-1", CHUNKS))
        shard = client.shard_of("st-1")
        reader = client.run("st-1").stream("numbers")
        got: list[int] = []
        killed = 0
        async for chunk in reader:
            got.append(chunk)
            if len(got) in (60, 180):
                holder = next(w for w in workers if shard in w.held())
                holder.kill()
                workers.remove(holder)
                killed += 1
                await eventually(lambda: any(shard in w.held() for w in workers), timeout=30, every=0.05)
        assert killed == 2
        assert got == list(range(CHUNKS)), (
            f"{len(got)} chunks, first gap at {next(i for i, v in enumerate(got) if v != i)}"
        )
        assert (reader.status, reader.closed, reader.offset) == ("ok", True, CHUNKS)
        assert await asyncio.wait_for(client.run("st-1").result(), 30) == CHUNKS
        # Reconnecting at an offset, after the end: the rest, once.
        tail = [chunk async for chunk in client.run("st-1").stream("numbers", from_=CHUNKS - 5)]
        assert tail == list(range(CHUNKS - 5, CHUNKS))
    finally:
        await client.close()
