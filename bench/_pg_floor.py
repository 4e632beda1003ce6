"""The database side of `bench/server_cost.py --store postgresql`: the PostgreSQL cluster
the servers share (a private one, started as the tests start theirs, or the one the URL
names), a fresh database per configuration (a store's shard count is fixed at its
creation), and the database's own floor: what one statement and one durable commit cost
from asyncio on this machine, whatever fusee does around them.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from _server_procs import ROOT  # noqa: F401 (puts the checkout on the path for tests.support)

from tests.support.postgres import Postgres, missing

TRIPS = 2000


class Database:
    """`postgresql` alone: a private cluster under `scratch` (fsync and synchronous commit
    on, as a production database keeps them); a URL: that cluster, databases made in it."""

    def __init__(self, store: str, scratch: Path) -> None:
        self.cluster: Postgres | None = None
        self.base = store
        if store == "postgresql":
            why = missing()
            if why is not None:
                raise SystemExit(f"--store postgresql: {why}")
            # Not under `scratch`: as root that is 0700, and the postgres user could not enter it.
            self.cluster = Postgres().init(fsync="on", synchronous_commit="on").start()
            self.base = self.cluster.url()
        self.made = 0

    def where(self) -> str:
        if self.cluster is None:
            return f"the database at {self.base}"
        return f"a private PostgreSQL cluster on 127.0.0.1:{self.cluster.port} (fsync, synchronous_commit on)"

    async def fresh(self) -> str:
        """A new empty database: its URL."""
        import asyncpg  # type: ignore[import-untyped]

        self.made += 1
        name = f"fusee_bench_{self.made}_{int(time.time())}"
        conn = await asyncpg.connect(self.base)
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        return self.base.rsplit("/", 1)[0] + "/" + name

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.remove()


async def floor_us(url: str) -> dict[str, float]:
    """p50 of TRIPS round trips each: `SELECT 1` (a statement, nothing made durable) and an
    autocommitted one-row UPDATE (a statement and its commit's WAL flush): the least a
    group commit can cost."""
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE TABLE fusee_bench_floor (k int PRIMARY KEY, v bigint)")
        await conn.execute("INSERT INTO fusee_bench_floor VALUES (1, 0)")
        select = await conn.prepare("SELECT 1")
        update = await conn.prepare("UPDATE fusee_bench_floor SET v = v + 1 WHERE k = 1")
        return {
            "select": await _p50(lambda: select.fetchval()),
            "commit": await _p50(lambda: update.fetchval()),
        }
    finally:
        await conn.execute("DROP TABLE IF EXISTS fusee_bench_floor")
        await conn.close()


async def _p50(call: Any) -> float:
    times = []
    for _ in range(TRIPS + TRIPS // 10):
        began = time.perf_counter_ns()
        await call()
        times.append((time.perf_counter_ns() - began) / 1000)
    return statistics.median(times[TRIPS // 10 :])
