"""Limits on the test kit's virtual clock (docs/limits.md): the concurrency bound, the
rate, strict priority, fairness turns, a retry taking a permit again, and a crash while
steps wait."""

from __future__ import annotations

import asyncio

import pytest

import fusee
from fusee import RejectedError
from fusee.testing import TestEngine

KIT: list[TestEngine] = []  # the open kit: step functions sleep on its clock


class Inside:
    """Counts attempts inside the limited section, and the most seen at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.began: list[int] = []  # virtual ms each attempt began at
        self.order: list[str] = []

    def enter(self, label: str = "") -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        self.began.append(KIT[0].now_ms())
        self.order.append(label)

    def leave(self) -> None:
        self.now -= 1


SEEN = Inside()
GATE: list[asyncio.Future[None]] = []  # the blocker's step waits on this


def vsleep(ms: int) -> asyncio.Future[None]:
    """A sleep on the kit's virtual clock (the step's work takes virtual time)."""
    fut = asyncio.get_running_loop().create_future()
    KIT[0].clock.call_at(KIT[0].now_ms() + ms, lambda: fut.done() or fut.set_result(None))
    return fut


@fusee.workflow
async def call_api(ctx: fusee.Ctx, x: dict) -> str:
    async def work() -> None:
        seen = SEEN  # the counter of the engine this attempt runs on (a crash swaps it)
        seen.enter(x.get("label", ""))
        try:
            await vsleep(x.get("ms", 100))
        finally:
            seen.leave()

    await ctx.step(
        "call",
        work,
        limit=x["limit"],
        priority=x.get("priority", 0),
        fairness_key=x.get("key"),
        fairness_weight=x.get("weight", 1),
    )
    return "ok"


@fusee.workflow
async def blocker(ctx: fusee.Ctx, limit: str) -> None:
    async def hold() -> None:
        seen, gate = SEEN, GATE[0]
        seen.enter("blocker")
        try:
            await gate
        finally:
            seen.leave()

    await ctx.step("hold", hold, limit=limit)


@fusee.workflow
async def tenant(ctx: fusee.Ctx, x: dict) -> None:
    """`n` steps at once, all waiting for one limit under one fairness key."""
    await ctx.all(
        [
            ctx.step(
                f"s{i}",
                lambda: SEEN.order.append(x["key"]),
                limit=x["limit"],
                fairness_key=x["key"],
                fairness_weight=x.get("weight", 1),
            )
            for i in range(x["n"])
        ]
    )


@fusee.workflow
async def flaky(ctx: fusee.Ctx, x: dict) -> str:
    def once(attempt: int) -> str:
        SEEN.order.append(f"{x['label']}#{attempt}")
        if attempt == 1:
            raise RuntimeError("first attempt fails")
        return "ok"

    def attempt_with(sc: fusee.StepContext) -> str:
        return once(sc.attempt)

    retry = fusee.Retry(attempts=3, initial="1s")
    return await ctx.step("flaky", attempt_with, limit=x["limit"], retry=retry)


WORKFLOWS = [call_api, blocker, tenant, flaky]


@pytest.fixture
async def t():
    global SEEN
    SEEN = Inside()
    GATE[:] = [asyncio.get_running_loop().create_future()]
    kit = await TestEngine.open(WORKFLOWS)
    KIT[:] = [kit]
    try:
        yield kit
    finally:
        if not GATE[0].done():
            GATE[0].set_result(None)
        await KIT[0].close()


async def statuses(t: TestEngine, type_: str) -> dict[str, str]:
    return {r.id: r.status async for r in t.engine.list(type=type_)}


async def test_concurrent_4_never_lets_more_than_4_attempts_inside(t):
    await t.engine.limit("api", concurrent=4)
    for i in range(30):
        await t.start(call_api, f"c{i}", {"limit": "api", "ms": 100 + 7 * i})
    await t.settle()
    assert SEEN.now == 4
    assert await t.engine.limit_usage("api") == {"in_use": 4, "waiting": 26}
    for _ in range(40):
        await t.advance("100ms")
    assert SEEN.most == 4
    assert set((await statuses(t, "call_api")).values()) == {"ok"}
    assert await t.engine.limit_usage("api") == {"in_use": 0, "waiting": 0}


async def test_per_second_20_keeps_to_the_rate_over_10_virtual_seconds(t):
    await t.engine.limit("rate", per_second=20)
    start = t.now_ms()
    for i in range(300):
        await t.start(call_api, f"r{i}", {"limit": "rate", "ms": 1})
    for _ in range(100):
        await t.advance("100ms")
    began = [ms - start for ms in SEEN.began if ms - start < 10_000]
    assert 180 <= len(began) <= 220, len(began)
    # and in no one-second window more than the rate (+1 for the window's edge)
    for first in began:
        assert sum(1 for ms in began if first <= ms < first + 1000) <= 21


async def test_priority_is_strict_then_arrival_order(t):
    await t.engine.limit("one", concurrent=1)
    await t.start(blocker, "b", "one")
    await t.settle()
    plan = [("low1", 0), ("high1", 10), ("low2", 0), ("mid1", 5), ("high2", 10), ("neg", -3)]
    for label, priority in plan:
        await t.start(call_api, label, {"limit": "one", "priority": priority, "label": label, "ms": 10})
        await t.settle()  # arrival order is start order
    assert await t.engine.limit_usage("one") == {"in_use": 1, "waiting": 6}
    GATE[0].set_result(None)
    for _ in range(20):
        await t.advance("10ms")
    assert SEEN.order == ["blocker", "high1", "high2", "mid1", "low1", "low2", "neg"]
    assert SEEN.most == 1


async def test_a_tenant_with_1000_waiting_steps_gets_one_permit_per_turn(t):
    await t.engine.limit("shared", concurrent=1)
    await t.start(blocker, "b", "shared")
    await t.settle()
    await t.start(tenant, "big", {"limit": "shared", "key": "A", "n": 1000})
    await t.settle()
    await t.start(tenant, "small", {"limit": "shared", "key": "B", "n": 3})
    await t.settle()
    await t.start(tenant, "heavy", {"limit": "shared", "key": "W", "n": 4, "weight": 2})
    await t.settle()
    assert (await t.engine.limit_usage("shared"))["waiting"] == 1007
    GATE[0].set_result(None)
    await t.settle()
    order = SEEN.order[1:]  # after the blocker
    assert order[:12] == ["A", "B", "W", "W", "A", "B", "W", "W", "A", "B", "A", "A"]
    assert len(order) == 1007
    await t.settle()
    assert set((await statuses(t, "tenant")).values()) == {"ok"}


async def test_a_retried_attempt_takes_a_permit_again(t):
    await t.engine.limit("one", concurrent=1)
    await t.start(flaky, "f", {"limit": "one", "label": "f"})
    await t.settle()
    assert SEEN.order == ["f#1"]
    # backing off: the permit is back, another step takes it
    assert await t.engine.limit_usage("one") == {"in_use": 0, "waiting": 0}
    await t.start(call_api, "other", {"limit": "one", "label": "other", "ms": 2000})
    await t.settle()
    assert await t.engine.limit_usage("one") == {"in_use": 1, "waiting": 0}
    await t.advance("1500ms")  # the retry is due but waits for the permit
    assert await t.engine.limit_usage("one") == {"in_use": 1, "waiting": 1}
    assert SEEN.order == ["f#1", "other"]
    await t.advance("1s")
    assert SEEN.order == ["f#1", "other", "f#2"]
    assert await t.engine.run("f").result() == "ok"
    assert await t.engine.limit_usage("one") == {"in_use": 0, "waiting": 0}


async def test_options_are_checked_where_they_are_given(t):
    with pytest.raises(RejectedError, match="concurrent="):
        await t.engine.limit("bad", concurrent=0)
    with pytest.raises(RejectedError, match="give concurrent="):
        await t.engine.limit("bad")
    with pytest.raises(RejectedError, match="per_second="):
        await t.engine.limit("bad", per_second=float("inf"))


async def test_limits_lists_stored_definitions_and_a_redefinition_applies(t):
    await t.engine.limit("b", per_second=5)
    await t.engine.limit("a", concurrent=2)
    await t.engine.limit("a", concurrent=3, per_second=1.5)
    listed = await t.engine.limits()
    assert listed == [
        {"name": "a", "concurrent": 3, "per_second": 1.5, "in_use": 0, "waiting": 0},
        {"name": "b", "concurrent": None, "per_second": 5, "in_use": 0, "waiting": 0},
    ]


async def test_a_crash_while_steps_wait_keeps_the_bound_and_the_definition(tmp_path):
    global SEEN
    SEEN = Inside()
    GATE[:] = [asyncio.get_running_loop().create_future()]
    kit = await TestEngine.open(WORKFLOWS, dir=tmp_path / "data", shards=2)
    KIT[:] = [kit]
    try:
        await kit.engine.limit("one", concurrent=1)
        await kit.start(blocker, "b", "one")
        await kit.settle()
        for i in range(5):
            await kit.start(call_api, f"w{i}", {"limit": "one", "label": f"w{i}", "ms": 50})
            await kit.settle()
        assert await kit.engine.limit_usage("one") == {"in_use": 1, "waiting": 5}
        SEEN = Inside()
        GATE[:] = [asyncio.get_running_loop().create_future()]
        await kit.crash(settle=False)
        # The reopened engine was never told the limit: it reads the stored definition.
        await kit.settle()
        assert SEEN.most == 1  # the blocker's step runs again (it was never recorded)
        assert (await kit.engine.limit_usage("one"))["waiting"] == 5
        assert [d["name"] for d in await kit.engine.limits()] == ["one"]
        GATE[0].set_result(None)
        for _ in range(20):
            await kit.advance("50ms")
        assert SEEN.most == 1
        assert sorted(SEEN.order) == ["blocker", "w0", "w1", "w2", "w3", "w4"]
        assert set((await statuses(kit, "call_api")).values()) == {"ok"}
        await kit.check()
    finally:
        if not GATE[0].done():
            GATE[0].set_result(None)
        await kit.close()
