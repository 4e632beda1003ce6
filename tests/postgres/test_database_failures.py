"""The database itself fails under load: its postmaster SIGKILLed and started again (the
server rides it out and loses nothing acknowledged), and a primary with a synchronous
streaming replica killed, the replica promoted and the server pointed at it (nothing
acknowledged lost). Each test runs a cluster of its own: the session's stays up."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.support.postgres import Postgres, StoreServer, missing, owned_store
from tests.support.procs import Proc, free_port, retry, steps_seen
from tests.support.waiting import eventually


@pytest.fixture
def own_cluster(postgres: Any) -> Iterator[list[Postgres]]:
    """Clusters a test starts for itself, removed after it (`postgres` is asked for so
    that a machine without PostgreSQL fails or skips these as it does the others)."""
    assert missing() is None
    made: list[Postgres] = []
    yield made
    for cluster in made:
        cluster.remove()


class Load:
    """Starts of one-step-after-another workflows through a client of `address`, each
    acknowledged when its answer came back; an unanswered one is not tried again under
    its ID (it may have run already, and a second start would be a second run)."""

    def __init__(self, address: str, steps: int = 3) -> None:
        self.address = address
        self.steps = steps
        self.acknowledged: list[str] = []
        self.clients: list[fusee.Client] = []
        self.stop = asyncio.Event()
        self.task: asyncio.Future[None] | None = None

    async def start(self) -> Load:
        self.clients.append(await retry(lambda: fusee.Client.connect(self.address), timeout=30))
        self.task = asyncio.ensure_future(self._run())
        return self

    async def _run(self) -> None:
        for i in itertools.count():
            if self.stop.is_set():
                return
            try:
                await self.clients[-1].start("steps", f"job-{i}", self.steps)
            except fusee.FuseeError:
                await asyncio.sleep(0.05)
                if self.clients[-1].closed or self.clients[-1].lost is not None:
                    await self._reconnect()
                continue
            self.acknowledged.append(f"job-{i}")

    async def _reconnect(self) -> None:
        """A new client, until one connects or the load is told to end (the server may be
        gone for good: `end` must not wait for it)."""
        deadline = time.monotonic() + 60
        while not self.stop.is_set():
            try:
                self.clients.append(await fusee.Client.connect(self.address))
                return
            except fusee.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def more(self, count: int, timeout: float = 30) -> None:
        target = len(self.acknowledged) + count
        await eventually(lambda: len(self.acknowledged) >= target, timeout=timeout, every=0.02)

    async def end(self) -> None:
        self.stop.set()
        assert self.task is not None
        await asyncio.wait_for(self.task, 60)

    async def check(self, address: str, steps: Path) -> None:
        """Every acknowledged start finishes, each step's result one its function returned."""
        client = await retry(lambda: fusee.Client.connect(address), timeout=30)
        try:
            seen = steps_seen(steps)
            for wid in self.acknowledged:
                result = await retry(lambda wid=wid: client.run(wid).result(), timeout=60)
                seen = steps_seen(steps)
                assert len(result) == self.steps
                assert all(value in seen[(wid, i)] for i, value in enumerate(result)), wid
        finally:
            await client.close()
            for one in self.clients:
                await one.close()


async def test_the_database_killed_and_started_again_under_load_loses_nothing_acknowledged(
    own_cluster: list[Postgres], procs: list[Proc], start_worker: Any, tmp_path: Path
):
    cluster = Postgres().init()
    own_cluster.append(cluster)
    cluster.start()
    url = cluster.database()
    steps = tmp_path / "steps.txt"
    server = StoreServer(url, free_port())
    procs.append(server)
    start_worker(server.address(), steps_file=steps)
    load = await Load(server.address()).start()
    await load.more(30)
    cluster.kill()
    await asyncio.sleep(0.5)
    await asyncio.to_thread(cluster.start)
    await load.more(30)
    await load.end()
    assert server.popen.poll() is None, server.output()
    assert not [line for line in server.lines if "Traceback" in line], server.output()
    await load.check(server.address(), steps)


async def test_a_synchronous_replica_promoted_after_the_primary_died_has_everything_acknowledged(
    own_cluster: list[Postgres], procs: list[Proc], start_worker: Any, tmp_path: Path
):
    primary = Postgres().init(wal_level="replica", max_wal_senders="4")
    own_cluster.append(primary)
    with open(primary.data / "pg_hba.conf", "a") as hba:
        hba.write("host replication all 127.0.0.1/32 trust\n")
    primary.start()
    url = primary.database()
    replica = Postgres()
    own_cluster.append(replica)
    await asyncio.to_thread(replica.replica_of, primary)
    # Every commit waits for the replica to have it on its disk.
    primary.sql("ALTER SYSTEM SET synchronous_standby_names = '*'")
    primary.sql("SELECT pg_reload_conf()")
    await eventually(
        lambda: primary.sql("SELECT sync_state FROM pg_stat_replication") == "sync", timeout=30, every=0.1
    )
    steps = tmp_path / "steps.txt"
    port = free_port()
    server = StoreServer(url, port)
    procs.append(server)
    worker = start_worker(server.address(), steps_file=steps)
    load = await Load(server.address()).start()
    await load.more(40)
    primary.kill()
    server.kill()  # it would wait for a primary that is gone; it is pointed at the replica
    await load.end()
    await asyncio.to_thread(replica.promote)
    moved = url.replace(f":{primary.port}/", f":{replica.port}/")
    server = StoreServer(moved, port)
    procs.append(server)
    worker.wait_for(r"^reconnected$", timeout=30)
    await load.check(server.address(), steps)


async def test_a_checkpoint_and_a_read_during_a_database_restart_wait_for_it(own_cluster: list[Postgres]):
    """Found by the model test: a holder's checkpoint answered "the database is not
    answering" while the postmaster restarted, which stopped the holder's shard with its
    lease still held, so nobody served it. A store that still owns its shards asks again
    once the database answers: both succeed, and the checkpoint is in the database."""
    from fusee.protocol import messages as m

    cluster = Postgres().init()
    own_cluster.append(cluster)
    cluster.start()
    url = cluster.database()
    pool, store = await owned_store(url, 1)
    try:
        cluster.kill()
        epoch = store.ownership.epochs[0]
        checkpoint = asyncio.ensure_future(store._checkpoint(0, 2, b"index"))
        read = asyncio.ensure_future(
            store.reply(0, m.Request(1, "records", 0, epoch, after=0, max_bytes=1 << 20))
        )
        await asyncio.sleep(0.5)
        assert not checkpoint.done() and not read.done()  # waiting, not failed
        await asyncio.to_thread(cluster.start)
        await asyncio.wait_for(checkpoint, 10)
        reply = await asyncio.wait_for(read, 10)
        assert reply.error is None and reply.items == [b"a", b"b"]
        assert (
            cluster.sql("SELECT position, data FROM fusee_checkpoints", url.rsplit("/", 1)[1])
            == "2|\\x696e646578"
        )
        assert store.stopped is None
        await store.close()
    finally:
        await pool.close()
