"""`list(where=...)` through a server: each worker answers from its own shards' index
(loaded and parked runs alike), the server merges the parts, and `limit` keeps the first
by ID (docs/engine.md, *Search attributes*). Two worker processes, one client."""

from __future__ import annotations

import asyncio

import pytest

import fusee
import fusee.sync
from tests.support.procs import retry
from tests.support.waiting import eventually


async def test_a_filtered_listing_spans_every_worker(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    start_worker(server.address())
    client = await retry(lambda: fusee.Client.connect(server.address()))
    try:
        for i in range(40):
            await retry(lambda i=i: client.start("tagged", f"t-{i:02d}", {"tenant": i % 4, "amount": i}))

        async def listed() -> list[str] | None:
            ids = sorted([row.id async for row in client.list(where={"tenant": 1, "amount": {"gte": 20}})])
            return ids if len(ids) == 5 else None

        ids = await eventually(listed, timeout=30, every=0.1)
        assert ids == [f"t-{i:02d}" for i in range(21, 40, 4)]
        await asyncio.sleep(0.5)  # the workers park them (park_after 200 ms): from the index now
        assert (
            sorted([row.id async for row in client.list(where={"tenant": 1, "amount": {"gte": 20}})]) == ids
        )
        first = [row.id async for row in client.list(where={"tenant": {"lt": 2}}, limit=3)]
        assert first == ["t-00", "t-01", "t-04"]
        with pytest.raises(fusee.RejectedError, match="unknown operator"):
            [row async for row in client.list(where={"tenant": {"like": 1}})]
    finally:
        await client.close()

    def blocking() -> list[str]:
        with fusee.sync.Client.connect(server.address()) as sync_client:
            return sorted(row.id for row in sync_client.list(where={"tenant": 3}, limit=2))

    assert await asyncio.to_thread(blocking) == ["t-03", "t-07"]


async def test_http_lists_with_a_filter_and_fusee_export_reads_through_the_server(
    start_server, start_worker, tmp_path
):
    import json
    import os
    import subprocess
    import sys

    from tests.support.http import Http
    from tests.support.procs import ROOT
    from tests.support.server_cli import base_url

    server = start_server("--http", "127.0.0.1:0")
    start_worker(server.address())
    client = await retry(lambda: fusee.Client.connect(server.address()))
    for i in range(6):
        await retry(
            lambda i=i: client.start("tagged", f"h-{i}", {"tier": "gold" if i % 2 else "free", "n": i})
        )
    await client.close()
    async with Http(base_url(server)) as api:

        async def gold() -> list[str] | None:
            status, page = await api.get("/v1/runs", where=json.dumps({"tier": "gold", "n": {"gt": 1}}))
            assert status == 200, page
            ids = [row["id"] for row in page["runs"]]
            return ids if len(ids) == 2 else None

        assert await eventually(gold, timeout=30, every=0.1) == ["h-3", "h-5"]
        status, error = await api.get("/v1/runs", where='{"n": {"near": 1}}')
        assert status == 400 and "unknown operator 'near'" in error["message"]
        status, error = await api.get("/v1/runs", where="{not json")
        assert status == 400 and "not JSON" in error["message"]

    exported = subprocess.run(
        [sys.executable, "-m", "fusee", "export", server.address(), "h-3"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert exported.returncode == 0, exported.stderr
    document = json.loads(exported.stdout)
    assert document["id"] == "h-3" and document["journal"][1]["kind"] == "AttributesSet"
