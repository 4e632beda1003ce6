"""A signal in flight while its worker lets the shard go cleanly (`Engine.detach`, as at an
invoked worker's budget end) is recorded once, whatever the order of its record, the
shard's close and the server's durable answer (docs/server.md, *Calls at a handback*).

The race (issue 17, item 2, seen under load as "9 recorded for 7 acknowledged"): the
signal, accepted while its parked run was read back, outlived the wait the handback
gives accepted calls; it recorded while the shard was closing, and the shard let go
before that record was known durable (or the close missed its deadline and dropped the
shard). The call heard the shard's ClosedError and was answered `Moved`: the server
routed it to the next holder, which recovered the record from the log and recorded the
signal again (here, with no invoker, a `Moved` that comes while the release is on its way
is answered NoHolder instead: either fails these tests). Each test holds the parked run's
read (the call is accepted and has not acted), and holds the durable answers back: on the
worker's side (a loaded worker reads its socket late), or at the server's disk (a stalled
write), where the answers of a close past its deadline must wait for it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import fusee
from fusee.engine.shard import Shard
from fusee.testing.faults import held_checkpoint, held_read
from tests.server_mode.flows import collector
from tests.support.engine_kit import parked_ref
from tests.support.waiting import eventually


class HeldDurable:
    """Holds back the durable positions the server pushes for a shard's store, until
    `release()` delivers them."""

    def __init__(self, shard: Shard) -> None:
        self.store: Any = shard.store
        self.deliver: Callable[[int], None] = self.store.durable
        self.held: list[int] = []
        self.holding = True

        def durable(position: int) -> None:
            if self.holding:
                self.held.append(position)
            else:
                self.deliver(position)

        self.store.durable = durable

    def release(self) -> None:
        self.holding = False
        for position in self.held:
            self.deliver(position)


class HeldCheckpoint:
    """Holds the checkpoint write of the shard's close (the engine let go of it) until
    `release()`; the timed ones before it go through."""

    def __init__(self, engine: fusee.Engine, shard: Shard) -> None:
        self.asked = asyncio.Event()
        self.gate = asyncio.Event()
        write = shard.store.checkpoint

        async def held(position: int, data: bytes) -> None:
            if engine.by_index.get(shard.index) is not shard:
                self.asked.set()
                await self.gate.wait()
            await write(position, data)

        shard.store.checkpoint = held  # type: ignore[method-assign]

    def release(self) -> None:
        self.gate.set()


async def opened(address: Any) -> fusee.Engine:
    # Runs park only when a test parks them (Shard.park): no timed park or the checkpoint
    # after it moves the shard under the test.
    return await fusee.Engine.open(
        durability="server", address=address, workflows=[collector], park_after="1h"
    )


@contextlib.asynccontextmanager
async def holder_and_standby(server: Any) -> AsyncIterator[tuple[fusee.Engine, fusee.Engine, fusee.Client]]:
    """The engine holding shard 0 (its run c-1 waits for signals), a standby connected
    second (it waits for shard 0), and a client; all closed at the end."""
    holder = await opened(server.address())
    standby = await opened(server.address())
    client = await fusee.Client.connect(server.address())
    try:
        await client.start(collector, "c-1", 0)
        yield holder, standby, client
    finally:
        await client.close()
        await standby.close()
        await holder.close()


async def parked(engine: fusee.Engine, wid: str) -> int:
    """Park the run `wid` (waiting for its signal) now: its frame's reference."""
    shard = engine.shard_of(wid)
    run = await eventually(lambda: shard.runs.get(wid))
    await eventually(lambda: not run.driving and not run.in_flight() and run not in shard.ready)
    shard.park(run)
    return parked_ref(engine, wid)


async def test_a_signal_recorded_while_its_shard_closes_is_answered_not_moved(start_server):
    """The signal's run is read back until the shard's close is writing its checkpoint;
    it records then, and the close lets go only once that record is durable: the call is
    answered, and the standby that takes the shard never sees it."""
    async with holder_and_standby(start_server(shards=1)) as (holder, standby, client):
        shard = holder.by_index[0]
        with held_read(shard.store, await parked(holder, "c-1")) as read:
            signal = asyncio.ensure_future(client.call("signal", 0, id="c-1", name="go", value=1))
            await asyncio.wait_for(read.asked.wait(), 5)
            await client.start(collector, "c-2", 0)  # stays loaded: the close has a checkpoint to write
            checkpoint = HeldCheckpoint(holder, shard)
            # The accepted call outlives the handback's wait for it (half of the deadline).
            detaching = asyncio.ensure_future(holder.detach(0, deadline=2.0))
            await asyncio.wait_for(checkpoint.asked.wait(), 5)
            durable = HeldDurable(shard)
            appended = shard.appended
            read.release()
            await eventually(lambda: shard.appended > appended)  # the signal's record, sent
            await asyncio.sleep(0.1)
            checkpoint.release()
            await asyncio.sleep(0.1)
            durable.release()
            assert await asyncio.wait_for(signal, 10) is None
            await asyncio.wait_for(detaching, 10)
            await eventually(lambda: 0 in standby.by_index, timeout=10)
            await client.run("c-1").signal("go", -1)
            assert await asyncio.wait_for(client.run("c-1").result(), 10) == [1]


async def test_a_signal_whose_record_outlives_the_close_deadline_is_not_moved(start_server):
    """The close misses its deadline while the signal's record waits for the server's
    durable answer, and the shard is let go as at a crash. The record was sent before the
    release, so the server writes it: the call is answered (the server holds the answer
    until the record is durable), not routed on to the next holder as never acted on, nor
    failed (a retry of a signal without ID would record it again). The run holds it once."""
    async with holder_and_standby(start_server(shards=1)) as (holder, standby, client):
        shard = holder.by_index[0]
        with held_read(shard.store, await parked(holder, "c-1")) as read:
            signal = asyncio.ensure_future(client.call("signal", 0, id="c-1", name="go", value=1))
            await asyncio.wait_for(read.asked.wait(), 5)
            # No flush in flight whose answer the hold would keep back: the signal's record
            # would wait for it, never sent (then answered Moved, as it should be).
            await eventually(lambda: shard.durable == shard.appended and not shard.durability.flushing)
            durable = HeldDurable(shard)
            appended = shard.appended
            read.release()
            await eventually(lambda: shard.store.sent_position > appended)  # the signal's record, sent
            await holder.detach(0, deadline=0.5)  # never durable within it: let go as at a crash
            durable.release()
            assert await asyncio.wait_for(signal, 10) is None
            await eventually(lambda: 0 in standby.by_index, timeout=10)
            await client.run("c-1").signal("go", -1)
            assert await asyncio.wait_for(client.run("c-1").result(), 10) == [1]  # once, not twice


STALL_MARKER = "handback-stall-5c1e"  # a signal's name: the server's write of its record stalls
STALL_S = 1.5
CLOSE_DEADLINE_S = 0.5  # half for the calls accepted, half for the close
SIGNALS = 4


async def test_signals_sent_as_a_close_misses_its_deadline_are_answered_once_durable(start_server):
    """Raw signals without IDs, accepted while their parked run is read back, record while
    the shard's close waits at its checkpoint (held: the close misses its deadline), and
    the server's write of their records stalls (`FUSEE_TEST_STALL_WRITE`): the shard is let
    go with their records sent and not known durable. Every caller is answered, none with
    ConnectionError, ClosedError or NoHolder, and only once the server wrote the records
    (it holds answers that come behind a release); the run holds each signal once.

    Before the fix the callers heard ClosedError and were answered Moved (the next holder
    recorded the signals again, or, with the release still on its way, NoHolder); with
    the close's half alone, a retriable ConnectionError; without the server's hold, the
    answers came within milliseconds of the release, before the records were durable."""
    env = {"FUSEE_TEST_STALL_WRITE": f"{int(STALL_S * 1000)}:{STALL_MARKER}"}
    server = start_server(shards=1, env=env)
    server.wait_for("FUSEE_TEST_STALL_WRITE is set")
    async with holder_and_standby(server) as (holder, standby, client):
        await client.start(collector, "c-2", 0)  # stays loaded: answers while c-1 is read back
        shard = holder.by_index[0]
        with held_read(shard.store, await parked(holder, "c-1")) as read:
            calls = [client.call("signal", 0, id="c-1", name="go", value=v) for v in range(1, SIGNALS + 1)]
            calls.append(client.call("signal", 0, id="c-1", name=STALL_MARKER, value=0))
            signals = [asyncio.ensure_future(call) for call in calls]
            await asyncio.wait_for(read.asked.wait(), 5)
            # Answered behind the signals: the worker accepted every one of them before.
            await client.call("query", 0, id="c-2", name="received", arg=None)
            with held_checkpoint() as checkpoint:
                detaching = asyncio.ensure_future(holder.detach(0, deadline=CLOSE_DEADLINE_S))
                await asyncio.wait_for(checkpoint.reached.wait(), 5)
                appended = shard.appended
                read_released = time.monotonic()
                read.release()  # the signals record now, and their records are sent
                await eventually(lambda: shard.store.sent_position >= appended + len(calls))  # sent
                await asyncio.wait_for(detaching, 10)  # past the deadline: let go as at a crash
            outcomes = await asyncio.wait_for(asyncio.gather(*signals, return_exceptions=True), 20)
            answered = time.monotonic() - read_released
            assert outcomes == [None] * len(calls), outcomes
            # Held by the server until the stalled write was done: it began once the records
            # were sent, after the read was let through (the close let go ~0.25 s after that).
            assert answered > STALL_S * 0.9, f"answered {answered:.3f} s after the records were made"
            await eventually(lambda: 0 in standby.by_index, timeout=10)
            await client.run("c-1").signal("go", -1)
            assert await asyncio.wait_for(client.run("c-1").result(), 10) == list(range(1, SIGNALS + 1))
            journal = (await client.run("c-1").describe()).journal
            marked = [r for r in journal if getattr(r, "name", None) == STALL_MARKER]
            assert len(marked) == 1, journal
