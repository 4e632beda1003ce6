"""Leases at the protocol level: a connection that does not hold a shard's current lease
can write nothing there, on any write path; an acknowledgment naming an old lease is
not forwarded; a shard let go of goes to the standby with a higher epoch."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec
import pytest

from fusee.journal import Ack, Msg
from fusee.protocol import messages as m
from fusee.protocol.address import parse
from fusee.protocol.connection import connect
from fusee.protocol.pinger import Pinger, open_blocking
from fusee.storage.remote import _encode


class Raw:
    """A worker speaking the protocol by hand."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.gone = asyncio.Event()

    def on_message(self, message: Any) -> None:
        self.inbox.put_nowait(message)

    def on_lost(self, error: Exception) -> None:
        self.gone.set()

    @classmethod
    async def open(cls, address: str, max_shards: int | None = 1) -> tuple[Raw, Any, m.Welcome]:
        raw = cls()
        conn, welcome = await connect(parse(address), m.Open(m.VERSION, m.ROLE_WORKER, max_shards), raw)
        return raw, conn, welcome

    async def next(self, kind: type, timeout: float = 5.0) -> Any:
        while True:
            message = await asyncio.wait_for(self.inbox.get(), timeout)
            if isinstance(message, kind):
                return message


async def ask(raw: Raw, conn: Any, request: m.Request) -> m.Reply:
    conn.send(request)
    reply: m.Reply = await raw.next(m.Reply)
    assert reply.rid == request.rid
    return reply


WRITES = {
    "append": lambda epoch: m.Append(0, epoch, 1, [b"stale"]),
    "put_run": lambda epoch: m.PutRun(0, epoch, 0, b"stale"),
    "checkpoint": lambda epoch: m.Request(7, "checkpoint", 0, epoch, after=0, data=b"stale"),
    "open": lambda epoch: m.Request(7, "open", 0, epoch),
    "records": lambda epoch: m.Request(7, "records", 0, epoch, max_bytes=1 << 20),
    "runs": lambda epoch: m.Request(7, "runs", 0, epoch, offsets=[0]),
    "release": lambda epoch: m.Request(7, "release", 0, epoch),
}


@pytest.mark.parametrize("path", list(WRITES))
async def test_a_deposed_holder_can_write_nothing_on_any_path(start_server, path):
    server = start_server(shards=1)
    address = server.address()
    old, old_conn, welcome = await Raw.open(address)
    ((shard, old_epoch),) = welcome.granted
    standby, standby_conn, standby_welcome = await Raw.open(address)
    assert standby_welcome.granted == []
    # The holder writes under its lease (a record, a run-store frame), then lets go.
    opened = await ask(old, old_conn, m.Request(1, "open", shard, old_epoch))
    old_conn.send(m.Append(shard, old_epoch, opened.position + 1, [b"kept"]))
    assert (await old.next(m.Durable)).positions == [(shard, old_epoch, opened.position + 1)]
    old_conn.send(m.PutRun(shard, old_epoch, opened.runs_len, b"frame"))
    assert (await old.next(m.RunPut)).error is None
    await ask(old, old_conn, m.Request(2, "release", shard, old_epoch))
    lease = await standby.next(m.Lease)
    assert lease.shard == shard and lease.epoch > old_epoch
    # The deposed holder (still connected) writes under its old epoch: refused, the
    # connection closed, nothing of it in the shard.
    old_conn.send(WRITES[path](old_epoch))
    await asyncio.wait_for(old.gone.wait(), 5)
    now = await ask(standby, standby_conn, m.Request(3, "open", shard, lease.epoch))
    assert now.position == opened.position + 1
    assert now.runs_len == opened.runs_len + 8 + len(b"frame")
    records = await ask(standby, standby_conn, m.Request(4, "records", shard, lease.epoch, max_bytes=1 << 20))
    assert records.items[-1:] == [b"kept"]
    assert server.popen.poll() is None
    server.wait_for(r"epoch \d+ is not a lease this connection holds")
    standby_conn.close()


async def test_an_acknowledgment_naming_an_old_lease_is_not_forwarded(start_server):
    server = start_server(shards=2)
    address = server.address()
    _a, a_conn, a_welcome = await Raw.open(address, max_shards=1)
    b, b_conn, b_welcome = await Raw.open(address, max_shards=1)
    (a_shard, _), (b_shard, b_epoch) = a_welcome.granted[0], b_welcome.granted[0]
    # An answer for b's shard naming its current lease arrives; one naming another does not.
    a_conn.send(m.Relay(b_shard, True, _encode(Ack(a_shard, 1, None, b_epoch - 1))))
    a_conn.send(m.Relay(b_shard, True, _encode(Ack(a_shard, 2, None, b_epoch))))
    relayed = await b.next(m.Relay)
    assert relayed.shard == b_shard and b"\x02" in relayed.item
    with pytest.raises(TimeoutError):
        await b.next(m.Relay, timeout=0.3)
    a_conn.close()
    b_conn.close()


async def test_messages_for_a_shard_without_holder_wait_for_one(start_server):
    server = start_server(shards=2)
    address = server.address()
    _a, a_conn, welcome = await Raw.open(address, max_shards=1)
    (a_shard, _) = welcome.granted[0]
    other = 1 - a_shard
    for seq in range(3):
        a_conn.send(m.Relay(other, False, _encode(Msg("signal", a_shard, seq, "x", name="go"))))
    await asyncio.sleep(0.2)
    b, b_conn, b_welcome = await Raw.open(address, max_shards=1)
    assert [shard for shard, _ in b_welcome.granted] == [other]
    got = [msgspec.msgpack.decode((await b.next(m.Relay)).item, type=Msg) for _ in range(3)]
    assert [msg.seq for msg in got] == [0, 1, 2]
    a_conn.close()
    b_conn.close()


async def test_a_holder_that_reads_nothing_for_five_seconds_loses_its_leases(start_server):
    """Its pings keep coming (its ping thread), but what the server writes to it makes no
    progress: the lease goes, as the spec's second liveness rule has it."""
    server = start_server(shards=2)
    address = parse(server.address())
    # The stuck holder: a blocking socket nobody reads, and a real pinger for its session.
    stuck, welcome = await asyncio.to_thread(open_blocking, address, m.Open(m.VERSION, m.ROLE_WORKER, 1))
    pinger = Pinger(address, welcome.session, 1.0)
    pinger.start()
    try:
        ((stuck_shard, _),) = welcome.granted
        _sender, sender_conn, _ = await Raw.open(server.address(), max_shards=1)
        # Messages for the stuck holder's shard, far more than the socket buffers hold.
        payload = bytes(1 << 20)
        for seq in range(64):
            sender_conn.send(
                m.Relay(stuck_shard, False, _encode(Msg("signal", 1 - stuck_shard, seq, "x", value=payload)))
            )
            await asyncio.sleep(0)
        began = time.monotonic()
        await asyncio.to_thread(
            server.wait_for, r"revoking its leases on shards \[\d\]: it has read nothing", 20
        )
        assert time.monotonic() - began >= 4
        sender_conn.close()
    finally:
        pinger.stop()
        stuck.close()


@pytest.mark.parametrize("thread", [False, True])
async def test_a_worker_that_was_silent_past_the_limit_runs_no_step_function(start_server, thread):
    """As after a SIGSTOP longer than the server waits: a step's retry comes due (a timer
    of this process: no frame from the server wakes it) when the worker's loop and pinger
    last showed life 10 s ago. The retry must not start, on the loop or on a step thread:
    another holder may own the shard and have run it. The shard stops with
    LeaseLostError instead."""
    import fusee

    ran: list[int] = []

    def effect(s: fusee.StepContext) -> str:
        ran.append(s.attempt)
        if s.attempt == 1:
            raise RuntimeError("the first attempt fails")
        return "done"

    @fusee.workflow("fenced")
    async def fenced(ctx: fusee.Ctx, _: None) -> str:
        return await ctx.step(
            "effect", effect, thread=thread, retry=fusee.Retry(initial="300ms", jitter=False)
        )

    server = start_server(shards=1)
    engine = await fusee.Engine.open(durability="server", address=server.address(), workflows=[fenced])
    storage = engine.storage
    try:
        run = await engine.start(fenced, "f-1", None)
        deadline = time.monotonic() + 5
        while ran != [1]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # its failure durable, the retry 0.2 s away: no frame is due
        # Silence the pings (as a stop would) and date the last sign of life 10 s back.
        if storage.ticker is not None:
            storage.ticker.cancel()
        if storage.pinger is not None:
            storage.pinger.stop()
            storage.pinger.last_beat = time.monotonic() - 10
        storage.last_tick = time.monotonic() - 10
        with pytest.raises(fusee.LeaseLostError):
            await asyncio.wait_for(run.result(), 5)
        await asyncio.sleep(0.1)
        assert ran == [1]  # the retry never started
    finally:
        engine.abandon()
        await storage.abandon()
