"""Bad input gets a clear error where it enters and loses nothing: poison values (nested
without end, too large, durations past the clock's range, NaN), IDs and names that are not
real strings, payloads of the wrong type, and interrupts that are not a step's failure.
Each case also checks that the engine goes on: other runs finish, a close and a reopen
work. Each test here failed before its fix."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import fusee
from fusee import journal as R
from fusee.testing import TestEngine

ROOT = Path(__file__).resolve().parents[2]


def deep(levels: int) -> Any:
    value: Any = []
    for _ in range(levels):
        value = [value]
    return value


@fusee.workflow("healthy")
async def healthy(ctx: fusee.Ctx, n: int) -> int:
    await ctx.sleep("nap", "1m")
    return await ctx.step("double", lambda: n * 2)


class Deep(Exception):
    def __init__(self) -> None:
        super().__init__(deep(1000))
        self.details = deep(1000)


@fusee.workflow("poison")
async def poison(ctx: fusee.Ctx, where: str) -> Any:
    if where == "step":
        return await ctx.step("deep", lambda: deep(1000))
    if where == "huge":
        return await ctx.step("huge", lambda: "x" * (17 << 20))
    if where == "result":
        return deep(1000)
    if where == "exception":
        raise Deep()
    if where == "child":
        return await ctx.child(healthy, "kid", deep(1000))
    if where == "sleep":
        await ctx.sleep("forever", 10**20)
    if where == "sleep-text":
        await ctx.sleep("forever", "99999999999999999999d")
    if where == "wait":
        await ctx.wait_for("x", timeout=float("inf"))
    if where == "step-timeout":
        await ctx.step("t", lambda: 1, timeout=10**20)
    return None


@pytest.mark.parametrize(
    ("where", "error", "words"),
    [
        ("step", fusee.StepError, "nests deeper"),
        ("huge", fusee.StepError, "at most 16,777,216 bytes"),
        ("result", fusee.CodecError, "nests deeper"),
        ("exception", fusee.WorkflowError, "cannot be shown"),
        ("child", fusee.CodecError, "nests deeper"),
        ("sleep", fusee.RejectedError, "longer than 10,000 years"),
        ("sleep-text", fusee.RejectedError, "longer than 10,000 years"),
        ("wait", fusee.RejectedError, "not a finite duration"),
        ("step-timeout", fusee.RejectedError, "longer than 10,000 years"),
    ],
)
async def test_a_poison_value_fails_its_run_alone_and_the_engine_goes_on(kit, where, error, words):
    t = await kit(poison, healthy)
    await t.start(healthy, "ok-1", 21)
    await t.start(poison, "bad-1", where)
    with pytest.raises(error) as caught:
        await t.result("bad-1")
    failure = getattr(caught.value, "cause", None)
    assert words in str(caught.value) + (failure.message if failure else "")
    assert await t.result("ok-1") == 42
    await t.start(healthy, "ok-2", 1)
    await t.restart()  # a clean close and a reopen
    await t.crash()
    assert await t.result("ok-2") == 2
    with pytest.raises(error):
        await t.result("bad-1")


@pytest.mark.parametrize(
    "timeout", [10**20, "99999999999999999999d", float("nan"), float("inf"), -1, math.inf]
)
async def test_a_start_with_an_unbounded_timeout_is_refused_recording_nothing(kit, timeout):
    t = await kit(healthy)
    with pytest.raises(fusee.RejectedError, match="timeout"):
        await t.start(healthy, "h-1", 1, timeout=timeout)
    with pytest.raises(fusee.NotFoundError):
        await t.engine.run("h-1").status()
    await t.restart()


@pytest.mark.parametrize("options", [{"initial": 10**20}, {"max": "99999999999999999999d"}, {"attempts": 0}])
def test_a_retry_policy_is_checked_when_it_is_made(options):
    with pytest.raises(fusee.RejectedError, match="Retry"):
        fusee.Retry(**options)


@pytest.mark.parametrize(
    ("wid", "words"),
    [
        (None, "expected a str"),
        (7, "expected a str"),
        ("", "empty"),
        ("a\ud800b", "Unicode"),
        ("x" * 2000, "longer"),
    ],
)
async def test_a_start_with_an_id_that_is_not_a_real_string_is_refused(kit, wid, words):
    t = await kit(healthy)
    with pytest.raises(fusee.RejectedError, match=words):
        await t.start(healthy, wid, 1)
    assert [s async for s in t.engine.list()] == []


async def test_a_start_of_none_is_refused(kit):
    t = await kit(healthy)
    with pytest.raises(fusee.RejectedError, match=r"@fusee\.workflow"):
        await t.start(None, "h-1", 1)  # type: ignore[arg-type]


number = fusee.signal("number", int)


@fusee.workflow("adder")
async def adder(ctx: fusee.Ctx) -> int:
    total = 0
    while True:
        try:
            got = await ctx.wait_for(number)
        except fusee.CodecError:
            continue  # a wrong payload sent under the bare name
        if got == 0:
            return total
        total += got


async def test_a_signal_of_the_wrong_type_is_refused_and_recorded_nowhere(kit):
    t = await kit(adder)
    run = await t.start(adder, "a-1")
    before = len((await run.describe()).journal)
    with pytest.raises(fusee.CodecError):
        await run.signal(number, "three")
    assert len((await run.describe()).journal) == before
    await run.signal(number, 3)
    await t.crash()
    await t.engine.run("a-1").signal(number, 4)
    await t.engine.run("a-1").signal(number, 0)
    assert await t.result("a-1") == 7


async def test_a_wrong_payload_under_the_bare_name_reaches_the_code_as_codec_error(kit):
    t = await kit(adder)
    run = await t.start(adder, "a-1")
    await run.signal("number", "three")  # the caller knows no type: recorded
    await run.signal(number, 5)
    await t.crash()
    await t.engine.run("a-1").signal(number, 0)
    assert await t.result("a-1") == 5


@fusee.workflow("names")
async def names_wf(ctx: fusee.Ctx, which: str) -> Any:
    if which == "step-int":
        return await ctx.step(3, lambda: 1)  # type: ignore[arg-type]
    if which == "step-timeout-0":
        return await ctx.step("s", lambda: 1, timeout=0)
    if which == "sleep-none":
        return await ctx.sleep(None, "1s")  # type: ignore[arg-type]
    if which == "nested":

        async def outer() -> int:
            return await ctx.step("inner", lambda: 1)

        return await ctx.step("outer", outer)
    return None


@pytest.mark.parametrize(
    ("which", "words"),
    [
        ("step-int", "step name: expected a str"),
        ("step-timeout-0", "must be more than 0"),
        ("sleep-none", "sleep name: expected a str"),
        ("nested", "steps do not nest"),
    ],
)
async def test_bad_operation_arguments_fail_the_run_the_same_on_every_storage(kit, which, words):
    t = await kit(names_wf)
    await t.start(names_wf, "n-1", which)
    with pytest.raises(fusee.FuseeError) as caught:
        await t.result("n-1")
    cause = getattr(caught.value, "cause", None)
    assert words in str(caught.value) + str(getattr(cause, "message", "")) + str(
        getattr(getattr(cause, "cause", None), "message", "")
    )
    await t.crash()
    with pytest.raises(type(caught.value)):
        await t.result("n-1")


boom = fusee.query("boom", None, int)


@fusee.workflow("queried")
async def queried(ctx: fusee.Ctx) -> None:
    def fail(_: Any) -> int:
        raise ValueError("the handler broke")

    ctx.on_query(boom, fail)
    await ctx.wait_for("never")


async def test_a_query_handler_failure_reaches_the_caller_as_a_fusee_error(kit):
    t = await kit(queried)
    run = await t.start(queried, "q-1")
    with pytest.raises(fusee.WorkflowError) as caught:
        await run.query(boom)
    assert caught.value.cause is not None and caught.value.cause.message == "the handler broke"
    assert caught.value.cause.type == "ValueError"


def run_child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("where", ["step", "thread-step", "workflow"])
def test_a_keyboard_interrupt_stops_the_process_and_is_never_recorded(tmp_path: Path, where: str) -> None:
    """Only Exception is a step's or a workflow's failure: an interrupt goes up and ends
    the process instead of being journaled as a retryable failure."""
    child = run_child(
        """
        import asyncio, sys, fusee

        def interrupt():
            raise KeyboardInterrupt

        @fusee.workflow("w")
        async def w(ctx):
            if sys.argv[2] == "workflow":
                raise KeyboardInterrupt
            await ctx.step("s", interrupt, thread=sys.argv[2] == "thread-step")

        async def main():
            engine = await fusee.Engine.open(sys.argv[1], workflows=[w], shards=1)
            await engine.start(w, "w-1")
            await asyncio.sleep(5)
            print("still running")

        asyncio.run(main())
        """,
        str(tmp_path / "data"),
        where,
    )
    assert "still running" not in child.stdout
    assert "KeyboardInterrupt" in child.stderr, child.stderr[-2000:]

    async def journal() -> list[R.Rec]:
        t = await TestEngine.open(dir=tmp_path / "data", shards=1)
        try:
            return (await t.engine.run("w-1").describe()).journal
        finally:
            await t.close()

    import asyncio

    records = asyncio.run(journal())
    assert not [r for r in records if isinstance(r, (R.Attempt, R.StepFailed, R.Finished))], records
