"""Objects on invoked workers (docs/objects.md): `fusee server --invoke` POSTing to uvicorn
serving `handlers.asgi:app`, four client processes (tests/invoke/object_client.py) calling
`ledger.append` on 100 keys with call IDs while the handler is SIGKILLed over and over.

Every acknowledged call must be in its key's log exactly once, at the position its answer
named, and each task's calls to a key in the order the task made them (each waits for the
previous one's answer); no shared call may ever see the exclusive handler's uncommitted
`pending` field. Each invocation's budget is one second, so keys are also handed back
between invocations at budget ends. The full size (10,000 calls, 10 kills) is behind
--run-slow."""

from __future__ import annotations

import asyncio
import collections
import sys
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, outputs, quiet
from tests.support.procs import Proc, retry


def start_clients(cluster: Cluster, procs: list[Proc], calls: int, seed: int) -> list[Proc]:
    module = "tests.invoke.object_client"
    clients = [
        Proc([sys.executable, "-m", module, cluster.host_port, str(c), str(calls), str(seed)])
        for c in range(4)
    ]
    procs.extend(clients)
    return clients


def answers(clients: list[Proc]) -> dict[str, tuple[str, str, int]]:
    """Each acknowledged call's entry: (task, key, position)."""
    found: dict[str, tuple[str, str, int]] = {}
    for proc in clients:
        for line in list(proc.lines):
            if line.startswith("ack "):
                _, task, key, entry, position = line.split()
                assert entry not in found, line
                found[entry] = (task, key, int(position))
    return found


async def check_logs(client, acked: dict[str, tuple[str, str, int]]) -> int:
    by_key: dict[str, list[str]] = collections.defaultdict(list)
    for entry, (_, key, _) in acked.items():
        by_key[key].append(entry)
    total = 0
    for key, entries in sorted(by_key.items()):
        state = await retry(lambda key=key: client.object_ref("ledger", key).state(), timeout=60)
        log = state["log"]
        assert "pending" not in state, (key, state.get("pending"))
        assert len(log) == len(set(log)), f"{key}: an entry applied twice"
        assert sorted(log) == sorted(entries), f"{key}: {set(log) ^ set(entries)}"
        for entry in entries:
            assert log[acked[entry][2] - 1] == entry, f"{key}: {entry} not at the position its answer named"
        # Each task's calls to the key, in the order the task made them.
        order: dict[str, list[int]] = collections.defaultdict(list)
        for entry in log:
            client_task, number = entry.split("-")
            order[client_task].append(int(number))
        for client_task, numbers in order.items():
            assert numbers == sorted(numbers), f"{key}: {client_task}'s calls out of order: {numbers}"
        total += len(log)
    return total


def finished(clients: list[Proc]) -> bool:
    return any("done" in proc.lines for proc in clients)


CALLS = [500, pytest.param(2_500, marks=[pytest.mark.slow, pytest.mark.timeout(900)], id="10000-calls")]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("calls", CALLS)
async def test_four_clients_call_100_keys_through_handler_kills_each_call_once_in_order(
    procs, tmp_path: Path, calls
):
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    cluster.start_invoked_config(budgetMs=1000)  # budget ends hand keys back between kills
    client = await cluster.client()
    await quiet(client)
    clients = start_clients(cluster, procs, calls, seed=3)
    kills = 0
    while kills < max(3, calls // 250) and not finished(clients):
        await asyncio.sleep(0.3)
        if finished(clients):
            break
        cluster.kill_handler()  # mid-invocation: the server invokes the new one
        kills += 1
        # The next kill once the new handler answered calls: killed faster, the endpoint
        # fails in a row and backs off (as in test_coordinators_invoked.py).
        before = len(answers(clients))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if len(answers(clients)) > before + 20 or finished(clients):
                break
    for proc in clients:
        try:
            await proc.wait_for_async(r"^done$", timeout=600)
        except BaseException:
            print(outputs([*clients, cluster.server]))
            raise
    assert kills >= 2, "the clients finished before the handler was killed twice"
    acked = answers(clients)
    assert len(acked) == 4 * calls
    assert await check_logs(client, acked) == 4 * calls
    peeks = [line.split() for proc in clients for line in list(proc.lines) if line.startswith("peek ")]
    assert peeks and all(pending == "-" for _, _, _, pending in peeks), "a shared call saw uncommitted state"
    retries = sum(1 for proc in clients for line in list(proc.lines) if line.startswith("retry "))
    assert cluster.server is not None
    ends = sum(1 for line in list(cluster.server.lines) if "released by" in line)
    print(
        f"{4 * calls} calls to 100 keys, {kills} handler kills, {ends} budget handbacks, "
        f"{retries} sent again, {len(peeks)} peeks"
    )
    assert not cluster.problems(), cluster.problems()
    await client.close()


async def test_a_workflow_calls_keys_from_its_code_on_invoked_workers(procs, tmp_path: Path):
    """`ctx.object(...).call` from a run on an invoked worker: each call's step reaches its
    key through the server (whichever shard holds it), and runs once."""
    cluster = Cluster(tmp_path, procs=procs)
    cluster.start_handler()
    cluster.start_invoked()
    client = await cluster.client()
    await quiet(client)
    keys = [f"w{i}" for i in range(6)]
    run = await client.start("bookkeeper", "bk-inv", keys)
    assert await asyncio.wait_for(run.result(), 60) == [1] * 6
    again = await client.start("bookkeeper", "bk-inv-2", keys)
    assert await asyncio.wait_for(again.result(), 60) == [2] * 6
    for key in keys:
        state = await client.object_ref("ledger", key).state()
        assert state["log"] == [f"bk-inv:{key}", f"bk-inv-2:{key}"]
    assert not cluster.problems(), cluster.problems()
    await client.close()
