"""A schedule on invoked workers (docs/schedules.md): `fusee server --invoke` POSTing to
uvicorn serving `handlers.asgi:app`; no long-lived worker. The schedule's timer is the
server's reason to invoke; between fires nothing holds a shard."""

from __future__ import annotations

import asyncio
import statistics
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, held_by_nobody, metrics, quiet
from tests.support.procs import Proc
from tests.support.waiting import eventually


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


def scheduled_ms(run_id: str) -> int:
    return int(datetime.fromisoformat(run_id.split("@", 1)[1].replace("Z", "+00:00")).timestamp() * 1000)


async def test_an_every_two_seconds_schedule_fires_on_time_through_invocations(cluster):
    cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)  # the server's first invocations, done
    before = (await metrics(client))["endpoints"][0]["invocations"]
    s = await client.schedule("tick", {"every": "2s", "overlap": "allow-all"}, "steps", 1)
    # Nothing asks the server anything meanwhile: a call to the schedule's shard would
    # invoke it too. Half-way between two fires, no shard is held.
    first = (int(time.time() * 1000) // 2000 + 1) * 2000
    await asyncio.sleep(max(0.0, (first + 7000) / 1000 - time.time()))
    assert held_by_nobody(server)
    await asyncio.sleep(max(0.0, (first + 8800) / 1000 - time.time()))
    after = (await metrics(client))["endpoints"][0]["invocations"]
    fired = sorted([row.id async for row in client.list(type="steps")])
    assert len(fired) == 5, fired
    late = []
    for rid in fired:
        started = (await client.run(rid).describe()).journal[0].now
        late.append(started - scheduled_ms(rid))
    await s.delete()
    p50 = statistics.median(late)
    invocations = after - before
    print(f"schedule every 2s, invoked: lateness ms {sorted(late)} p50 {p50}; invocations {invocations}")
    assert all(x >= 0 for x in late)
    assert p50 < 100, late
    # The schedule's shard is invoked once a fire, the target's shard once a start
    # (both, or one when the two hash to the same shard), and once for the making.
    assert invocations <= 2 * 5 + 2, invocations
    await eventually(lambda: held_by_nobody(server), timeout=10.0, every=0.05)
    await client.close()
