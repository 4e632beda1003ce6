"""Steps: recorded results, no re-execution after a crash, the step context, retries and
their policies, timeouts, codec failures, typed results and mocks."""

from __future__ import annotations

import asyncio
import itertools
import threading
from dataclasses import dataclass
from typing import Any

import pytest

import fusee
from tests.support.waiting import eventually


async def eventually_steps(t: Any, wid: str, attempts: int) -> None:
    """Wait (real time, the virtual clock stays) until `attempts` Attempt records exist."""

    async def enough() -> bool:
        await t.settle()
        rows = await t.journal(wid)
        return sum(1 for row in rows if row["kind"] == "Attempt") >= attempts

    await eventually(enough)


async def _steps_are(t: Any, wid: str, names: list[str]) -> bool:
    await t.settle()
    return await t.steps(wid) == names


# -- results are recorded and not run again ----------------------------------------------


async def test_step_result_is_recorded_and_returned(kit):
    calls: list[int] = []

    @fusee.workflow("steps-basic")
    async def wf(ctx, n: int) -> int:
        def double() -> int:
            calls.append(n)
            return n * 2

        doubled = await ctx.step("double", double)
        plus = await ctx.step("plus", lambda: doubled + 1)
        return plus

    t = await kit(wf)
    await t.start(wf, "basic-1", 20)
    assert await t.result("basic-1") == 41
    assert calls == [20]
    assert await t.steps("basic-1") == ["double", "plus"]
    done = [row for row in await t.journal("basic-1") if row["kind"] == "StepDone"]
    assert [row["value"] for row in done] == [40, 41]
    await t.check()


@pytest.mark.parametrize("kind", ["sync", "async", "thread"])
async def test_recorded_step_does_not_run_again_after_crash(kit, kind):
    calls: list[str] = []
    threads: list[bool] = []

    def sync_fn() -> str:
        calls.append(kind)
        threads.append(threading.current_thread() is threading.main_thread())
        return f"made by {kind}"

    async def async_fn() -> str:
        await asyncio.sleep(0)
        calls.append(kind)
        return f"made by {kind}"

    @fusee.workflow(f"steps-crash-{kind}")
    async def wf(ctx) -> list[str]:
        if kind == "async":
            made = await ctx.step("make", async_fn)
        else:
            made = await ctx.step("make", sync_fn, thread=kind == "thread")
        await ctx.sleep("pause", "10m")
        return [made, "after"]

    t = await kit(wf)
    await t.start(wf, "crash-1")
    await eventually(lambda: _steps_are(t, "crash-1", ["make"]))
    await t.crash()
    assert await t.result("crash-1") == [f"made by {kind}", "after"]
    assert calls == [kind]
    if kind == "thread":
        assert threads == [False]
    elif kind == "sync":
        assert threads == [True]
    assert await t.steps("crash-1") == ["make"]
    await t.check()


# -- the step context -------------------------------------------------------------------


async def test_step_context_key_stable_and_attempts_count(kit):
    seen: list[tuple[str, int]] = []

    @fusee.workflow("steps-context")
    async def wf(ctx) -> int:
        def flaky(s: fusee.StepContext) -> int:
            seen.append((s.key, s.attempt))
            if s.attempt < 3:
                raise ConnectionResetError(f"attempt {s.attempt} lost")
            return s.attempt

        first = await ctx.step("flaky", flaky)
        other = await ctx.step("other", lambda s: s.key)
        return first if other != seen[0][0] else -1

    t = await kit(wf)
    await t.start(wf, "ctx-1")
    assert await t.result("ctx-1") == 3
    assert [attempt for _, attempt in seen] == [1, 2, 3]
    assert len({key for key, _ in seen}) == 1
    await t.check()


async def test_retry_after_crash_continues_attempt_numbers(kit):
    seen: list[tuple[str, int]] = []

    @fusee.workflow("steps-retry-crash")
    async def wf(ctx) -> str:
        def flaky(s: fusee.StepContext) -> str:
            seen.append((s.key, s.attempt))
            if s.attempt == 1:
                raise TimeoutError("upstream slow")
            return f"ok on {s.attempt}"

        return await ctx.step("flaky", flaky)

    t = await kit(wf)
    await t.start(wf, "rc-1")
    await t.settle()
    rows = await t.journal("rc-1")
    attempts = [row for row in rows if row["kind"] == "Attempt"]
    assert len(attempts) == 1 and attempts[0]["attempt"] == 1
    assert attempts[0]["failure"]["type"] == "TimeoutError"
    assert len(seen) == 1

    await t.crash()
    # wait_real_s: the retry waits on the virtual clock; no step function runs meanwhile.
    assert await t.result("rc-1", wait_real_s=2) == "ok on 2"
    assert [attempt for _, attempt in seen] == [1, 2]
    assert seen[0][0] == seen[1][0]
    kinds = [row["kind"] for row in await t.journal("rc-1")]
    assert kinds.count("Attempt") == 1 and kinds.count("StepDone") == 1
    await t.check()


@pytest.mark.parametrize("kind", ["sync", "async", "thread"])
async def test_ctx_key_inside_step_matches_step_context(kit, kind):
    keys: list[tuple[str, str]] = []

    @fusee.workflow(f"steps-key-{kind}")
    async def wf(ctx) -> str:
        def sync_fn(s: fusee.StepContext) -> str:
            keys.append((ctx.key(), s.key))
            if s.attempt == 1:
                raise RuntimeError("again")
            return ctx.key()

        async def async_fn(s: fusee.StepContext) -> str:
            await asyncio.sleep(0)
            keys.append((ctx.key(), s.key))
            if s.attempt == 1:
                raise RuntimeError("again")
            return ctx.key()

        fn = async_fn if kind == "async" else sync_fn
        return await ctx.step("keyed", fn, thread=kind == "thread")

    t = await kit(wf)
    await t.start(wf, "key-1")
    key = await t.result("key-1")
    assert len(keys) == 2
    assert all(inner == outer == key for inner, outer in keys)
    assert "key-1" in key
    await t.crash()
    assert await t.result("key-1") == key
    assert len(keys) == 2
    await t.check()


async def test_ctx_key_outside_a_step_raises(kit):
    @fusee.workflow("steps-key-outside")
    async def wf(ctx) -> str:
        try:
            ctx.key()
        except fusee.RejectedError as error:
            return f"{error.code}: {error}"
        return "no error"

    t = await kit(wf)
    await t.start(wf, "key-out")
    text = await t.result("key-out")
    assert text.startswith("Rejected: ")
    assert "outside a step" in text
    await t.check()


# -- retry policies ----------------------------------------------------------------------


async def test_default_policy_three_attempts_then_step_error(kit):
    calls: list[int] = []  # the virtual time of each attempt

    @fusee.workflow("steps-default-retry")
    async def wf(ctx) -> str:
        def failing() -> str:
            calls.append(t.now_ms())
            raise ValueError(f"boom {len(calls)}")

        return await ctx.step("failing", failing)

    t = await kit(wf)
    await t.start(wf, "dr-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("dr-1")
    error = info.value
    assert error.step == "failing"
    assert error.code == "StepFailed"
    assert error.cause.type == "ValueError"
    assert error.cause.message == "boom 3"
    assert len(calls) == 3

    attempts = [row for row in await t.journal("dr-1") if row["kind"] == "Attempt"]
    assert [row["attempt"] for row in attempts] == [1, 2]
    assert [row["failure"]["message"] for row in attempts] == ["boom 1", "boom 2"]
    first_delay = attempts[0]["retry_at"] - calls[0]
    second_delay = attempts[1]["retry_at"] - calls[1]
    assert 50 <= first_delay <= 100
    assert 100 <= second_delay <= 200
    # Each retry ran when its recorded time came, not before.
    assert calls[1] == attempts[0]["retry_at"]
    assert calls[2] == attempts[1]["retry_at"]
    await t.check()


async def test_retry_attempts_five(kit):
    calls: list[int] = []

    @fusee.workflow("steps-retry-five")
    async def wf(ctx) -> int:
        def flaky(s: fusee.StepContext) -> int:
            calls.append(s.attempt)
            if s.attempt < 5:
                raise OSError("not yet")
            return s.attempt

        return await ctx.step("flaky", flaky, retry=fusee.Retry(attempts=5))

    @fusee.workflow("steps-retry-five-fail")
    async def wf_fail(ctx) -> None:
        def never(s: fusee.StepContext) -> None:
            calls.append(-s.attempt)
            raise OSError("never")

        await ctx.step("never", never, retry=fusee.Retry(attempts=5, jitter=False))

    t = await kit(wf, wf_fail)
    await t.start(wf, "five-1")
    assert await t.result("five-1") == 5
    assert calls == [1, 2, 3, 4, 5]

    calls.clear()
    await t.start(wf_fail, "five-2")
    with pytest.raises(fusee.StepError):
        await t.result("five-2")
    assert calls == [-1, -2, -3, -4, -5]
    attempts = [row for row in await t.journal("five-2") if row["kind"] == "Attempt"]
    gaps = [b["retry_at"] - a["retry_at"] for a, b in itertools.pairwise(attempts)]
    assert gaps == [200, 400, 800]  # no jitter: 100, 200, 400, 800 after each failure
    await t.check()


class CardDeclined(fusee.Fatal):
    pass


async def test_fatal_is_not_retried_and_carries_code_and_details(kit):
    calls: list[int] = []

    @fusee.workflow("steps-fatal")
    async def wf(ctx) -> None:
        def charge() -> None:
            calls.append(1)
            raise CardDeclined("card declined", code="card_declined", details={"limit": 100})

        await ctx.step("charge", charge, retry=fusee.Retry(attempts=5))
        await ctx.step("unreached", lambda: calls.append(99))

    t = await kit(wf)
    await t.start(wf, "fatal-1")
    await t.settle()
    await t.crash()
    with pytest.raises(fusee.StepError) as info:
        await t.result("fatal-1")
    error = info.value
    assert error.step == "charge"
    assert error.cause.type == "CardDeclined"
    assert error.cause.code == "card_declined"
    assert error.cause.details == {"limit": 100}
    assert error.cause.message == "card declined"
    assert calls == [1]
    kinds = [row["kind"] for row in await t.journal("fatal-1")]
    assert "Attempt" not in kinds and "StepFailed" in kinds
    await t.check()


class NotWorthRetrying(Exception):
    retryable = False


class Throttled(Exception):
    pass


class Throttled2(Throttled):
    pass


class RootCause(Exception):
    pass


def _wrapped() -> Exception:
    error = RuntimeError("wrapped")
    error.__cause__ = RootCause("deep down")
    return error


FINAL_CASES = [
    ("retryable-false", fusee.Retry(attempts=4), lambda: NotWorthRetrying("no"), "NotWorthRetrying"),
    ("by-class", fusee.Retry(attempts=4, non_retryable=(Throttled,)), lambda: Throttled("slow"), "Throttled"),
    (
        "by-subclass",
        fusee.Retry(attempts=4, non_retryable=(Throttled,)),
        lambda: Throttled2("slow"),
        "Throttled2",
    ),
    (
        "by-name",
        fusee.Retry(attempts=4, non_retryable=("Throttled",)),
        lambda: Throttled("slow"),
        "Throttled",
    ),
    ("cause-by-name", fusee.Retry(attempts=4, non_retryable=("RootCause",)), _wrapped, "RuntimeError"),
    ("cause-by-class", fusee.Retry(attempts=4, non_retryable=(RootCause,)), _wrapped, "RuntimeError"),
    (
        "retry-if-false",
        fusee.Retry(attempts=4, retry_if=lambda failure, attempt: False),
        lambda: OSError("flaky"),
        "OSError",
    ),
]


@pytest.mark.parametrize(
    ("case", "policy", "make_error", "expected_type"), FINAL_CASES, ids=[case[0] for case in FINAL_CASES]
)
async def test_final_failures_are_not_retried(kit, case, policy, make_error, expected_type):
    calls: list[int] = []

    @fusee.workflow(f"steps-final-{case}")
    async def wf(ctx) -> None:
        def fn() -> None:
            calls.append(1)
            raise make_error()

        await ctx.step("fn", fn, retry=policy)

    t = await kit(wf)
    await t.start(wf, "final-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("final-1")
    assert info.value.cause.type == expected_type
    assert calls == [1]
    assert "Attempt" not in [row["kind"] for row in await t.journal("final-1")]
    await t.check()


async def test_other_types_still_retried_with_non_retryable(kit):
    calls: list[int] = []

    @fusee.workflow("steps-non-retryable-other")
    async def wf(ctx) -> int:
        def fn(s: fusee.StepContext) -> int:
            calls.append(s.attempt)
            if s.attempt < 3:
                raise OSError("transient")
            return s.attempt

        return await ctx.step("fn", fn, retry=fusee.Retry(non_retryable=(Throttled, "CardDeclined")))

    t = await kit(wf)
    await t.start(wf, "nr-other")
    assert await t.result("nr-other") == 3
    assert calls == [1, 2, 3]


async def test_retry_if_sees_failure_and_attempt(kit):
    asked: list[tuple[str | None, str, int]] = []

    def retry_if(failure: fusee.Failure, attempt: int) -> bool:
        asked.append((failure.type, failure.message, attempt))
        return attempt < 2

    @fusee.workflow("steps-retry-if")
    async def wf(ctx) -> None:
        def fn(s: fusee.StepContext) -> None:
            raise LookupError(f"missing {s.attempt}")

        await ctx.step("fn", fn, retry=fusee.Retry(attempts=5, retry_if=retry_if))

    t = await kit(wf)
    await t.start(wf, "rif-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("rif-1")
    assert info.value.cause.message == "missing 2"
    assert asked == [("LookupError", "missing 1", 1), ("LookupError", "missing 2", 2)]


async def test_max_elapsed_stops_retries(kit):
    calls: list[int] = []

    @fusee.workflow("steps-max-elapsed")
    async def wf(ctx) -> None:
        def fn() -> None:
            calls.append(t.now_ms())
            raise OSError("down")

        # Without jitter: retries 100 ms and 200 ms after a failure; the second retry would
        # start 300 ms after the first failure, past max_elapsed.
        policy = fusee.Retry(attempts=10, initial=100, jitter=False, max_elapsed=250)
        await ctx.step("fn", fn, retry=policy)

    t = await kit(wf)
    await t.start(wf, "me-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("me-1")
    assert info.value.cause.type == "OSError"
    assert len(calls) == 2
    assert calls[1] - calls[0] == 100


# -- timeouts, codec failures, read-only, typed results ----------------------------------


async def test_step_timeout_is_retried_then_fails_timed_out(kit):
    calls: list[int] = []

    @fusee.workflow("steps-timeout")
    async def wf(ctx) -> str:
        async def hangs(s: fusee.StepContext) -> str:
            calls.append(s.attempt)
            await asyncio.Event().wait()
            return "never"

        return await ctx.step("hangs", hangs, timeout="20ms")

    t = await kit(wf)
    await t.start(wf, "to-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("to-1")
    assert info.value.cause.type == "TimedOut"
    assert "20 ms" in info.value.cause.message
    assert calls == [1, 2, 3]
    attempts = [row for row in await t.journal("to-1") if row["kind"] == "Attempt"]
    assert [row["failure"]["type"] for row in attempts] == ["TimedOut", "TimedOut"]
    await t.check()


async def test_unencodable_result_is_a_codec_failure_not_retried(kit):
    calls: list[int] = []

    @fusee.workflow("steps-codec")
    async def wf(ctx) -> None:
        def fn() -> dict[str, Any]:
            calls.append(1)
            return {"items": [1, object(), 3]}

        await ctx.step("fn", fn, retry=fusee.Retry(attempts=5))

    t = await kit(wf)
    await t.start(wf, "codec-1")
    with pytest.raises(fusee.StepError) as info:
        await t.result("codec-1")
    cause = info.value.cause
    assert cause.type == "Codec"
    assert "$.items[1]" in cause.message
    assert calls == [1]
    assert "Attempt" not in [row["kind"] for row in await t.journal("codec-1")]
    await t.check()


async def test_read_only_step_runs_and_records(kit):
    calls: list[int] = []

    @fusee.workflow("steps-read-only")
    async def wf(ctx) -> int:
        def look() -> int:
            calls.append(1)
            return 7

        seen = await ctx.step("look", look, read_only=True)
        await ctx.sleep("pause", "1h")
        return seen * 6

    t = await kit(wf)
    await t.start(wf, "ro-1")
    await t.settle()
    assert await t.steps("ro-1") == ["look"]
    await t.crash()
    assert await t.result("ro-1") == 42
    assert calls == [1]
    await t.check()


@dataclass
class Parcel:
    id: str
    weight: float
    tags: list[str]


def make_parcel() -> Parcel:
    return Parcel("p-1", 2.5, ["fragile"])


async def test_typed_step_result_live_and_after_crash(kit):
    seen: list[Any] = []
    calls: list[int] = []

    def counted() -> Parcel:
        calls.append(1)
        return make_parcel()

    @fusee.workflow("steps-typed")
    async def wf(ctx) -> Parcel:
        parcel = await ctx.step("parcel", counted)
        seen.append(parcel)
        await ctx.sleep("pause", "1m")
        return parcel

    t = await kit(wf)
    await t.start(wf, "typed-1")
    await t.settle()
    await t.crash()
    result = await t.result("typed-1")
    assert result == make_parcel()
    assert isinstance(result, Parcel)
    assert len(seen) >= 2  # live, then replayed after the crash (and after parking)
    assert all(isinstance(p, Parcel) and p == make_parcel() for p in seen)
    assert calls == [1]
    await t.check()


# -- mocks and catching ------------------------------------------------------------------


async def test_mock_step_replaces_function_and_failures_are_attempts(kit):
    real: list[int] = []
    mocked: list[int] = []

    @fusee.workflow("steps-mocked")
    async def wf(ctx) -> str:
        charged = await ctx.step("charge", lambda: real.append(1) or "real")
        shipped = await ctx.step("ship", lambda: real.append(2) or "shipped")
        await ctx.sleep("pause", "1m")
        return f"{charged}/{shipped}"

    def charge_mock(attempt: int) -> str:
        mocked.append(attempt)
        if attempt == 1:
            raise ConnectionError("gateway down")
        return f"mock charge {attempt}"

    t = await kit(wf)
    t.mock_step(wf, "charge", charge_mock)
    t.mock_step("steps-mocked", "ship", lambda attempt: f"mock ship {attempt}")
    await t.start(wf, "mock-1")
    await eventually_steps(t, "mock-1", attempts=1)
    await t.advance("1s")
    assert await t.steps("mock-1") == ["charge", "ship"]
    await t.crash()
    assert await t.result("mock-1") == "mock charge 2/mock ship 1"
    assert real == []
    assert mocked == [1, 2]
    attempts = [row for row in await t.journal("mock-1") if row["kind"] == "Attempt"]
    assert len(attempts) == 1
    assert attempts[0]["failure"]["type"] == "ConnectionError"
    assert attempts[0]["failure"]["message"] == "gateway down"
    await t.check()


async def test_workflow_catches_step_error_and_continues(kit):
    calls: list[str] = []

    @fusee.workflow("steps-catch")
    async def wf(ctx) -> dict[str, Any]:
        def charge() -> None:
            calls.append("charge")
            raise CardDeclined("declined", code="card_declined")

        try:
            await ctx.step("charge", charge)
            outcome = "charged"
        except fusee.StepError as error:
            outcome = f"{error.step}:{error.cause.type}:{error.cause.code}"
            await ctx.step("notify", lambda: calls.append("notify") or "notified")
        await ctx.sleep("pause", "1h")
        return {"outcome": outcome, "size": ctx.journal_size()}

    t = await kit(wf)
    await t.start(wf, "catch-1")
    await t.settle()
    await t.crash()
    result = await t.result("catch-1")
    assert result == {"outcome": "charge:CardDeclined:card_declined", "size": 3}
    assert calls == ["charge", "notify"]
    assert await t.steps("catch-1") == ["notify"]
    await t.check()


def always_fails() -> None:
    raise RuntimeError("down")


@fusee.workflow("steps.capped")
async def capped(ctx: fusee.Ctx) -> None:
    policy = fusee.Retry(attempts=5, initial=100, factor=10, max=300, jitter=False)
    await ctx.step("down", always_fails, retry=policy)


async def test_retry_delays_grow_by_the_factor_up_to_max(kit):
    t = await kit(capped)
    await t.start(capped, "c-1")
    with pytest.raises(fusee.StepError):
        await t.result("c-1")
    journal = (await t.engine.run("c-1").describe()).journal
    delays = [r.retry_at - r.failed_at for r in journal if type(r).__name__ == "Attempt"]
    assert delays == [100, 300, 300, 300]


# -- a step that starts or signals a run on its own engine --------------------------------


@fusee.workflow("napper")
async def napper(ctx: fusee.Ctx) -> str:
    await ctx.sleep("nap", "1m")
    woken = await ctx.wait_for("wake")
    return f"woke {woken}"


async def test_a_step_that_starts_and_signals_a_run_on_its_own_engine_leaves_its_code_its_own(kit):
    """The run started (and later signalled) from a step's function runs its code on that
    step's stack: its ctx calls are its own, not calls from inside the step."""
    holder: dict[str, Any] = {}

    @fusee.workflow("starter")
    async def starter(ctx: fusee.Ctx) -> str:
        await ctx.step("start", lambda: _started(holder["engine"]))
        await ctx.sleep("later", "2m")
        await ctx.step("signal", lambda: holder["engine"].run("napped").signal("wake", 7))
        return "sent"

    t = await kit(starter, napper)
    holder["engine"] = t.engine
    await t.start(starter, "starting")
    assert await t.result("starting") == "sent"
    assert await t.result("napped") == "woke 7"


async def _started(engine: fusee.Engine) -> str:
    run = await engine.start(napper, "napped")
    return run.id
