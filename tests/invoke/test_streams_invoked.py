"""A stream read through the server while invoked workers write it: budget handbacks
every second and handler SIGKILLs on the way, the reader gets every chunk once, in order,
none it later loses (docs/engine.md, *Streams*). Real processes: `fusee server
--invoke-config`, uvicorn serving handlers/asgi.py, a client. The full-size run (10,000
chunks, 10 kills) is behind --run-slow."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, quiet
from tests.support.procs import Proc


def handbacks(cluster: Cluster) -> int:
    assert cluster.server is not None
    return sum(1 for line in list(cluster.server.lines) if "released by" in line)


async def _read_through(procs: list[Proc], tmp_path: Path, chunks: int, kills: int) -> None:
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    cluster.start_invoked_config(budgetMs=1000)
    client = await cluster.client()
    await quiet(client)
    await client.start("streamer", "si-1", chunks)
    reader = client.run("si-1").stream("numbers")
    got: list[int] = []
    at = {chunks * (k + 1) // (kills + 1) for k in range(kills)}
    async for chunk in reader:
        got.append(chunk)
        if len(got) in at:
            cluster.kill_handler()
    assert got == list(range(chunks)), f"{len(got)} chunks read"
    assert (reader.status, reader.closed, reader.offset) == ("ok", True, chunks)
    assert await asyncio.wait_for(client.run("si-1").result(), 60) == chunks
    assert handbacks(cluster) >= 2, "the run crossed budget ends"
    await client.close()


async def test_a_reader_gets_every_chunk_once_across_handbacks_and_kills(procs: list[Proc], tmp_path: Path):
    await _read_through(procs, tmp_path, 1_000, 2)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_ten_thousand_chunks_across_ten_kills_and_ten_handbacks(procs: list[Proc], tmp_path: Path):
    await _read_through(procs, tmp_path, 10_000, 10)
