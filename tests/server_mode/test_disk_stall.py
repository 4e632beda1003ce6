"""A log write that stalls (the test-only `FUSEE_TEST_STALL_WRITE`, server/src/stall.rs)
holds only what waits for it. The server's event loop never writes to the disk, so while
the flush hangs it goes on reading frames, answering calls on every shard, accepting
connections and hearing pings, and no healthy worker loses a lease.

Records of every shard wait for the stalled flush: the log is one file with one write in
flight (each batch names the one before it as durable), so the disk's stall is every
shard's durability's stall. What must not stall is everything else."""

from __future__ import annotations

import asyncio
import time

import pytest

import fusee
from tests.support.procs import Server, Worker

MARKER = "stall-marker-9d2e"  # in the stalled run's ID: its first write stalls
SILENCE_S = 5.0  # the server's liveness limit (server/fusee_server/server.py)


def stalled_server(start_server, seconds: float) -> Server:
    env = {"FUSEE_TEST_STALL_WRITE": f"{int(seconds * 1000)}:{MARKER}"}
    server: Server = start_server(shards=4, env=env)
    server.wait_for("FUSEE_TEST_STALL_WRITE is set")  # the open says so, loudly
    return server


async def finished_runs(client: fusee.Client) -> dict[int, str]:
    """One finished run on each shard, by shard."""
    ids: dict[int, str] = {}
    i = 0
    while len(ids) < client.shards:
        ids.setdefault(client.shard_of(f"before-{i}"), f"before-{i}")
        i += 1
    runs = [await client.start("steps", wid, 1) for wid in ids.values()]
    for run in runs:
        assert len(await run.result()) == 1
    return ids


async def start_stall(server: Server, client: fusee.Client) -> tuple[asyncio.Task[object], float]:
    """Start the run whose first write stalls; return once the write is stalling."""
    started = asyncio.create_task(client.start("steps", f"{MARKER}-1", 1))
    await asyncio.to_thread(server.wait_for, "stalling a log write")
    return started, time.monotonic()


def assert_leases_kept(server: Server, workers: list[Worker]) -> None:
    assert not [line for line in server.lines if "revoking" in line], server.output()
    for worker in workers:
        assert worker.held() == set(worker.initial), worker.output()
        assert len(worker.initial) == 2


async def test_a_stalled_log_write_holds_no_call_connection_or_ping(start_server, start_worker):
    stall_s = 1.0
    server = stalled_server(start_server, stall_s)
    workers = [start_worker(server.address(max_shards=2)) for _ in range(2)]
    async with await fusee.Client.connect(server.address()) as client:
        done = await finished_runs(client)
        started, began = await start_stall(server, client)
        try:
            stalled_shard = client.shard_of(f"{MARKER}-1")
            # Calls to both workers, on the shards whose records do not wait for the
            # stalled write (an output of the stalled shard waits for its records).
            for shard, wid in done.items():
                if shard != stalled_shard:
                    assert (await client.run(wid).status()).status == "ok"
            async with await fusee.Client.connect(server.address()) as late:  # a handshake
                other = next(wid for shard, wid in done.items() if shard != stalled_shard)
                assert (await late.run(other).status()).status == "ok"
            answered_s = time.monotonic() - began
            assert answered_s < stall_s * 0.5, f"calls waited {answered_s:.2f} s for a stalled write"
            assert not started.done(), "the stalled write was acknowledged before its flush ended"
        except BaseException:
            started.cancel()  # after a failure: nothing left pending
            raise
        run = await asyncio.wait_for(started, stall_s + 10)
        assert time.monotonic() - began > stall_s * 0.5  # the start waited for the flush
        assert len(await run.result()) == 1
        # Everything goes on after the stall: a run on every shard.
        after = [await client.start("steps", f"after-{i}", 1) for i in range(8)]
        assert [len(await r.result()) for r in after] == [1] * 8
    assert_leases_kept(server, workers)


@pytest.mark.slow
async def test_a_write_stalled_past_the_silence_limit_revokes_no_lease(start_server, start_worker):
    """Longer than the liveness watch's limit: the watch hears the pings all along (on
    the old inline write it could run first after the stall, with five seconds unread)."""
    stall_s = SILENCE_S + 2
    server = stalled_server(start_server, stall_s)
    workers = [start_worker(server.address(max_shards=2)) for _ in range(2)]
    async with await fusee.Client.connect(server.address()) as client:
        done = await finished_runs(client)
        started, began = await start_stall(server, client)
        try:
            stalled_shard = client.shard_of(f"{MARKER}-1")
            while time.monotonic() - began < stall_s - 0.5:
                for shard, wid in done.items():
                    if shard != stalled_shard:
                        call = time.monotonic()
                        await client.run(wid).status()
                        assert time.monotonic() - call < 1.0
                await asyncio.sleep(0.2)
        finally:
            if not started.done():
                await asyncio.wait([started], timeout=10)
            started.cancel()
        run = await started
        assert len(await run.result()) == 1
    assert_leases_kept(server, workers)
