"""Defects the model test's server mode found, each as a small standalone test against a
real `fusee server` (each was seen failing before its fix)."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee.testing.faults import held_recovery
from tests.support.procs import Proc, Server

from .server_cluster import WorkersCluster as Cluster
from .workflows import BUMP_STEP, CODE, GO, Plan


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    started = Cluster(tmp_path)
    try:
        yield started
    finally:
        started.close()


async def _client(cluster: Cluster) -> fusee.Client:
    client = await fusee.Client.connect(cluster.address())
    for _ in range(200):
        try:
            await anext(client.list(), None)  # answered: every shard has a holder
            return client
        except fusee.NoHolderError:
            await asyncio.sleep(0.02)
    raise AssertionError("the shards never got holders")


async def _journal(client: fusee.Client, wid: str) -> list[Any]:
    from fusee import journal as R

    got = await client.call("model.journal", client.shard_of(wid), id=wid)
    return [R.decode_entry(e).rec for e in got["records"]]


async def test_a_client_signal_of_the_wrong_type_is_refused(cluster: Cluster) -> None:
    """In process, `run.signal(GO, "bad")` raises CodecError and records nothing
    (test_model's typed-calls check); through a Client the same call must do the same."""
    client = await _client(cluster)
    await client.start("model.plan", "a", Plan(["wait", "step"]))
    with pytest.raises(fusee.CodecError):
        await client.run("a").signal(GO, "bad-1")
    assert not [r for r in await _journal(client, "a") if type(r).__name__ == "SignalReceived"]
    await client.close()


async def test_a_client_update_of_the_wrong_type_is_refused(cluster: Cluster) -> None:
    """In process, `run.update(BUMP_STEP, "three", id=...)` raises CodecError and records
    nothing; through a Client the CodecError comes back, but after the update was recorded."""
    client = await _client(cluster)
    await client.start("model.plan", "a", Plan(["wait", "step"]))
    with pytest.raises(fusee.CodecError):
        await client.run("a").update(BUMP_STEP, "three", id="u1")
    assert not [r for r in await _journal(client, "a") if type(r).__name__ == "UpdateAccepted"]
    await client.close()


async def test_a_call_to_a_worker_still_recovering_its_first_shards_waits(tmp_path: Path) -> None:
    """A worker that connects is granted its shards at once and recovers them before its
    engine opens (at its start, and whenever it reconnects after the server restarted). A
    call the server relays to it meanwhile waits for the shard, as a call to a shard a
    standby is taking over does (serve.CallServer._answer). Found by test_server_model
    (seed 5, 4 sequences of 12 steps: a call right after a server restart was refused
    "RejectedError: this process serves no calls"); fixed in 2bfdd24 (RemoteStorage holds
    the calls that arrive before the engine serves them)."""
    server = Server(tmp_path / "server", shards=1)
    with held_recovery() as held:
        opening = asyncio.ensure_future(
            fusee.Engine.open(durability="server", address=server.address(), workflows=CODE["right"])
        )
        try:
            await asyncio.wait_for(held.recovering.wait(), 10)
            client = await fusee.Client.connect(server.address())
            call = asyncio.ensure_future(client.run("nobody").describe())
            await asyncio.sleep(0.2)
            held.release()
            with pytest.raises(fusee.NotFoundError):
                await asyncio.wait_for(call, 10)
            await client.close()
        finally:
            held.release()
            engine = await opening
            await engine.close()
            server.stop()
            server.close()


# A worker for the test below: it stops its own process (SIGSTOP) right after it sent the
# records of its workflow's first step, once (a flag file), so the server's answer that
# they are durable waits in its socket while its lease moves, and the second step is the
# next thing it starts when it wakes: a holder stopped as it starts a step.
STOPPING_WORKER = """
import asyncio, os, signal, sys
import fusee
from fusee.storage import remote

address, dir = sys.argv[1], sys.argv[2]
send_records = remote.RemoteShardStore._send_records

def send_then_stop(self, records, first):
    send_records(self, records, first)
    armed, flag = os.path.join(dir, "armed"), os.path.join(dir, "stopped")
    if os.path.exists(armed) and not os.path.exists(flag):
        open(flag, "w").close()
        os.kill(os.getpid(), signal.SIGSTOP)

remote.RemoteShardStore._send_records = send_then_stop

def note(name):
    def fn():
        with open(os.path.join(dir, "calls"), "a") as f:
            f.write(f"{name} {os.getpid()}\\n")
        if name == "first":
            open(os.path.join(dir, "armed"), "w").close()
        return os.getpid()
    return fn

@fusee.workflow("stopping")
async def stopping(ctx: fusee.Ctx, _: int) -> int:
    await ctx.step("first", note("first"))
    return int(await ctx.step("second", note("second")))

async def main():
    engine = await fusee.Engine.open(durability="server", address=address, workflows=[stopping])
    print("ready", " ".join(str(s.index) for s in engine.shards), flush=True)
    while engine.storage.lost is None and engine.storage.connections == 1:  # (it connects again by itself)
        await asyncio.sleep(0.05)
    print("disconnected", flush=True)
    engine.abandon()
    await engine.storage.abandon()

asyncio.run(main())
"""


async def test_a_holder_that_wakes_deposed_runs_no_step_another_holder_recorded(tmp_path: Path) -> None:
    """Found by test_server_model (seed 21, FUSEE_MODEL_SERVER_EXAMPLES=8,
    FUSEE_MODEL_SERVER_STEPS=20): a start met by a holder SIGSTOPped right after; the
    standby ran and recorded the step; after SIGCONT the deposed holder ran it too."""
    server = Server(tmp_path / "server", shards=1)
    first = Proc([sys.executable, "-c", STOPPING_WORKER, server.address(), str(tmp_path)])
    first.wait_for(r"^ready 0$")
    standby = Proc([sys.executable, "-c", STOPPING_WORKER, server.address(), str(tmp_path)])
    standby.wait_for(r"^ready $")
    try:
        client = await fusee.Client.connect(server.address())
        try:
            await client.start("stopping", "w", 0)
        except fusee.ConnectionError:
            pass  # (if the holder stopped before its answer left: the standby has the run)
        # The first holder stops itself after the first step; five seconds later the
        # standby holds the shard, replays the first step and runs the second.
        result = await asyncio.wait_for(_result_once_held(client, "w"), 30)
        assert result == standby.popen.pid
        first.signal(signal.SIGCONT)
        first.wait_for(r"^disconnected$")
        calls = (tmp_path / "calls").read_text().split("\n")
        assert f"second {first.popen.pid}" not in calls, calls
        await client.close()
    finally:
        for proc in (first, standby, server):
            proc.signal(signal.SIGCONT)
            proc.kill()
            proc.close()


async def _result_once_held(client: fusee.Client, wid: str) -> Any:
    while True:
        try:
            return await client.run(wid).result()
        except (fusee.NoHolderError, fusee.ConnectionError):
            await asyncio.sleep(0.05)
