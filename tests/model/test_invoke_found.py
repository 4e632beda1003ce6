"""Defects the model test's invoked mode found, each as a small standalone test against a
real `fusee server` (xfail, strict, until the fix: then the marker goes)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from aiohttp import web

import fusee
from tests.support.invoked import Endpoint
from tests.support.procs import Server

from .invoke_cluster import SECRET, InvokeCluster
from .workflows import Plan

SHARDS = 4


class FailingAtOnce(Endpoint):
    """An endpoint that holds every invocation until `count` are in flight, then fails
    them all at the same moment (as a handler instance that crashes with that many
    requests in flight), and answers 200 without doing anything afterwards."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.arrived = 0
        self.all_in = asyncio.Event()
        super().__init__()

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.arrived += 1
        if self.arrived > self.count:
            return web.json_response({}, status=200)
        if self.arrived == self.count:
            self.all_in.set()
        await self.all_in.wait()
        return web.Response(status=500, text="crashed")


async def _metrics(client: fusee.Client) -> dict[str, Any]:
    got: dict[str, Any] = await client.call("invocations", {})
    return got


async def test_invocations_failing_together_back_the_endpoint_off_one_step(tmp_path: Path) -> None:
    """Found by test_invoke_model (seed 11): three handler SIGKILLs, each with the four
    shards' invocations in flight, left the endpoint backing off 30 s, and the next read
    went unanswered for 20 s. Four invocations sent at once (the server's start invokes
    each shard) that fail at once are one failure of the endpoint: it backs off 100 ms
    (a fifth of jitter), as after one failed invocation."""
    endpoint = FailingAtOnce(SHARDS)
    await endpoint.start()
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    server = Server(
        tmp_path / "server",
        "--invoke",
        f"http://127.0.0.1:{endpoint.port}/",
        "--invoke-secret-file",
        str(secret),
        shards=SHARDS,
    )
    try:
        client = await fusee.Client.connect(server.address())
        deadline = time.monotonic() + 10
        while (now := await _metrics(client))["endpoints"][0]["failed"] < SHARDS:
            assert time.monotonic() < deadline, now
            await asyncio.sleep(0.005)
        await client.close()
        backoff_ms = now["endpoints"][0]["backoffMs"]
        assert backoff_ms <= 100 * 1.2, f"the endpoint backs off {backoff_ms} ms after one crash: {now}"
    finally:
        server.kill()
        server.close()
        await endpoint.stop()


async def test_a_call_racing_a_budget_handback_is_not_refused(tmp_path: Path) -> None:
    """Found by test_invoke_model (seed 4, `overrun`): `describe` of a run whose gated step
    outlived its invocation's budget raised RejectedError. Calls made while the budget
    ends are answered, or fail with an error that says to retry; never refused."""
    cluster = InvokeCluster(tmp_path)
    try:
        client = await fusee.Client.connect(cluster.address())
        await client.start("model.plan", "a", Plan(["gate"]))
        shard = client.shard_of("a")
        since = time.monotonic()
        refused: list[str] = []
        ended = asyncio.Event()

        async def describe() -> None:
            while not ended.is_set():
                try:
                    await client.run("a").describe()
                except fusee.RejectedError as error:
                    refused.append(str(error))
                except (fusee.LeaseLostError, fusee.ConnectionError, fusee.ClosedError):
                    pass  # retriable: not acknowledged, as documented

        callers = [asyncio.ensure_future(describe()) for _ in range(8)]
        deadline = time.monotonic() + 10
        while not [line for line in cluster.left(shard, since) if "exit=budget" in line]:
            assert time.monotonic() < deadline, cluster.outputs()
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        ended.set()
        await asyncio.gather(*callers)
        cluster.valve.open()
        await client.close()
        assert not refused, f"{len(refused)} calls refused, the first: {refused[0]}"
    finally:
        cluster.close()


async def test_a_crashed_invocation_backs_its_shard_off_one_step(tmp_path: Path) -> None:
    """Found by test_invoke_model: handler SIGKILLs in a row, each catching the shards'
    invocations in flight, backed the shards off 25 s and more. One crash is one failure
    of the shard: its next invocation goes out 100 ms later (a fifth of jitter), as for
    the endpoint after one failure."""
    cluster = InvokeCluster(tmp_path)
    try:
        client = await fusee.Client.connect(cluster.address())
        deadline = time.monotonic() + 10
        while (now := await _metrics(client))["invokingShards"] or now["dueShards"]:
            assert time.monotonic() < deadline, now
            await asyncio.sleep(0.01)
        await client.start("model.plan", "a", Plan(["gate"]))
        shard = client.shard_of("a")
        while "gate a/1/" not in (
            (tmp_path / "ledger").read_text() if (tmp_path / "ledger").exists() else ""
        ):
            assert time.monotonic() < deadline, cluster.outputs()
            await asyncio.sleep(0.01)
        killed = time.monotonic()
        cluster.kill_handler()  # mid-invocation; a new process serves the port
        lines = cluster.server.stamped
        while True:
            failed = [at for at, line in list(lines) if at >= killed and "outcome=failed" in line]
            again = [
                at
                for at, line in list(lines)
                if failed and at > failed[0] and "fusee invoke: send" in line and f"shards=[{shard}]" in line
            ]
            if again:
                break
            assert time.monotonic() < deadline + 10, cluster.outputs()
            await asyncio.sleep(0.01)
        cluster.valve.open()
        await client.close()
        waited_s = again[0] - failed[0]
        assert waited_s <= 0.15, f"shard {shard} invoked again {waited_s:.3f} s after its invocation failed"
    finally:
        cluster.close()
