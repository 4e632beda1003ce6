"""Traces (docs/telemetry.md) on the test kit: a run joins the trace of the span that
started it, with a `fusee.workflow` span per stretch of its life in a process and a
`fusee.step` span per attempt below it; replayed steps make none; children and
continue-as-new keep the trace; with telemetry off nothing of opentelemetry is imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import fusee


class Traces:
    """A tracer provider of the test's own, its finished spans kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")
        self.telemetry = fusee.open_telemetry(self.provider)

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if name is None or s.name == name]

    def steps(self) -> list[tuple[str, int]]:
        return [
            (s.attributes["fusee.step.name"], s.attributes["fusee.step.attempt"])
            for s in self.spans("fusee.step")
        ]  # type: ignore[index,misc]


@pytest.fixture
def traces() -> Iterator[Traces]:
    found = Traces()
    yield found
    found.provider.shutdown()


def _parent(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


flaky_calls: dict[str, int] = {}


def _flaky(key: str) -> str:
    flaky_calls[key] = flaky_calls.get(key, 0) + 1
    if flaky_calls[key] == 1:
        raise ValueError("the card was declined")
    return "charged"


@fusee.workflow("traced-pay")
async def pay(ctx: fusee.Ctx, order: str) -> list[Any]:
    quote = await ctx.step("quote", lambda: 42)
    charge = await ctx.step("charge", lambda: _flaky(order), retry=fusee.Retry(attempts=3, initial="1s"))
    return [quote, charge, ctx.traceparent()]


async def test_a_run_joins_the_trace_of_the_span_that_started_it(kit, traces):
    flaky_calls.clear()
    t = await kit(pay, telemetry=traces.telemetry)
    with traces.tracer.start_as_current_span("checkout request") as request:
        await t.start(pay, "order-1", "order-1")
    quote, charge, recorded = await t.result("order-1")
    assert (quote, charge) == (42, "charged")
    context = request.get_span_context()
    assert recorded.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")

    [workflow] = traces.spans("fusee.workflow")
    steps = traces.spans("fusee.step")
    assert {s.context.trace_id for s in [workflow, *steps]} == {context.trace_id}
    assert _parent(workflow) == context.span_id
    assert all(_parent(s) == workflow.context.span_id for s in steps)
    assert traces.steps() == [("quote", 1), ("charge", 1), ("charge", 2)]
    assert workflow.attributes == {
        "fusee.workflow.id": "order-1",
        "fusee.workflow.type": "traced-pay",
        "fusee.workflow.run": 1,
        "fusee.shard": t.engine.shard_index("order-1"),
        "fusee.workflow.status": "ok",
    }
    failed, retried = steps[1], steps[2]
    assert failed.attributes is not None and failed.attributes["fusee.step.position"] == 1
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: the card was declined"
    assert [event.name for event in failed.events] == ["exception"]
    assert retried.status.status_code is StatusCode.UNSET
    assert workflow.status.status_code is StatusCode.UNSET


@fusee.workflow("traced-fails")
async def fails(ctx: fusee.Ctx, _: None) -> None:
    await ctx.step("doomed", lambda: 1 / 0, retry=fusee.Retry(attempts=1))


async def test_a_failed_run_ends_its_span_with_an_error(kit, traces):
    t = await kit(fails, telemetry=traces.telemetry)
    await t.start(fails, "doomed-1")  # no active span: a root span, nothing recorded
    with pytest.raises(fusee.StepError):
        await t.result("doomed-1")
    [workflow] = traces.spans("fusee.workflow")
    assert workflow.parent is None
    assert workflow.status.status_code is StatusCode.ERROR
    assert workflow.attributes is not None and workflow.attributes["fusee.workflow.status"] == "failed"
    [step] = traces.spans("fusee.step")
    assert step.status.status_code is StatusCode.ERROR
    assert (await t.journal("doomed-1"))[0].get("traceparent") is None


async def test_a_step_function_runs_under_its_attempts_span(kit, traces):
    inner: list[Any] = []

    async def call_out() -> str:
        with traces.tracer.start_as_current_span("http call") as span:
            inner.append(span)
        return "done"

    def on_thread() -> str:
        with traces.tracer.start_as_current_span("thread call"):
            return "done"

    @fusee.workflow("traced-nesting")
    async def nesting(ctx: fusee.Ctx, _: None) -> list[str]:
        return [
            await ctx.step("async", call_out),
            await ctx.step("thread", on_thread, thread=True),
            await ctx.step("inline", lambda: on_thread()),
        ]

    t = await kit(nesting, telemetry=traces.telemetry)
    await t.start(nesting, "nest-1")
    assert await t.result("nest-1") == ["done"] * 3
    steps = {s.attributes["fusee.step.name"]: s for s in traces.spans("fusee.step")}  # type: ignore[index]
    calls = traces.spans("http call") + traces.spans("thread call")
    assert [_parent(call) for call in calls] == [
        steps["async"].context.span_id,
        steps["thread"].context.span_id,
        steps["inline"].context.span_id,
    ]


@fusee.workflow("traced-sleeper")
async def sleeper(ctx: fusee.Ctx, _: None) -> str:
    await ctx.step("before", lambda: 1)
    await ctx.sleep("nap", "1h")
    return await ctx.step("after", lambda: "woke")


async def test_after_a_crash_the_run_continues_its_trace_and_replays_no_step(kit, traces):
    t = await kit(sleeper, telemetry=traces.telemetry)
    with traces.tracer.start_as_current_span("request") as request:
        await t.start(sleeper, "nap-1")
    await t.settle()
    await t.crash()
    assert await t.result("nap-1") == "woke"
    # One span before the crash, one for the code that resumed after it, and one each
    # time the run was loaded again after parking for its hour's sleep.
    workflows = traces.spans("fusee.workflow")
    assert len(workflows) >= 2
    assert {w.context.trace_id for w in workflows} == {request.get_span_context().trace_id}
    assert {_parent(w) for w in workflows} == {request.get_span_context().span_id}
    statuses = [w.attributes["fusee.workflow.status"] for w in workflows]  # type: ignore[index]
    assert statuses[-1] == "ok" and "ok" not in statuses[:-1]
    assert traces.steps() == [("before", 1), ("after", 1)]  # the replayed "before" made none
    after = traces.spans("fusee.step")[1]
    assert _parent(after) == workflows[-1].context.span_id


@fusee.workflow("traced-child")
async def child(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("double", lambda: n * 2)


@fusee.workflow("traced-parent")
async def parent(ctx: fusee.Ctx, rounds: int) -> int:
    value = await ctx.child(child, f"{ctx.workflow_id}-kid-{rounds}", rounds)
    if rounds > 1:
        ctx.continue_as_new(rounds - 1)
    return value


async def test_children_and_continue_as_new_keep_the_trace(kit, traces):
    t = await kit(parent, child, telemetry=traces.telemetry)
    with traces.tracer.start_as_current_span("request") as request:
        await t.start(parent, "family-1", 2)
    assert await t.result("family-1") == 2
    trace_id = request.get_span_context().trace_id
    workflows = traces.spans("fusee.workflow")
    assert sorted(w.attributes["fusee.workflow.id"] for w in workflows) == [  # type: ignore[index]
        "family-1",
        "family-1",
        "family-1-kid-1",
        "family-1-kid-2",
    ]
    assert {w.context.trace_id for w in workflows} == {trace_id}
    runs = {(w.attributes["fusee.workflow.id"], w.attributes["fusee.workflow.run"]): w for w in workflows}  # type: ignore[index]
    assert _parent(runs[("family-1", 2)]) == request.get_span_context().span_id  # continue-as-new
    # A child's span is below its parent run's span in this process.
    assert _parent(runs[("family-1-kid-2", 1)]) == runs[("family-1", 1)].context.span_id
    assert _parent(runs[("family-1-kid-1", 1)]) == runs[("family-1", 2)].context.span_id


async def test_a_start_takes_a_traceparent_given_and_refuses_a_malformed_one(kit):
    t = await kit(pay)  # telemetry off: a given traceparent is still recorded
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await t.start(pay, "given-1", "given-1", traceparent=given)
    assert (await t.result("given-1"))[2] == given
    assert (await t.journal("given-1"))[0]["traceparent"] == given
    for bad in ["", "00-abc-def-01", given.upper(), given + "-", 7]:
        with pytest.raises(fusee.RejectedError, match="traceparent"):
            await t.start(pay, "bad-1", "bad-1", traceparent=bad)


def test_without_telemetry_import_fusee_imports_no_opentelemetry():
    """In a fresh interpreter: `import fusee` and a whole run on an engine without
    telemetry load no opentelemetry module."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        import fusee

        @fusee.workflow("plain")
        async def plain(ctx, n):
            return await ctx.step("one", lambda: n + 1)

        async def main():
            async with await fusee.Engine.open(workflows=[plain]) as engine:
                run = await engine.start(plain, "p-1", 1)
                assert await run.result() == 2
            assert "opentelemetry" not in sys.modules
            fusee.open_telemetry  # asking for it is what loads it
            assert "opentelemetry" in sys.modules

        asyncio.run(main())
        print([m for m in sys.modules if m.startswith("opentelemetry")][:1])
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['opentelemetry']"
