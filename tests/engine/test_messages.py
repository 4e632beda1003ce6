"""Signals and child workflows: between shards and on one shard, and across crashes."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pytest

import fusee
from fusee.storage import MemoryStorage
from fusee.testing import TestEngine

CALLS: Counter[str] = Counter()

# Workflow IDs and the shard each hashes to with shards=4 (checked in every test).
APART = ("parent", "child")  # shards 3 and 1
TOGETHER = ("boss", "worker")  # both on shard 2
PAIRS = {"apart": APART, "together": TOGETHER}


@pytest.fixture(autouse=True)
def _fresh_calls() -> None:
    CALLS.clear()


def counted(name: str, value: Any = None) -> Any:
    def fn() -> Any:
        CALLS[name] += 1
        return value

    return fn


def placed(t: TestEngine, where: str, a: str, b: str) -> None:
    same = t.engine.shard_of(a).index == t.engine.shard_of(b).index
    assert same == (where == "together"), f"{a} and {b}: pick IDs on {where} shards"


async def crash_at_once(t: TestEngine) -> None:
    """A crash with no turn run before it (`t.crash()` settles first)."""
    await t.crash(settle=False)
    await t.settle()


async def kinds(t: TestEngine, wid: str) -> list[str]:
    return [row["kind"] for row in await t.journal(wid)]


@dataclass
class Point:
    x: int
    y: int


@dataclass
class Order:
    sku: str
    qty: int


go = fusee.signal("go")
order_sig = fusee.signal("order", Order)


class OutOfStock(fusee.Fatal):
    pass


# -- workflows --------------------------------------------------------------------------


@fusee.workflow("msg.child")
async def child_wf(ctx: fusee.Ctx, n: int) -> Point:
    x = await ctx.step("work", counted(f"work:{ctx.workflow_id}", n))
    await ctx.sleep("nap", "1m")
    y = await ctx.step("finish", counted(f"finish:{ctx.workflow_id}", n * 10))
    return Point(x, y)


@fusee.workflow("msg.parent")
async def parent_wf(ctx: fusee.Ctx, child_id: str) -> list[Any]:
    p = await ctx.child(child_wf, child_id, 4)
    return [type(p).__name__, p.x, p.y]


@fusee.workflow("msg.fan_out")
async def fan_out(ctx: fusee.Ctx, ids: list[str]) -> list[int]:
    points = await ctx.all([ctx.child(child_wf, cid, i) for i, cid in enumerate(ids, 1)])
    return [p.x + p.y for p in points]


@fusee.workflow("msg.handle")
async def handle_wf(ctx: fusee.Ctx, child_id: str) -> list[Any]:
    h = await ctx.start_child(child_wf, child_id, 2)
    await ctx.sleep("linger", "1h")  # the child (1 min) is long done by then
    p = await h.result()
    return [h.id, p.x, p.y]


def reserve_fails(sku: str) -> Any:
    def fn() -> None:
        CALLS["reserve"] += 1
        raise OutOfStock(f"no stock for {sku}", code="out_of_stock", details={"sku": sku})

    return fn


@fusee.workflow("msg.failing_child")
async def failing_child(ctx: fusee.Ctx, sku: str) -> int:
    await ctx.step("reserve", reserve_fails(sku))
    return 1


@fusee.workflow("msg.catches")
async def catches_child(ctx: fusee.Ctx, child_id: str) -> dict[str, Any]:
    try:
        await ctx.child(failing_child, child_id, "sku-9")
    except fusee.ChildError as e:
        inner = e.cause.cause
        return {
            "child": e.child_id,
            "type": e.cause.type,
            "inner": inner.type,
            "code": inner.code,
            "details": inner.details,
        }
    return {}


@fusee.workflow("msg.lets_fail")
async def lets_child_fail(ctx: fusee.Ctx, child_id: str) -> int:
    return int(await ctx.child(failing_child, child_id, "sku-3"))


@fusee.workflow("msg.waiter")
async def waiter(ctx: fusee.Ctx) -> Any:
    return await ctx.wait_for(go)


@fusee.workflow("msg.greeter")
async def greeter(ctx: fusee.Ctx, name: str) -> list[Any]:
    return [name, await ctx.wait_for(go)]


@fusee.workflow("msg.collector")
async def collector(ctx: fusee.Ctx) -> list[Any]:
    await ctx.sleep("first", "1m")
    return [await ctx.wait_for(go), await ctx.wait_for(go)]


@fusee.workflow("msg.takes_taken")
async def takes_taken(ctx: fusee.Ctx, child_id: str) -> str:
    try:
        await ctx.start_child(waiter, child_id)
    except fusee.AlreadyExistsError as e:
        return f"taken:{e.code}"
    return "started"


@fusee.workflow("msg.leaves")
async def leaves_child(ctx: fusee.Ctx, args: dict[str, Any]) -> str:
    options = {"parent_close": args["close"]} if args["close"] else {}
    h = await ctx.start_child(waiter, args["child"], **options)
    await ctx.step("between", counted("between"))
    if args["fail"]:
        raise fusee.Fatal("the parent gives up")
    return h.id


@fusee.workflow("msg.sender")
async def sender(ctx: fusee.Ctx, target: str) -> str:
    try:
        await ctx.signal_workflow(target, go, {"from": ctx.workflow_id})
    except fusee.NotFoundError as e:
        return f"missing:{e.code}"
    return "sent"


@fusee.workflow("msg.canceller")
async def canceller(ctx: fusee.Ctx, target: str) -> str:
    await ctx.cancel_workflow(target, reason="no longer needed")
    return "done"


@fusee.workflow("msg.order_taker")
async def order_taker(ctx: fusee.Ctx) -> list[Any]:
    o = await ctx.wait_for(order_sig)
    await ctx.sleep("pack", "1h")
    return [type(o).__name__, o.sku, o.qty]


@fusee.workflow("msg.order_sender")
async def order_sender(ctx: fusee.Ctx, target: str) -> str:
    await ctx.signal_workflow(target, order_sig, Order("sku-7", 3))
    return "sent"


# -- children ---------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_child_returns_its_typed_result(kit, where):
    t = await kit(parent_wf, child_wf, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(parent_wf, p, c)
    assert await t.result(p) == ["Point", 4, 40]
    assert await t.result(c) == Point(4, 40)
    assert CALLS == {f"work:{c}": 1, f"finish:{c}": 1}
    assert (await kinds(t, p)).count("ChildResult") == 1
    await t.check()


async def test_all_over_children_on_several_shards(kit):
    t = await kit(fan_out, child_wf, shards=4)
    ids = ["kid", "kid-a", "kid-b"]
    shards = {t.engine.shard_of(i).index for i in ids}
    assert len(shards) == 3 and t.engine.shard_of("parent").index in shards
    await t.start(fan_out, "parent", ids)
    assert await t.result("parent") == [11, 22, 33]
    assert CALLS == Counter({f"{k}:{i}": 1 for i in ids for k in ("work", "finish")})
    await t.crash()
    assert await t.result("parent") == [11, 22, 33]
    assert sum(CALLS.values()) == 6
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_start_child_handle_result_after_the_child_finished(kit, where):
    t = await kit(handle_wf, child_wf, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(handle_wf, p, c)
    await t.advance("2m")
    assert await t.result(c) == Point(2, 20)
    journal = await kinds(t, p)
    assert "ChildResult" in journal and "TimerFired" not in journal  # still lingering
    await t.crash()
    assert await t.result(p) == [c, 2, 20]
    journal = await kinds(t, p)
    assert journal.index("ChildResult") < journal.index("TimerFired")
    assert CALLS == {f"work:{c}": 1, f"finish:{c}": 1}
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_failing_child_raises_child_error_with_the_original_failure(kit, where):
    t = await kit(catches_child, lets_child_fail, failing_child, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(catches_child, p, c)
    assert await t.result(p) == {
        "child": c,
        "type": "StepFailed",
        "inner": "OutOfStock",
        "code": "out_of_stock",
        "details": {"sku": "sku-9"},
    }
    with pytest.raises(fusee.StepError) as child_error:
        await t.result(c)
    assert child_error.value.step == "reserve" and child_error.value.cause.code == "out_of_stock"

    await t.start(lets_child_fail, "mom", "dad")
    with pytest.raises(fusee.ChildError) as parent_error:
        await t.result("mom")
    e = parent_error.value
    assert e.code == "ChildFailed" and e.child_id == "dad"
    assert e.cause.type == "StepFailed" and e.cause.cause.type == "OutOfStock"
    assert e.cause.cause.code == "out_of_stock" and e.cause.cause.details == {"sku": "sku-3"}
    assert CALLS["reserve"] == 2  # Fatal: never retried
    await t.crash()
    with pytest.raises(fusee.ChildError):
        await t.result("mom")
    assert CALLS["reserve"] == 2
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_child_id_that_is_running_fails_in_the_parent(kit, where):
    t = await kit(takes_taken, waiter, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(waiter, c)
    await t.start(takes_taken, p, c)
    assert await t.result(p) == "taken:AlreadyExists"
    status = await t.engine.run(c).status()
    assert (status.status, status.run) == ("running", 1)
    await t.engine.run(c).signal(go, "still mine")
    assert await t.result(c) == "still mine"
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
@pytest.mark.parametrize("close", [None, "terminate"])
@pytest.mark.parametrize("fail", [False, True])
async def test_parent_close_terminate_ends_the_running_child(kit, where, close, fail):
    t = await kit(leaves_child, waiter, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(leaves_child, p, {"child": c, "close": close, "fail": fail})
    if fail:
        with pytest.raises(fusee.WorkflowError):
            await t.result(p)
    else:
        assert await t.result(p) == c
    with pytest.raises(fusee.TerminatedError):
        await t.result(c)
    assert (await t.engine.run(c).status()).status == "terminated"
    with pytest.raises(fusee.NotFoundError):
        await t.engine.run(c).signal(go, 1)
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
@pytest.mark.parametrize("fail", [False, True])
async def test_parent_close_abandon_leaves_the_child_running(kit, where, fail):
    t = await kit(leaves_child, waiter, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(leaves_child, p, {"child": c, "close": "abandon", "fail": fail})
    await t.advance("1h")
    assert (await t.engine.run(p).status()).status == ("failed" if fail else "ok")
    await t.crash()
    await t.advance("1h")
    assert (await t.engine.run(c).status()).status == "running"
    await t.engine.run(c).signal(go, "free")
    assert await t.result(c) == "free"
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_parent_close_request_cancel_cancels_the_running_child(kit, where):
    t = await kit(leaves_child, waiter, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(leaves_child, p, {"child": c, "close": "request-cancel", "fail": False})
    assert await t.result(p) == c
    with pytest.raises(fusee.CancelledError):
        await t.result(c)
    assert (await t.engine.run(c).status()).status == "cancelled"
    await t.check()


# -- signals between workflows -------------------------------------------------------------


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_signal_workflow_reaches_the_receivers_wait_for(kit, where):
    t = await kit(sender, waiter, shards=4)
    s, r = PAIRS[where]
    placed(t, where, s, r)
    await t.start(waiter, r)
    await t.start(sender, s, r)
    assert await t.result(s) == "sent"
    assert await t.result(r) == {"from": s}
    await t.crash()
    assert await t.result(r) == {"from": s}
    assert (await kinds(t, r)).count("SignalReceived") == 1
    await t.check()


async def test_signal_workflow_to_a_missing_id_raises_not_found_in_the_sender(kit):
    t = await kit(sender, waiter, shards=4)
    await t.start(sender, "sender", "nobody")
    assert await t.result("sender") == "missing:NotFound"
    await t.crash()
    assert await t.result("sender") == "missing:NotFound"
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_cancel_workflow_cancels_the_target(kit, where):
    t = await kit(canceller, waiter, shards=4)
    s, r = PAIRS[where]
    placed(t, where, s, r)
    await t.start(waiter, r)
    await t.start(canceller, s, r)
    assert await t.result(s) == "done"
    with pytest.raises(fusee.CancelledError) as cancelled:
        await t.result(r)
    assert "no longer needed" in str(cancelled.value)
    assert (await t.engine.run(r).status()).status == "cancelled"
    await t.check()


# -- crashes in the middle of a parent/child exchange ------------------------------------


async def _exchange_done_once(t: TestEngine, p: str, c: str) -> None:
    assert await t.result(p) == ["Point", 4, 40]
    if isinstance(t.storage, MemoryStorage) and t.storage.stores[0].instant:
        assert CALLS == {f"work:{c}": 1, f"finish:{c}": 1}
    else:
        # At least once: a crash between a step's function and its flushed result runs
        # the function again (with the same key); its result is recorded once.
        assert set(CALLS) == {f"work:{c}", f"finish:{c}"} and all(1 <= n <= 2 for n in CALLS.values())
    steps = [row["name"] for row in await t.journal(c) if row["kind"] == "StepDone"]
    assert sorted(steps) == sorted(set(steps))
    parent = await kinds(t, p)
    assert parent.count("ChildRequested") == 1 and parent.count("ChildResult") == 1
    child = await kinds(t, c)
    assert child.count("Started") == 1 and (await t.engine.run(c).status()).run == 1
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
@pytest.mark.parametrize("turns", [0, 1, 2, 3, 4, 6, 8, 12, 16, 32])
async def test_crash_right_after_starting_the_parent(kit, where, turns):
    t = await kit(parent_wf, child_wf, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(parent_wf, p, c)
    for _ in range(turns):
        await asyncio.sleep(0)
    await crash_at_once(t)
    await _exchange_done_once(t, p, c)


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_crash_while_the_child_sleeps(kit, where):
    t = await kit(parent_wf, child_wf, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(parent_wf, p, c)
    await t.settle()
    child = await kinds(t, c)
    assert "TimerStarted" in child and "TimerFired" not in child
    assert CALLS == {f"work:{c}": 1}
    await t.crash()
    await _exchange_done_once(t, p, c)


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_crash_after_the_child_finished(kit, where):
    t = await kit(parent_wf, child_wf, shards=4)
    p, c = PAIRS[where]
    placed(t, where, p, c)
    await t.start(parent_wf, p, c)
    await t.settle()  # the child's start reached its shard
    assert await t.result(c) == Point(4, 40)
    await t.crash()
    await _exchange_done_once(t, p, c)
    await t.crash()
    await _exchange_done_once(t, p, c)


# -- signals from outside -----------------------------------------------------------------


async def test_run_signal_from_outside_and_after_the_run_finished(kit):
    t = await kit(waiter, shards=4)
    run = await t.start(waiter, "alice")
    await t.settle()
    await run.signal(go, [1, 2])
    await crash_at_once(t)  # an acknowledged signal survives
    assert await t.result("alice") == [1, 2]
    with pytest.raises(fusee.NotFoundError):
        await t.engine.run("alice").signal(go, 3)
    with pytest.raises(fusee.NotFoundError):
        await t.engine.run("never-started").signal(go, 3)
    assert (await kinds(t, "alice")).count("SignalReceived") == 1
    await t.check()


async def test_signals_before_the_code_waits_are_kept_in_order(kit):
    t = await kit(collector, shards=4)
    run = await t.start(collector, "bob")
    await t.settle()
    await run.signal(go, "early")
    await run.signal(go, "late")
    await t.crash()
    assert await t.result("bob") == ["early", "late"]
    journal = await kinds(t, "bob")
    assert journal.count("SignalReceived") == 2
    assert journal.index("SignalReceived") < journal.index("TimerFired")  # kept until then
    await t.check()


async def test_signal_with_start_on_a_new_id(kit):
    t = await kit(greeter, shards=4)
    await t.engine.signal_with_start(greeter, "carol", "carol", go, "hi")
    await t.settle()  # let the code run its first turn
    journal = await kinds(t, "carol")
    assert journal[0] == "Started"
    assert journal.index("SignalReceived") < journal.index("WaitStarted")  # before the code ran
    await crash_at_once(t)
    assert await t.result("carol") == ["carol", "hi"]
    await t.check()


async def test_signal_with_start_on_a_running_id_only_signals(kit):
    t = await kit(greeter, shards=4)
    await t.start(greeter, "dave", "first")
    await t.settle()
    await t.engine.signal_with_start(greeter, "dave", "second", go, "again")
    assert await t.result("dave") == ["first", "again"]
    journal = await kinds(t, "dave")
    assert journal.count("Started") == 1 and (await t.engine.run("dave").status()).run == 1
    await t.check()


# -- typed payloads -------------------------------------------------------------------------


async def test_typed_signal_decodes_to_the_dataclass(kit):
    t = await kit(order_taker, shards=4)
    run = await t.start(order_taker, "ping")
    await run.signal(order_sig, Order("sku-1", 2))
    await t.settle()
    await t.crash()  # replay decodes the recorded signal again
    assert await t.result("ping") == ["Order", "sku-1", 2]
    await t.check()


@pytest.mark.parametrize("where", ["apart", "together"])
async def test_typed_signal_between_workflows_decodes_to_the_dataclass(kit, where):
    t = await kit(order_taker, order_sender, shards=4)
    s, r = PAIRS[where]
    placed(t, where, s, r)
    await t.start(order_taker, r)
    await t.start(order_sender, s, r)
    assert await t.result(s) == "sent"
    await t.crash()
    assert await t.result(r) == ["Order", "sku-7", 3]
    await t.check()


@fusee.workflow("msg.dup_collector")
async def dup_collector(ctx: fusee.Ctx) -> list[str]:
    got: list[str] = []
    while len(got) < 2:
        got.append(await ctx.wait_for("s"))
    return got


async def test_a_duplicate_arriving_while_its_run_loads_is_applied_once():
    """Two copies of one message (a resend) reach a parked run whose frame takes a while to
    read: both wait for the same load; only one may be applied."""
    from fusee.journal import Msg
    from tests.support.engine_kit import slow_reads

    clock = fusee.VirtualClock()
    engine = await fusee.Engine.open(workflows=[dup_collector], storage=slow_reads(1), clock=clock)
    await engine.start(dup_collector, "c-1")
    await asyncio.sleep(0)
    clock.set(clock.now_ms() + 5_000)  # parked
    shard = engine.shards[0]
    assert not shard.runs
    msg = Msg("signal", 0, 99, "c-1", name="s", value=b'"once"')
    await asyncio.gather(shard.messages.receive(msg), shard.messages.receive(msg))
    signals = [
        r for r in (await engine.run("c-1").describe()).journal if type(r).__name__ == "SignalReceived"
    ]
    assert len(signals) == 1
    await engine.close()
