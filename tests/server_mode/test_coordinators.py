"""Debounce, batching and runs at once through a client and a real server with one
worker (docs/coordinators.md)."""

from __future__ import annotations

import asyncio
import itertools
import sys

import pytest

import fusee
import fusee.sync
from tests.support.procs import Proc, listed, retry


async def test_debounce_and_batch_through_a_client(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        runs = [
            await client.debounce("gather", "doc-1", [i], window="500ms", event_id=f"d{i}") for i in range(3)
        ]
        again = await client.debounce("gather", "doc-1", [99], window="500ms", event_id="d1")
        assert len({r.id for r in [*runs, again]}) == 1
        await runs[0].started()
        assert await runs[0].result() == [2]  # the latest input; the repeated ID added nothing

        batched = [await client.batch("gather", "t-7", i, max_events=3, max_wait="1s") for i in range(4)]
        assert batched[0].id == batched[2].id != batched[3].id
        assert await batched[0].result() == [0, 1, 2]
        await batched[3].started()
        assert await batched[3].result() == [3]


def test_debounce_and_batch_through_the_blocking_client(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    with fusee.sync.Client.connect(server.address()) as client:
        run = client.debounce("gather", "doc-2", [1], window="300ms")
        assert run.started(timeout=30).status in ("running", "ok")
        assert run.result(timeout=30) == [1]
        batch = client.batch("gather", "t-8", "x", max_events=1)
        assert batch.result(timeout=30) == ["x"]


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


async def test_four_client_processes_batch_through_worker_kills_each_event_once(
    start_server, start_worker, procs
):
    """Four client processes send batch events (each with an event ID, sent again until
    acknowledged) while the workers running the coordinators are SIGKILLed and replaced:
    every acknowledged event is in exactly one run's input, once, under the run its
    receipt named, and every run's input is events that were sent."""
    server = start_server(shards=4)
    workers = [start_worker(server.address(max_shards=2)) for _ in range(2)]
    clients = [
        Proc(
            [
                sys.executable,
                "-m",
                "tests.server_mode.batch_client",
                server.address(),
                str(c),
                "60",
                "3",
                "0.05",
            ]
        )
        for c in range(4)
    ]
    procs.extend(clients)
    for _ in range(3):
        await asyncio.sleep(0.8)
        assert not any(line == "done" for c in clients for line in list(c.lines))  # under load
        victim = workers.pop(0)
        victim.kill()  # mid-handler: coordinators and runs on its shards recover elsewhere
        workers.append(start_worker(server.address(max_shards=2)))
    for c in clients:
        await c.wait_for_async(r"^done$", timeout=120)
    acked: dict[str, str] = {}
    for c in clients:
        for line in list(c.lines):
            if line.startswith("ack "):
                _, event, rid = line.split()
                acked[event] = rid
    assert len(acked) == 240
    async with await fusee.Client.connect(server.address()) as client:
        seen: dict[str, str] = {}
        for rid in sorted(set(acked.values())):
            # The last windows close up to max_wait after the last event (later if their
            # coordinator's worker was killed): each receipt's run must come to exist.
            await asyncio.wait_for(client.run(rid).started(), 60)
            events = await retry(lambda rid=rid: client.run(rid).result(), timeout=60)
            assert len(events) == len(set(events)) <= 5  # once each, never over max_events
            for event in events:
                assert event not in seen, f"{event} in {seen[event]} and {rid}"
                seen[event] = rid
        assert seen == acked  # each acknowledged event in the run its receipt named
        runs = {row.id for row in await retry(lambda: listed(client, type="gather"))}
        assert runs == set(acked.values())  # no run besides those named by receipts


async def test_runs_at_once_by_type_name_with_two_workers(start_server, start_worker):
    """A start by type name queues on the worker that holds the run's shard, which reaches
    the coordinator on whichever worker holds its shard."""
    server = start_server(shards=4)
    workers = [start_worker(server.address(max_shards=2)) for _ in range(2)]
    assert all(len(w.initial) == 2 for w in workers)
    async with await fusee.Client.connect(server.address()) as client:
        coordinator = client.shard_of("fusee.concurrency/one_at_a_time")
        ids = [f"w{i}" for i in range(40)]
        # Runs on the other worker's shards than the coordinator's, and on the same one.
        far = [wid for wid in ids if (client.shard_of(wid) < 2) != (coordinator < 2)][:4]
        near = [wid for wid in ids if (client.shard_of(wid) < 2) == (coordinator < 2)][:2]
        runs = [await retry(lambda wid=wid: client.start("one_at_a_time", wid, 0.2)) for wid in far + near]
        ends = [await retry(lambda r=r: r.result(), timeout=60) for r in runs]
        # One at a time, in the order started.
        assert all(a + 0.2 <= b + 0.05 for a, b in itertools.pairwise(ends))
