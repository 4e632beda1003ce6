"""The three waits: a step's function waits for the records before it, an output waits for
the records behind it, nothing else waits. Run on storage whose records become durable a
loop turn after they are made, and are lost by a crash until then."""

from __future__ import annotations

import asyncio

import fusee
from fusee import journal as R
from fusee.testing import TestEngine

seen: list[tuple[str, int, int]] = []


def store_of(t: TestEngine, wid: str) -> fusee.storage.MemoryShardStore:
    return t.storage.stores[t.engine.shard_index(wid)]


async def open_kit(*workflows: fusee.Workflow, shards: int = 1) -> TestEngine:
    return await TestEngine.open(workflows=list(workflows), shards=shards, flush_on_turn=True)


def probe(t_box: list[TestEngine], wid: str, name: str) -> int:
    """Inside a step: how far the log is appended and how far it is durable."""
    store = store_of(t_box[0], wid)
    appended = store.log_start + len(store.log)
    seen.append((name, appended, store.durable))
    return appended


box: list[TestEngine] = []


@fusee.workflow("gates")
async def gates(ctx: fusee.Ctx) -> int:
    await ctx.step("first", lambda: probe(box, "g", "first"))
    await ctx.step("look", lambda: probe(box, "g", "look"), read_only=True)
    return await ctx.step("second", lambda: probe(box, "g", "second"))


async def test_a_step_sees_only_durable_records_and_a_read_only_step_does_not_wait():
    seen.clear()
    t = await open_kit(gates)
    box[:] = [t]
    await t.start(gates, "g")
    await t.result("g")
    by_name = {name: (appended, durable) for name, appended, durable in seen}
    # Before `first` and `second` every record of the run was durable.
    assert by_name["first"][1] == by_name["first"][0]
    assert by_name["second"][1] == by_name["second"][0]
    # The read-only step ran at once, with `first`'s result not yet flushed.
    assert by_name["look"][1] < by_name["look"][0]
    await t.close()


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("nap", "1h")
    return n


async def test_a_start_returns_once_its_record_is_durable_and_survives_a_crash():
    t = await open_kit(napper)
    store = store_of(t, "n-1")
    await t.start(napper, "n-1", 1)
    assert store.durable == store.log_start + len(store.log)  # acknowledged means durable
    await t.crash()
    assert await t.result("n-1") == 1
    await t.close()


async def test_an_unacknowledged_start_may_be_lost_but_an_acknowledged_one_never():
    t = await open_kit(napper, shards=1)
    store = t.storage.stores[0]
    await t.start(napper, "kept", 1)
    pending = asyncio.ensure_future(t.engine.start(napper, "maybe", 2))
    for _ in range(10):  # until its Started is appended and not yet flushed
        await asyncio.sleep(0)
        if store.log_start + len(store.log) > store.durable:
            break
    assert store.log_start + len(store.log) > store.durable
    assert not pending.done()  # so the caller was not answered
    await t.crash(settle=False)  # the crash, right now
    pending.cancel()
    assert await t.result("kept") == 1
    names = [s.id async for s in t.engine.list()]
    assert names == ["kept"]
    await t.close()


async def test_flushes_are_shared_by_what_is_staged_together():
    t = await open_kit(napper, shards=1)
    store = t.storage.stores[0]
    await asyncio.gather(*(t.engine.start(napper, f"b-{i}", i) for i in range(50)))
    await t.settle()
    records = store.log_start + len(store.log)
    assert records >= 100  # a Started and a TimerStarted each
    assert store.flushes < records / 5  # batches, not a flush per record
    await t.close()


state_q = fusee.query("state")
go = fusee.signal("go", int)


@fusee.workflow("answers")
async def answers(ctx: fusee.Ctx) -> int:
    seen_value = {"v": 0}
    ctx.on_query(state_q, lambda _: seen_value["v"])
    seen_value["v"] = await ctx.wait_for(go) or 0
    await ctx.sleep("hold", "1h")
    return seen_value["v"]


async def test_a_query_answer_and_a_signal_ack_wait_for_durability():
    t = await open_kit(answers)
    run = await t.start(answers, "q")
    await t.settle()
    store = store_of(t, "q")
    await run.signal(go, 7)
    assert store.durable == store.log_start + len(store.log)
    assert await run.query(state_q) == 7
    assert store.durable == store.log_start + len(store.log)
    await t.crash()
    assert await t.engine.run("q").query(state_q) == 7
    await t.close()


attempts: list[tuple[int, int]] = []


def flaky() -> int:
    appended, durable = probe_pair(box[0], "r")
    attempts.append((appended, durable))
    if len(attempts) == 1:
        raise RuntimeError("first attempt fails")
    return len(attempts)


def probe_pair(t: TestEngine, wid: str) -> tuple[int, int]:
    store = store_of(t, wid)
    return store.log_start + len(store.log), store.durable


@fusee.workflow("retrying")
async def retrying(ctx: fusee.Ctx) -> int:
    result: int = await ctx.step("flaky", flaky, retry=fusee.Retry(initial=0, jitter=False))
    return result


async def test_a_retry_waits_for_the_failed_attempt_to_be_durable():
    """The retry is due at once (no delay): it still runs only once the record of the
    failed attempt is durable, as every attempt of a step waits for the records before it."""
    attempts.clear()
    t = await open_kit(retrying)
    box[:] = [t]
    await t.start(retrying, "r")
    assert await t.result("r") == 2
    assert len(attempts) == 2
    for appended, durable in attempts:
        assert durable == appended
    await t.close()


@fusee.workflow("dur.kid")
async def dur_kid(ctx: fusee.Ctx, parent: str) -> int:
    await ctx.signal_workflow(parent, "hello", 1)
    return 7


@fusee.workflow("dur.parent")
async def dur_parent(ctx: fusee.Ctx, kid_id: str) -> int:
    result: int = await ctx.child(dur_kid, kid_id, ctx.workflow_id)
    hello: int = await ctx.wait_for("hello")
    return result + hello


async def test_a_message_leaves_only_once_the_record_that_sends_it_is_durable():
    """Every message (a child's start, a signal, a child's result) is routed only when the
    sender's log holds, durably, the record that implies it."""
    t = await open_kit(dur_parent, dur_kid, shards=2)
    parent = "p-0"
    kid = next(f"k-{i}" for i in range(100) if t.engine.shard_index(f"k-{i}") != t.engine.shard_index(parent))
    routed: list[str] = []
    early: list[str] = []  # collected, not raised: the engine would swallow an exception here
    route = t.engine.route

    def checked_route(msg: fusee.engine.outbox.Msg) -> None:
        store = t.storage.stores[msg.src]
        durable = [R.decode_entry(e).rec for e in store.log[: store.durable - store.log_start]]
        numbers = {getattr(r, "msg", 0) for r in durable}
        numbers |= {n for r in durable for _, n, _ in getattr(r, "closes", [])}
        if msg.seq not in numbers:
            early.append(f"{msg.kind} message {msg.seq} left before its record was durable")
        routed.append(msg.kind)
        route(msg)

    t.engine.route = checked_route  # type: ignore[method-assign]
    await t.start(dur_parent, parent, kid)
    assert await t.result(parent) == 8
    assert sorted(set(routed)) == ["result", "signal", "start"]
    assert early == []
    await t.close()


@fusee.workflow("dur.waiter")
async def dur_waiter(ctx: fusee.Ctx) -> str:
    got: str = await ctx.wait_for("a")
    return got


async def test_a_shard_with_records_not_yet_durable_is_not_idle():
    t = await open_kit(dur_waiter)
    run = await t.start(dur_waiter, "w")
    await t.settle()
    shard = t.engine.shard_of("w")
    assert shard.idle()
    pending = asyncio.ensure_future(run.signal("b", "kept for later"))
    for _ in range(10):  # until the signal's record is appended and not yet flushed
        await asyncio.sleep(0)
        if shard.appended > shard.durable:
            break
    assert shard.appended > shard.durable
    assert not shard.idle()
    await pending
    await t.settle()
    assert shard.idle()
    await t.close()
