"""Limits held by a real server across real worker processes (docs/limits.md, *Server
mode*): attempts inside are counted from outside every process, in a file each attempt
appends to as it begins and ends."""

from __future__ import annotations

import asyncio
import signal
import time
import zlib
from pathlib import Path

import fusee
from tests.support.procs import free_port, retry


def events(path: Path) -> list[tuple[float, int, int]]:
    """(time, +1 or -1, pid) per line, in time order."""
    out = []
    for line in path.read_text().splitlines():
        delta, at, pid = line.split()
        out.append((float(at), int(delta), int(pid)))
    return sorted(out)


def most_inside(path: Path) -> int:
    inside = most = 0
    for _, delta, _ in events(path):  # at one instant, an end sorts before a beginning
        inside += delta
        most = max(most, inside)
    return most


async def test_concurrent_4_across_3_workers_never_lets_more_than_4_inside(
    start_server, start_worker, tmp_path
):
    server = start_server(shards=6)
    workers = [start_worker(server.address(max_shards=2)) for _ in range(3)]
    assert all(len(w.initial) == 2 for w in workers)
    file = tmp_path / "inside"
    file.touch()
    client = await fusee.Client.connect(server.address())
    try:
        await client.limit("api", concurrent=4)
        runs = await asyncio.gather(
            *(
                client.start("limited", f"c{i}", {"limit": "api", "ms": 60, "file": str(file)})
                for i in range(60)
            )
        )
        assert [await run.result() for run in runs] == ["ok"] * 60
        assert most_inside(file) == 4
        assert len({pid for _, _, pid in events(file)}) == 3  # every worker ran some
        assert await client.limit_usage("api") == {"in_use": 0, "waiting": 0}
        assert [(d["name"], d["concurrent"]) for d in await client.limits()] == [("api", 4)]
    finally:
        await client.close()


async def test_per_second_20_across_3_workers_keeps_to_the_rate(start_server, start_worker, tmp_path):
    server = start_server(shards=6)
    for _ in range(3):
        start_worker(server.address(max_shards=2))
    file = tmp_path / "inside"
    file.touch()
    client = await fusee.Client.connect(server.address())
    try:
        await client.limit("rate", per_second=20)
        runs = await asyncio.gather(
            *(
                client.start("limited", f"r{i}", {"limit": "rate", "ms": 1, "file": str(file)})
                for i in range(280)
            )
        )
        await asyncio.sleep(11)
        began = [at for at, delta, _ in events(file) if delta == 1]
        first = began[0]
        in_10s = sum(1 for at in began if at < first + 10)
        print(f"per_second=20 across 3 workers: {in_10s} attempts began in the first 10 s")
        assert 180 <= in_10s <= 220, in_10s
        assert [await run.result() for run in runs] == ["ok"] * len(runs)
    finally:
        await client.close()


async def test_a_sigkilled_workers_permits_come_back_after_their_lease_not_before(
    start_server, start_worker, tmp_path
):
    server = start_server(shards=2)
    a = start_worker(server.address(max_shards=1))
    b = start_worker(server.address(max_shards=1))
    assert a.initial == [0] and b.initial == [1]
    on = {0: [], 1: []}
    for i in range(200):
        wid = f"k{i}"
        on[zlib.crc32(wid.encode()) % 2].append(wid)
    file = tmp_path / "inside"
    file.touch()
    client = await fusee.Client.connect(server.address())
    try:
        await client.call("limit", {"name": "two", "concurrent": 2})
        for wid in on[0][:2]:  # A's: they hold both permits for a minute
            await client.start("limited", wid, {"limit": "two", "ms": 60_000, "file": str(file)})
        deadline = time.monotonic() + 20
        while sum(d for _, d, _ in events(file)) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        runs = [
            await client.start("limited", wid, {"limit": "two", "ms": 10, "file": str(file)})
            for wid in on[1][:3]
        ]
        await asyncio.sleep(1.5)
        assert await client.call("limit_usage", {"name": "two"}) == {"in_use": 2, "waiting": 3}
        killed = time.time()
        a.signal(signal.SIGKILL)
        assert [await run.result() for run in runs] == ["ok"] * 3
        b_began = [at for at, delta, pid in events(file) if delta == 1 and pid == b.popen.pid]
        waited = b_began[0] - killed
        print(f"a SIGKILLed worker's permits: granted again {waited:.2f} s after the kill")
        # renewed at most a second before the kill, a lease lapses 3 s after its renewal
        assert 2.0 <= waited <= 5.0, waited
    finally:
        await client.close()


async def test_a_restarted_server_waits_out_the_leases_it_may_have_granted(
    start_server, start_worker, tmp_path
):
    """The server is SIGKILLed while a worker holds the only permit; the worker connects
    to the restarted server and its steps ask again: nothing is granted until a lease's
    length after the restart (the killed server's permit may still be in use), and the
    definition is the one stored."""
    data, listen = tmp_path / "server", f"127.0.0.1:{free_port()}"
    server = start_server(dir=data, listen=listen, shards=1)
    start_worker(server.address())
    file = tmp_path / "inside"
    file.touch()
    client = await fusee.Client.connect(server.address())
    try:
        await client.call("limit", {"name": "one", "concurrent": 1})
        await client.start("limited", "long", {"limit": "one", "ms": 2_000, "file": str(file)})
        deadline = time.monotonic() + 20
        while not events(file) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    await asyncio.to_thread(server.kill)
    before = len(events(file))
    server = await asyncio.to_thread(start_server, dir=data, listen=listen, shards=1)
    ready = time.time()
    client = await fusee.Client.connect(server.address())
    try:
        assert await retry(lambda: client.run("long").result()) == "ok"
        again = [at for at, delta, _ in events(file)[before:] if delta == 1]
        waited = again[0] - ready
        print(f"after a server restart: first permit {waited:.2f} s after it was ready")
        assert waited >= 2.9, waited
        limits = await client.call("limits", {})
        assert [(d["name"], d["concurrent"]) for d in limits] == [("one", 1)]
    finally:
        await client.close()


async def test_priority_is_strict_across_workers(start_server, start_worker, tmp_path):
    server = start_server(shards=6)
    for _ in range(3):
        start_worker(server.address(max_shards=2))
    file = tmp_path / "inside"
    file.touch()
    client = await fusee.Client.connect(server.address())
    try:
        await client.call("limit", {"name": "one", "concurrent": 1})
        first = await client.start("limited", "first", {"limit": "one", "ms": 1_500, "file": str(file)})
        deadline = time.monotonic() + 20
        while not events(file) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        order = {}
        runs = []
        for priority in (0, 5, -2, 9, 3, 7):  # on whichever worker holds each ID's shard
            wid = f"p{priority}"
            marked = tmp_path / wid
            marked.touch()
            order[wid] = marked
            args = {"limit": "one", "ms": 20, "file": str(marked), "priority": priority}
            runs.append(await client.start("limited", wid, args))
        await asyncio.sleep(0.5)
        assert await client.call("limit_usage", {"name": "one"}) == {"in_use": 1, "waiting": 6}
        await first.result()
        for run in runs:
            await run.result()
        began = sorted((events(path)[0][0], wid) for wid, path in order.items())
        assert [wid for _, wid in began] == ["p9", "p7", "p5", "p3", "p0", "p-2"]
    finally:
        await client.close()


async def test_a_step_keeps_its_place_in_the_queue_when_its_worker_dies(start_server, start_worker, tmp_path):
    """The wait is the shard's (docs/limits.md, *A waiting step holds no invocation*):
    worker A's step asks first, a step on worker B asks second; A is SIGKILLed and the
    standby S takes A's shard, whose step asks again. It keeps its place: it goes first."""
    server = start_server(shards=2)
    a = start_worker(server.address(max_shards=1))
    b = start_worker(server.address(max_shards=1))
    assert a.initial == [0] and b.initial == [1]
    standby = start_worker(server.address(max_shards=1))
    assert standby.initial == []
    on = {0: [], 1: []}
    for i in range(200):
        wid = f"q{i}"
        on[zlib.crc32(wid.encode()) % 2].append(wid)
    files = {name: tmp_path / name for name in ("holder", "first", "second")}
    for file in files.values():
        file.touch()
    client = await fusee.Client.connect(server.address())
    try:
        await client.call("limit", {"name": "one", "concurrent": 1})
        holder = await client.start(
            "limited", on[1][0], {"limit": "one", "ms": 4_000, "file": str(files["holder"])}
        )
        deadline = time.monotonic() + 20
        while not events(files["holder"]) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        first = await client.start(
            "limited", on[0][0], {"limit": "one", "ms": 10, "file": str(files["first"])}
        )
        while (await client.limit_usage("one"))["waiting"] < 1:
            await asyncio.sleep(0.02)
        second = await client.start(
            "limited", on[1][1], {"limit": "one", "ms": 10, "file": str(files["second"])}
        )
        while (await client.limit_usage("one"))["waiting"] < 2:
            await asyncio.sleep(0.02)
        a.signal(signal.SIGKILL)
        while 0 not in standby.held() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert 0 in standby.held()
        await asyncio.sleep(0.5)  # the standby recovered shard 0: its step asked again
        assert await client.limit_usage("one") == {"in_use": 1, "waiting": 2}
        assert not events(files["first"]) and not events(files["second"])
        assert [await r.result() for r in (holder, first, second)] == ["ok"] * 3
        began = {name: events(files[name])[0] for name in ("first", "second")}
        assert began["first"][2] == standby.popen.pid
        assert began["first"][0] < began["second"][0], began
        assert await client.limit_usage("one") == {"in_use": 0, "waiting": 0}
    finally:
        await client.close()


async def test_a_tenant_with_1000_waiting_steps_gets_one_permit_per_turn_across_workers(
    start_server, start_worker, tmp_path
):
    """Tenants A (1,000 steps waiting), B (3) and W (4, weight 2), each on its own worker
    process, queue in that order behind a held permit of `concurrent=1`: the server grants
    A one permit per turn, the same as B, and W two, as tests/engine/test_limits.py's
    queue in one process does."""
    server = start_server(shards=6)
    workers = [start_worker(server.address(max_shards=2)) for _ in range(3)]
    assert all(len(w.initial) == 2 for w in workers)
    file, hold = tmp_path / "order", tmp_path / "hold"
    file.touch()
    client = await fusee.Client.connect(server.address())

    def lines() -> list[list[str]]:
        return [line.split() for line in file.read_text().splitlines()]

    async def waiting(count: int) -> None:
        deadline = time.monotonic() + 30
        while (await client.limit_usage("shared"))["waiting"] < count:
            assert time.monotonic() < deadline, await client.limit_usage("shared")
            await asyncio.sleep(0.05)
        assert await client.limit_usage("shared") == {"in_use": 1, "waiting": count}

    def on(worker: int, name: str) -> str:
        """An ID of `name` on a shard `workers[worker]` holds."""
        return next(
            wid
            for wid in (f"{name}-{i}" for i in range(100))
            if client.shard_of(wid) in workers[worker].initial
        )

    try:
        await client.limit("shared", concurrent=1)
        args = {"limit": "shared", "file": str(file)}
        runs = [
            await client.start("tenant", on(1, "blocker"), {**args, "key": "z", "n": 1, "hold": str(hold)})
        ]
        deadline = time.monotonic() + 30
        while not lines():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        runs.append(await client.start("tenant", on(0, "big"), {**args, "key": "A", "n": 1000}))
        await waiting(1000)
        runs.append(await client.start("tenant", on(1, "small"), {**args, "key": "B", "n": 3}))
        await waiting(1003)
        runs.append(await client.start("tenant", on(2, "heavy"), {**args, "key": "W", "n": 4, "weight": 2}))
        await waiting(1007)
        hold.touch()
        assert [await run.result() for run in runs] == [1, 1000, 3, 4]
        order = lines()[1:]  # after the blocker
        assert [key for key, _ in order[:12]] == ["A", "B", "W", "W", "A", "B", "W", "W", "A", "B", "A", "A"]
        assert len(order) == 1007
        pids = {key: {int(pid) for k, pid in order if k == key} for key in "ABW"}
        assert pids == {"A": {workers[0].pid}, "B": {workers[1].pid}, "W": {workers[2].pid}}
        assert await client.limit_usage("shared") == {"in_use": 0, "waiting": 0}
    finally:
        await client.close()
