"""The `reasons` of the invocation request, as the server sends them (docs/server.md,
*Due*): `recovery` at the server's start, `call` for a client's call, `message` for a
message from another shard, `timer` for a reported due time, `handback` for a budget
that ended, `code` for runs whose type another endpoint lists. Read from the server's
`FUSEE_INVOKE_TRACE=1` lines, every part a real process on loopback."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, Handler, quiet, sends
from tests.support.procs import Proc, Server, free_port
from tests.support.waiting import eventually

NAMES = {"call", "message", "timer", "recovery", "handback", "code"}


@pytest.fixture
def cluster(procs: list[Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    monkeypatch.setenv("FUSEE_INVOKE_TRACE", "1")  # the server's processes inherit it
    return Cluster(tmp_path, procs=procs)


def reasons_since(server: Server, mark: int) -> set[str]:
    return {reason for _, _, reasons in sends(server)[mark:] for reason in reasons}


async def test_each_reason_has_its_name(cluster):
    cluster.start_handler()
    server = cluster.start_invoked("--invoke-budget-ms", "1000")
    client = await cluster.client()
    await quiet(client)
    assert [r for _, _, r in sends(server)] == [{"recovery"}] * 4  # the start: nothing known of any shard
    mark = len(sends(server))
    run = await client.start("parent", "p-1", 3)  # its children's starts are messages to their shards
    assert len(await run.result()) == 3
    await quiet(client)
    assert {"call", "message"} <= reasons_since(server, mark), sends(server)[mark:]
    mark = len(sends(server))
    # Due well after the start's invocation has ended (its budget is 1 s): a shorter nap
    # could end inside that invocation when the machine is loaded, with no timer needed.
    await client.start("sleeper", "nap-1", 3.0)
    await eventually(lambda: "timer" in reasons_since(server, mark), timeout=10, every=0.05)
    mark = len(sends(server))
    await client.start("slow_step", "too-long", 30.0)  # longer than the 1 s budget: handed back
    await eventually(lambda: "handback" in reasons_since(server, mark), timeout=10, every=0.05)
    assert all(reasons and reasons <= NAMES for _, _, reasons in sends(server)), sends(server)
    await client.close()


async def test_runs_without_code_go_to_the_endpoint_for_their_type_as_code(cluster):
    """Two endpoints: one for every type, whose handler has no code for `steps`, and one
    listing `steps`. A run there starts a `steps` child: the first endpoint's worker
    reports the type it has no code for, and the server invokes the second for it
    (`code`), with no client call for the child."""
    plain_port = free_port()
    plain = Handler(
        plain_port, {**cluster.handler_env(), "FUSEE_WORKFLOWS": "tests.invoke.flows"}
    )  # `greet`, `spawn`
    cluster.procs.append(plain)
    cluster.start_handler()  # has `steps`
    plain_url = f"http://127.0.0.1:{plain_port}/"
    typed_url = f"http://127.0.0.1:{cluster.handler_port}/"
    server = cluster.start_server(
        *cluster.invoking(plain_url), *cluster.invoking(typed_url), "--invoke-types", "steps"
    )
    client = await cluster.client()
    await quiet(client)
    assert await (await client.start("spawn", "spawner", "spawned")).result() == "spawned"

    def coded() -> bool:
        return any(url == typed_url and "code" in reasons for url, _, reasons in sends(server))

    await eventually(coded, timeout=20, every=0.05)
    assert len(await asyncio.wait_for(client.run("spawned").result(), 20)) == 2
    await client.close()
