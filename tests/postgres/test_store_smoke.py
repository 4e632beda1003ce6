"""`fusee server --store postgresql://...`: one server on a private PostgreSQL cluster,
the basic path end to end, and what it keeps across restarts."""

from __future__ import annotations

import fusee
from tests.support.postgres import StoreServer
from tests.support.procs import free_port, retry


async def test_a_worker_runs_what_a_client_starts_and_a_restart_keeps_it(pg_url, procs, start_worker):
    port = free_port()
    server = StoreServer(pg_url, port)
    procs.append(server)
    worker = start_worker(server.address())
    assert worker.initial == [0, 1, 2, 3]
    client = await fusee.Client.connect(server.address())
    try:
        runs = [await client.start("steps", f"smoke-{i}", 3) for i in range(8)]
        results = [await run.result() for run in runs]
        assert all(len(r) == 3 for r in results)
    finally:
        await client.close()
    assert worker.stop() == 0
    server.kill()
    server = StoreServer(pg_url, port)
    procs.append(server)
    worker = start_worker(server.address())
    client = await retry(lambda: fusee.Client.connect(server.address()))
    try:
        rows = [row async for row in client.list(type="steps")]
        assert sorted(r.id for r in rows) == sorted(f"smoke-{i}" for i in range(8))
        again = [await client.run(f"smoke-{i}").result() for i in range(8)]
        assert again == results
    finally:
        await client.close()
    assert worker.stop() == 0
    assert server.stop() == 0
