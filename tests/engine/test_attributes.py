"""Search attributes (docs/engine.md, *Search attributes*): `ctx.set_attributes` records
them with no position; `engine.list(where=...)` filters loaded, parked and finished runs
on them and on the run's own fields, across crashes (the log), clean restarts (the
checkpoint's index) and replays (which record nothing again)."""

from __future__ import annotations

import pytest

import fusee

paid = fusee.signal("paid", int)


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, x: dict) -> str:
    ctx.set_attributes({"customer": x["customer"], "status": "open", "amount": x["amount"]})
    await ctx.step("reserve", lambda: "reserved")
    if x.get("park"):
        await ctx.sleep("hold", "1h")
    amount = await ctx.wait_for(paid) if x.get("wait") else x["amount"]
    ctx.set_attributes(
        {"status": "paid", "amount": amount, "customer": None if x.get("anonymous") else x["customer"]}
    )
    return "done"


async def _ids(t, **where) -> list[str]:
    return sorted([row.id async for row in t.engine.list(where=where)])


async def _count_records(t, wid: str) -> int:
    return sum(1 for row in await t.journal(wid) if row["kind"] == "AttributesSet")


async def test_listings_filter_loaded_parked_and_finished_runs(kit):
    t = await kit(order)
    await t.start(order, "o-1", {"customer": "ana", "amount": 120})  # finishes
    await t.start(order, "o-2", {"customer": "bob", "amount": 80, "park": True})  # parks
    await t.start(order, "o-3", {"customer": "ana", "amount": 300, "wait": True})  # stays loaded
    await t.start(order, "o-4", {"customer": "cy", "amount": 50, "anonymous": True})
    assert await t.result("o-1") == "done"
    await t.advance("5s")  # o-2 parks (park_after 1s)
    assert "o-2" not in t.engine.shard_of("o-2").runs

    assert await _ids(t, status="paid") == ["o-1", "o-4"]
    assert await _ids(t, status="open") == ["o-2", "o-3"]
    assert await _ids(t, customer="ana") == ["o-1", "o-3"]
    assert await _ids(t, amount={"gte": 100}) == ["o-1", "o-3"]
    assert await _ids(t, amount={"gt": 50, "lt": 300}) == ["o-1", "o-2"]
    assert await _ids(t, customer={"ne": "ana"}) == ["o-2"]  # o-4 has no customer: no match
    assert await _ids(t, status="open", type="order", id={"gte": "o-3"}) == ["o-3"]
    assert await _ids(t, status="paid", amount="120") == []  # a string is not the number
    # Removed by None: o-4 lost its customer.
    assert await _ids(t, customer="cy") == []
    rows = [row async for row in t.engine.list(where={"status": "open"}, limit=1)]
    assert len(rows) == 1

    # Across a crash (the log), then a clean restart (the checkpoint's index).
    before = {wid: await _count_records(t, wid) for wid in ("o-1", "o-2", "o-3")}
    await t.crash()
    assert await _ids(t, status="open") == ["o-2", "o-3"]
    assert await _ids(t, amount={"gte": 100}) == ["o-1", "o-3"]
    await t.restart()
    assert await _ids(t, status="paid") == ["o-1", "o-4"]
    assert await _ids(t, customer="bob", status="open") == ["o-2"]
    # The replays after the crash and restart recorded nothing again.
    assert {wid: await _count_records(t, wid) for wid in ("o-1", "o-2", "o-3")} == before

    await t.engine.run("o-3").signal(paid, 310)
    assert await t.result("o-3") == "done"
    assert await _ids(t, amount={"gt": 300}) == ["o-3"]
    await t.check()


@fusee.workflow("flagged")
async def flagged(ctx: fusee.Ctx, flag: object) -> None:
    ctx.set_attributes({"flag": flag})
    await ctx.sleep("hold", "1h")


async def test_booleans_are_not_numbers_and_started_ms_filters(kit):
    t = await kit(flagged)
    await t.start(flagged, "f-true", True)
    await t.start(flagged, "f-one", 1)
    await t.advance("5s")  # both parked: answered from the index
    assert await _ids(t, flag=True) == ["f-true"]
    assert await _ids(t, flag=1) == ["f-one"]
    assert await _ids(t, flag={"gt": 0}) == ["f-one"]
    now = t.now_ms()
    assert await _ids(t, startedMs={"lte": now}) == ["f-one", "f-true"]
    assert await _ids(t, startedMs={"gt": now}) == []


@fusee.workflow("badattrs")
async def badattrs(ctx: fusee.Ctx, attrs: object) -> str:
    try:
        ctx.set_attributes(attrs)  # type: ignore[arg-type]
    except (fusee.RejectedError, fusee.CodecError) as error:
        return f"{type(error).__name__}: {error}"
    return "set"


@pytest.mark.parametrize(
    ("attrs", "message"),
    [
        ([1], "expected a dict"),
        ({"": 1}, "attribute name"),
        ({"big": "x" * 20_000}, "at most 16,384 bytes"),
    ],
)
async def test_bad_attributes_are_refused_where_the_code_sets_them(kit, attrs, message):
    t = await kit(badattrs)
    await t.start(badattrs, "b-1", attrs)
    assert message in await t.result("b-1")


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ({"amount": {"between": 1}}, "unknown operator 'between'"),
        ({"amount": {}}, "no operator"),
        ({"amount": {"gt": [1]}}, "not a number or a string"),
        ([("a", 1)], "expected a map"),
    ],
)
async def test_a_bad_filter_is_refused_naming_it(kit, where, message):
    t = await kit(order)
    with pytest.raises(fusee.RejectedError, match=message):
        [row async for row in t.engine.list(where=where)]


async def test_a_bad_limit_is_refused(kit):
    t = await kit(order)
    with pytest.raises(fusee.RejectedError, match="limit"):
        [row async for row in t.engine.list(limit=0)]
