"""The workflows of the scale-to-zero demo (examples/scale_to_zero.py).

Nothing in this module runs in the demo's own process: the handler (`uvicorn
handlers.asgi:app` with FUSEE_WORKFLOWS=examples.scale_to_zero_flows) imports it and runs
these workflows only while the server has invoked it for a shard with work. The client
starts them by name, with plain JSON input.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import fusee

approve = fusee.signal("approve", bool)


@dataclass
class Order:
    item: str
    quantity: int
    hold_s: float = 0.0  # how long to hold the parcel before shipping (0: ship at once)


@dataclass
class Shipped:
    item: str
    total_cents: int
    due_at: float | None  # when the hold ended (Unix time), None without a hold
    shipped_at: float  # when the ship step ran (Unix time)


def ship() -> float:
    """A step function may do anything, read the clock included: its result is recorded."""
    return time.time()


@fusee.workflow("order")
async def order(ctx: fusee.Ctx, o: Order) -> Shipped:
    """Reserve, charge, hold for `hold_s` seconds if asked, then ship.

    While it holds, the run is a timer in its shard's journal: no process needs to exist
    for it. The server invokes the handler again when the timer is due."""
    await ctx.step("reserve", lambda: f"{o.quantity} x {o.item}")
    total = await ctx.step("charge", lambda: o.quantity * 250)
    due_at = None
    if o.hold_s:
        due_at = ctx.now().timestamp() + o.hold_s  # ctx.now() is recorded, like a step
        await ctx.sleep("hold", timedelta(seconds=o.hold_s))
    shipped_at = await ctx.step("ship", ship)
    return Shipped(o.item, total, due_at, shipped_at)


@fusee.workflow("refund")
async def refund(ctx: fusee.Ctx, o: Order) -> str:
    """Opens a case, then waits (up to an hour, costing nothing) for a person's approval."""
    await ctx.step("open-case", lambda: f"refund {o.quantity} x {o.item}")
    if not await ctx.wait_for(approve, timeout="1h"):
        return "not approved"
    cents = await ctx.step("refund", lambda: o.quantity * 250)
    return f"refunded {cents} cents"
