"""Schedules and delayed starts through a client and a real server with one worker
(docs/schedules.md), and the `fusee schedules` command."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import fusee
import fusee.sync
from tests.support.procs import ROOT


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fusee", "schedules", *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_a_schedule_made_through_a_client_fires_and_is_driven_by_the_command(
    start_server, start_worker
):
    server = start_server()
    start_worker(server.address())
    client = await fusee.Client.connect(server.address())
    try:
        s = await client.schedule("tick", {"every": "1s"}, "steps", 1)
        deadline = time.monotonic() + 20
        while (await s.describe())["fired"] < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        described = await s.describe()
        assert described["fired"] >= 3 and described["errors"] == 0
        ran = [row.id async for row in client.list(type="steps")]
        assert all(rid.startswith("tick@") and rid.endswith("Z") for rid in ran) and len(ran) >= 3
        assert len(await client.run(ran[0]).result()) == 1

        listed = cli("ls", server.address(), "--json")
        assert listed.returncode == 0, listed.stderr
        assert [d["name"] for d in json.loads(listed.stdout)] == ["tick"]
        table = cli("ls", server.address())
        assert table.stdout.splitlines()[0].split()[:2] == ["name", "workflow"]
        assert "tick" in table.stdout and "every 1000 ms" in table.stdout
        assert cli("pause", server.address(), "tick").returncode == 0
        assert (await s.describe())["paused"] is True
        fired = (await s.describe())["fired"]
        await asyncio.sleep(2.5)
        assert (await s.describe())["fired"] == fired  # paused: nothing fires
        triggered = cli("trigger", server.address(), "tick")
        assert triggered.returncode == 0 and triggered.stdout.startswith("started tick@"), triggered
        assert cli("resume", server.address(), "tick").returncode == 0
        assert cli("delete", server.address(), "tick").returncode == 0
        assert json.loads(cli("ls", server.address(), "--json").stdout) == []
        missing = cli("pause", server.address(), "tick")
        assert missing.returncode == 2 and "no schedule 'tick'" in missing.stderr
    finally:
        await client.close()


async def test_a_delayed_start_through_a_client_exists_at_once_and_begins_later(start_server, start_worker):
    server = start_server()
    start_worker(server.address())
    async with await fusee.Client.connect(server.address()) as client:
        began = time.monotonic()
        run = await client.start("steps", "later-1", 2, delay="1500ms")
        assert (await run.status()).status == "running"
        assert len(await run.result()) == 2
        assert time.monotonic() - began >= 1.4
        at = time.time() + 1.0
        later = await client.start("steps", "at-1", 1, at=at * 1000)
        assert len(await later.result()) == 1
        assert time.time() >= at


async def test_a_schedule_reaches_runs_on_shards_another_worker_holds(start_server, start_worker):
    """Two workers split the shards: the schedule's worker starts the runs of times whose
    IDs hash to the other's shards through the server."""
    server = start_server(shards=4)
    first = start_worker(server.address(max_shards=2))
    second = start_worker(server.address(max_shards=2))
    assert sorted(first.initial + second.initial) == [0, 1, 2, 3]
    async with await fusee.Client.connect(server.address()) as client:
        s = await client.schedule("split", {"every": "500ms", "overlap": "allow-all"}, "steps", 1)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shards = {row.shard async for row in client.list(type="steps")}
            if len(shards) == 4:
                break
            await asyncio.sleep(0.2)
        assert shards == {0, 1, 2, 3}
        described = await s.describe()
        assert described["errors"] == 0 and described["fired"] >= 4
        await s.delete()


async def test_a_blocking_client_has_the_same_schedules(start_server, start_worker):
    server = start_server()
    start_worker(server.address())

    def blocking() -> tuple[dict, str, list, dict]:
        with fusee.sync.Client.connect(server.address()) as client:
            s = client.schedule("daily", "@daily", "steps", 2)
            described = s.describe()
            run = s.trigger()
            result = run.result(timeout=30)
            listed = [d["name"] for d in client.schedules.list()]
            filled = client.schedules.get("daily").backfill(0, 3 * 86_400_000)
            s.delete()
            return described, run.id, [result, listed], filled

    described, rid, (result, listed), filled = await asyncio.to_thread(blocking)
    assert (described["cron"], described["fired"]) == ("0 0 * * *", 0)
    assert rid.startswith("daily@") and len(result) == 2 and listed == ["daily"]
    assert filled == {"times": 3, "started": 3, "attached": 0, "error": 0}
