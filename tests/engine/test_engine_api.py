"""The engine's public surface: starting runs, typed payloads, ID policies, listing and
describing runs, continue-as-new, combinators, errors and the exported names."""

from __future__ import annotations

import asyncio
import enum
import inspect
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest

import fusee
from fusee.journal import Status

# -- typed payloads -------------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Line:
    sku: str
    qty: int


@dataclass
class Order:
    id: uuid.UUID
    placed: datetime
    color: Color
    lines: list[Line]
    gifts: dict[str, Line]


class Receipt(msgspec.Struct):
    order: uuid.UUID
    total: int
    colors: list[Color]
    at: datetime
    lines: dict[str, Line]


ORDER = Order(
    id=uuid.UUID("12345678-1234-5678-1234-567812345678"),
    placed=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    color=Color.BLUE,
    lines=[Line("apple", 2), Line("pear", 3)],
    gifts={"card": Line("card", 1)},
)

seen_types: list[tuple[type, ...]] = []
calls: list[str] = []


def price(order: Order) -> Line:
    calls.append("price")
    return Line("total", sum(line.qty for line in order.lines))


@fusee.workflow("typed")
async def typed(ctx: fusee.Ctx, order: Order) -> Receipt:
    def priced() -> Line:  # the annotation types the recorded result, live and on replay
        return price(order)

    total = await ctx.step("price", priced)
    seen_types.append(
        (
            type(order),
            type(order.id),
            type(order.placed),
            type(order.color),
            type(order.lines[0]),
            type(order.gifts["card"]),
            type(total),
        )
    )
    await ctx.sleep("settle", "1h")
    return Receipt(order.id, total.qty, [order.color, Color.RED], order.placed, {"first": order.lines[0]})


@fusee.workflow("typed_lists")
async def typed_lists(ctx: fusee.Ctx, colors: list[Color]) -> dict[str, list[uuid.UUID]]:
    seen_types.append(tuple(type(c) for c in colors))
    await ctx.sleep("nap", "1m")
    return {c.value: [uuid.UUID(int=i)] for i, c in enumerate(colors)}


@fusee.workflow("takes_line")
async def takes_line(ctx: fusee.Ctx, line: Line) -> int:
    return line.qty


async def test_start_returns_a_run(kit):
    t = await kit(typed)
    run = await t.engine.start(typed, "r-1", ORDER)
    assert isinstance(run, fusee.Run)
    assert run.id == "r-1"
    assert (await run.status()).status == "running"


async def test_typed_input_and_result_also_after_crash(kit):
    seen_types.clear()
    calls.clear()
    t = await kit(typed)
    await t.start(typed, "typed-1", ORDER)
    await t.settle()
    assert calls == ["price"]
    await t.crash()
    receipt = await t.result("typed-1")
    assert calls == ["price"]  # recorded before the crash: not run again
    assert isinstance(receipt, Receipt)
    assert receipt == Receipt(ORDER.id, 5, [Color.BLUE, Color.RED], ORDER.placed, {"first": Line("apple", 2)})
    assert isinstance(receipt.colors[0], Color) and isinstance(receipt.lines["first"], Line)
    assert isinstance(receipt.order, uuid.UUID) and isinstance(receipt.at, datetime)
    # The code saw typed values live and on replay; the step's result typed by its annotation.
    assert len(seen_types) >= 2
    assert set(seen_types) == {(Order, uuid.UUID, datetime, Color, Line, Line, Line)}
    assert await t.engine.run("typed-1", typed).result() == receipt
    await t.crash()  # a finished run's result decodes to its type too
    assert await t.engine.run("typed-1", typed).result() == receipt
    await t.check()


async def test_typed_lists_and_dicts(kit):
    seen_types.clear()
    t = await kit(typed_lists)
    await t.start(typed_lists, "lists-1", [Color.RED, Color.BLUE])
    await t.settle()
    await t.crash()
    out = await t.result("lists-1")
    assert out == {"red": [uuid.UUID(int=0)], "blue": [uuid.UUID(int=1)]}
    assert all(isinstance(u, uuid.UUID) for ids in out.values() for u in ids)
    assert set(seen_types) == {(Color, Color)}
    await t.check()


async def test_bad_input_is_refused_and_nothing_is_recorded(kit):
    t = await kit(typed, takes_line)
    bad = Order(ORDER.id, ORDER.placed, Color.RED, [Line("apple", 1), Line("pear", "two")], {})  # type: ignore[arg-type]
    with pytest.raises(fusee.CodecError) as caught:
        await t.start(typed, "bad-1", bad)
    assert "$.lines[1].qty" in str(caught.value)
    assert caught.value.code == "Codec"
    with pytest.raises(fusee.CodecError) as caught:
        await t.start(takes_line, "bad-2", {"sku": "a", "qty": "seven"})
    assert "$.qty" in str(caught.value)
    assert [s async for s in t.engine.list()] == []
    for wid in ("bad-1", "bad-2"):
        with pytest.raises(fusee.NotFoundError):
            await t.engine.run(wid).status()
    # The same IDs start with good input, as their first run.
    run = await t.start(typed, "bad-1", ORDER)
    await t.start(takes_line, "bad-2", Line("a", 7))
    assert (await run.status()).run == 1
    assert isinstance(await t.result("bad-1"), Receipt)
    assert await t.result("bad-2") == 7
    await t.check()


# -- registration and unknown types ----------------------------------------------------------


@fusee.workflow("greet")
async def greet(ctx: fusee.Ctx, name: str) -> str:
    return await ctx.step("compose", lambda: f"hello {name}")


@fusee.workflow("greet_twin")
async def greet_twin(ctx: fusee.Ctx, name: str) -> str:
    return name


async def dup_code(ctx: fusee.Ctx) -> int:
    return 2


DUP = fusee.workflow("greet")(dup_code)


async def test_unknown_workflow_lists_types_and_suggests_nearest(kit):
    t = await kit(greet, greet_twin, typed)
    with pytest.raises(fusee.UnknownWorkflowError) as caught:
        await t.engine.start("gret", "u-1", "x")
    message = str(caught.value)
    assert caught.value.code == "UnknownWorkflow"
    for name in ("greet", "greet_twin", "typed"):
        assert name in message
    assert "did you mean 'greet'" in message
    assert [s async for s in t.engine.list()] == []
    # A registered name given as a string works.
    await t.engine.start("greet", "u-1", "ann")
    assert await t.result("u-1") == "hello ann"


async def test_registering_a_type_twice_names_both_places(kit):
    first = f"{__file__}:{inspect.getsourcelines(greet.fn)[1]}"
    second = f"{__file__}:{inspect.getsourcelines(dup_code)[1]}"
    with pytest.raises(fusee.FuseeError) as caught:
        await fusee.Engine.open(workflows=[greet, DUP])
    assert first in str(caught.value) and second in str(caught.value)
    t = await kit(greet)
    t.engine.register(greet)  # the same code again is no conflict
    with pytest.raises(fusee.FuseeError) as caught:
        t.engine.register(DUP)
    assert first in str(caught.value) and second in str(caught.value)
    await t.start(greet, "g-1", "bo")
    assert await t.result("g-1") == "hello bo"  # the first registration stands


# -- a result JSON cannot hold ------------------------------------------------------------------


@fusee.workflow("unencodable")
async def unencodable(ctx: fusee.Ctx) -> object:
    await ctx.step("fine", lambda: 1)
    return object()


async def test_unencodable_result_fails_the_run_with_a_codec_error(kit):
    t = await kit(unencodable)
    await t.start(unencodable, "enc-1")
    with pytest.raises(fusee.CodecError) as caught:
        await t.result("enc-1")
    assert "result" in str(caught.value) and "object" in str(caught.value)
    assert (await t.engine.run("enc-1").status()).status == "failed"
    await t.crash()
    with pytest.raises(fusee.CodecError, match="object"):
        await t.engine.run("enc-1").result()
    await t.check()


# -- ID policies ------------------------------------------------------------------------------

go = fusee.signal("go", str)
policy_calls: list[str] = []


@fusee.workflow("gated")
async def gated(ctx: fusee.Ctx, tag: str) -> str:
    word = await ctx.wait_for(go)
    if word == "fail":
        raise fusee.Fatal("asked to fail")

    def finish() -> str:
        policy_calls.append(tag)
        return f"{tag}:{word}"

    return await ctx.step("finish", finish)


async def _kinds(t, wid: str) -> list[str]:
    return [row["kind"] for row in await t.journal(wid)]


async def test_default_policy_refuses_a_running_id(kit):
    t = await kit(gated)
    await t.start(gated, "p-1", "first")
    await t.settle()
    with pytest.raises(fusee.AlreadyExistsError) as caught:
        await t.start(gated, "p-1", "second")
    assert "'p-1'" in str(caught.value) and "running" in str(caught.value)
    assert caught.value.code == "AlreadyExists"
    assert caught.value.workflow_id == "p-1"
    assert (await _kinds(t, "p-1")).count("Started") == 1


async def test_use_existing_returns_the_running_run(kit):
    policy_calls.clear()
    t = await kit(gated)
    await t.start(gated, "p-2", "first")
    await t.settle()
    run = await t.start(gated, "p-2", "second", id_policy={"running": "use-existing"})
    assert run.id == "p-2"
    await t.crash()
    await t.engine.run("p-2").signal(go, "now")
    assert await t.result("p-2") == "first:now"
    assert policy_calls == ["first"]
    assert (await t.engine.run("p-2").status()).run == 1
    await t.check()


async def test_terminate_existing_replaces_the_run(kit):
    policy_calls.clear()
    t = await kit(gated)
    await t.start(gated, "p-3", "first")
    await t.settle()
    await t.start(gated, "p-3", "second", id_policy={"running": "terminate-existing"})
    await t.settle()
    summary = await t.engine.run("p-3").status()
    assert (summary.run, summary.status) == (2, "running")
    await t.crash()
    await t.engine.run("p-3").signal(go, "now")
    assert await t.result("p-3") == "second:now"
    assert policy_calls == ["second"]  # the replaced run's code never ran on
    await t.check()


async def test_finished_id_allows_a_new_run_by_default(kit):
    t = await kit(gated)
    run = await t.start(gated, "p-4", "first")
    await run.signal(go, "a")
    assert await t.result("p-4") == "first:a"
    await t.start(gated, "p-4", "second")
    await t.settle()
    assert (await t.engine.run("p-4").status()).run == 2
    await t.engine.run("p-4").signal(go, "b")
    assert await t.result("p-4") == "second:b"
    summaries = [s async for s in t.engine.list()]
    assert [(s.id, s.run, s.status) for s in summaries] == [("p-4", 2, "ok")]
    await t.check()


async def test_finished_policies_refuse_and_allow_if_failed(kit):
    t = await kit(gated)
    await (await t.start(gated, "ok-1", "x")).signal(go, "a")
    await (await t.start(gated, "bad-1", "x")).signal(go, "fail")
    assert await t.result("ok-1") == "x:a"
    with pytest.raises(fusee.WorkflowError):
        await t.result("bad-1")
    for wid in ("ok-1", "bad-1"):
        with pytest.raises(fusee.AlreadyExistsError) as caught:
            await t.start(gated, wid, "y", id_policy={"finished": "refuse"})
        assert f"'{wid}'" in str(caught.value)
    with pytest.raises(fusee.AlreadyExistsError, match="'ok-1'"):
        await t.start(gated, "ok-1", "y", id_policy={"finished": "allow-if-failed"})
    assert (await t.engine.run("ok-1").status()).run == 1
    await t.start(gated, "bad-1", "y", id_policy={"finished": "allow-if-failed"})
    assert (await t.engine.run("bad-1").status()).run == 2
    same = await t.start(gated, "ok-1", "z", id_policy={"finished": "use-existing"})
    assert await same.result() == "x:a"
    assert (await same.status()).run == 1
    with pytest.raises(fusee.RejectedError):
        await t.start(gated, "ok-2", "y", id_policy={"finished": "sometimes"})
    await t.check()


# -- listing, status, describe ------------------------------------------------------------------


@fusee.workflow("stepper")
async def stepper(ctx: fusee.Ctx, n: int) -> int:
    value = await ctx.step("double", lambda: n * 2)
    await ctx.sleep("rest", "10m")
    if n < 0:
        raise fusee.Fatal("negative")
    return value


async def test_list_filters_by_type_and_status(kit):
    t = await kit(stepper, gated)
    await t.start(stepper, "s-ok", 1)
    await t.start(stepper, "s-bad", -1)
    await t.start(gated, "g-wait", "x")
    await t.result("s-ok")
    with pytest.raises(fusee.WorkflowError):
        await t.result("s-bad")

    async def ids(**filters) -> set[str]:
        return {s.id async for s in t.engine.list(**filters)}

    assert await ids() == {"s-ok", "s-bad", "g-wait"}
    assert await ids(type="stepper") == {"s-ok", "s-bad"}
    assert await ids(type="gated") == {"g-wait"}
    assert await ids(status="ok") == {"s-ok"}
    assert await ids(status="failed") == {"s-bad"}
    assert await ids(status="running") == {"g-wait"}
    assert await ids(type="gated", status="ok") == set()
    assert await ids(type="nope") == set()
    await t.crash()
    assert await ids(type="stepper", status="failed") == {"s-bad"}
    assert await ids(status="running") == {"g-wait"}


async def test_list_refuses_a_status_no_run_is_listed_with(kit):
    """A misspelt filter ("completed" for "ok") would list nothing, read as "no such runs"."""
    t = await kit(stepper)
    await t.start(stepper, "s-ok", 1)
    await t.result("s-ok")
    valid = (
        "running, paused, waiting_for_code, stuck, ok, failed, cancelled, timed_out, terminated, continued"
    )
    for wrong in ("completed", "bogus", "parked", "active", 3):
        with pytest.raises(
            fusee.RejectedError, match=f"list\\(status={wrong!r}\\).*expected one of {valid}$"
        ):
            [s async for s in t.engine.list(status=wrong)]
    listed = [s async for s in t.engine.list(status=Status.OK)]
    assert [(s.id, s.status) for s in listed] == [("s-ok", "ok")]
    assert type(listed[0].status) is Status


async def test_status_and_describe(kit):
    t = await kit(stepper)
    run = await t.start(stepper, "d-1", 4)
    await t.settle()
    summary = await run.status()
    assert isinstance(summary, fusee.RunSummary)
    assert (summary.id, summary.run, summary.type, summary.status) == ("d-1", 1, "stepper", "running")
    assert summary.shard == t.engine.shard_of("d-1").index
    described = await run.describe()
    assert isinstance(described, fusee.RunDescription)
    assert [type(r).__name__ for r in described.journal] == ["Started", "StepDone", "TimerStarted"]
    assert await t.result("d-1") == 8
    await t.crash()
    described = await t.engine.run("d-1").describe()
    assert described.summary.status == "ok"
    assert [type(r).__name__ for r in described.journal] == [
        "Started",
        "StepDone",
        "TimerStarted",
        "TimerFired",
        "Finished",
    ]
    with pytest.raises(fusee.NotFoundError) as caught:
        await t.engine.run("nobody").describe()
    assert caught.value.code == "NotFound"
    await t.check()


async def test_closed_engine_refuses_calls(kit):
    t = await kit(stepper)
    run = await t.start(stepper, "c-1", 1)
    await t.close()
    with pytest.raises(fusee.ClosedError) as caught:
        await t.engine.start(stepper, "c-2", 1)
    assert caught.value.code == "Closed"
    with pytest.raises(fusee.ClosedError):
        await run.status()


async def test_async_with_engine_open():
    async with await fusee.Engine.open(workflows=[greet], shards=2) as engine:
        run = await engine.start(greet, "w-1", "cy")
        assert await run.result() == "hello cy"
        assert [s.status async for s in engine.list()] == ["ok"]
    assert engine.closed
    with pytest.raises(fusee.ClosedError):
        await engine.start(greet, "w-2", "dee")


# -- continue-as-new ----------------------------------------------------------------------------

loop_calls: list[int] = []


@fusee.workflow("looper")
async def looper(ctx: fusee.Ctx, n: int) -> dict[str, int]:
    def work() -> int:
        loop_calls.append(n)
        return n

    await ctx.step("work", work)
    await ctx.sleep("between", "1m")
    if n < 3:
        ctx.continue_as_new(n + 1)
    return {"n": n, "size": ctx.journal_size()}


async def test_continue_as_new_keeps_the_id_and_starts_a_fresh_journal(kit):
    loop_calls.clear()
    t = await kit(looper)
    await t.start(looper, "loop-1", 1)
    await t.settle()
    await t.advance("1m")
    await t.crash()
    assert await t.result("loop-1") == {"n": 3, "size": 2}
    assert await t.engine.run("loop-1").result() == {"n": 3, "size": 2}
    assert loop_calls == [1, 2, 3]  # each run's step once, across the crash
    described = await t.engine.run("loop-1").describe()
    assert described.summary.run == 3
    rows = await t.journal("loop-1")
    assert [row["kind"] for row in rows] == ["Started", "StepDone", "TimerStarted", "TimerFired", "Finished"]
    assert rows[0]["input"] == 3
    assert [s.id async for s in t.engine.list()] == ["loop-1"]
    await t.check()


@fusee.workflow("numbered")
async def numbered(ctx: fusee.Ctx, n: int) -> list[int]:
    await ctx.sleep("tick", "1s")
    if n < 2:
        ctx.continue_as_new(n + 1)
    return [n, ctx.run_number]


async def test_check_replays_a_continued_run_under_its_run_number(kit):
    t = await kit(numbered)
    await t.start(numbered, "num-1", 1)
    assert await t.result("num-1") == [2, 2]
    await t.crash()  # recovery replays run 2 as run 2
    assert await t.engine.run("num-1").result() == [2, 2]
    await t.check()  # so does strict replay


# -- combinators ----------------------------------------------------------------------------------

combo_calls: list[str] = []


@fusee.workflow("combos")
async def combos(ctx: fusee.Ctx) -> dict[str, object]:
    def counted(name: str, value: object):
        def fn() -> object:
            combo_calls.append(name)
            return value

        return fn

    both = await ctx.all([ctx.step("a", counted("a", 1)), ctx.step("b", counted("b", 2))])

    async def slow() -> str:
        combo_calls.append("slow")
        await asyncio.Event().wait()
        return "slow"

    first = await ctx.race([ctx.step("fast", counted("fast", "fast")), ctx.step("slow", slow)])
    word = await ctx.wait_for(go)
    return {"all": both, "race": first, "word": word}


async def test_all_and_race_of_steps(kit):
    combo_calls.clear()
    t = await kit(combos)
    await t.start(combos, "combo-1")
    await t.settle()
    assert sorted(c for c in combo_calls if c != "slow") == ["a", "b", "fast"]
    await t.crash()
    await t.engine.run("combo-1").signal(go, "done")
    assert await t.result("combo-1") == {"all": [1, 2], "race": "fast", "word": "done"}
    assert sorted(c for c in combo_calls if c != "slow") == ["a", "b", "fast"]
    assert await t.steps("combo-1") == ["a", "b", "fast"]
    rows = await t.journal("combo-1")
    assert [(r["name"], r["seq"]) for r in rows if r["kind"] == "StepDone"] == [
        ("a", 0),
        ("b", 1),
        ("fast", 2),
    ]
    await t.check()


@fusee.workflow("awaits_asyncio")
async def awaits_asyncio(ctx: fusee.Ctx) -> str:
    await ctx.step("before", lambda: 1)
    await asyncio.sleep(0)
    return "unreachable"


async def test_awaiting_a_non_ctx_awaitable_fails_the_run(kit):
    t = await kit(awaits_asyncio)
    await t.start(awaits_asyncio, "aw-1")
    with pytest.raises(fusee.FuseeError) as caught:
        await t.result("aw-1")
    assert "step" in str(caught.value) and "ctx" in str(caught.value)
    assert "put other awaits in a step" in str(caught.value)
    assert (await t.engine.run("aw-1").status()).status == "failed"
    await t.check()


# -- errors and names ---------------------------------------------------------------------------

CODES = {
    fusee.NotFoundError: "NotFound",
    fusee.AlreadyExistsError: "AlreadyExists",
    fusee.UnknownWorkflowError: "UnknownWorkflow",
    fusee.StepError: "StepFailed",
    fusee.WorkflowError: "WorkflowFailed",
    fusee.ChildError: "ChildFailed",
    fusee.CancelledError: "Cancelled",
    fusee.TimeoutError: "TimedOut",
    fusee.TerminatedError: "Terminated",
    fusee.DeterminismError: "Determinism",
    fusee.RejectedError: "Rejected",
    fusee.StaleVersionError: "StaleVersion",
    fusee.CodecError: "Codec",
    fusee.ConnectionError: "Connection",
    fusee.IoError: "Io",
    fusee.LeaseLostError: "LeaseLost",
    fusee.NoHolderError: "NoHolder",
    fusee.BusyError: "Busy",
    fusee.ClosedError: "Closed",
}


def _instance(cls: type[fusee.FuseeError]) -> fusee.FuseeError:
    cause = fusee.Failure("boom")
    if cls is fusee.StepError:
        return cls("charge", cause)
    if cls is fusee.ChildError:
        return cls("child-1", cause)
    if cls is fusee.WorkflowError:
        return cls(cause)
    return cls("boom")


@pytest.mark.parametrize("cls", list(CODES), ids=lambda c: c.__name__)
def test_every_error_has_code_and_docs(cls):
    error = _instance(cls)
    assert isinstance(error, fusee.FuseeError)
    assert error.code == CODES[cls]
    assert error.docs == "docs/errors.md#" + CODES[cls].lower()
    page = (Path(__file__).resolve().parents[2] / "docs" / "errors.md").read_text()
    assert f"\n## {CODES[cls].lower()}\n" in page, f"docs/errors.md has no section for {CODES[cls]}"


def test_public_names_are_pinned():
    pinned = """
        AesGcm AlreadyExistsError BusyError CancelledError ChildError ChildHandle Client ClosedError CodecError
        Completion Concurrency ConnectionError Ctx DeterminismError Durability Engine Failure Fatal FuseeError
        IoError LeaseLostError NoHolderError NotFoundError ObjectCtx ObjectRef ObjectType Query RejectedError Replayer Retry Run RunDescription RunSummary
        ScheduleHandle ScheduleSpec Signal StaleVersionError State StepContext StepError SystemClock TerminatedError TimeoutError UnknownWorkflowError Update
        VirtualClock Workflow WorkflowError aes_gcm as_requester invocation_handler object open_telemetry query shared signal update workflow
    """.split()
    assert sorted(fusee.__all__) == pinned
    namespace: dict[str, object] = {}
    exec(f"from fusee import {', '.join(fusee.__all__)}", namespace)
    for name in fusee.__all__:
        assert namespace[name] is getattr(fusee, name)
