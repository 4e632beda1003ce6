"""Streams (docs/engine.md, *Streams*): appends never wait and take no position; readers
get durable chunks only, in order, from any offset, while the stream grows, after the run
parked or ended, and across crashes; a replay appends nothing again; a step that runs
again continues after what its earlier attempts recorded."""

from __future__ import annotations

import asyncio

import pytest

import fusee

more = fusee.signal("more", int)
attempts: list[tuple[int, list[str]]] = []


@fusee.workflow("talker")
async def talker(ctx: fusee.Ctx, n: int) -> int:
    out = ctx.stream("tokens")
    for i in range(n):
        out.append(f"t{i}")
    await ctx.step("think", lambda: "thought")
    extra = await ctx.wait_for(more)
    for i in range(n, n + extra):
        out.append(f"t{i}")
    out.append(b"\x00\x01raw")
    out.close()
    return n + extra


async def _all(t, wid: str, name: str = "tokens", from_: int = 0) -> tuple[list, object]:
    reader = t.engine.run(wid).stream(name, from_=from_)
    got = [chunk async for chunk in reader]
    return got, (reader.status, reader.closed, reader.offset)


async def _chunks(t, wid: str) -> int:
    return sum(1 for row in await t.journal(wid) if row["kind"] == "StreamChunk")


async def test_a_reader_follows_a_stream_across_a_crash_and_a_replay_appends_nothing(kit):
    t = await kit(talker)
    await t.start(talker, "s-1", 3)
    await t.settle()
    before = await _chunks(t, "s-1")
    assert before == 3
    await t.crash()
    assert await _chunks(t, "s-1") == 3  # the replay matched the 3 appends, recorded none

    reader = t.engine.run("s-1").stream("tokens")
    head = [await reader.__anext__() for _ in range(3)]
    assert head == ["t0", "t1", "t2"] and reader.status is None
    follow = asyncio.ensure_future(reader.__anext__())  # waits for the stream to grow
    await asyncio.sleep(0.05)
    assert not follow.done()
    await t.engine.run("s-1").signal(more, 2)
    assert await asyncio.wait_for(follow, 10) == "t3"
    assert await t.result("s-1") == 5
    rest = [chunk async for chunk in reader]
    assert rest == ["t4", b"\x00\x01raw"]
    assert (reader.status, reader.closed, reader.offset) == ("ok", True, 6)

    got, end = await _all(t, "s-1", from_=4)  # reconnecting at an offset
    assert got == ["t4", b"\x00\x01raw"] and end == ("ok", True, 6)
    await t.crash()  # the finished run is read from its stored journal
    assert (await _all(t, "s-1"))[0] == ["t0", "t1", "t2", "t3", "t4", b"\x00\x01raw"]
    await t.check()


@fusee.workflow("answer")
async def answer(ctx: fusee.Ctx, prompt: str) -> str:
    async def generate(s: fusee.StepContext) -> str:
        out = s.stream("answer")
        text = "".join(out.recorded())
        attempts.append((s.attempt, out.recorded()))
        for word in ["Hello", " there", ",", " friend"][len(out.recorded()) :]:
            out.append(word)
            text += word
            await asyncio.sleep(0)
            if s.attempt == 1 and word == ",":
                raise RuntimeError("the model's connection dropped")
        return text

    return await ctx.step("generate", generate, retry=fusee.Retry(attempts=3, initial="1ms"))


async def test_a_step_that_runs_again_continues_after_what_it_recorded(kit):
    attempts.clear()
    t = await kit(answer)
    await t.start(answer, "a-1", "hi")
    assert await t.result("a-1") == "Hello there, friend"
    assert attempts == [(1, []), (2, ["Hello", " there", ","])]
    got, end = await _all(t, "a-1", "answer")
    assert got == ["Hello", " there", ",", " friend"]  # each token once
    assert end == ("ok", False, 4)  # completed by the step's result
    kinds = [row["kind"] for row in await t.journal("a-1")]
    assert kinds.index("StreamEnd") == kinds.index("StepDone") - 1
    await t.check()


@fusee.workflow("two_steps")
async def two_steps(ctx: fusee.Ctx) -> str:
    def first(s: fusee.StepContext) -> str:
        s.stream("mine").append(1)
        return "first"

    def second(s: fusee.StepContext) -> str:
        try:
            s.stream("mine")
        except fusee.RejectedError as error:
            return str(error)
        return "wrote it"

    await ctx.step("first", first)
    return await ctx.step("second", second)


async def test_a_step_cannot_write_another_steps_stream(kit):
    t = await kit(two_steps)
    await t.start(two_steps, "x-1")
    assert "opened by the step at position 0" in await t.result("x-1")


@fusee.workflow("silent")
async def silent(ctx: fusee.Ctx) -> str:
    await ctx.step("noop", lambda: "x")
    return "done"


async def test_a_reader_of_a_stream_never_opened_ends_with_the_run(kit):
    t = await kit(silent)
    await t.start(silent, "q-1")
    assert await t.result("q-1") == "done"
    got, end = await _all(t, "q-1", "nothing")
    assert got == [] and end[0] == "ok" and end[1] is False
    with pytest.raises(fusee.NotFoundError):
        await _all(t, "never-ran")


@fusee.workflow("waits_then_ends")
async def waits_then_ends(ctx: fusee.Ctx) -> str:
    await ctx.wait_for(more)
    return "done"


async def test_a_reader_waiting_on_a_stream_nobody_opened_records_nothing(kit):
    t = await kit(waits_then_ends)
    await t.start(waits_then_ends, "r-1")
    await t.settle()
    reader = t.engine.run("r-1").stream("ghost")
    waiting = asyncio.ensure_future(reader.__anext__())
    await asyncio.sleep(0.05)
    await t.engine.run("r-1").signal(more, 1)
    assert await t.result("r-1") == "done"
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 10)
    assert reader.status == "ok" and reader.closed is False
    kinds = [row["kind"] for row in await t.journal("r-1")]
    assert "StreamEnd" not in kinds  # a read writes nothing
