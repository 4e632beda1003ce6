"""Several `fusee server --store` on one PostgreSQL database: one owns the shards, the
others stand by. The owner SIGKILLed under load, or SIGSTOPped past its lease and resumed:
the shards are owned again within the lease and a look, workers and clients given the
list of servers find the new owner, every acknowledged workflow finishes, and no step
whose result was recorded runs again."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.support.postgres import StoreServer
from tests.support.procs import Proc, free_port, retry, steps_seen
from tests.support.waiting import eventually

LEASE_S = 5.0  # fusee_server/postgres/ownership.py
TAKEOVER_S = LEASE_S + 1.0 + 1.5  # the lease, a standby's look a second later, and its open
RESUMED_S = TAKEOVER_S + 3.0  # and the worker and the client at the new owner (their reconnect)


def servers(pg_url: str, procs: list[Proc], count: int = 3) -> tuple[list[StoreServer], str]:
    """`count` servers on one database, the first owning the shards; and the address list."""
    ports = [free_port() for _ in range(count)]
    started = [StoreServer(pg_url, ports[0])]
    procs.append(started[0])
    for port in ports[1:]:
        started.append(StoreServer(pg_url, port, standby=True))
        procs.append(started[-1])
    return started, ",".join(f"127.0.0.1:{p}" for p in ports)


def owner(started: list[StoreServer], after: dict[StoreServer, int]) -> StoreServer | None:
    """The server that said it is ready since `after` (a line count per server)."""
    for server in started:
        if any("ready" in line for line in server.lines[after.get(server, 0) :]):
            return server
    return None


async def test_the_owner_killed_under_load_its_shards_are_owned_again_and_nothing_acknowledged_is_lost(
    pg_url: str, procs: list[Proc], start_worker: Any, tmp_path: Path
):
    steps = tmp_path / "steps.txt"
    started, listed = servers(pg_url, procs)
    workers = [start_worker(listed, steps_file=steps) for _ in range(4)]
    client = await fusee.Client.connect(listed)
    acknowledged: list[str] = []
    stop = asyncio.Event()

    clients = [client]

    async def load() -> None:
        # Starts one after another, before the kill, during the failover and after it:
        # a start whose answer came back is acknowledged and must finish. One whose
        # answer was lost is not tried again under its ID: it may have run to its end
        # already, and a second start of the ID would be a second run.
        for i in itertools.count():
            if stop.is_set():
                return
            try:
                await clients[-1].start("steps", f"job-{i}", 6)
            except fusee.FuseeError:
                await asyncio.sleep(0.05)
                if clients[-1].closed or clients[-1].lost is not None:
                    clients.append(await retry(lambda: fusee.Client.connect(listed), timeout=30))
                continue
            acknowledged.append(f"job-{i}")

    loading = asyncio.ensure_future(load())
    await eventually(lambda: len(steps_seen(steps)) >= 40, timeout=30, every=0.02)
    lines = {s: len(s.lines) for s in started[1:]}
    started[0].kill()
    killed_at = time.monotonic()
    await eventually(lambda: owner(started[1:], lines) is not None, timeout=TAKEOVER_S + 5, every=0.02)
    taken_s = time.monotonic() - killed_at
    assert taken_s <= TAKEOVER_S, f"the shards were owned again {taken_s:.1f} s after the kill"
    before = len(acknowledged)
    await eventually(lambda: len(acknowledged) >= before + 20, timeout=30, every=0.05)
    stop.set()
    await loading
    new_client = await retry(lambda: fusee.Client.connect(listed), timeout=30)
    results = {
        wid: await retry(lambda wid=wid: new_client.run(wid).result(), timeout=60) for wid in acknowledged
    }
    seen = steps_seen(steps)
    for wid, result in results.items():
        assert len(result) == 6
        for i, value in enumerate(result):
            assert value in seen[(wid, i)], (wid, i, value)
        # A step runs again only if it was in flight when its worker lost the shard.
        again = [i for i in range(6) if len(seen[(wid, i)]) > 1]
        assert len(again) <= 1, (wid, again)
    await new_client.close()
    for one in clients:
        await one.close()
    for worker in workers:
        worker.end()


async def test_an_owner_stopped_past_its_lease_steps_down_when_resumed_and_writes_nothing(
    pg_url: str, procs: list[Proc], start_worker: Any, tmp_path: Path, postgres: Any
):
    steps = tmp_path / "steps.txt"
    started, listed = servers(pg_url, procs, count=2)
    frozen, standby = started
    worker = start_worker(listed, steps_file=steps)
    client = await fusee.Client.connect(listed)  # (the list's first: the owner, frozen below)
    ids = [f"slow-{i}" for i in range(12)]
    for wid in ids:
        await client.start("steps", wid, 20)
    await eventually(lambda: len(steps_seen(steps)) >= 10, timeout=30, every=0.02)
    frozen.signal(signal.SIGSTOP)
    stopped_at = time.monotonic()
    lines = {standby: len(standby.lines)}
    await eventually(lambda: owner([standby], lines) is not None, timeout=TAKEOVER_S + 5, every=0.05)
    # The worker hears nothing from the stopped server and goes to the next of its list.
    worker.wait_for(r"^reconnected$", timeout=20)
    # So does the client (its socket to the stopped server stays open): its calls are
    # answered by the standby before the old owner resumes.
    status = await asyncio.wait_for(retry(lambda: client.run(ids[0]).status(), timeout=20), 20)
    assert status.run == 1
    assert client.link.conn is not None and client.link.conn.where == standby.host_port
    # Service is back within the lease, the standby's look and the silence limits: the
    # worker and the client pass the frozen server over (its kernel still completes
    # their TCP connects) instead of waiting out a handshake with it.
    assert time.monotonic() - stopped_at < RESUMED_S
    epochs = postgres.sql(
        "SELECT string_agg(epoch::text, ',' ORDER BY shard) FROM fusee_shards", pg_url.rsplit("/", 1)[1]
    )
    frozen.signal(signal.SIGCONT)
    assert frozen.popen.wait(timeout=20) == 3
    assert any("stepped down" in line for line in frozen.lines), frozen.output()
    # Nothing of the resumed server reached the database: the epochs are the standby's.
    after = postgres.sql(
        "SELECT string_agg(epoch::text, ',' ORDER BY shard) FROM fusee_shards", pg_url.rsplit("/", 1)[1]
    )
    assert after == epochs
    results = {wid: await retry(lambda wid=wid: client.run(wid).result(), timeout=90) for wid in ids}
    seen = steps_seen(steps)
    for wid, result in results.items():
        assert len(result) == 20
        for i, value in enumerate(result):
            assert value in seen[(wid, i)]
    await client.close()


pytestmark = pytest.mark.timeout(120)
