"""Leases between real worker processes: shards shared with max-shards, a SIGKILLed
holder's shards taken by the standby, a SIGSTOPped holder deposed after five seconds of
silence, and the server itself killed and restarted under load."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import fusee
from tests.support.procs import retry, steps_seen
from tests.support.waiting import eventually


def two_holders_and_a_standby(start_server: Any, start_worker: Any, steps: Path) -> tuple[Any, ...]:
    """A server and three workers of at most two shards each: two hold 0-1 and 2-3, one
    waits. The workers record their steps' results in `steps`."""
    server = start_server()
    workers = [start_worker(server.address(max_shards=2), steps_file=steps) for _ in range(3)]
    return (server, *workers)


def recorded_by(steps: Path, pid: str) -> int:
    """How many step results the worker of process `pid` recorded."""
    return sum(v.startswith(pid) for vs in steps_seen(steps).values() for v in vs)


async def test_a_killed_holders_shards_move_to_the_standby_and_every_recorded_step_stands(
    start_server, start_worker, tmp_path: Path
):
    steps = tmp_path / "steps.txt"
    server, first, second, standby = two_holders_and_a_standby(start_server, start_worker, steps)
    assert first.initial == [0, 1] and second.initial == [2, 3] and standby.initial == []
    client = await fusee.Client.connect(server.address())
    ids = [f"job-{i}" for i in range(24)]
    for wid in ids:
        await client.start("steps", wid, 8)
    on_first = [wid for wid in ids if client.shard_of(wid) in (0, 1)]
    assert on_first
    # Mid-step: the first worker has recorded some steps of its workflows, not all.
    pid = str(first.popen.pid)
    await eventually(lambda: recorded_by(steps, pid) >= 10, timeout=20.0, every=0.02)
    first.kill()
    await eventually(lambda: standby.held() == {0, 1}, timeout=20.0, every=0.02)
    results = {wid: await retry(lambda wid=wid: client.run(wid).result()) for wid in ids}
    seen = steps_seen(steps)
    for wid, result in results.items():
        assert len(result) == 8
        for i, value in enumerate(result):
            assert value in seen[(wid, i)], (wid, i, value)
    # The steps the killed worker recorded stand: their results come from its process.
    kept = [v for wid in on_first for v in results[wid] if v.startswith(pid + ":")]
    resumed = [v for wid in on_first for v in results[wid] if v.startswith(f"{standby.popen.pid}:")]
    assert kept and resumed, "the killed worker's workflows finish on the standby, its recorded steps kept"
    # A step runs again only if it was in flight at the kill: at most one per workflow.
    for wid in on_first:
        again = [i for i in range(8) if len(seen[(wid, i)]) > 1]
        assert len(again) <= 1, (wid, again)
    await client.close()


async def test_a_stopped_holder_loses_its_lease_after_five_seconds_and_writes_nothing_after(
    start_server, start_worker, tmp_path: Path
):
    steps = tmp_path / "steps.txt"
    server, stalled, other, standby = two_holders_and_a_standby(start_server, start_worker, steps)
    client = await fusee.Client.connect(server.address())
    ids = [f"slow-{i}" for i in range(16)]
    for wid in ids:
        await client.start("steps", wid, 30)
    pid = str(stalled.popen.pid)
    await eventually(lambda: recorded_by(steps, pid) >= 1, timeout=20.0, every=0.02)
    stalled.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    await eventually(lambda: standby.held() == {0, 1}, timeout=15, every=0.02)
    assert time.monotonic() - stopped_at >= 4.5, "revoked only after five seconds of silence"
    server.wait_for(r"revoking its leases on shards \[0, 1\]: no byte from it")
    stalled.signal(signal.SIGCONT)
    stalled.wait_for(r"^lost 0$")
    stalled.wait_for(r"^lost 1$")
    stalled.wait_for(r"^reconnected$")  # its engine connects again by itself, as a standby now
    results = {wid: await retry(lambda wid=wid: client.run(wid).result(), timeout=60) for wid in ids}
    seen = steps_seen(steps)
    for wid, result in results.items():
        assert len(result) == 30
        for i, value in enumerate(result):
            assert value in seen[(wid, i)]
    assert other.held() == {2, 3}
    await client.close()


async def test_children_and_signals_between_workers_arrive_exactly_once(start_server, start_worker, tmp_path):
    server = start_server()
    left = start_worker(server.address(max_shards=2))
    right = start_worker(server.address(max_shards=2))
    standby = start_worker(server.address(max_shards=2))
    client = await fusee.Client.connect(server.address())
    # A parent whose children hash to every shard, held by both workers.
    parent = await client.start("parent", "family", 8)
    shards = {client.shard_of(f"family-c{i}") for i in range(8)}
    assert shards & {0, 1} and shards & {2, 3}
    # Signals from a workflow on one worker to one on the other, three of them, in order.
    left_ids = [f"w-{i}" for i in range(60) if client.shard_of(f"w-{i}") < 2]
    right_ids = [f"w-{i}" for i in range(60) if client.shard_of(f"w-{i}") >= 2]
    pairs = list(zip(left_ids[:3], right_ids[:3], strict=True))
    pairs += list(zip(right_ids[3:6], left_ids[3:6], strict=True))
    for sender, target in pairs:
        await client.start("waiter", target, 3)
        await client.start("sender", sender, target)
    # Kill one worker while messages are in flight: a standby takes over and resends.
    left.kill()
    family = await retry(lambda: parent.result(), timeout=60)
    assert len(family) == 8 and all(len(child) == 2 for child in family)
    for sender, target in pairs:
        assert await retry(lambda t=target: client.run(t).result(), timeout=60) == [1, 2, 3]
        assert await retry(lambda s=sender: client.run(s).result(), timeout=60) == 3
    assert standby.held() == {0, 1} or right.held() == {2, 3}
    await client.close()


async def test_the_server_killed_under_load_and_restarted_loses_nothing_acknowledged(
    start_server, start_worker, tmp_path
):
    data = tmp_path / "server"
    server = start_server(dir=data)
    host_port = server.host_port
    worker = start_worker(server.address())
    client = await fusee.Client.connect(server.address())
    acknowledged: list[str] = []

    async def load() -> None:
        i = 0
        while True:
            wid = f"load-{i}"
            try:
                await client.start("steps", wid, 2)
            except (fusee.ConnectionError, fusee.NoHolderError, fusee.LeaseLostError):
                return
            acknowledged.append(wid)
            i += 1

    loading = asyncio.ensure_future(load())
    await eventually(lambda: len(acknowledged) >= 40, timeout=20.0, every=0.02)
    server.kill()
    await asyncio.wait_for(loading, 10)
    await client.close()
    restarted = start_server(dir=data, listen=host_port)
    worker.wait_for(r"^reconnected$")
    client = await retry(lambda: fusee.Client.connect(restarted.address()))
    for wid in acknowledged:
        result = await retry(lambda wid=wid: client.run(wid).result(), timeout=60)
        assert len(result) == 2
    await client.close()


async def test_a_holder_whose_event_loop_blocks_keeps_its_leases_through_its_ping_thread(
    start_server, start_worker
):
    server = start_server()
    busy = start_worker(server.address())
    standby = start_worker(server.address())
    assert busy.initial == [0, 1, 2, 3] and standby.initial == []
    client = await fusee.Client.connect(server.address())
    run = await client.start("hog", "hog-1", 7.0)
    assert await retry(run.result, timeout=30) == "done"
    assert standby.held() == set()
    assert not any("revoking" in line for line in server.lines), server.output()
    await client.close()


async def test_calls_racing_a_holders_clean_exit_are_answered_or_retriable(start_server, start_worker):
    """Calls and listings keep coming while the holder exits cleanly (SIGTERM: its shards
    let go, the standby takes them). Each is answered, or fails with an error that says to retry; a
    call that reached the holder after it let the shard go is routed on to the standby
    (ANSWER `Moved`), never refused."""
    server = start_server(shards=1)
    holder = start_worker(server.address())
    standby = start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        await client.start("waiter", "w-1", 1)
        refused: list[str] = []
        answered = 0
        stop = asyncio.Event()

        async def describe(listing: bool) -> None:
            nonlocal answered
            while not stop.is_set():
                try:
                    if listing:
                        assert [row.id async for row in client.list()] == ["w-1"]
                    else:
                        await client.run("w-1").status()
                    answered += 1
                except fusee.RejectedError as error:
                    refused.append(str(error))
                except (fusee.NoHolderError, fusee.ConnectionError, fusee.LeaseLostError):
                    await asyncio.sleep(0.001)  # retriable, as documented

        callers = [asyncio.ensure_future(describe(listing=i % 4 == 0)) for i in range(8)]
        await asyncio.sleep(0.3)
        before = answered
        assert holder.stop() == 0
        await asyncio.to_thread(standby.wait_for, r"^took 0$")
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*callers)
        assert not refused, f"{len(refused)} calls refused, the first: {refused[0]}"
        assert answered > before  # answered by the standby after the hand-over
        await retry(lambda: client.run("w-1").signal("go", 1))
        assert await retry(lambda: client.run("w-1").result()) == [1]
