"""Recovery, checkpoints, parking, the outbox, and what invoked workers need from a
shard: the idle predicate, the next due time, steps run, types without code."""

from __future__ import annotations

import asyncio
from pathlib import Path

import fusee
from fusee import journal as R
from fusee.journal import Msg
from fusee.storage import MemoryShardStore, MemoryStorage
from fusee.testing import TestEngine
from tests.support.waiting import eventually

effects: list[str] = []


@fusee.workflow("sleepy")
async def sleepy(ctx: fusee.Ctx, n: int) -> int:
    await ctx.step("before", lambda: effects.append(f"before-{n}"))
    await ctx.sleep("nap", "1h")
    await ctx.step("after", lambda: effects.append(f"after-{n}"))
    return n


gates: list[asyncio.Event] = []


def new_gate() -> asyncio.Event:
    """An event of the test's own loop (each test has a loop of its own)."""
    gates[:] = [asyncio.Event()]
    return gates[0]


async def wait_gate() -> str:
    await gates[0].wait()
    return "through"


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx) -> str:
    return await ctx.step("wait", lambda s: (effects.append(s.key), wait_gate())[1])


@fusee.workflow("kid")
async def kid(ctx: fusee.Ctx, n: int) -> int:
    await ctx.step("work", lambda: effects.append(f"kid-{n}"))
    return n + 1


@fusee.workflow("mother")
async def mother(ctx: fusee.Ctx, kid_id: str) -> int:
    result: int = await ctx.child(kid, kid_id, 41)
    return result


def ids_on_two_shards(t: fusee.testing.TestEngine) -> tuple[str, str]:
    a = "mother-1"
    b = next(f"kid-{i}" for i in range(100) if t.engine.shard_index(f"kid-{i}") != t.engine.shard_index(a))
    return a, b


async def test_idle_and_next_due_while_a_run_sleeps(kit):
    effects.clear()
    t = await kit(sleepy, shards=1)
    await t.start(sleepy, "s-1", 1)
    await t.settle()
    shard = t.engine.shard_of("s-1")
    assert shard.idle()
    due = shard.next_due_ms()
    assert due - t.now_ms() == 3_600_000
    assert shard.steps_run == 1
    # 100 ms before the timer the shard is not idle (due within 250 ms).
    await t.advance(3_600_000 - 100)
    assert not shard.idle()
    assert await t.result("s-1") == 1
    assert shard.steps_run == 2


async def test_a_running_step_keeps_the_shard_busy(kit):
    effects.clear()
    gate = new_gate()
    t = await kit(gated, shards=1)
    await t.start(gated, "g-1")
    await t.settle()
    shard = t.engine.shard_of("g-1")
    assert not shard.idle()
    gate.set()
    assert await t.result("g-1") == "through"
    assert shard.idle()


async def test_parked_runs_cost_an_index_entry_and_wake_on_their_timer(kit):
    effects.clear()
    t = await kit(sleepy, shards=2, park_after="100ms")
    started = t.now_ms()  # the virtual clock stands still while they start
    for n in range(20):
        await t.start(sleepy, f"p-{n}", n)
    await t.advance("1s")
    assert sum(len(s.runs) for s in t.engine.shards) == 0
    assert sum(len(s.index_entries) for s in t.engine.shards) == 20
    # The next due time is known without loading a run: each shard's is its runs' timer,
    # early by less than the index's 100 ms bucket.
    due = started + 3_600_000
    for shard in t.engine.shards:
        assert due - 100 < shard.next_due_ms() <= due
    for n in range(20):
        assert await t.result(f"p-{n}") == n
    assert sorted(e for e in effects if e.startswith("after")) == sorted(f"after-{n}" for n in range(20))


async def test_checkpoint_then_crash_recovers_parked_runs_without_loading_them(kit):
    effects.clear()
    t = await kit(sleepy, shards=1, park_after="100ms")
    for n in range(10):
        await t.start(sleepy, f"c-{n}", n)
    await t.advance("1s")
    shard = t.engine.shards[0]
    await shard.checkpoint(wait=True)  # after the one going idle may have started
    store = t.storage.stores[0]
    if isinstance(store, MemoryShardStore):
        assert store.checkpoint_position == shard.appended
        assert store.log == []  # the checkpoint covers the whole log
    else:
        assert store.files.checkpoint_positions()[-1] == shard.appended
    await t.crash()
    shard = t.engine.shards[0]
    assert len(shard.runs) == 0 and len(shard.index_entries) == 10
    for n in range(10):
        assert await t.result(f"c-{n}") == n
    assert effects.count("before-3") == 1 and effects.count("after-3") == 1


async def test_clean_close_leaves_nothing_to_replay():
    effects.clear()
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[sleepy], storage=storage)
    await engine.start(sleepy, "z-1", 5)
    await asyncio.sleep(0)
    await engine.close()
    for store in storage.stores:
        assert store.log == []  # a checkpoint covers every record
    again = await fusee.Engine.open(workflows=[sleepy], storage=storage)
    assert (await again.run("z-1").status()).status == "running"
    await again.close()


async def test_a_step_in_flight_at_a_crash_runs_again_with_the_same_key(kit):
    effects.clear()
    gate = new_gate()
    t = await kit(gated, shards=1)
    await t.start(gated, "k-1")
    await t.settle()
    assert len(effects) == 1
    await t.crash()
    await eventually(lambda: len(effects) == 2)
    assert effects[0] == effects[1] == "k-1/1/0"
    gate.set()
    assert await t.result("k-1") == "through"
    await t.check()


async def test_child_start_survives_a_crash_before_delivery_exactly_once(kit):
    effects.clear()
    t = await kit(mother, kid, shards=4)
    parent, child = ids_on_two_shards(t)
    await t.start(mother, parent, child)
    # Crash at once: the ChildRequested record is durable, its message not yet sent.
    await t.crash()
    assert await t.result(parent) == 42
    assert effects.count("kid-41") == 1
    await t.check()


async def test_a_duplicate_message_is_absorbed(kit):
    effects.clear()
    wait = fusee.signal("go", int)

    @fusee.workflow("listener")
    async def listener(ctx: fusee.Ctx) -> int:
        a = await ctx.wait_for(wait)
        b = await ctx.wait_for(wait, timeout="1s")
        return (a or 0) * 10 + (b or 0)

    t = await kit(listener, shards=2)
    await t.start(listener, "l-1")
    await t.settle()
    shard = t.engine.shard_of("l-1")
    msg = Msg("signal", src=1 - shard.index, seq=7, target="l-1", name="go", value=b"3")
    await shard.messages.receive(msg)
    await shard.messages.receive(msg)  # a resend: same sender, same number
    assert await t.result("l-1") == 30  # the second wait timed out: one signal only
    received = [r for r in (await t.journal("l-1")) if r["kind"] == "SignalReceived"]
    assert len(received) == 1


async def test_runs_without_code_wait_instead_of_failing(kit):
    effects.clear()
    t = await kit(sleepy, shards=1)
    await t.start(sleepy, "w-1", 1)
    await t.settle()
    t.workflows = []
    await t.crash()
    shard = t.engine.shards[0]
    assert shard.types_without_code == {"sleepy"}
    assert (await t.engine.run("w-1").status()).status == "waiting_for_code"
    t.workflows = [sleepy]
    await t.crash()
    assert await t.result("w-1") == 1
    assert effects.count("before-1") == 1


async def test_an_engine_can_hold_some_shards_only():
    storage = MemoryStorage(4)
    engine = await fusee.Engine.open(workflows=[mother, kid], storage=storage, shard_ids=[0])
    assert [s.index for s in engine.shards] == [0]
    parent = next(f"m-{i}" for i in range(100) if engine.shard_index(f"m-{i}") == 0)
    child = next(f"k-{i}" for i in range(100) if engine.shard_index(f"k-{i}") != 0)
    await engine.start(mother, parent, child)
    # The child's start is for a shard held elsewhere: it waits for a relay.
    await eventually(lambda: storage.relayed.waiting)
    [(index, [msg])] = storage.relayed.waiting.items()
    assert index == engine.shard_index(child) and isinstance(msg, Msg) and msg.kind == "start"
    try:
        engine.run(child)._shard  # noqa: B018 - the property is the check
    except fusee.RejectedError as error:
        assert "does not hold" in str(error)
    else:
        raise AssertionError("a run on a shard the engine does not hold was reachable")
    await engine.close()


async def test_park_after_is_a_setting(kit):
    t = await kit(sleepy, shards=1, park_after="50ms")
    await t.start(sleepy, "pa-1", 1)
    await t.advance("40ms")
    assert "pa-1" in t.engine.shards[0].runs
    await t.advance("100ms")
    assert "pa-1" not in t.engine.shards[0].runs
    assert "pa-1" in t.engine.shards[0].index_entries


async def test_recovered_journal_records_are_the_same(kit):
    effects.clear()
    t = await kit(sleepy, shards=1)
    await t.start(sleepy, "j-1", 2)
    await t.settle()
    before = await t.journal("j-1")
    await t.crash()
    assert await t.journal("j-1") == before
    assert isinstance((await t.engine.run("j-1").describe()).journal[0], R.Started)


@fusee.workflow("opener")
async def opener(ctx: fusee.Ctx, kid_id: str) -> int:
    result: int = await ctx.child(kid, kid_id, 1)
    return result


async def test_a_revived_run_takes_a_message_number_after_every_number_the_log_holds():
    """Run a's child request was lost in a crash; run b's, numbered after it, is durable.
    Revived first, a must not take b's number: the receiver would drop one start as a
    duplicate of the other and a child would never start."""
    t = await TestEngine.open([opener, kid], shards=2)
    a = "a-0"
    b = next(f"b-{i}" for i in range(100) if t.engine.shard_index(f"b-{i}") == t.engine.shard_index(a))
    index = t.engine.shard_index(a)
    now = t.now_ms()
    store = t.storage.stores[index]
    for entry in (
        R.Entry(a, 1, R.Started("opener", 1, b'"kid-a"', now, 1)),
        R.Entry(b, 1, R.Started("opener", 1, b'"kid-b"', now, 2)),
        R.Entry(b, 1, R.ChildRequested(0, "kid", "kid-b", b"1", 1)),
    ):
        store.append(R.encode_entry(entry))
    await t.crash()
    assert await t.result(a) == 2
    assert await t.result(b) == 2
    await t.close()


async def test_a_wake_up_taken_just_before_a_clean_close_is_not_lost(kit):
    effects.clear()
    t = await kit(sleepy)
    await t.start(sleepy, "s-1", 1)
    await t.advance("5s")  # parked, due in an hour
    assert not t.engine.shard_of("s-1").runs
    t.clock.set(t.now_ms() + 3_600_000)  # due: its wake-up is spawned, not yet run
    await t.restart()  # a clean close right then checkpoints the index
    assert await t.result("s-1") == 1


async def test_a_wake_up_taken_just_before_a_checkpoint_is_not_lost(kit):
    effects.clear()
    t = await kit(sleepy)
    await t.start(sleepy, "s-1", 1)
    await t.advance("5s")
    shard = t.engine.shard_of("s-1")
    t.clock.set(t.now_ms() + 3_600_000)
    await shard.checkpoint(wait=True)
    await t.crash(settle=False)
    assert await t.result("s-1") == 1


async def test_a_finished_run_leaves_no_timer_behind_as_next_due(kit):
    effects.clear()
    t = await kit(sleepy)
    run = await t.start(sleepy, "s-1", 1)
    await t.advance("5s")  # parked with its hour-long timer
    await run.terminate()
    await t.settle()
    assert t.engine.shard_of("s-1").next_due_ms() == 0


async def test_an_unacknowledged_message_makes_its_resend_the_next_due_time():
    clock = fusee.VirtualClock()
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[mother, kid], storage=storage, clock=clock, shard_ids=[0])
    parent = next(f"m-{i}" for i in range(100) if engine.shard_index(f"m-{i}") == 0)
    child = next(f"k-{i}" for i in range(100) if engine.shard_index(f"k-{i}") == 1)
    await engine.start(mother, parent, child)
    await eventually(lambda: storage.relayed.waiting)  # the start of a child on shard 1, not held here
    shard = engine.by_index[0]
    assert shard.next_due_ms() == clock.now_ms() + 1000
    assert not shard.idle()
    await engine.close()


@fusee.workflow("renewer")
async def renewer(ctx: fusee.Ctx, n: int) -> int:
    if n == 0:
        ctx.continue_as_new(1)
    got: int = await ctx.wait_for("go")
    return got


async def test_a_run_that_continues_as_new_in_its_recovery_keeps_its_next_run():
    """The crash lost the record of run 1 continuing as new; replayed, its code continues
    as new again and begins run 2. Recovery must keep run 2 as the ID's run, not file the
    ID away as 'continued' with no run after it (found by the model test, seed 846186137)."""
    t = await TestEngine.open([renewer], shards=1)
    store = t.storage.stores[0]
    store.append(R.encode_entry(R.Entry("r-1", 1, R.Started("renewer", 1, b"0", t.now_ms(), 1))))
    await t.crash()
    run = t.engine.run("r-1")
    assert (await run.describe()).summary.run == 2
    await run.signal("go", 7)
    assert await t.result("r-1") == 7
    await t.close()


async def test_a_message_unacknowledged_at_a_checkpoint_goes_out_again_after_reopening():
    """The checkpoint holds the outbox: a child's start that shard 1 never acknowledged
    (nobody held shard 1) is sent again by the next engine, and the child runs once."""
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[mother, kid], storage=storage, shard_ids=[0])
    parent = next(f"m-{i}" for i in range(100) if engine.shard_index(f"m-{i}") == 0)
    child = next(f"k-{i}" for i in range(100) if engine.shard_index(f"k-{i}") == 1)
    await engine.start(mother, parent, child)
    await eventually(lambda: storage.relayed.waiting)
    await engine.close()  # flush, then a checkpoint with the start still pending
    storage.relayed.waiting.clear()  # the relay lost it: only the checkpoint's outbox has it
    assert not storage.stores[0].log[storage.stores[0].checkpoint_position - storage.stores[0].log_start :]
    effects.clear()
    engine = await fusee.Engine.open(workflows=[mother, kid], storage=storage)
    try:
        assert await asyncio.wait_for(engine.run(parent).result(), 5) == 42
        assert effects == ["kid-41"]
    finally:
        await engine.close()


@fusee.workflow("waits-for-go")
async def waits_for_go(ctx: fusee.Ctx) -> str:
    got: str = await ctx.wait_for("go")
    return got


async def test_a_child_loaded_at_a_checkpoint_that_ends_after_it_sends_its_result_again():
    """A child was loaded when the checkpoint was taken (so its journal starts in a frame,
    with its parent in the frame's first record) and ended after it; the crash came before
    the parent acknowledged the result. Recovery must find the parent in the frame and
    send the result again, or the parent waits for ever."""
    storage = MemoryStorage(2)
    engine = await fusee.Engine.open(workflows=[waits_for_go], storage=storage, shard_ids=[0])
    child = next(f"c-{i}" for i in range(100) if engine.shard_index(f"c-{i}") == 0)
    shard = engine.by_index[0]
    parent = R.Parent(1, "the-parent", 1, 3)
    await shard.messages.receive(
        Msg("start", 1, 5, child, name="waits-for-go", value=b"[]", parent=parent, op=3)
    )
    await eventually(lambda: child in shard.runs)
    await shard.checkpoint(wait=True)
    await engine.run(child).signal("go", "done")
    assert await asyncio.wait_for(engine.run(child).result(), 5) == "done"

    def results() -> list[Msg]:
        waiting = storage.relayed.waiting.get(1, [])
        return [m for m in waiting if isinstance(m, Msg) and m.kind == "result"]

    await eventually(results)
    sent = results()[0]
    engine.abandon()  # a crash: shard 1 never acknowledged the result
    storage.relayed.waiting.clear()  # and the relay lost it
    engine = await fusee.Engine.open(workflows=[waits_for_go], storage=storage, shard_ids=[0])
    try:
        await eventually(results)
        again = results()[0]
        assert (again.target, again.seq, again.value) == ("the-parent", sent.seq, sent.value)
    finally:
        await engine.close()


def checkpoint_files(t: TestEngine) -> object:
    """What a checkpoint write would change: the memory store's checkpoint object, or the
    local shard folder's checkpoint files with their modification times."""
    if isinstance(t.storage, MemoryStorage):
        return id(t.storage.stores[0].checkpoint_data)
    folder = next(Path(t.dir).rglob("shard-000"))  # type: ignore[arg-type]
    return sorted((f.name, f.stat().st_mtime_ns) for f in folder.glob("checkpoint-*"))


async def test_a_close_with_nothing_changed_since_the_last_checkpoint_writes_none(kit):
    """Opening a shard of parked runs and closing it again leaves its checkpoint as it
    was (an invoked worker with nothing due costs no write); any change writes one."""
    t = await kit(sleepy, shards=1)
    for n in range(3):
        await t.start(sleepy, f"quiet-{n}", n)
    await t.settle()
    await t.advance("10s")  # they park
    await t.restart()
    shard = t.engine.shards[0]
    assert not shard.runs and len(shard.index_entries) == 3
    before = checkpoint_files(t)
    await t.restart()
    await t.restart()
    assert checkpoint_files(t) == before
    await t.start(sleepy, "quiet-new", 9)  # a record: the next close writes a checkpoint
    await t.settle()
    await t.advance("10s")  # parked too (a run loaded at a checkpoint is loaded again, and
    await t.restart()  # may change without a record: that close writes one as well)
    after = checkpoint_files(t)
    assert after != before
    await t.restart()
    assert checkpoint_files(t) == after
    await t.close()
