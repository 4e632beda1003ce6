"""Step heartbeats (docs/engine.md, *Heartbeats*): `s.heartbeat(progress)` never waits for
the disk and is coalesced; `s.progress()` gives a retry the latest progress in this
process and the last durable one after a crash; `heartbeat_timeout` fails an attempt that
goes silent, and the policy retries it."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import fusee
from fusee import journal as R

seen: list[tuple[int, object]] = []  # (attempt, progress at the attempt's start)
gate: list[asyncio.Event] = []  # made per test: an Event belongs to one loop
pages_done: list[int] = []


@fusee.workflow("export")
async def export(ctx: fusee.Ctx, pages: int) -> int:
    async def fn(s: fusee.StepContext) -> int:
        start = s.progress() or 0
        seen.append((s.attempt, s.progress()))
        for page in range(start, pages):
            pages_done.append(page)
            s.heartbeat(page + 1)
            if page + 1 == 5 and not gate[0].is_set():
                await gate[0].wait()  # the first attempt hangs after five pages
            await asyncio.sleep(0)
        return pages

    return await ctx.step("export", fn)


def _reset() -> None:
    seen.clear()
    pages_done.clear()
    gate[:] = [asyncio.Event()]


async def _beats(t, wid: str) -> list[dict]:
    return [row for row in await t.journal(wid) if row["kind"] == "Heartbeat"]


async def test_a_step_run_again_after_a_crash_resumes_from_its_last_durable_progress(kit):
    _reset()
    t = await kit(export)
    await t.start(export, "e-1", 8)
    for _ in range(200):
        await t.settle()
        if len(pages_done) >= 5:
            break
        await asyncio.sleep(0.005)
    await t.settle()  # the latest progress is flushed: heartbeats ask for no wait of their own
    await t.crash()
    gate[0].set()
    assert await t.result("e-1") == 8
    # The attempt after the crash began at page 5 (attempt 1 again: a crash is not a retry).
    assert seen[-1] == (1, 5)
    assert pages_done == [0, 1, 2, 3, 4, 5, 6, 7]
    # Coalesced: the journal holds far fewer heartbeats than beats, the last one 8.
    beats = await _beats(t, "e-1")
    assert beats and len(beats) <= 8
    await t.check()


@fusee.workflow("flaky-export")
async def flaky_export(ctx: fusee.Ctx) -> int:
    def fn(s: fusee.StepContext) -> int:
        seen.append((s.attempt, s.progress()))
        s.heartbeat({"page": s.attempt * 10})
        if s.attempt < 3:
            raise RuntimeError("the export service hiccuped")
        return s.progress()["page"]

    return await ctx.step("export", fn, retry=fusee.Retry(attempts=3, initial="1s"))


async def test_a_retry_in_the_same_process_reads_the_latest_progress(kit):
    _reset()
    t = await kit(flaky_export)
    await t.start(flaky_export, "f-1")
    assert await t.result("f-1") == 30
    assert seen == [(1, None), (2, {"page": 10}), (3, {"page": 20})]
    await t.check()


@fusee.workflow("tight")
async def tight(ctx: fusee.Ctx) -> int:
    async def fn(s: fusee.StepContext) -> int:
        for n in range(10_000):
            s.heartbeat(n)  # one turn of the loop: one record
        await asyncio.sleep(0.05)  # recorded meanwhile (a step's result ends its heartbeats)
        return s.progress()

    return await ctx.step("tight", fn)


async def test_heartbeats_within_a_turn_are_one_record_and_the_last_one_wins(kit):
    t = await kit(tight)
    await t.start(tight, "t-1")
    assert await t.result("t-1") == 9_999
    beats = await _beats(t, "t-1")
    assert len(beats) == 1, beats


@fusee.workflow("silent")
async def silent(ctx: fusee.Ctx) -> str:
    async def fn(s: fusee.StepContext) -> str:
        seen.append((s.attempt, s.progress()))
        if s.attempt == 1:
            s.heartbeat("started")
            await asyncio.sleep(30)  # hangs: no heartbeat comes again
        for _ in range(5):
            await asyncio.sleep(0.02)
            s.heartbeat("alive")  # beats faster than the timeout: never cut
        return "done"

    return await ctx.step(
        "export", fn, heartbeat_timeout="60ms", retry=fusee.Retry(attempts=3, initial="1ms")
    )


async def test_an_attempt_that_stops_heartbeating_fails_and_is_retried(kit):
    _reset()
    t = await kit(silent)
    began = time.monotonic()
    await t.start(silent, "s-1")
    assert await t.result("s-1") == "done"
    assert time.monotonic() - began < 10
    assert seen == [(1, None), (2, "started")]
    attempts = [row for row in await t.journal("s-1") if row["kind"] == "Attempt"]
    assert len(attempts) == 1
    assert "no heartbeat for 60 ms" in str(attempts[0]["failure"])
    await t.check()


@fusee.workflow("silent-for-good")
async def silent_for_good(ctx: fusee.Ctx) -> str:
    async def fn() -> str:  # takes no context: it cannot heartbeat, and is cut each time
        await asyncio.sleep(30)
        return "never"

    return await ctx.step(
        "export", fn, heartbeat_timeout="30ms", retry=fusee.Retry(attempts=2, initial="1ms")
    )


async def test_a_step_silent_on_every_attempt_fails_with_a_timeout(kit):
    t = await kit(silent_for_good)
    await t.start(silent_for_good, "g-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("g-1")
    assert "heartbeat_timeout" in str(info.value)


@fusee.workflow("thread-export")
async def thread_export(ctx: fusee.Ctx) -> list[int]:
    def fn(s: fusee.StepContext) -> list[int]:
        got = [s.progress() or 0]
        for page in range(got[0], 4):
            time.sleep(0.03)  # on a step thread: the loop is free meanwhile
            s.heartbeat(page + 1)
            got.append(s.progress())
        assert threading.current_thread() is not threading.main_thread()
        return got

    return await ctx.step("export", fn, thread=True, heartbeat_timeout="2s")


async def test_a_thread_step_heartbeats_through_the_loop(kit):
    t = await kit(thread_export)
    await t.start(thread_export, "th-1")
    assert await t.result("th-1") == [0, 1, 2, 3, 4]
    beats = await _beats(t, "th-1")
    assert beats and beats[-1]["progress"] == 4
    await t.check()


@fusee.workflow("bad-progress")
async def bad_progress(ctx: fusee.Ctx) -> str:
    def fn(s: fusee.StepContext) -> str:
        try:
            s.heartbeat({"pages": [object()]})
        except fusee.CodecError as error:
            return str(error)
        return "encoded"

    return await ctx.step("export", fn)


async def test_a_heartbeat_json_cannot_encode_raises_codec_error_naming_the_path(kit):
    t = await kit(bad_progress)
    await t.start(bad_progress, "b-1")
    message = await t.result("b-1")
    assert "progress" in message and "$.pages[0]" in message, message


def test_the_record_takes_its_steps_position():
    assert R.op_of(R.Heartbeat(3, "export", b"1")) == ("step", "export")
