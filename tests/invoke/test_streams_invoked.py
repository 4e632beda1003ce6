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


async def _read_through(
    procs: list[Proc],
    tmp_path: Path,
    workflow: str,
    chunks: int,
    kills: int,
    ends: int = 2,
    pause_s: float = 0.005,
) -> None:
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    cluster.start_invoked_config(budgetMs=1000)
    client = await cluster.client()
    await quiet(client)
    await client.start(
        workflow, "si-1", chunks if workflow == "streamer" else {"n": chunks, "pause_s": pause_s}
    )
    reader = client.run("si-1").stream("numbers")
    got: list[int] = []
    at = {chunks * (k + 1) // (kills + 1) for k in range(kills)}
    async for chunk in reader:
        got.append(chunk)
        if len(got) in at:
            cluster.kill_handler()
    assert got == list(range(chunks)), f"{len(got)} chunks read"
    # The code closes its stream; a step's completes with the step's result.
    assert (reader.status, reader.closed, reader.offset) == ("ok", workflow == "streamer", chunks)
    assert await asyncio.wait_for(client.run("si-1").result(), 60) == chunks
    assert handbacks(cluster) >= ends, f"the run crossed {handbacks(cluster)} budget ends"
    assert cluster.server is not None
    assert not [line for line in cluster.server.lines if "before any step finished" in line]
    await client.close()


async def test_a_reader_gets_every_chunk_once_across_handbacks_and_kills(procs: list[Proc], tmp_path: Path):
    # The run's code appends (a replay matches its appends at each new invocation).
    await _read_through(procs, tmp_path, "streamer", 1_000, 2)


async def test_a_steps_stream_continues_after_its_recorded_chunks_across_handbacks(
    procs: list[Proc], tmp_path: Path
):
    # A step appends (each invocation's attempt continues after what was durable).
    await _read_through(procs, tmp_path, "scribe", 3_000, 2)


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_ten_thousand_chunks_across_ten_kills_and_ten_handbacks(procs: list[Proc], tmp_path: Path):
    # 200 pauses of 75 ms: 15 s of writing, so budget ends come between the kills.
    await _read_through(procs, tmp_path, "scribe", 10_000, 10, ends=10, pause_s=0.075)
