"""Invoked workers end to end, every part a real process on loopback: `fusee server
--invoke` POSTing to uvicorn serving `handlers.asgi:app`, and a client. No worker runs
but the ones the server invokes (and, in one test, a long-lived one alongside)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fusee
from tests.support.cluster import Cluster, Handler, held_by_nobody, metrics, quiet
from tests.support.invoked import Flaky, sleeps_one_second
from tests.support.procs import Proc, retry, steps_seen
from tests.support.waiting import eventually


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


async def test_a_start_on_a_shard_nobody_holds_runs_to_its_result(cluster):
    cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)  # the start's invocation of every shard, done
    run = await client.start("steps", "first", 3)
    assert len(await run.result()) == 3
    after = await quiet(client)
    assert after["endpoints"][0]["succeeded"] >= 1 and after["endpoints"][0]["failed"] == 0
    await eventually(lambda: held_by_nobody(server), timeout=30.0, every=0.05)
    await client.close()


async def test_a_shard_too_large_to_open_ahead_is_opened_on_request(cluster):
    """An invoked worker's WELCOME carries the open of each small shard it is granted (its
    checkpoint and first records); a shard whose checkpoint is over 64 KiB (2,000 runs
    waiting for a signal) is opened by the worker's own request instead. Both recover
    every run."""
    cluster.start_handler()
    server = cluster.start_invoked(shards=1)
    client = await cluster.client()
    gate = asyncio.Semaphore(64)

    async def start(i: int) -> None:
        async with gate:
            await client.start("waiter", f"w-{i}", 1)

    await asyncio.gather(*(start(i) for i in range(2000)))
    await quiet(client)
    await eventually(lambda: held_by_nobody(server), timeout=30.0, every=0.05)
    sizes = [path.stat().st_size for path in server.dir.rglob("checkpoint-*")]
    assert max(sizes) > 64 << 10, sizes
    await client.run("w-7").signal("go", 7)
    assert await client.run("w-7").result() == [7]
    assert len([row async for row in client.list(type="waiter", status="running")]) == 1999
    await client.close()


async def test_a_one_second_sleep_is_invoked_again_on_time(cluster):
    await sleeps_one_second(cluster, "nap-1", quiet)


@pytest.mark.parametrize("together", [True, False], ids=["at-once", "one-after-another"])
async def test_two_hundred_workflows_on_four_shards_take_four_invocations(cluster, together):
    cluster.start_handler()
    cluster.start_invoked()
    client = await cluster.client()
    settled = (await quiet(client))["endpoints"][0]
    before, steps_before = settled["invocations"], settled["steps"]
    ids = [f"fan-{i}" for i in range(200)]
    if together:
        await asyncio.gather(*(client.start("steps", wid, 4) for wid in ids))
    else:
        for wid in ids:
            await client.start("steps", wid, 4)
    after = await quiet(client)
    endpoint = after["endpoints"][0]
    trace = "\n".join(line for line in cluster.server.lines + cluster.handler.lines if "fusee invoke" in line)
    assert endpoint["invocations"] - before == 4, trace
    assert endpoint["steps"] - steps_before == 800, trace
    # (Reading the results afterwards invokes the shards again: counted above, not here.)
    results = await asyncio.gather(*(client.run(wid).result() for wid in ids))
    assert all(len(r) == 4 for r in results)
    await client.close()


async def test_a_handler_killed_mid_step_loses_nothing_acknowledged(cluster):
    handler = cluster.start_handler()
    cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)
    ids = [f"kill-{i}" for i in range(8)]
    for wid in ids:
        await client.start("steps", wid, 12)
    await eventually(lambda: len(steps_seen(cluster.steps)) >= 12, timeout=30.0, every=0.05)
    handler.kill()
    cluster.start_handler()  # the platform starts a fresh process on the same URL
    results = {wid: await retry(lambda wid=wid: client.run(wid).result(), timeout=60) for wid in ids}
    seen = steps_seen(cluster.steps)
    for wid, result in results.items():
        assert len(result) == 12
        for i, value in enumerate(result):
            assert value in seen[(wid, i)]
    assert any(v.startswith(f"{handler.popen.pid}:") for r in results.values() for v in r)
    await client.close()


async def frozen_mid_run(cluster: Cluster, wid: str, **endpoint: Any) -> tuple[fusee.Client, Handler]:
    """A run of 40 steps under way on the handler (the endpoint's settings as given),
    and the handler then SIGSTOPped mid-invocation."""
    handler = cluster.start_handler()
    cluster.start_invoked_config(**endpoint)
    client = await cluster.client()
    await quiet(client)
    await client.start("steps", wid, 40)
    await eventually(lambda: len(steps_seen(cluster.steps)) >= 2, timeout=30.0, every=0.05)
    handler.signal(signal.SIGSTOP)
    return client, handler


async def test_a_handler_that_hangs_past_budget_and_grace_loses_its_lease(cluster):
    client, handler = await frozen_mid_run(cluster, "hang-1", budgetMs=2000, graceMs=500)
    cluster.server.wait_for(r"revoking its leases on shards \[\d\]", timeout=15)
    handler.signal(signal.SIGCONT)
    result = await retry(lambda: client.run("hang-1").result(), timeout=60)
    assert len(result) == 40
    seen = steps_seen(cluster.steps)
    assert all(value in seen[("hang-1", i)] for i, value in enumerate(result))
    counts = (await metrics(client))["endpoints"][0]
    assert counts["timedOut"] + counts["failed"] >= 1, counts
    await client.close()


async def test_a_frozen_handler_loses_its_lease_on_silence_not_at_budget_end(cluster):
    """A SIGSTOPped function holds its shard only as long as any silent worker: the
    liveness timeout (5 s), not its budget and grace (30 s here)."""
    client, handler = await frozen_mid_run(cluster, "frozen-1", budgetMs=20_000, graceMs=10_000)
    stopped = time.monotonic()
    cluster.server.wait_for(r"revoking its leases on shards \[\d\]: no byte from it", timeout=12)
    assert time.monotonic() - stopped < 9
    handler.signal(signal.SIGCONT)
    result = await retry(lambda: client.run("frozen-1").result(), timeout=60)
    assert len(result) == 40
    await client.close()


async def test_an_endpoint_that_is_down_backs_off_and_recovers(cluster):
    cluster.start_invoked()  # no handler yet: nothing listens at the endpoint's URL
    client = await cluster.client()
    down = await eventually(lambda: _failed(client), timeout=30.0, every=0.05)
    assert down["endpoints"][0]["backoffMs"] > 0 or down["endpoints"][0]["failed"] >= 2
    # Against an endpoint that keeps failing a start fails soon, saying why; retried as
    # the error says, it goes through once the handler is up.
    starting = asyncio.ensure_future(retry(lambda: client.start("steps", "late-1", 1), timeout=60))
    await asyncio.sleep(0.5)
    cluster.start_handler()
    await asyncio.wait_for(starting, 60)
    assert len(await client.run("late-1").result()) == 1
    after = await quiet(client)
    assert after["endpoints"][0]["succeeded"] >= 1
    await client.close()


async def _failed(client: fusee.Client) -> dict[str, Any] | None:
    now = await metrics(client)
    return now if now["endpoints"][0]["failed"] >= 1 else None


async def test_a_long_lived_worker_alongside_takes_freed_shards_first(cluster, start_worker):
    cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    before = (await quiet(client))["endpoints"][0]["invocations"]
    worker = start_worker(server.address())
    assert worker.initial == [0, 1, 2, 3]
    runs = [await client.start("steps", f"ll-{i}", 2) for i in range(20)]
    assert [len(await run.result()) for run in runs] == [2] * 20
    assert (await quiet(client))["endpoints"][0]["invocations"] == before  # none invoked
    worker.kill()  # its shards are due at once and invoked workers take over
    run = await retry(lambda: client.start("steps", "after-ll", 2))
    assert len(await run.result()) == 2
    assert (await quiet(client))["endpoints"][0]["invocations"] > before
    await client.close()


@pytest.mark.parametrize("status", [500, 429])
async def test_an_endpoint_that_fails_or_throttles_shows_it_in_the_metrics_and_recovers(cluster, status):
    cluster.start_handler()
    flaky = Flaky(cluster.handler_port, status, 3, retry_after="0.2" if status == 429 else None)
    await flaky.start()
    try:
        cluster.start_server(*cluster.invoking(flaky.url))
        client = await cluster.client()
        seen = await eventually(
            lambda: _counted(client, "failed" if status == 500 else "throttled", 3), timeout=30.0, every=0.05
        )
        endpoint = seen["endpoints"][0]
        if status == 500:
            assert endpoint["backoffMs"] > 0 or endpoint["failed"] > 3  # backing off after three failures
        else:
            assert (
                endpoint["failed"] == 0 and endpoint["concurrency"] < 16
            )  # throttled: fewer at once, no failure
        run = await client.start("steps", "after-flaky", 2)
        assert len(await run.result()) == 2
        assert (await quiet(client))["endpoints"][0]["succeeded"] >= 1
        await client.close()
    finally:
        await flaky.stop()


async def _counted(client: fusee.Client, key: str, least: int) -> dict[str, Any] | None:
    now = await metrics(client)
    return now if now["endpoints"][0][key] >= least else None


async def test_fusee_invocations_prints_the_metrics(cluster):
    cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)
    await client.close()
    table = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "fusee", "invocations", server.address()],
        capture_output=True,
        text=True,
    )
    assert table.returncode == 0, table.stderr
    assert f"http://127.0.0.1:{cluster.handler_port}/" in table.stdout
    assert "shards due: 0" in table.stdout and "overdue" in table.stdout
    raw = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "fusee", "invocations", server.address(), "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(raw.stdout)["endpoints"][0]["invocations"] >= 4  # every shard invoked once at the start


async def test_a_step_longer_than_the_budget_backs_its_shard_off_instead_of_looping(cluster):
    cluster.start_handler()
    cluster.start_invoked_config(budgetMs=1000)
    client = await cluster.client()
    await quiet(client)
    before = (await metrics(client))["endpoints"][0]["invocations"]
    await client.start("slow_step", "too-long", 30.0)
    await eventually(lambda: _counted_overall(client, "noProgress", 2), timeout=20, every=0.05)
    cluster.server.wait_for(r"budget ended before any step finished; next try in 2 s")
    now = await metrics(client)
    # About one invocation per backoff period (1 s, then 2 s...), not one after another.
    assert now["endpoints"][0]["invocations"] - before <= 4, now
    await client.close()


async def _counted_overall(client: fusee.Client, key: str, least: int) -> dict[str, Any] | None:
    now = await metrics(client)
    return now if now[key] >= least else None
