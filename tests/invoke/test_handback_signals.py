"""Signals sent back to back while invoked workers hand their shard back at every budget
end (1 s), and while the server is SIGKILLed: each acknowledged signal is in the run
exactly once. Every part is a real process on loopback (`fusee server --invoke-config`,
uvicorn serving `handlers.asgi:app`, a client)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from tests.support.cluster import Cluster, quiet
from tests.support.procs import Proc, Server, retry

BUDGET_MS = 1000
SENDERS = 8  # signals in flight at once: some are at the worker when its budget ends
RUNS_PER_SENDER = 5


def handbacks(server: Server) -> int:
    """Invocations that ended at their budget (the server logs each release)."""
    return sum(1 for line in list(server.lines) if "released by" in line)


async def test_calls_in_flight_at_a_budget_handback_are_answered_not_failed(
    procs: list[Proc], tmp_path: Path
):
    """Without signal IDs: a call the worker accepted is answered before its shard goes,
    and one that arrives as it goes is routed on; none comes back as an error, so none
    is sent twice. Each sender signals runs that park between its signals (an invoked
    worker parks a run 50 ms after it last did something), so many calls are loading a
    run when a budget ends."""
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    server = cluster.start_invoked_config(budgetMs=BUDGET_MS, graceMs=1000)
    client = await cluster.client()
    await quiet(client)
    ids = [f"handback-{i}" for i in range(SENDERS * RUNS_PER_SENDER)]
    for wid in ids:
        await client.start("collector", wid, 0)
    sent: dict[str, list[int]] = {wid: [] for wid in ids}
    began = time.monotonic()

    async def sender(mine: list[str]) -> None:
        value = 0
        while time.monotonic() - began < 5 or handbacks(server) < 3:
            assert time.monotonic() - began < 30, "the shard was never handed back at a budget end"
            for wid in mine:
                # The raw call: no ID, no retry here. An error fails the test.
                await client.call("signal", client.shard_of(wid), id=wid, name="go", value=value)
                sent[wid].append(value)
                await asyncio.sleep(0.01)
            value += 1

    queries = 0

    async def querier() -> None:
        # Queries at every point of a handback: an answer or a reroute, never the
        # engine's ClosedError nor a ConnectionError.
        nonlocal queries
        while time.monotonic() - began < 5 or handbacks(server) < 3:
            for wid in ids[::7]:
                count = await client.call("query", client.shard_of(wid), id=wid, name="received", arg=None)
                assert count <= len(sent[wid]) + SENDERS
                queries += 1
            await asyncio.sleep(0.01)

    await asyncio.gather(*(sender(ids[i::SENDERS]) for i in range(SENDERS)), querier())
    assert queries > 0
    for wid in ids:
        await client.call("signal", client.shard_of(wid), id=wid, name="go", value=-1)
    for wid in ids:
        result = await client.run(wid).result()
        assert result == sent[wid], f"{wid}: {len(result)} recorded for {len(sent[wid])} acknowledged"
    await client.close()


async def test_signals_through_handbacks_and_server_kills_are_each_recorded_once(
    procs: list[Proc], tmp_path: Path
):
    """With signal IDs, retried as the errors say (the client does it): every signal
    acknowledged once, recorded once."""
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    server = cluster.start_invoked_config(budgetMs=BUDGET_MS, graceMs=1000)
    client = await cluster.client()
    await quiet(client)
    await client.start("collector", "killed-1", 0)

    async def signal(value: int) -> None:
        # The client retries a signal itself (under its ID) through lost connections and
        # moved shards, and connects again once the server is back: one Client throughout.
        await client.run("killed-1").signal("go", value, id=f"go-{value}")

    numbers = iter(range(1_000_000))
    acknowledged: list[int] = []
    killing = True

    async def sender() -> None:
        while killing or handbacks(server) < 2:
            value = next(numbers)
            await signal(value)
            acknowledged.append(value)

    async def killer() -> None:
        # SIGKILLs while signals are in flight: some are durable at the server when it
        # dies, their answers lost.
        nonlocal server, killing
        for kill in range(3):
            await asyncio.sleep(1.5 + kill * 0.3)
            server.kill()
            server = await asyncio.to_thread(cluster.start_invoked_config, budgetMs=BUDGET_MS, graceMs=1000)
        killing = False

    await asyncio.gather(killer(), *(sender() for _ in range(SENDERS)))
    await signal(-1)
    result = await retry(lambda: client.run("killed-1").result(), timeout=60)
    assert sorted(result) == sorted(acknowledged), (
        f"{len(result)} recorded for {len(acknowledged)} acknowledged"
    )
    await client.close()
