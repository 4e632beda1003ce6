"""Limits on invoked workers (docs/limits.md, *A waiting step holds no invocation*): a
real `fusee server --invoke` POSTing to uvicorn serving `handlers.asgi:app`. A step
waiting for a permit lets its shard go (the function returns); the server keeps the wait
for the shard and invokes it again, reason `permit`, when the permit is granted. Attempts
inside are counted from outside every process, in files each attempt appends to."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from fusee.protocol import address
from fusee.protocol import messages as m
from fusee.storage.remote import RemoteStorage
from tests.server_mode.test_limits import events, most_inside
from tests.support.cluster import Cluster, metrics, quiet, sends
from tests.support.procs import Proc
from tests.support.waiting import eventually


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path) -> Cluster:
    return Cluster(tmp_path, procs=procs)


def ids_on_other_shards(client, avoid: int, count: int, prefix: str) -> list[str]:
    """`count` run IDs none of which is on shard `avoid`."""
    out: list[str] = []
    n = 0
    while len(out) < count:
        rid = f"{prefix}{n}"
        n += 1
        if client.shard_of(rid) != avoid:
            out.append(rid)
    return out


def began(path: Path) -> float:
    """When the (only) attempt written to `path` began."""
    return next(at for at, delta, _ in events(path) if delta == 1)


async def test_a_step_waiting_for_a_permit_holds_no_invocation_and_is_invoked_again_on_its_grant(
    cluster, tmp_path, monkeypatch
):
    monkeypatch.setenv("FUSEE_INVOKE_TRACE", "1")  # the server's `send` lines (`sends`)
    cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)
    await client.limit("gate", concurrent=1)
    blocker_file = tmp_path / "blocker"
    blocker_file.touch()
    blocker = "blocker"
    blocker_shard = client.shard_of(blocker)
    waiters = ids_on_other_shards(client, blocker_shard, 5, "w")
    waiter_shards = {client.shard_of(w) for w in waiters}
    files = {w: tmp_path / w for w in waiters}
    for file in files.values():
        file.touch()
    hold_ms = 4000
    b = await client.start("limited", blocker, {"limit": "gate", "ms": hold_ms, "file": str(blocker_file)})
    await eventually(lambda: events(blocker_file), timeout=10.0, every=0.01)
    # Priorities 0 to 4 asked in rising order: served highest first, whichever
    # invocation (or none) holds each waiter's shard when its turn comes.
    runs = [
        await client.start("limited", w, {"limit": "gate", "ms": 20, "file": str(files[w]), "priority": i})
        for i, w in enumerate(waiters)
    ]
    assert (await client.limit_usage("gate"))["waiting"] == 5
    # Every waiter's shard is let go of while the blocker still holds the permit.
    await eventually(lambda: not (set(server.held()) & waiter_shards), timeout=3.0, every=0.02)
    quiet_from = await metrics(client)
    invocations_before = quiet_from["endpoints"][0]["invocations"]
    waited = time.time()
    assert set(server.held()) == {blocker_shard}
    assert not any(events(f) for f in files.values())
    # Until the blocker's attempt ends, nothing invokes the waiters' shards: no polling.
    end = began(blocker_file) + hold_ms / 1000
    await asyncio.sleep(max(0.0, end - 0.3 - time.time()))
    assert set(server.held()) == {blocker_shard}
    assert (await metrics(client))["endpoints"][0]["invocations"] == invocations_before
    assert (await client.limit_usage("gate")) == {"in_use": 1, "waiting": 5}
    # Waited for from outside: a client's `result()` is a call, which would invoke the
    # shard it waits on (reason `call`) and hold it until the run ends.
    await eventually(lambda: all(len(events(f)) == 2 for f in files.values()), timeout=10.0, every=0.01)
    waited = time.time() - waited
    permit_sends = [s for s in sends(server) if "permit" in s[2]]
    assert [await r.result() for r in [b, *runs]] == ["ok"] * 6

    starts = {w: began(files[w]) for w in waiters}
    assert sorted(waiters, key=lambda w: starts[w]) == list(reversed(waiters))  # priority order
    freed = next(at for at, delta, _ in events(blocker_file) if delta == -1)
    delay_ms = (min(starts.values()) - freed) * 1000
    assert most_inside_all([blocker_file, *files.values()], tmp_path) == 1
    assert {i for _, shards, _ in permit_sends for i in shards} == waiter_shards
    after = await metrics(client)
    endpoint = after["endpoints"][0]
    # Function time: the blocker's invocation, and short ones for the waiters. Waiters
    # that held their invocations through the wait would add about `waited` each.
    spent_ms = endpoint["totalMs"] - quiet_from["endpoints"][0]["totalMs"]
    print(
        f"permit wait, invoked: grant -> next attempt {delay_ms:.1f} ms; waited {waited:.1f} s; "
        f"invocations {endpoint['invocations'] - invocations_before} after the wait, "
        f"function time {spent_ms} ms"
    )
    assert delay_ms < 2000, delay_ms
    assert spent_ms < hold_ms + 5 * 1000, spent_ms
    assert (await client.limit_usage("gate")) == {"in_use": 0, "waiting": 0}
    await quiet(client)
    assert not server.held()
    assert not cluster.problems(), cluster.problems()
    await client.close()


def most_inside_all(paths: list[Path], tmp_path: Path) -> int:
    merged = tmp_path / "merged"
    merged.write_text("".join(p.read_text() for p in paths))
    return most_inside(merged)


async def test_concurrent_4_across_worker_processes_and_invoked_handlers(cluster, start_worker, tmp_path):
    cluster.start_handler()
    server = cluster.start_invoked(shards=8)
    client = await cluster.client()
    await quiet(client)
    workers = [start_worker(cluster.address(max_shards=2)) for _ in range(2)]
    await eventually(lambda: all(len(w.held()) == 2 for w in workers), timeout=20.0, every=0.05)
    by_workers = {i for w in workers for i in w.held()}
    file = tmp_path / "inside"
    file.touch()
    await client.limit("api", concurrent=4)
    ids = [f"c{i}" for i in range(48)]
    assert {client.shard_of(i) for i in ids} - by_workers  # some on invoked shards
    assert {client.shard_of(i) for i in ids} & by_workers  # some on the workers'
    runs = await asyncio.gather(
        *(client.start("limited", i, {"limit": "api", "ms": 60, "file": str(file)}) for i in ids)
    )
    assert [await r.result() for r in runs] == ["ok"] * len(ids)
    pids = {pid for _, _, pid in events(file)}
    worker_pids = {w.popen.pid for w in workers}
    assert worker_pids <= pids and pids - worker_pids  # the workers and the handler ran some
    assert most_inside(file) == 4
    assert await client.limit_usage("api") == {"in_use": 0, "waiting": 0}
    assert server.held()  # the workers' shards
    assert not cluster.problems(), cluster.problems()
    await client.close()


class Grants:
    """A scripted worker's side of the limits (RemoteStorage's `permits`): it hands every
    grant back unused, as a worker letting the step's shard go does."""

    def __init__(self, storage: RemoteStorage) -> None:
        self.storage = storage
        self.got: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()

    def granted(self, message: m.PermitGrant) -> None:
        self.storage.send(m.PermitReturn(message.tickets, unused=True))
        if not self.got.done():
            self.got.set_result(message.tickets)

    def lost(self) -> None:
        pass


async def test_a_permit_granted_as_its_worker_lets_the_shard_go_is_kept_for_the_shard(
    cluster, tmp_path, monkeypatch
):
    """The race of a grant and a leaving worker: a worker holding shard S (scripted here,
    on the real wire) asks for the permit for S, and hands the grant back unused, then
    lets S go. The server keeps the permit for S and invokes S (reason `permit`); the
    handler's engine has no step asking for it, so the permit goes back when it lets S go."""
    monkeypatch.setenv("FUSEE_INVOKE_TRACE", "1")
    cluster.start_handler()
    server = cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)
    await client.limit("gate", concurrent=1)
    raw = await RemoteStorage.connect(address.parse(cluster.address(max_shards=1)))
    grants = Grants(raw)
    raw.permits = grants
    try:
        [(shard, epoch)] = raw.granted.items()
        blocker = ids_on_other_shards(client, shard, 1, "b")[0]
        file = tmp_path / "blocker"
        file.touch()
        run = await client.start("limited", blocker, {"limit": "gate", "ms": 300, "file": str(file)})
        await eventually(lambda: events(file), timeout=10.0, every=0.01)
        raw.send(m.PermitAsk(1, "gate", 0, None, 1, shard))
        assert await eventually(lambda: grants.got.done(), timeout=10.0, every=0.01)
        assert grants.got.result() == [1]
        sent_before = len(sends(server))
        raw.release(shard, epoch)
        assert await run.result() == "ok"
        await eventually(
            lambda: any(shard in s and "permit" in r for _, s, r in sends(server)[sent_before:]),
            timeout=10.0,
            every=0.01,
        )

        async def back() -> bool:
            return await client.limit_usage("gate") == {"in_use": 0, "waiting": 0}

        await eventually(back, timeout=10.0, every=0.02)
    finally:
        await raw.close()
    await quiet(client)
    assert not cluster.problems(), cluster.problems()
    await client.close()
