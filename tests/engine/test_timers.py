"""Timers, signals and recorded values: sleep, sleep_until, wait_for, now/random/uuid,
races of a sleep and a wait, and runs parked out of memory while they wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import fusee

DURATIONS: dict[str, tuple[Any, int]] = {
    "500ms": ("500ms", 500),
    "5m": ("5m", 5 * 60_000),
    "1d": ("1d", 86_400_000),
    "int-ms": (1500, 1500),
    "timedelta": (timedelta(minutes=2, seconds=3), 123_000),
}


@fusee.workflow("timers-sleep")
async def sleeper(ctx, which: str) -> int:
    await ctx.sleep("nap", DURATIONS[which][0])
    return ctx.journal_size()


async def _status(t: Any, wid: str) -> str:
    return (await t.engine.run(wid).status()).status


def _kinds(rows: list[dict[str, Any]]) -> list[str]:
    return [row["kind"] for row in rows]


# -- sleep ------------------------------------------------------------------------------


@pytest.mark.parametrize("which", list(DURATIONS))
async def test_sleep_moves_virtual_clock_to_due_time(kit, which):
    ms = DURATIONS[which][1]
    t = await kit(sleeper)
    t0 = t.now_ms()
    await t.start(sleeper, f"sleep-{which}", which)
    await t.settle()
    timer = next(row for row in await t.journal(f"sleep-{which}") if row["kind"] == "TimerStarted")
    assert timer["due"] == t0 + ms
    assert timer["name"] == "nap"

    await t.advance(ms - 1)
    assert await _status(t, f"sleep-{which}") == "running"
    assert await t.result(f"sleep-{which}") == 1
    assert t.now_ms() - t0 >= ms
    assert _kinds(await t.journal(f"sleep-{which}")) == ["Started", "TimerStarted", "TimerFired", "Finished"]
    await t.check()


async def test_sleep_survives_crash_without_restarting(kit):
    calls: list[int] = []

    @fusee.workflow("timers-sleep-crash")
    async def wf(ctx) -> str:
        before = await ctx.step("before", lambda: calls.append(1) or "b")
        await ctx.sleep("wait", "10m")
        after = await ctx.step("after", lambda: calls.append(2) or "a")
        return before + after

    t = await kit(wf)
    t0 = t.now_ms()
    await t.start(wf, "sc-1")
    await t.settle()
    await t.advance("5m")
    await t.crash()
    assert await _status(t, "sc-1") == "running"
    assert await t.result("sc-1") == "ba"
    assert t.now_ms() - t0 == 10 * 60_000
    assert calls == [1, 2]
    await t.check()


async def test_sleep_survives_two_crashes_before_and_after_due(kit):
    @fusee.workflow("timers-sleep-crash-twice")
    async def wf(ctx) -> int:
        await ctx.sleep("one", "1h")
        await ctx.sleep("two", "1h")
        return ctx.journal_size()

    t = await kit(wf)
    t0 = t.now_ms()
    await t.start(wf, "sc-2")
    await t.settle()
    await t.advance("30m")
    await t.crash()
    await t.advance("45m")  # the first timer falls due while recovered
    await t.crash()
    assert await t.result("sc-2") == 2
    assert t.now_ms() - t0 == 2 * 3_600_000
    await t.check()


async def test_sleep_until_datetime_and_unix_ms(kit):
    @fusee.workflow("timers-sleep-until")
    async def wf(ctx, at: datetime) -> str:
        await ctx.sleep_until("deadline", at)
        later = int(at.timestamp() * 1000) + 60_000
        await ctx.sleep_until("a minute later", later)
        return ctx.now().isoformat()

    t = await kit(wf)
    t0 = t.now_ms()
    at = datetime.fromtimestamp((t0 + 3_600_000) / 1000, tz=UTC)
    await t.start(wf, "until-1", at)
    await t.settle()
    await t.advance("59m")
    await t.crash()
    result = await t.result("until-1")
    assert t.now_ms() - t0 == 3_600_000 + 60_000
    assert datetime.fromisoformat(result) == at + timedelta(minutes=1)
    dues = [row["due"] for row in await t.journal("until-1") if row["kind"] == "TimerStarted"]
    assert dues == [t0 + 3_600_000, t0 + 3_660_000]
    await t.check()


async def test_sleep_until_in_the_past_fires_at_once(kit):
    @fusee.workflow("timers-sleep-until-past")
    async def wf(ctx, at: int) -> str:
        await ctx.sleep_until("past", at)
        return "woke"

    t = await kit(wf)
    t0 = t.now_ms()
    await t.start(wf, "past-1", t0 - 60_000)
    assert await t.result("past-1") == "woke"
    assert t.now_ms() == t0


async def test_invalid_duration_fails_the_workflow_clearly(kit):
    @fusee.workflow("timers-bad-duration")
    async def wf(ctx) -> None:
        await ctx.sleep("nap", "5 parsecs")

    @fusee.workflow("timers-bad-duration-caught")
    async def caught(ctx) -> str:
        try:
            ctx.sleep("nap", "ten minutes")
        except fusee.RejectedError as error:
            return str(error)
        return "accepted"

    t = await kit(wf, caught)
    await t.start(wf, "bad-1")
    with pytest.raises(fusee.RejectedError) as info:
        await t.result("bad-1")
    assert "5 parsecs" in str(info.value)
    assert "'nap'" in str(info.value)
    assert (await t.engine.run("bad-1").status()).status == "failed"

    await t.start(caught, "bad-2")
    message = await t.result("bad-2")
    assert "ten minutes" in message and "nap" in message
    await t.check()


# -- wait_for -----------------------------------------------------------------------------

APPROVE = fusee.signal("approve", str)
AMOUNT = fusee.signal("amount", int)


@fusee.workflow("timers-wait")
async def waiter(ctx) -> dict[str, Any]:
    value = await ctx.wait_for(APPROVE, timeout="1h")
    return {"value": value, "at": ctx.now().isoformat()}


async def test_wait_for_timeout_returns_none(kit):
    t = await kit(waiter)
    t0 = t.now_ms()
    await t.start(waiter, "wait-1")
    await t.settle()
    await t.advance("30m")
    await t.crash()
    result = await t.result("wait-1")
    assert result["value"] is None
    assert t.now_ms() - t0 == 3_600_000
    assert datetime.fromisoformat(result["at"]).timestamp() * 1000 == t0 + 3_600_000
    await t.check()


async def test_wait_for_returns_signal_that_comes_first(kit):
    t = await kit(waiter)
    t0 = t.now_ms()
    run = await t.start(waiter, "wait-2")
    await t.settle()
    await t.advance("10m")
    await run.signal(APPROVE, "yes")
    await t.crash()
    result = await t.result("wait-2")
    assert result["value"] == "yes"
    assert t.now_ms() - t0 < 3_600_000
    await t.advance("2h")  # the wait's timeout passing later changes nothing
    assert await t.result("wait-2") == result
    await t.check()


async def test_signal_before_wait_for_is_kept(kit):
    @fusee.workflow("timers-early-signal")
    async def wf(ctx) -> int:
        await ctx.sleep("first", "5m")
        amount = await ctx.wait_for(AMOUNT)
        return amount * 2

    t = await kit(wf)
    run = await t.start(wf, "early-1")
    await t.settle()
    await run.signal(AMOUNT, 21)
    await t.crash()
    assert await t.result("early-1") == 42
    kinds = _kinds(await t.journal("early-1"))
    assert kinds.index("SignalReceived") < kinds.index("TimerFired")
    await t.check()


async def test_two_signals_of_one_name_are_taken_in_order(kit):
    @fusee.workflow("timers-two-signals")
    async def wf(ctx) -> list[str]:
        first = await ctx.wait_for(APPROVE)
        await ctx.sleep("between", "1m")
        second = await ctx.wait_for(APPROVE)
        third = await ctx.wait_for(APPROVE, timeout="1m")
        return [first, second, third]

    t = await kit(wf)
    run = await t.start(wf, "two-1")
    await t.settle()
    await run.signal(APPROVE, "one")
    await run.signal(APPROVE, "two")
    await run.signal(APPROVE, "three")
    await t.crash()
    assert await t.result("two-1") == ["one", "two", "three"]
    await t.check()


async def test_signals_to_a_waiting_run_in_order_after_crash(kit):
    @fusee.workflow("timers-signals-queue")
    async def wf(ctx) -> list[int]:
        await ctx.sleep("gather", "1m")
        return [await ctx.wait_for(AMOUNT) for _ in range(3)]

    t = await kit(wf)
    await t.start(wf, "queue-1")
    await t.settle()
    for amount in (3, 1, 2):
        await t.engine.run("queue-1").signal(AMOUNT, amount)
        await t.crash()
    assert await t.result("queue-1") == [3, 1, 2]
    await t.check()


# -- recorded values ------------------------------------------------------------------------


async def test_now_random_uuid_are_the_same_after_crash(kit):
    drawn: list[tuple[datetime, float, str]] = []

    @fusee.workflow("timers-values")
    async def wf(ctx) -> dict[str, Any]:
        now, rnd, uid = ctx.now(), ctx.random(), ctx.uuid()
        drawn.append((now, rnd, str(uid)))
        await ctx.sleep("nap", "1h")
        stamped = await ctx.step("stamp", lambda: [now.isoformat(), rnd, str(uid)])
        return {"now": now.isoformat(), "random": rnd, "uuid": str(uid), "stamped": stamped}

    t = await kit(wf)
    t0 = t.now_ms()
    await t.start(wf, "values-1")
    await t.settle()
    await t.advance("30m")
    await t.crash()
    result = await t.result("values-1")
    assert len(drawn) >= 2
    assert all(d == drawn[0] for d in drawn)
    now, rnd, uid = drawn[0]
    assert now == datetime.fromtimestamp(t0 / 1000, tz=UTC)
    assert 0.0 <= rnd < 1.0
    assert result == {
        "now": now.isoformat(),
        "random": rnd,
        "uuid": uid,
        "stamped": [now.isoformat(), rnd, uid],
    }
    await t.crash()
    assert await t.result("values-1") == result
    await t.check()


async def test_values_differ_between_runs(kit):
    @fusee.workflow("timers-values-differ")
    async def wf(ctx) -> list[Any]:
        return [ctx.random(), str(ctx.uuid()), str(ctx.uuid())]

    t = await kit(wf)
    await t.start(wf, "differ-1")
    await t.start(wf, "differ-2")
    one, two = await t.result("differ-1"), await t.result("differ-2")
    assert one != two
    assert one[1] != one[2]


# -- race of a sleep and a wait (reminders) ---------------------------------------------------


async def test_reminder_race_one_wait_many_sleeps(kit):
    reminders: list[int] = []

    @fusee.workflow("timers-reminder-one-wait")
    async def wf(ctx) -> dict[str, Any]:
        approval = ctx.wait_for(APPROVE)
        for i in range(10):
            value = await ctx.race([approval, ctx.sleep(f"remind-{i}", "1d")])
            if value is not None:
                return {"value": value, "reminders": i}
            await ctx.step(f"remind-{i}", lambda i=i: reminders.append(i) or i)
        return {"value": None, "reminders": 10}

    t = await kit(wf)
    await t.start(wf, "remind-1")
    await t.settle()
    await t.advance("1d")
    await t.advance("1d")
    await t.advance("12h")
    await t.crash()
    await t.engine.run("remind-1").signal(APPROVE, "ok")
    assert await t.result("remind-1") == {"value": "ok", "reminders": 2}
    assert reminders == [0, 1]
    assert await t.steps("remind-1") == ["remind-0", "remind-1"]
    await t.check()


async def test_reminder_loop_race_new_wait_each_time(kit):
    reminders: list[int] = []

    @fusee.workflow("timers-reminder-loop")
    async def wf(ctx) -> dict[str, Any]:
        for i in range(10):
            value = await ctx.race([ctx.wait_for(APPROVE), ctx.sleep(f"remind-{i}", "1d")])
            if value is not None:
                return {"value": value, "reminders": i}
            await ctx.step(f"remind-{i}", lambda i=i: reminders.append(i) or i)
        return {"value": None, "reminders": 10}

    t = await kit(wf)
    run = await t.start(wf, "remind-2")
    await t.settle()
    await t.advance("1d")
    await t.advance("1d")
    await t.advance("12h")
    await run.signal(APPROVE, "ok")
    assert await t.result("remind-2") == {"value": "ok", "reminders": 2}
    assert reminders == [0, 1]
    await t.check()


async def test_race_signal_first_then_sleep_does_not_resume_twice(kit):
    @fusee.workflow("timers-race-signal-first")
    async def wf(ctx) -> list[Any]:
        first = await ctx.race([ctx.wait_for(APPROVE), ctx.sleep("limit", "1h")])
        await ctx.sleep("after", "2h")
        return [first, ctx.journal_size()]

    t = await kit(wf)
    t0 = t.now_ms()
    run = await t.start(wf, "race-1")
    await t.settle()
    await run.signal(APPROVE, "fast")
    await t.crash()
    assert await t.result("race-1") == ["fast", 3]
    assert t.now_ms() - t0 == 2 * 3_600_000
    await t.check()


# -- parked runs ------------------------------------------------------------------------------


def _parked(t: Any, wid: str) -> bool:
    shard = t.engine.shard_of(wid)
    entry = shard.index_entries.get(wid)
    return wid not in shard.runs and entry is not None and entry.status == "parked"


async def test_parked_run_leaves_memory_and_completes_on_its_timer(kit):
    calls: list[int] = []

    @fusee.workflow("timers-parked")
    async def wf(ctx) -> str:
        got = await ctx.step("before", lambda: calls.append(1) or "stepped")
        await ctx.sleep("long", "2h")
        return got + " and slept"

    t = await kit(wf, park_after="100ms")
    t0 = t.now_ms()
    await t.start(wf, "park-1")
    await t.settle()
    assert not _parked(t, "park-1")
    await t.advance("300ms")
    assert _parked(t, "park-1")
    assert await _status(t, "park-1") == "running"
    assert await t.result("park-1") == "stepped and slept"
    assert t.now_ms() - t0 == 2 * 3_600_000
    assert calls == [1]
    shard = t.engine.shard_of("park-1")
    assert "park-1" not in shard.runs
    entry = shard.index_entries.get("park-1")
    assert entry is not None and entry.status == "ok"
    await t.check()


async def test_parked_run_survives_crash(kit):
    calls: list[int] = []

    @fusee.workflow("timers-parked-crash")
    async def wf(ctx) -> str:
        got = await ctx.step("before", lambda: calls.append(1) or "stepped")
        await ctx.sleep("long", "2h")
        after = await ctx.step("after", lambda: calls.append(2) or "done")
        return f"{got}/{after}"

    t = await kit(wf, park_after="100ms")
    t0 = t.now_ms()
    await t.start(wf, "park-2")
    await t.settle()
    await t.advance("1h")
    assert _parked(t, "park-2")
    await t.crash()
    # Recovery may load the run from the log; it parks again once idle.
    assert await _status(t, "park-2") == "running"
    await t.advance("300ms")
    assert _parked(t, "park-2")
    assert await t.result("park-2") == "stepped/done"
    assert t.now_ms() - t0 == 2 * 3_600_000
    assert calls == [1, 2]
    await t.check()


async def test_parked_run_wakes_for_a_signal(kit):
    @fusee.workflow("timers-parked-signal")
    async def wf(ctx) -> list[Any]:
        first = await ctx.wait_for(APPROVE, timeout="1d")
        second = await ctx.wait_for(APPROVE, timeout="1d")
        return [first, second]

    t = await kit(wf, park_after="100ms")
    run = await t.start(wf, "park-3")
    await t.settle()
    await t.advance("300ms")
    assert _parked(t, "park-3")
    signalled_at = t.now_ms()
    await run.signal(APPROVE, "loaded")
    rows = await t.journal("park-3")
    assert [row["kind"] for row in rows if row["kind"] in ("SignalReceived", "WaitStarted")] == [
        "WaitStarted",
        "SignalReceived",
        "WaitStarted",
    ]
    await t.advance("1s")
    assert _parked(t, "park-3")
    await t.crash()
    assert await t.result("park-3") == ["loaded", None]
    assert t.now_ms() == signalled_at + 86_400_000
    await t.check()
