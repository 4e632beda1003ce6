"""A client outlives a server restart: the calls in flight at the loss fail with a
retriable ConnectionError, the same Client object connects again by itself (calls made
meanwhile wait for it), and a closed client stops trying."""

from __future__ import annotations

import asyncio
import signal

import pytest

import fusee
import fusee.sync
from tests.support.procs import free_port
from tests.support.waiting import eventually


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
async def test_a_client_outlives_a_server_restart(start_server, start_worker, how):
    listen = f"127.0.0.1:{free_port()}"  # the restarted server listens where the first did
    server = start_server(listen=listen)
    worker = start_worker(server.address())
    client = await fusee.Client.connect(server.address())
    blocking = await asyncio.to_thread(fusee.sync.Client.connect, server.address())
    try:
        run = await client.start("waiter", "w-1", 2)
        await run.signal("go", 1)
        shard = client.shard_of("w-1")
        in_flight = asyncio.ensure_future(client.call("result", shard, id="w-1"))  # waits at the worker
        await asyncio.sleep(0.2)
        if how == "SIGKILL":
            server.kill()
        else:
            server.signal(signal.SIGTERM)
            await asyncio.to_thread(server.popen.wait, 15)
        with pytest.raises(fusee.ConnectionError, match="retry"):  # lost, or its worker let go first
            await in_flight
        waiting = asyncio.ensure_future(run.result())  # made while the server is down

        # A fresh worker (the worker engine's own reconnect is tested on its own): this
        # test is about the client's.
        worker.kill()
        server = start_server(listen=listen)
        await asyncio.to_thread(start_worker, server.address())
        # One call each, not retried: the same client objects work again.
        assert (await run.status()).status == "running"
        assert (await asyncio.to_thread(blocking.run("w-1").status)).status == "running"
        await run.signal("go", 2)
        assert await asyncio.wait_for(waiting, 10) == [1, 2]

        server.kill()  # down again: a client closed now stops connecting
        await eventually(lambda: client.lost is not None)
        await client.close()
        assert client.link.reconnecting is None
        with pytest.raises(fusee.ClosedError):
            await run.status()
    finally:
        await client.close()
        await asyncio.to_thread(blocking.close)


async def test_a_first_connection_to_a_list_waits_for_a_server_to_answer(start_server):
    """Of a list of servers, none up yet (a failover, or a deployment whose servers start
    after their clients): the first connection of a client and of a worker waits for one,
    as their reconnects do, instead of failing at once."""
    ports = [free_port(), free_port()]
    listed = ",".join(f"127.0.0.1:{port}" for port in ports)
    client = asyncio.ensure_future(fusee.Client.connect(listed))
    worker = asyncio.ensure_future(fusee.Engine.open(durability="server", address=listed, workflows=[]))
    await asyncio.sleep(1.0)
    assert not client.done() and not worker.done()
    await asyncio.to_thread(start_server, listen=f"127.0.0.1:{ports[1]}")
    connected = await asyncio.wait_for(client, 15)
    engine = await asyncio.wait_for(worker, 15)
    assert sorted(shard.index for shard in engine.shards) == [0, 1, 2, 3]
    await engine.close()
    await connected.close()


async def test_a_first_connection_to_a_list_says_when_no_server_answered_in_time(monkeypatch):
    from fusee.client import _link

    monkeypatch.setattr(_link, "FIRST_WAIT_S", 0.5)
    listed = f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(fusee.ConnectionError, match=r"no server of the list answered \(tried for 0.5 s\)"):
        await fusee.Client.connect(listed)
