"""The workflows of the golden journals (tests/engine/golden/), recorded once and replayed
against today's code by tests/engine/test_golden.py and tests/engine/test_journal_fuzz.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fusee

GOLDEN = Path(__file__).resolve().parents[1] / "engine" / "golden"
NONDETERMINISTIC = "nondeterministic.json"

approve = fusee.signal("approve", bool)
add_item = fusee.update("add_item", str, int)


def flaky_charge(s: fusee.StepContext) -> str:
    """Fails twice (a retryable error), then succeeds: two Attempt records, one StepDone."""
    if s.attempt < 3:
        raise ConnectionResetError(f"card network down (attempt {s.attempt})")
    return "ch_1"


@fusee.workflow("g_retry")
async def g_retry(ctx: fusee.Ctx, order: str) -> str:
    charge = await ctx.step("charge", flaky_charge, retry=fusee.Retry(attempts=4, initial=100, jitter=False))
    await ctx.sleep("cooldown", "1m")
    receipt = await ctx.step("receipt", lambda: f"receipt:{order}")
    return f"{charge}/{receipt}"


@fusee.workflow("g_approval")
async def g_approval(ctx: fusee.Ctx, requester: str) -> dict[str, Any]:
    items: list[str] = []

    async def on_add(item: str) -> int:
        stored = await ctx.step("store", lambda: item.upper())
        items.append(stored)
        return len(items)

    ctx.on_update(add_item, on_add, validate=lambda item: None if item else "an empty item")
    approved = await ctx.wait_for(approve, timeout="1d")
    return {"requester": requester, "approved": approved, "items": items}


@fusee.workflow("g_child")
async def g_child(ctx: fusee.Ctx, n: int) -> int:
    return await ctx.step("square", lambda: n * n)


@fusee.workflow("g_parent")
async def g_parent(ctx: fusee.Ctx, n: int) -> int:
    squared = await ctx.child(g_child, f"{ctx.workflow_id}/child", n)
    return await ctx.step("add_one", lambda: squared + 1)


@fusee.workflow("g_pay")
async def g_pay(ctx: fusee.Ctx, amount: int) -> str:
    return await ctx.step("refund", lambda: f"refunded {amount}")


REPAIRED = [False]  # the fix deployed: g_repair's charge succeeds from then on


def repair_charge() -> str:
    if not REPAIRED[0]:
        raise ConnectionResetError("payments are down")
    return "ch_2"


@fusee.workflow("g_repair")
async def g_repair(ctx: fusee.Ctx, order: str) -> str:
    """Paused out of retries, reset to before its charge, paused again, resumed once
    fixed (docs/run-operations.md): its journal holds Reset, a paused Attempt and Resume."""
    prepared = await ctx.step("prepare", lambda: f"prepared:{order}")
    approved = await ctx.wait_for(approve, timeout="1d")
    retry = fusee.Retry(attempts=2, initial=100, jitter=False, on_exhausted="pause")
    charge = await ctx.step("charge", repair_charge, retry=retry)
    return f"{prepared}/{approved}/{charge}"


@fusee.workflow("g_patch")
async def g_patch(ctx: fusee.Ctx, parcel: str) -> str:
    """Two patches of one deploy (docs/engine.md, *Patching*). Its golden run started under
    the code before them and slept through the deploy: it went past 'gift' before the
    patch existed (the old branch) and reached 'express' after it (the new branch)."""
    if ctx.patched("gift"):
        packed = await ctx.step("pack-gift", lambda: f"gift-wrapped {parcel}")
    else:
        packed = await ctx.step("pack", lambda: f"packed {parcel}")
    await ctx.sleep("wait-for-truck", "1h")
    if ctx.patched("express"):
        shipped = await ctx.step("ship-express", lambda: "express")
    else:
        shipped = await ctx.step("ship", lambda: "standard")
    return f"{packed}/{shipped}"


g_tab = fusee.object("g_tab")


@g_tab.exclusive
async def order(ctx: fusee.ObjectCtx, item: str) -> int:
    """An object key's calls (docs/objects.md): its golden run holds two calls, one with a
    step, an edit from outside and a shared read."""
    price = await ctx.step("price", lambda: len(item))
    items = ctx.state.get("items") or []
    items.append([item, price])
    ctx.state.set("items", items)
    return len(items)


@g_tab.shared
async def total(ctx: fusee.ObjectCtx) -> int:
    return sum(price for _, price in ctx.state.get("items") or [])
