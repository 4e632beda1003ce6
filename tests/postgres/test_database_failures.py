"""The database itself fails under load: its postmaster SIGKILLed and started again (the
server rides it out and loses nothing acknowledged), and a primary with a synchronous
streaming replica killed, the replica promoted and the server pointed at it (nothing
acknowledged lost). Each test runs a cluster of its own: the session's stays up."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.support.postgres import Postgres, StoreServer, missing
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
                    self.clients.append(await retry(lambda: fusee.Client.connect(self.address), timeout=60))
                continue
            self.acknowledged.append(f"job-{i}")

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


# Behind --run-slow until an intermittent asyncpg state error after a restart is
# understood (docs/postgresql.md, *Known limits*): each passes on its own here.
@pytest.mark.slow
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


@pytest.mark.slow
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
