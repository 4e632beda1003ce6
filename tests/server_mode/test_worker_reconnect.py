"""A long-lived worker engine outlives its server (docs/server.md, *Reconnecting*): after a
restart (SIGKILL or SIGTERM) it connects again with backoff, takes its shards back under
new epochs and serves them, while its callers get retriable errors; a clean close stops
it trying. The worker process opens its engine once, as the README shows
(tests/server_mode/worker.py), and the client is one Client object throughout."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import pytest

import fusee
from fusee.testing.faults import held_recovery
from tests.server_mode.flows import WORKFLOWS
from tests.support.procs import Server, free_port, retry
from tests.support.waiting import eventually

ALL = {0, 1, 2, 3}
BACK_WITHIN_S = 2.0  # from the restarted server's "ready" to the worker holding every shard
RETRIABLE = (fusee.ConnectionError, fusee.NoHolderError, fusee.LeaseLostError)
AGAIN = {"running": "use-existing", "finished": "use-existing"}  # a retried start finds its run


async def _restart(start_server, data: Path, listen: str, shards: int = 4) -> tuple[Server, float]:
    server = await asyncio.to_thread(start_server, dir=data, listen=listen, shards=shards)
    return server, time.monotonic()


async def _stop(server: Server, n: int) -> None:
    if n % 2 == 0:
        await asyncio.to_thread(server.kill)
    else:
        server.signal(signal.SIGTERM)
        assert await asyncio.to_thread(server.popen.wait, 15) == 0


@pytest.mark.parametrize(
    "restarts", [3, pytest.param(10, marks=pytest.mark.slow)], ids=["3-restarts", "10-restarts"]
)
async def test_a_worker_and_a_client_outlive_server_restarts_under_load(
    start_server, start_worker, tmp_path: Path, restarts: int
) -> None:
    data, listen = tmp_path / "server", f"127.0.0.1:{free_port()}"
    server = start_server(dir=data, listen=listen)
    worker = start_worker(server.address())
    assert worker.initial == sorted(ALL)
    client = await fusee.Client.connect(server.address())
    started: list[str] = []
    loading = True

    async def load() -> None:
        # Starts throughout, each retried as its error says (with the same workflow ID)
        # until it is acknowledged.
        i = 0
        while loading:
            wid = f"load-{i}"
            while True:
                try:
                    await client.start("steps", wid, 2, id_policy=AGAIN)
                    break
                except RETRIABLE:
                    await asyncio.sleep(0.02)
            started.append(wid)
            i += 1
            await asyncio.sleep(0.005)

    loader = asyncio.ensure_future(load())
    last: dict[int, int] = {}  # shard -> the epoch its last grant had
    try:
        for n in range(restarts):
            before = len(started)
            await eventually(lambda before=before: len(started) >= before + 20, timeout=15)
            mark = len(worker.lines)
            await _stop(server, n)
            server, ready_at = await _restart(start_server, data, listen)
            await eventually(
                lambda mark=mark: any(line == "reconnected" for line in worker.lines[mark:]),
                timeout=BACK_WITHIN_S + 3,
            )
            await eventually(lambda: worker.held() == ALL, timeout=BACK_WITHIN_S + 3)
            back_s = time.monotonic() - ready_at
            assert back_s < BACK_WITHIN_S, f"restart {n + 1}: shards back after {back_s:.2f} s"
            # Under new epochs, granted by the restarted server.
            leased = dict(
                re.findall(r"shard (\d+): leased to worker \S+ \(epoch (\d+)", "\n".join(server.lines))
            )
            epochs = {int(shard): int(epoch) for shard, epoch in leased.items()}
            assert set(epochs) == ALL and all(epochs[i] > last.get(i, 0) for i in ALL), server.output()
            last = epochs
        loading = False
        await loader
        assert worker.popen.poll() is None and sum(line.startswith("ready") for line in worker.lines) == 1
        assert len(started) > restarts * 20
        for wid in started:
            assert len(await retry(lambda wid=wid: client.run(wid).result(), timeout=30)) == 2
    finally:
        loading = False
        loader.cancel()
        await client.close()


async def test_calls_to_a_disconnected_worker_engine_are_retriable_and_a_close_stops_its_reconnects(
    start_server, tmp_path: Path
) -> None:
    """In process: while the server is down, the engine's own callers get a retriable
    error (never ClosedError or a refusal), the same engine serves once the server is
    back, and after a clean close nothing connects any more."""
    data, listen = tmp_path / "server", f"127.0.0.1:{free_port()}"
    server = start_server(dir=data, listen=listen, shards=1)
    engine = await fusee.Engine.open(durability="server", address=server.address(), workflows=WORKFLOWS)
    try:
        assert [s.index for s in engine.shards] == [0]
        assert len(await (await engine.start("steps", "before", 1)).result()) == 1
        await asyncio.to_thread(server.kill)
        await eventually(lambda: not engine.shards)
        with pytest.raises(RETRIABLE, match="retry"):
            await engine.start("steps", "meanwhile", 1)
        server, _ = await _restart(start_server, data, listen, shards=1)
        await eventually(lambda: [s.index for s in engine.shards] == [0], timeout=5)
        assert len(await engine.run("before").result()) == 1
        assert len(await (await engine.start("steps", "after", 1)).result()) == 1
        await asyncio.to_thread(server.kill)
        await eventually(lambda: not engine.shards)
    finally:
        await engine.close()
    assert engine.storage.reconnecting is None  # type: ignore[attr-defined]
    # Nothing of the engine is left to connect: its reconnect loop (backing off up to a
    # second between tries) would be a task of this loop. A wait for the backoff's cap
    # could only fail to see one.
    left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    assert not left, left
    server, _ = await _restart(start_server, data, listen, shards=1)
    assert not [line for line in server.lines if "leased to worker" in line], server.output()


async def test_a_shard_whose_attach_the_lost_connection_cut_short_is_attached_under_the_next_one(
    start_server, tmp_path: Path
) -> None:
    """The connection goes while the engine recovers a shard it was granted, and the next
    connection grants the shard again before that recovery ends: the stale attach must
    neither sit in the engine stopped nor give back the new grant; the new one attaches."""
    data, listen = tmp_path / "server", f"127.0.0.1:{free_port()}"
    server = start_server(dir=data, listen=listen, shards=1)
    engine = await fusee.Engine.open(durability="server", address=server.address(), workflows=WORKFLOWS)
    with held_recovery() as held:
        try:
            await asyncio.to_thread(server.kill)
            server, _ = await _restart(start_server, data, listen, shards=1)
            await asyncio.wait_for(held.recovering.wait(), 10)  # the attach under the second connection
            await asyncio.to_thread(server.kill)
            server, _ = await _restart(start_server, data, listen, shards=1)
            await eventually(lambda: engine.storage.connections == 3 and 0 in engine.storage.granted)  # type: ignore[attr-defined]
            held.release()
            await eventually(
                lambda: [s.index for s in engine.shards] == [0] and engine.shards[0].stop_error is None
            )
            assert len(await (await engine.start("steps", "after", 1)).result()) == 1
        finally:
            held.release()
            await engine.close()
