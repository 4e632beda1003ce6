"""A server, one worker, one client: the basic path end to end."""

from __future__ import annotations

import fusee


async def test_a_worker_runs_what_a_client_starts(start_server, start_worker):
    server = start_server()
    worker = start_worker(server.address())
    assert worker.initial == [0, 1, 2, 3]
    client = await fusee.Client.connect(server.address())
    try:
        runs = [await client.start("steps", f"smoke-{i}", 3) for i in range(8)]
        results = [await run.result() for run in runs]
        assert all(len(r) == 3 for r in results)
        rows = await client.list(type="steps")
        assert sorted(r.id for r in rows) == sorted(f"smoke-{i}" for i in range(8))
        assert [r.shard for r in rows] == sorted(r.shard for r in rows)
    finally:
        await client.close()
    assert worker.stop() == 0
    assert server.stop() == 0
