"""Objects (keyed state, docs/objects.md) on the test kit, in its three modes: exclusive
calls one at a time in arrival order, shared calls on committed state only, state
committed with a handler's result and dropped by its failure, calls with IDs run once
(also across compaction), a handler cut by a crash finished once, compaction and parking
of an idle key, edits from outside with `if_version`, and calls from workflow code."""

from __future__ import annotations

import asyncio

import pytest

import fusee
from fusee import journal as R
from fusee.engine.objects.flow import OPS_PER_RUN
from fusee.testing import Case, crash_everywhere

effects: list[str] = []  # what handlers' steps did, in order (each time they ran)
ledger: dict[str, str] = {}  # the same, written idempotently under each step's key
gate: list[asyncio.Event] = []  # made per test: an Event belongs to one loop

account = fusee.object("account")


@account.exclusive
async def deposit(ctx: fusee.ObjectCtx, amount: int) -> int:
    async def record(s: fusee.StepContext) -> str:
        effects.append(f"{ctx.object_key}+{amount}")
        ledger[s.key] = f"{ctx.object_key}+{amount}"
        if amount == 13 and gate and not gate[0].is_set():
            await gate[0].wait()  # the unlucky deposit waits mid-step
        return "ok"

    await ctx.step("ledger", record)
    balance = (ctx.state.get("balance") or 0) + amount
    ctx.state.set("balance", balance)
    if amount < 0 and balance < 0:
        raise ValueError(f"overdrawn: {balance}")
    history = ctx.state.get("history") or []
    history.append(amount)
    ctx.state.set("history", history)
    return balance


@account.shared
async def balance(ctx: fusee.ObjectCtx) -> int:
    return ctx.state.get("balance") or 0


@account.shared
async def scribble(ctx: fusee.ObjectCtx) -> None:
    ctx.state.set("balance", 1_000_000)


@fusee.workflow
async def payroll(ctx: fusee.Ctx, people: list) -> list:
    paid = []
    for who in people:
        paid.append(await ctx.object("account", who).call("deposit", 10))
    ctx.object("account", "audit").send("deposit", len(people))
    return paid


@fusee.workflow
async def squatter(ctx: fusee.Ctx) -> None:
    await ctx.wait_for("never")


def _reset() -> None:
    effects.clear()
    ledger.clear()
    gate[:] = [asyncio.Event()]


async def test_exclusive_calls_apply_in_arrival_order_and_commit_with_their_result(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    results = await asyncio.gather(*[ref.call("deposit", n) for n in range(1, 11)])
    assert results == [sum(range(1, n + 1)) for n in range(1, 11)]  # one at a time, in order
    assert await ref.state() == {"balance": 55, "history": list(range(1, 11))}
    assert await ref.call("balance") == 55
    assert effects == [f"ana+{n}" for n in range(1, 11)]
    assert await t.engine.object("account", "bob").state() == {}  # never called: empty
    await t.check()


async def test_a_shared_call_sees_only_committed_state_and_cannot_change_it(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    await ref.call("deposit", 5)
    running = asyncio.ensure_future(ref.call("deposit", 13))  # waits mid-step at the gate
    queued = asyncio.ensure_future(ref.call("deposit", 1))  # waits for the key
    for _ in range(50):
        await t.settle()
        if (await ref.inspect())["running"]:
            break
    detail = await ref.inspect()
    assert [c["handler"] for c in detail["running"]] == ["deposit"]
    assert [c["handler"] for c in detail["waiting"]] == ["deposit"]
    assert await ref.call("balance") == 5  # not the running call's uncommitted write
    with pytest.raises(fusee.RejectedError, match="cannot change"):
        await ref.call("scribble")
    gate[0].set()
    assert await running == 18 and await queued == 19
    assert await ref.call("balance") == 19
    await t.check()


async def test_a_failed_handler_changes_nothing_and_its_caller_gets_the_error(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    await ref.call("deposit", 5)
    with pytest.raises(fusee.WorkflowError, match="overdrawn"):
        await ref.call("deposit", -9, id="w-1")
    assert await ref.state() == {"balance": 5, "history": [5]}
    with pytest.raises(fusee.WorkflowError, match="overdrawn"):  # the same ID: the recorded failure
        await ref.call("deposit", -9, id="w-1")
    assert effects == ["ana+5", "ana+-9"]


async def test_a_call_with_an_id_runs_once_also_after_the_key_compacted_and_parked(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    assert await ref.call("deposit", 7, id="req-1") == 7
    assert await ref.call("deposit", 7, id="req-1") == 7
    await t.advance("5s")  # idle: compacted, then parked
    detail = await ref.inspect()
    assert detail["run"]["run"] == 2 and detail["state"] == {"balance": 7, "history": [7]}
    assert await ref.call("deposit", 7, id="req-1") == 7  # remembered across the compaction
    await t.crash()
    ref = t.engine.object("account", "ana")  # the new engine's
    assert await ref.call("deposit", 7, id="req-1") == 7
    assert effects == ["ana+7"]
    assert await ref.call("deposit", 1) == 8
    await t.check()


async def test_an_idle_key_is_parked_as_one_record(kit):
    _reset()
    t = await kit(account, park_after="1s")
    ref = t.engine.object("account", "ana")
    for n in range(3):
        await ref.call("deposit", n)
    await t.advance("5s")
    shard = t.engine.shard_of(ref.id)
    assert ref.id not in shard.runs  # parked: nothing of it in memory but its index entry
    described = await t.engine.run(ref.id).describe()
    assert [type(r) for r in described.journal] == [R.Started]
    assert described.summary.run == 2
    assert await ref.state() == {"balance": 3, "history": [0, 1, 2]}


async def test_a_key_idle_for_a_minute_leaves_nothing_in_memory_but_its_index_entry(kit):
    import gc
    import weakref

    _reset()
    t = await kit(account, park_after="1s")
    ref = t.engine.object("account", "ana")
    await ref.call("deposit", 1)
    shard = t.engine.shard_of(ref.id)
    held = weakref.ref(shard.runs[ref.id])  # the key's run as it was loaded
    await t.advance("60s")
    assert ref.id not in shard.runs and shard.index_entries.get(ref.id) is not None
    gc.collect()
    assert held() is None  # no run object, fibers or state left anywhere
    for run in shard.runs.values():
        assert not run.wid.startswith("account/")  # not its compacted run either
    assert await ref.state() == {"balance": 1, "history": [1]}  # loaded again when read


async def test_a_busy_key_compacts_every_128_operations(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    for n in range(300):
        await ref.call("deposit", 1, id=f"c-{n}")
    detail = await ref.inspect()
    assert detail["state"]["balance"] == 300
    assert detail["run"]["run"] >= 300 // OPS_PER_RUN
    described = await t.engine.run(ref.id).describe()
    assert len(described.journal) <= 3 * OPS_PER_RUN  # Update, step records, UpdateDone per call
    assert await ref.call("deposit", 1, id="c-3") == 4  # an early call's ID, remembered
    await t.check()


async def test_a_handler_cut_by_a_crash_finishes_once(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    await ref.call("deposit", 2)
    call = asyncio.ensure_future(ref.call("deposit", 13, id="lucky"))
    for _ in range(50):
        await t.settle()
        if "ana+13" in effects:
            break
    await t.crash()  # the handler's step ran, its result not recorded
    call.cancel()
    gate[0].set()
    ref = t.engine.object("account", "ana")
    assert await ref.call("deposit", 13, id="lucky") == 15  # the retry joins the call
    assert await ref.state() == {"balance": 15, "history": [2, 13]}
    assert effects.count("ana+13") == 2  # its step ran again (at least once), the call once


async def test_edits_from_outside_commit_as_exclusive_calls(kit):
    _reset()
    t = await kit(account)
    ref = t.engine.object("account", "ana")
    await ref.call("deposit", 4)
    assert (await ref.set_state("note", "vip"))["changed"] == ["note"]
    version = (await ref.inspect())["version"]
    answer = await ref.patch_state([{"op": "add", "path": "/history/-", "value": 99}], if_version=version)
    assert answer["changed"] == ["history"] and answer["version"] != version
    with pytest.raises(fusee.StaleVersionError, match="changed since"):
        await ref.edit_state({"set": {"note": "x"}}, if_version=version)
    with pytest.raises(fusee.RejectedError, match="patch operation 0"):
        await ref.patch_state([{"op": "remove", "path": "/nope"}])
    with pytest.raises(fusee.RejectedError, match="edit has no"):
        await ref.edit_state({"sett": {}})
    assert await ref.state() == {"balance": 4, "history": [4, 99], "note": "vip"}
    await ref.clear_state("note")
    assert await ref.call("deposit", 1) == 5  # handlers after an edit see it
    assert (await ref.state())["history"] == [4, 99, 1]
    await ref.clear_state()
    assert await ref.state() == {}
    await ref.edit_state({"set": {"a": 1}}, by="cli:ana")
    accepted = [r for r in (await t.engine.run(ref.id).describe()).journal if isinstance(r, R.UpdateAccepted)]
    assert b'"by":"cli:ana"' in accepted[-1].arg  # who asked, kept in the call's record
    await t.check()


async def test_a_deleted_key_starts_again_empty_and_keys_are_listed(kit):
    _reset()
    t = await kit(account)
    await t.engine.object("account", "ana").call("deposit", 3)
    await t.engine.object("account", "bob").call("deposit", 4)
    assert sorted([k async for k in t.engine.objects("account")]) == ["ana", "bob"]
    await t.engine.object("account", "ana").delete()
    assert await t.engine.object("account", "ana").state() == {}
    assert sorted([k async for k in t.engine.objects("account")]) == ["bob"]
    assert await t.engine.object("account", "ana").call("deposit", 1) == 1


async def test_an_id_held_by_another_types_run_refuses_the_call(kit):
    _reset()
    t = await kit(account, squatter)
    await t.start(squatter, "account/eve")
    with pytest.raises(fusee.RejectedError, match="is a run of 'squatter'"):
        await t.engine.object("account", "eve").call("deposit", 1)


async def test_calls_from_workflow_code_run_once_across_crashes(kit):
    _reset()
    t = await kit(account, payroll)
    await t.start(payroll, "pay-1", ["ana", "bob"])
    assert await t.result("pay-1") == [10, 10]
    for _ in range(50):
        await t.settle()
        if await t.engine.object("account", "audit").state():
            break
    assert await t.engine.object("account", "audit").state() == {"balance": 2, "history": [2]}
    await t.crash()
    await t.start(payroll, "pay-2", ["ana"])
    assert await t.result("pay-2") == [20]
    await t.check()


async def test_crash_everywhere_covers_an_object_handler():
    def build() -> Case:
        _reset()
        return Case(
            [account, payroll], payroll, "pay", ["ana", "bob", "ana"], effects=lambda: sorted(ledger.values())
        )

    steps = await crash_everywhere(build)
    assert "ledger" in steps and "account.deposit" in steps


def test_object_types_are_checked_where_they_are_defined():
    with pytest.raises(fusee.RejectedError, match="holds no '/'"):
        fusee.object("a/b")
    cart = fusee.object("cart", {"add": lambda ctx, item: item, "get": fusee.shared(lambda ctx: 1)})
    assert cart.handlers["get"].shared and not cart.handlers["add"].shared
    with pytest.raises(fusee.RejectedError, match="two handlers"):
        cart.exclusive(lambda ctx: None) if False else cart._add("add", cart.handlers["add"])
    with pytest.raises(TypeError, match=r"\(ctx\) or \(ctx, arg\)"):
        fusee.object("x", {"h": lambda: None})
    with pytest.raises(fusee.RejectedError, match="engine's"):
        fusee.object("x", {"fusee.state.edit": lambda ctx: None})
